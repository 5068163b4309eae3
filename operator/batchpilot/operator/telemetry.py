"""The operator's own metrics, for the platform team that runs it: `GET /metrics` on
`BATCHPILOT_OPERATOR_METRICS_PORT` (the chart's `operator.metricsPort`; 0: none).

The services' metrics are the runtimes'; these say whether the operator itself is doing its
job: which replica is active (the leader), whether each autopilot round ran, how long it took
against its interval and whether Prometheus answered it, whether its requests to the API server
fail (an outage, as its log tells it), and every Event the operator posted by
service and reason — `AutopilotDecided`, `MetricsUnavailable`, `ReplicasChangedElsewhere`,
`ApplyFailed`, `ReplicasFailing`… — so that an alert can say "the autopilot is blind" or "someone
fights the autopilot over vision/resnet50" without reading Events. One registry per process (a
standby's says it is not active).

The service is in `isvc_namespace` and `isvc`, not `namespace`: Prometheus gives the operator
pod's own namespace that name when it scrapes (honorLabels is false). A service's series go when
it is deleted (`forget`), so a fleet that turns over does not grow the exposition without end:
it holds one series per service and reason posted.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from batchpilot.operator.events import Event

REGISTRY = CollectorRegistry()

ACTIVE = Gauge(
    "batchpilot_operator_active",
    "1 while this process reconciles and runs the autopilot (the leader, or the only one)",
    registry=REGISTRY,
)
EVENTS = Counter(
    "batchpilot_operator_events",
    "Events the operator posted, by InferenceService (isvc_namespace, isvc), type and reason",
    ["isvc_namespace", "isvc", "type", "reason"],
    registry=REGISTRY,
)
_POSTED: dict[tuple[str, str], set[tuple[str, str]]] = {}
"""The (type, reason) series each service has, for `forget`; the fleet's workers post from their
threads, hence the lock."""
_POSTED_LOCK = threading.Lock()
ROUNDS = Counter(
    "batchpilot_operator_autopilot_rounds",
    "Autopilot rounds run (one Prometheus round, then every service's tick)",
    registry=REGISTRY,
)
ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120)
"""The round histogram's bounds for any interval; `round_buckets` adds the interval's own."""


def round_buckets(interval_s: float) -> tuple[float, ...]:
    """The round histogram's bounds for rounds every `interval_s`: `ROUND_BUCKETS`, the interval
    and twice it. The chart's BatchpilotAutopilotRoundsLate compares the rounds' 90th percentile
    (`histogram_quantile`) with the interval. With the interval a bound, that percentile is above
    it exactly when more than one round in ten took longer; with twice the interval a bound above
    it, the percentile can be above it at all — `histogram_quantile` never answers more than the
    highest finite bound, and an interval of 120 s or more had none above it."""
    return tuple(sorted({*ROUND_BUCKETS, interval_s, 2 * interval_s}))


def _round_seconds(buckets: tuple[float, ...]) -> Histogram:
    return Histogram(
        "batchpilot_operator_autopilot_round_seconds",
        "How long each autopilot round took (longer than the interval delays the next)",
        buckets=buckets,
        registry=REGISTRY,
    )


ROUND_SECONDS = _round_seconds(ROUND_BUCKETS)
SERVICES = Gauge(
    "batchpilot_operator_autopilot_services",
    "InferenceServices in the last autopilot round (modes auto and recommend)",
    registry=REGISTRY,
)
TICKS_FAILED = Counter(
    "batchpilot_operator_autopilot_ticks_failed",
    "Services' ticks that failed (an API error, a bug): their decisions waited a round",
    registry=REGISTRY,
)
API_OUTAGE = Gauge(
    "batchpilot_operator_api_outage",
    "1 while this process's requests to the API server fail or go unanswered (the outage its "
    "log tells once, 'API server outage'), else 0",
    registry=REGISTRY,
)
PROMETHEUS_UP = Gauge(
    "batchpilot_operator_prometheus_up",
    "1 where the last autopilot round's Prometheus answered, 0 where it did not (the autopilot "
    "held, or read the pods' own metrics)",
    registry=REGISTRY,
)


@dataclass(frozen=True, slots=True)
class Round:
    """What one round reports (`fleet.RoundReport`'s counts)."""

    services: int
    failed: int
    prometheus_answered: bool
    took_s: float


def api_outage(open_: bool) -> None:
    """An API-server outage began (True) or is over (False): `outage_log` tells it."""
    API_OUTAGE.set(1.0 if open_ else 0.0)


def posted(namespace: str, name: str, events: Iterable[Event]) -> None:
    """Count the Events posted about the InferenceService `namespace`/`name`."""
    with _POSTED_LOCK:
        for event in events:
            EVENTS.labels(namespace, name, event.type, event.reason).inc()
            _POSTED.setdefault((namespace, name), set()).add((event.type, event.reason))


def forget(namespace: str, name: str) -> None:
    """Drop the series of a deleted InferenceService (a new one of the name starts from 0)."""
    with _POSTED_LOCK:
        for type_, reason in _POSTED.pop((namespace, name), set()):
            EVENTS.remove(namespace, name, type_, reason)


def forget_all_but(services: Collection[tuple[str, str]]) -> None:
    """Keep the series of `services` (namespace, name) alone: a pass that read a service a
    moment after its deletion was forgotten posts for it again, and nothing forgot it then."""
    kept = set(services)
    with _POSTED_LOCK:
        gone = [key for key in _POSTED if key not in kept]
    for namespace, name in gone:
        forget(namespace, name)


def time_rounds(interval_s: float) -> None:
    """Time the rounds in `round_buckets(interval_s)` from now on (the autopilot's start, before
    its first round: the rounds timed before are dropped)."""
    global ROUND_SECONDS
    REGISTRY.unregister(ROUND_SECONDS)
    ROUND_SECONDS = _round_seconds(round_buckets(interval_s))


def ran(round_: Round) -> None:
    ROUNDS.inc()
    ROUND_SECONDS.observe(round_.took_s)
    SERVICES.set(round_.services)
    TICKS_FAILED.inc(round_.failed)
    PROMETHEUS_UP.set(1 if round_.prometheus_answered else 0)


def serve(port: int, *, address: str = "0.0.0.0") -> WSGIServer:
    """`GET /metrics` on `port` (0: a free one), in a daemon thread: its server (`server_port`
    the port bound, `shutdown()` to stop it)."""
    server, _ = start_http_server(port, addr=address, registry=REGISTRY)
    return server
