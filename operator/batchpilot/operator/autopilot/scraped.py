"""Two reads of the pods' own samples (`GET /admin/metrics`) as the answers Prometheus would
give: what the autopilot decides scale-ups from while Prometheus does not answer.

Each signal is what `promql.queries` asks, evaluated over the two reads of each pod instead of
over Prometheus' window: a counter's rate is its increase between the reads (a reset, a
restarted pod, counts from zero) over the seconds between them, summed over the pods read both
times; a latency quantile is `histogram_quantile` over the buckets' increases, summed by bound;
a gauge is its value at the second read. The answers are in Prometheus' instant-vector shape, so
`answers.observation_from` reads them as it reads Prometheus': one reading of the signals for
both sources. What needs Prometheus' history (the recent rate between its scrapes, the daily
pattern, how much of the window it holds) is left out.

Pure: samples in, answers out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchpilot.api.arrivals import ATTEMPT_LABEL, RETRY_ATTEMPT
from batchpilot.api.samples import Sample
from batchpilot.operator.autopilot.answers import Raw

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Read:
    """One pod's samples, read at `at` (seconds, a monotonic clock)."""

    at: float
    samples: tuple[Sample, ...]

    def values(self, name: str) -> dict[Labels, float]:
        """Each series of `name`, by its labels."""
        return {tuple(sorted(ls.items())): value for n, ls, value in self.samples if n == name}


def answers(before: Mapping[str, Read], after: Mapping[str, Read]) -> tuple[Raw, float] | None:
    """Each signal's answer from the pods read both times, and the mean seconds between their
    reads (the window the rates are over); None where no pod was read both times, or no time
    passed between the reads."""
    pods = sorted(pod for pod in after if pod in before and after[pod].at > before[pod].at)
    if not pods:
        return None
    window_s = sum(after[p].at - before[p].at for p in pods) / len(pods)

    def pod_rates(pod: str, name: str) -> list[tuple[Labels, float]]:
        """Each of one pod's series' rate between its two reads."""
        then, now = before[pod].values(name), after[pod].values(name)
        seconds = after[pod].at - before[pod].at
        found = []
        for labels, value in now.items():
            start = then.get(labels, 0.0)
            increase = value - start if value >= start else value  # a reset counts from 0
            found.append((labels, increase / seconds))
        return found

    def rates(name: str) -> list[tuple[Labels, float]]:
        """Each series' rate between the two reads, over every pod read both times."""
        return [found for pod in pods for found in pod_rates(pod, name)]

    def sla_gauges() -> list[float]:
        return [v for _, v in gauges("batchpilot_sla_seconds") if math.isfinite(v)]

    def late_share() -> float | None:
        """The requests over the SLA over those timed, of the pods that count them (as
        `promql.queries` reads it: a pod not yet given the SLA is in neither)."""
        late = timed = 0.0
        for pod in pods:
            over = pod_rates(pod, "batchpilot_requests_over_sla_total")
            if over:
                late += sum(r for _, r in over)
                counted = pod_rates(pod, "batchpilot_request_duration_seconds_count")
                timed += sum(r for _, r in counted)
        return late / timed if timed > 0 else None

    def total(name: str, **match: str) -> float | None:
        picked = [r for labels, r in rates(name) if _matches(labels, match)]
        return sum(picked) if picked else None

    def by(name: str, label: str) -> dict[str, float]:
        """The rates summed by one label."""
        grouped: dict[str, float] = defaultdict(float)
        for labels, r in rates(name):
            key = dict(labels).get(label)
            if key is not None:
                grouped[key] += r
        return dict(grouped)

    def gauges(name: str) -> list[tuple[Labels, float]]:
        return [item for pod in pods for item in after[pod].values(name).items()]

    def demand(found: list[tuple[Labels, float]]) -> list[float]:
        """The values of the arrival series not marked retries (as `NOT_RETRIED` reads them)."""
        return [v for labels, v in found if dict(labels).get(ATTEMPT_LABEL) != RETRY_ATTEMPT]

    served = total("batchpilot_requests_total", outcome="success")
    busy = [r for _, r in rates("batchpilot_device_busy_seconds_total")]
    rows = total("batchpilot_batch_size_sum")
    batches = total("batchpilot_batch_size_count")
    duration_sum = total("batchpilot_request_duration_seconds_sum")
    duration_count = total("batchpilot_request_duration_seconds_count")
    in_batcher = total("batchpilot_batcher_seconds_total")
    before_batcher = total("batchpilot_before_batcher_seconds_total")
    startup: dict[str, list[float]] = defaultdict(list)
    for labels, value in gauges("batchpilot_startup_batch_seconds"):
        if (at_rows := dict(labels).get("rows")) is not None:
            startup[at_rows].append(value)
    memory = [v for _, v in gauges("batchpilot_device_memory_batch_rows")]
    now = demand(gauges("batchpilot_recent_arrivals_per_second"))
    clumps = [v for _, v in gauges("batchpilot_arrival_dispersion") if math.isfinite(v)]
    varies = [v for _, v in gauges("batchpilot_batch_time_cv") if math.isfinite(v)]
    arrivals = demand(rates("batchpilot_arrivals_total"))
    retried = total("batchpilot_arrivals_total", **{ATTEMPT_LABEL: RETRY_ATTEMPT})
    every = total("batchpilot_arrivals_total")
    arrived_rows = total("batchpilot_arrival_rows_total")
    squares = total("batchpilot_arrival_rows_squared_total")
    requests_buckets = by("batchpilot_request_duration_seconds_bucket", "le")
    raw: Raw = {
        "p99": _one(histogram_quantile(0.99, requests_buckets)),
        "p95": _one(histogram_quantile(0.95, requests_buckets)),
        "queue_p99": _one(
            histogram_quantile(0.99, by("batchpilot_queue_wait_seconds_bucket", "le"))
        ),
        "qps": _one(served),
        "late_share": _one(late_share()),
        "counted_sla_min": _one(min(slas) if (slas := sla_gauges()) else None),
        "counted_sla_max": _one(max(slas) if slas else None),
        "rejected": _one(total("batchpilot_requests_total", outcome="rejected")),
        "arrivals": _one(sum(arrivals) if arrivals else None),
        "retried": _one(retried),
        "withdrawn": _one(total("batchpilot_withdrawn_total")),
        "utilization": _one(sum(busy) / len(busy) if busy else None),
        "dispersion": _one(sum(clumps) / len(clumps) if clumps else None),
        "second_squares": _one(total("batchpilot_arrival_second_squares_total")),
        "counted_seconds": _one(total("batchpilot_arrival_counted_seconds_total")),
        "batch_cv": _one(sum(varies) / len(varies) if varies else None),
        "rows_cv": _one(_spread(squares, every, arrived_rows)),
        "mean_batch": _one(_ratio(rows, batches)),
        "rows_per_request": _one(_ratio(rows, served)),
        "outside": _one(
            None
            if duration_sum is None or in_batcher is None
            else _ratio(duration_sum - in_batcher, duration_count)
        ),
        "before": _one(None if before_batcher is None else _ratio(before_batcher, duration_count)),
        "startup": [
            _series({"rows": r}, sum(values) / len(values)) for r, values in startup.items()
        ],
        "compute_seconds": _vector(by("batchpilot_batch_compute_seconds_total", "batch_bucket")),
        "compute_rows": _vector(by("batchpilot_batch_rows_total", "batch_bucket")),
        "compute_batches": _vector(by("batchpilot_batches_total", "batch_bucket")),
        "reporting": _one(float(len(pods))),
        "memory_rows": _one(min(memory) if memory else None),
        "now": _one(sum(now) if now else None),
    }
    return raw, window_s


def _spread(squares: float | None, count: float | None, total: float | None) -> float | None:
    """The coefficient of variation of values from their count, sum and sum of squares, as
    `promql`'s `rows_cv` computes it; None where any is missing or nothing was counted."""
    if squares is None or count is None or total is None or total <= 0:
        return None
    return math.sqrt(max(0.0, squares * count / (total * total) - 1.0))


def histogram_quantile(q: float, buckets: Mapping[str, float]) -> float | None:
    """Prometheus' `histogram_quantile` over one histogram's bucket rates by upper bound (`le`):
    linear within the bucket the rank falls in, the largest finite bound where it falls in the
    +Inf bucket; None without observations."""
    bounds = sorted((float(le), count) for le, count in buckets.items())
    if len(bounds) < 2 or not math.isinf(bounds[-1][0]):
        return None
    total = bounds[-1][1]
    if not total > 0:
        return None
    rank = q * total
    start, below = 0.0, 0.0
    for i, (bound, count) in enumerate(bounds):
        if count >= rank:
            if math.isinf(bound):
                return bounds[-2][0]
            if i == 0 and bound <= 0:
                return bound
            if count <= below:
                return bound
            return start + (bound - start) * (rank - below) / (count - below)
        start, below = bound, count
    return bounds[-2][0]


def _matches(labels: Labels, match: Mapping[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in match.items())


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


def _series(metric: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": metric, "value": [0, repr(value)]}


def _one(value: float | None) -> list[dict[str, Any]]:
    """An instant vector of one value, or empty (missing)."""
    return [] if value is None or not math.isfinite(value) else [_series({}, value)]


def _vector(values: Mapping[str, float]) -> list[dict[str, Any]]:
    return [_series({"batch_bucket": key}, value) for key, value in values.items()]
