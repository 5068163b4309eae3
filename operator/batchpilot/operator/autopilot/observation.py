"""What the autopilot sees of a service over one window. Missing is None, never zero.

A reading no signal can have — NaN (Prometheus' answer for a quantile or a ratio over nothing),
an infinity, a negative rate, count or time — is missing too: an `Observation` holds None in
its place, and its per-bucket and per-pod points leave such points out, whoever built it (the
Prometheus reader, the pods' reads, a simulator, a test). A decision is then a hold, never one
taken on a number that cannot be; and no such number reaches the status, whose JSON cannot carry
it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class ComputePoint:
    """Mean per-batch compute time of the batches in one batch-size bucket."""

    mean_batch: float
    mean_seconds: float
    batches: float


@dataclass(frozen=True, slots=True)
class PodCompute:
    """One replica's batches over the window: how many, their mean rows and mean time."""

    pod: str
    mean_batch: float
    mean_seconds: float
    batches: float


@dataclass(frozen=True, slots=True)
class PastPeriod:
    """The arrival rates one period (or a whole number of periods) ago."""

    ahead_qps: float
    """The highest one-minute arrival rate in the look-ahead after this time, then."""
    then_qps: float
    """The one-minute arrival rate at this time, then: a look-ahead peak above it is a rise."""
    level_qps: float
    """The median one-minute arrival rate over the level window before this time, then."""


@dataclass(frozen=True, slots=True)
class Observation:
    """One window of a service's metrics, summed or averaged over its ready replicas.

    A rate of 0.0 means "measured, and nothing happened"; None means the series was absent,
    NaN or stale — the difference between an idle service and a blind autopilot.
    """

    at: float
    """When it was observed (seconds, the decision clock)."""
    window_s: float
    p99_s: float | None
    p95_s: float | None
    qps: float | None
    """Requests answered successfully per second."""
    rejected_qps: float | None
    """Requests shed with 503 per second: load the service did not serve."""
    queue_p99_s: float | None
    utilization: float | None
    """Device busy fraction per replica, 0-1 (busy-seconds rate, NVML or DCGM)."""
    mean_batch: float | None
    late_share: float | None = None
    """The share of the requests timed that took longer than the SLA, as the runtime counted
    them against the SLA it was given (`batchpilot_requests_over_sla_total`): P99 is over the
    SLA exactly where more than 1 % were. The histogram's P99 interpolates inside buckets 15 %
    apart, and reads a narrow tail's P99 up to a bucket high. None where no replica counts it
    (an older runtime; one not yet given the SLA)."""
    counted_sla_min_s: float | None = None
    """The lowest SLA the replicas counted `late_share` against over the window
    (`batchpilot_sla_seconds`); with `counted_sla_max_s`: the share speaks of the policy's SLA
    only where both are it (a spec whose SLA changed reaches the pods seconds later). None where
    not known."""
    counted_sla_max_s: float | None = None
    """The highest (see `counted_sla_min_s`)."""
    compute: tuple[ComputePoint, ...] = ()
    rows_per_request: float | None = None
    """Rows the batches ran per request answered: 1 where every request carries one row (an
    image, a sentence), more where clients batch on their side. The fit t(b) counts rows and
    the rates count requests; this converts. None without requests answered in the window."""
    startup: tuple[ComputePoint, ...] = ()
    """The batch times the replicas measured at start-up, by rows (1, and the largest batch
    limit allowed up to 64), averaged over them; `batches` 0: no traffic. A slope before
    traffic has run two batch sizes; empty where the runtime did not time any."""
    outside_s: float | None = None
    """Mean seconds a request taken on spent outside the batcher (decoding, pre- and
    post-processing, encoding): its duration less its time queued and computing. Measured in
    every window, even one whose P99 is all queue; None from runtimes that do not count the
    time in the batcher, or without requests."""
    before_s: float | None = None
    """Of `outside_s`, the mean seconds inside the deadline's clock before the batcher: waiting
    for the decoder and a preprocess, and preprocessed (`batchpilot_before_batcher_seconds_total`).
    The runtime's deadline counts it already; None from runtimes that do not count it."""
    ready_replicas: int | None = None
    blocked_replicas: int = 0
    """Of the replicas asked for and not ready, those Kubernetes says cannot come up
    (`rollout.blocked`: not schedulable — no node with a free GPU —, refused by a ResourceQuota,
    a container crashing or its image not pulling), as opposed to starting: no wait for them
    holds a scale-down, and how long they waited is no cold start."""
    covered_s: float | None = None
    """The part of the window, at its end, that its rates describe: all of it (`window_s`) where
    Prometheus holds the whole window, less where it holds only its last seconds (restarted
    without its history, or down for part of it). The rates (`qps`, `rejected_qps`,
    `arrival_qps`, a busy-time `utilization`) are per second of this part, not of the window.
    None where not measured: the whole window, as older setups read it."""
    reporting_replicas: int | None = None
    """The replicas Prometheus scrapes now: fewer than the ready ones means some load is not in
    the rates (a replica whose scrapes fail, or not scraped yet). None where not counted."""
    scrapes_per_replica: int | None = None
    """How many times Prometheus scrapes the most scraped replica: more than once (two scrape
    jobs on its pod) counts its load that many times in every rate. None where not counted."""
    memory_rows: int | None = None
    """The largest batch the replicas' devices have memory for, where one ran out of memory for
    a larger batch (the smallest over them); the runtime forms no larger batch, whatever limit it
    is given. None: none ran out."""
    arrival_qps: float | None = None
    """Requests that arrived per second, counted at arrival by the runtime whatever became of
    them (served, refused, expired): the demand, so not those whose headers said they were
    retries; None from runtimes that do not count arrivals."""
    arrival_dispersion: float | None = None
    """How the arrivals clumped over the window, the replicas' mean: the variance of their
    count per 10 ms over its mean (`batchpilot_arrival_dispersion`), 1 for Poisson arrivals.
    None from runtimes that do not measure it."""
    arrival_second_squares: float | None = None
    """Per second of the window, the sum over each replica's seconds of the arrivals in it (every
    attempt), squared (`batchpilot_arrival_second_squares_total`): over the arrivals' rate, the
    rate a request met in its second on its replica, plus the noise of the count (see
    `learn.unevenness`). None from runtimes that do not count it."""
    arrival_counted_seconds: float | None = None
    """Per second of the window, the seconds the replicas counted those squares over
    (`batchpilot_arrival_counted_seconds_total`), summed: the replicas the window had, on
    average, each for the part of it it was there."""
    batch_time_cv: float | None = None
    """How much a batch's time varied around t(b) over the window, the replicas' mean: the root
    mean square of each runtime's measured over predicted, less 1 (`batchpilot_batch_time_cv`).
    None from runtimes that do not measure it, or before they have."""
    request_rows_cv: float | None = None
    """How much the rows a request brings varied over the window: their coefficient of variation
    over every arrival (`batchpilot_arrival_rows_total` and `…_squared_total` against
    `batchpilot_arrivals_total`), 0 where every request brings the same rows. None from runtimes
    that do not count them, or without arrivals."""
    retried_qps: float | None = None
    """The arrivals per second that said they were retries (`attempt="retry"`): no part of
    `arrival_qps`, shown beside it. None from runtimes that do not count by attempt."""
    withdrawn_qps: float | None = None
    """Arrivals per second their clients cancelled before the SLA had passed (and before their
    own deadline: `batchpilot_withdrawn_total`) — a client that hedges, sending a second copy
    to another replica and cancelling the slower, one that moved on. No answer was owed, so
    they count neither as served nor as missed in `unserved_share`; they are load all the same
    (in `arrival_qps`: they were queued). None from runtimes that do not count them."""
    recent_qps: float | None = None
    """Arrivals per second over the last `recent_window_s` only (between the last two scrapes):
    the fast signal. The window's rate trails a sudden rise by half the window; this one by half
    a scrape interval, at the price of more Poisson noise. None where it cannot be measured."""
    recent_window_s: float | None = None
    """The span the recent rate covers."""
    now_qps: float | None = None
    """Arrivals per second over the last `batchpilot.api.arrivals.RECENT_ARRIVALS_S` seconds
    before the last scrape (the runtime's gauge): at the first scrape after a step, the new rate
    where `recent_qps` still averages it with the one before. None from runtimes without it."""
    level_qps: float | None = None
    """The median one-minute arrival rate over the seasonal level window (an hour) before now:
    today's level, against which past periods' forecasts are scaled (a burst within the hour
    does not move it). None where seasonality is off."""
    past: tuple[PastPeriod, ...] = ()
    """The same time one, two, … periods ago (a day by default), all of them or none."""
    pods: tuple[PodCompute, ...] = ()
    """Each replica's batches over the window, by its pod (the `pod` label Prometheus puts on
    its series): how a replica's pace compares with its peers' (`stragglers`). Empty where the
    series carry no pod label, or no replica ran a batch."""
    recent_pods: tuple[PodCompute, ...] = ()
    """The same between each replica's last two scrapes (`recent_window_s`): a replica that
    slowed down a scrape ago reads so here, where the window's mean still averages it with the
    minute before. Empty where it cannot be measured."""

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in _REQUIRED or value is None:
                continue
            if isinstance(value, tuple):
                kept = tuple(point for point in value if _possible(point))
                if len(kept) != len(value):
                    object.__setattr__(self, spec.name, kept)
            elif isinstance(value, int | float) and not _sane(value):
                object.__setattr__(self, spec.name, None)

    @property
    def offered_qps(self) -> float | None:
        """The load the service was asked to carry: measured at arrival where the runtime counts
        arrivals, else inferred as served + shed (which misses requests that expired)."""
        if self.qps is None:
            return None
        if self.arrival_qps is not None:
            return max(self.arrival_qps, self.qps)
        return self.qps + (self.rejected_qps or 0.0)

    @property
    def unserved_share(self) -> float:
        """The share of the offered requests not answered successfully: refused at arrival,
        expired in the queue or failed (0 when there was no traffic). Where retries are counted
        apart, of every attempt: a retry the runtime answered is in `qps`, so against the
        demand alone a service refusing half of what reached it could read as refusing
        nothing. Requests their clients withdrew (`withdrawn_qps`) are left out of both sides:
        no answer was owed."""
        offered = self.offered_qps
        if not offered or self.qps is None:
            return 0.0
        if self.retried_qps and self.arrival_qps is not None:
            offered = max(offered, self.arrival_qps + self.retried_qps)
        owed = max(self.qps, offered - (self.withdrawn_qps or 0.0))
        return max(0.0, 1.0 - self.qps / owed) if owed > 0 else 0.0

    @property
    def idle(self) -> bool:
        """Measured and no traffic at all: latency has no samples, and that is fine. Requests
        that arrived and were never answered (expired in the queue, failed on a stuck device)
        are traffic: a service that answers nothing is not idle."""
        return self.qps == 0.0 and not self.rejected_qps and not self.arrival_qps

    def missing(self) -> list[str]:
        """Names of the signals the decision needs and this window lacks."""
        absent = []
        if self.qps is None:
            absent.append("request rate")
        if self.p99_s is None and not self.idle:
            absent.append("P99 latency")
        if self.ready_replicas is None:
            absent.append("ready replicas")
        return absent


_REQUIRED = frozenset({"at", "window_s"})
"""The fields that are never missing: when the window was read, and how long it is."""


def _sane(value: float) -> bool:
    """Whether a signal's reading can be: finite and not negative (rates, times, counts, shares
    are none of them below zero)."""
    return math.isfinite(value) and value >= 0


def _possible(point: object) -> bool:
    """Whether each number of a per-bucket, per-pod or past-period point can be."""
    return all(
        _sane(getattr(point, spec.name))
        for spec in fields(point)  # type: ignore[arg-type]
        if isinstance(getattr(point, spec.name), int | float)
    )
