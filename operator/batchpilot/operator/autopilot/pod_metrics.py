"""Reads the pods' own metrics (`GET /admin/metrics` on the admin port) when Prometheus does not
answer: an `Observation` from the samples of each ready pod at this tick and at the one before
(`scraped`), for the autopilot to add replicas on (`pilot`: it never removes any on them).

The pods are read only at the ticks whose Prometheus observation is missing, so a Prometheus
that works costs no pod a request; the first such tick keeps the reads it takes, and the next
(one interval later) has its window. Where the round lacks a service's signals (an outage
begins, an operator starts or takes the lead during one, Prometheus stops scraping a service's
pods), the fleet's round `prime`s that service first and lets `FIRST_WINDOW_S` pass before
its tick, so it decides on a window of those seconds instead of holding one interval more.
Reads older than `MAX_BASELINE_S` are not a window's start: a Prometheus that came back and went
again starts afresh. One pod that does not
answer within `TIMEOUT_S` is left out of the window (its load is not in the rates, and
`reporting_replicas` says so); a service's pods are read at once. What is remembered is per
operator process.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from batchpilot.api.samples import Sample, read_samples
from batchpilot.operator.autopilot.acting import Pods
from batchpilot.operator.autopilot.answers import observation_from
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.scraped import Read, answers
from batchpilot.operator.children.common import ISVC_LABEL, Owner
from batchpilot.operator.kube import KubeError

log = logging.getLogger(__name__)

TIMEOUT_S = 1.0
MAX_AT_ONCE = 16
"""Pods of one service read at the same time."""
MAX_BASELINE_S = 60.0
"""Reads older than this start no window: four default intervals."""
FIRST_WINDOW_S = 5.0
"""The window of an outage's first round, between the reads `prime` takes and the ticks' (the
round waits for it; at most a third of the interval, see `first_window_s`). Long enough to hold
batches and the tail of a latency histogram at a few requests a second — the runtime's own
recent-rate gauge is over as many seconds — and short against the default interval, which the
round would otherwise lose."""


def first_window_s(interval_s: float) -> float:
    """The first blind round's window for rounds `interval_s` apart: `FIRST_WINDOW_S`, or a
    third of the interval where that is shorter, so the round stays well inside it."""
    return min(FIRST_WINDOW_S, interval_s / 3)


Fetch = Callable[[str], list[Sample]]
"""The samples of the pod whose admin endpoint is `IP:PORT`; raises where it does not answer."""


def _starts_a_window(read: Read, now: float) -> bool:
    """Whether a kept read is recent enough to start the window of a read now."""
    return now - read.at <= MAX_BASELINE_S


def fetch_samples(endpoint: str, *, timeout_s: float = TIMEOUT_S) -> list[Sample]:
    with urllib.request.urlopen(f"http://{endpoint}/admin/metrics", timeout=timeout_s) as answer:
        return read_samples(json.loads(answer.read()))


class PodScraper:
    """`scraper(owner, ready_replicas=…, at=…)`: the Observation of the pods read now and at the
    previous call, or None (the first call, no pod read twice)."""

    def __init__(
        self,
        pods: Pods,
        *,
        fetch: Fetch = fetch_samples,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pods = pods
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, str], dict[str, Read]] = {}

    def __call__(
        self, owner: Owner, *, ready_replicas: int | None, at: float
    ) -> Observation | None:
        key = (owner.namespace, owner.name)
        reads = self._read_service(*key)
        if reads is None:
            return None
        with self._lock:
            before = self._reads.get(key, {})
            self._reads[key] = reads
        now = self._clock()
        before = {pod: read for pod, read in before.items() if _starts_a_window(read, now)}
        found = answers(before, reads)
        if found is None:
            return None
        raw, window_s = found
        return observation_from(
            raw,
            window_s=window_s,
            recent_s=None,
            seasonality=None,
            ready_replicas=ready_replicas,
            at=at,
        )

    def prime(self, namespace: str, name: str) -> bool:
        """Read the service's pods now, to start the window of its next call, where no read of
        them can start one (none kept, or all older than `MAX_BASELINE_S`). Whether it read a
        pod: False where a read was kept already, or none of its pods answered."""
        key = (namespace, name)
        now = self._clock()
        with self._lock:
            kept = self._reads.get(key, {})
        if any(_starts_a_window(read, now) for read in kept.values()):
            return False
        reads = self._read_service(namespace, name)
        if not reads:
            return False
        with self._lock:
            self._reads[key] = reads
        return True

    def _read_service(self, namespace: str, name: str) -> dict[str, Read] | None:
        """Each ready pod's read, by endpoint, of those that answered; None where the pods
        could not be listed."""
        try:
            endpoints = self._pods.ready_pod_endpoints(namespace, {ISVC_LABEL: name})
        except KubeError as exc:
            log.warning("listing pods of %s/%s failed: %s", namespace, name, exc)
            return None
        reads: dict[str, Read] = {}
        if endpoints:
            # At once: pods that hang cost the tick one timeout, not one each.
            with ThreadPoolExecutor(min(len(endpoints), MAX_AT_ONCE)) as pool:
                for endpoint, read in zip(endpoints, pool.map(self._read, endpoints), strict=True):
                    if isinstance(read, Read):
                        reads[endpoint] = read
                    else:  # one pod's silence costs the window its load, no more
                        log.info(
                            "metrics of %s (%s/%s) not read: %s", endpoint, namespace, name, read
                        )
        return reads

    def _read(self, endpoint: str) -> Read | Exception:
        try:
            samples = self._fetch(endpoint)
        except Exception as exc:
            return exc
        return Read(self._clock(), tuple(samples))

    def drop(self, namespace: str, name: str) -> None:
        """Forget a service's reads (Prometheus answers for it again)."""
        with self._lock:
            self._reads.pop((namespace, name), None)

    def forget(self, keep: Iterable[tuple[str, str]]) -> None:
        """Forget every service but `keep`."""
        kept = set(keep)
        with self._lock:
            for key in [k for k in self._reads if k not in kept]:
                del self._reads[key]
