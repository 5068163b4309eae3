"""The runtime's Prometheus metrics: exactly the signals the autopilot reads, low cardinality.

Every series carries the model and the InferenceService/namespace it serves (from the pod's
environment), so one PromQL selector finds a service's replicas. What each metric is for:

- `batchpilot_request_duration_seconds` (histogram): end-to-end latency inside the server, the
  SLA's P99, of the requests the server took on (answered, timed out or failed); a refusal at
  arrival is answered in microseconds and would only hide the latency of the others. Buckets
  grow by 15 % from 1 ms to 2.5 s, so an interpolated P99 is off by less than 15 % (typically a
  few per cent) anywhere between 2 ms and 2 s.
- `batchpilot_queue_wait_seconds` (histogram): time from arrival to batch formation.
- `batchpilot_async_job_duration_seconds` (histogram): an async job's time from its submit to
  its end (answered, timed out or failed). Jobs wait in a background lane, behind the SLA's
  requests, seconds to minutes: they are kept out of the two above (the SLA's latency and
  queue wait) and out of `batchpilot_batcher_seconds_total`, and their arrivals count in the
  arrival totals (the demand the replicas are sized for) but not in the last seconds' rate and
  the burst measures (the lane spreads a burst of jobs out).
- `batchpilot_refusal_duration_seconds` (histogram): time from arrival to a 503 refusal, inside
  the server: what a refused caller waits before it can go elsewhere.
- `batchpilot_batch_size` (histogram): rows per batch.
- `batchpilot_pipeline_seconds` (histogram by `stage`: preprocess, postprocess): time spent
  decoding, resizing, tokenizing and picking top-k per request, outside the batch; with the
  request and batch durations it tells end-to-end, server and pure inference time apart.
- `batchpilot_batcher_seconds_total` (counter): the seconds the requests timed in
  `batchpilot_request_duration_seconds` spent in the batcher, from entering the queue to their
  answer (queued, then computing). The request durations' sum less this is the time spent
  outside the batcher (decoding, pre/post-processing, encoding): measured in every window, even
  one whose P99 is all queue, where the P99 tells nothing of it.
- `batchpilot_before_batcher_seconds_total` (counter): of the time outside the batcher, the
  seconds the same requests spent inside their deadline's clock before the batcher — from their
  body's arrival, waiting for the decoder and the preprocess, and preprocessed. The deadline
  already counts it: the operator takes only the rest of the time outside the batcher (encoding,
  postprocessing, the body's receipt) off the SLA for the pods' default deadline.
- `batchpilot_startup_batch_seconds` (gauge by `rows`): the mean time of the batches timed at
  start-up, of 1 row and of the largest batch limit allowed (`--calibration-rows`, 64 at most):
  t(b)'s slope before traffic has run two batch sizes. Absent where the start-up timing was
  skipped (queue admission, a model the zero inputs do not fit).
- `batchpilot_batch_compute_seconds_total`, `batchpilot_batch_rows_total`,
  `batchpilot_batches_total` (counters by power-of-two `batch_bucket`): mean compute time and
  mean rows per bucket, the points the autopilot fits t(b) ≈ α + β·b to. A batch's compute
  time is the engine's own measure, on the thread or device it ran on, plus the server's
  delay in taking its outputs back — not a stall of the event loop (a burst being read), which
  is no property of the batch (`batching.batcher`). `batchpilot_batch_time_cv` (gauge): how
  much a batch's compute time varies around the server's own t(b), the root mean square of
  measured over predicted, less 1, over its last ~50 batches (`admission.BatchTiming`): 0.1
  where batches take their time ±10 %; absent until ten batches have been predicted.
- `batchpilot_requests_total` (counter by `outcome`), `batchpilot_queue_depth`,
  `batchpilot_inflight_requests` (gauges). `batchpilot_withdrawn_total` (counter): arrivals
  their client cancelled before the SLA had passed and before their own deadline
  (`outcomes.withdrawn`; also in `outcome="cancelled"`): no answer was owed yet, so the share of
  the arrivals left unserved counts them neither as served nor as missed — a client that hedges
  (sends a second copy elsewhere and cancels the slower) would otherwise read as a service that
  fails its SLA.
- `batchpilot_arrivals_total` (counter): every valid request for the model, counted when it
  arrives, whatever happens to it next: its rate is the offered load, measured rather than
  inferred from what was served. `batchpilot_admitted_total` counts those that entered the
  queue; `batchpilot_shed_total` (counter by `reason`) those shed: `predicted_late` (refused at
  arrival, it would have finished after its deadline), `queue_full`, `draining` (refused at
  arrival), and `expired` (its deadline passed, or could no longer be met, before it reached
  the device). Every arrival is admitted or refused at arrival, so arrivals = admitted +
  predicted_late + queue_full + draining. With a pipeline a request arrives once preprocessed
  (one its preprocess refuses is invalid, no arrival), and one whose deadline passed while it
  was preprocessed counts as admitted, then expired. `batchpilot_recent_arrivals_per_second`
  (gauge): the same arrivals over the last 5 s (`batchpilot.api.arrivals`), per second at the
  moment of the scrape: a step in the load shows in it whole once it is that old, where the
  counter's rate between two scrapes averages it with what came before. Both by `attempt`:
  `retry` for a request whose headers say it is one (`batchpilot.runtime.attempts`), `first`
  for the rest — the demand the autopilot sizes for. `batchpilot_arrival_dispersion` (gauge):
  how every arrival of the last 10 s clumped, the variance over the mean of their counts per
  10 ms (`ArrivalDispersion`): 1 for Poisson arrivals, more where requests come together.
  `batchpilot_arrival_second_squares_total` (counter): the same arrivals counted per second,
  each second's count squared once it has ended, summed (`ArrivalSeconds`): over the arrivals'
  count, the rate a request met in its second — more than the window's mean where the load
  swings within the window; `batchpilot_arrival_counted_seconds_total` (counter), the seconds
  it has counted while the server took requests: summed over the replicas, their rate is the
  replicas that served the window.
  `batchpilot_arrival_rows_total`, `batchpilot_arrival_rows_squared_total` (counters): the
  rows those arrivals brought, and the sum of each one's rows squared — with the arrivals'
  count, the mean and the spread of a request's rows (every attempt): requests of varied sizes
  are rows arriving in clumps, and the queue's tail grows with their spread.
- `batchpilot_deadline_seconds` (gauge): the default deadline in force (0: none).
- `batchpilot_device_memory_batch_rows` (gauge): absent until the device runs out of memory for
  a batch; then the largest batch it is not known to lack memory for. Batches are formed no
  larger for `server.MEMORY_RETRY_S` (ten minutes; then the series goes and the limit set is
  tried again), and the batch limit and burst size in force
  (`batchpilot_batching_max_batch_size`, `…_burst_batch_size`) say so.
- `batchpilot_requests_over_sla_total` (counter, from the first SLA given on): the requests timed
  that took longer than the SLA in force — over their count, the share P99 <= SLA allows to be
  1 %, exactly, where the latency histogram's buckets (15 % apart) only say which bucket P99 is
  in, and read a narrow tail's P99 up to a bucket high.
- `batchpilot_sla_seconds`, `batchpilot_slo_objective_ratio` (gauges): the service's P99 SLA and
  objective (0.99: the SLA holds 99 % of the time), as the operator's batching document gives
  them; absent until it does. Prometheus judges the service against them (the chart's
  PrometheusRule: SLI recording rules and burn-rate alerts).
- `batchpilot_device_busy_seconds_total` (counter): its rate is device utilization, for any device.
  With several model instances it counts the time at least one instance computes (the union of
  their batches), so its rate stays a utilization between 0 and 1. A batch is busy from its start
  until the server has taken its outputs back: a server too busy to take them holds the device
  as surely as a batch still computing.
- `batchpilot_engine_instances` (gauge): model instances configured (batches that run at once).
- `batchpilot_open_connections` (gauge): HTTP connections open, all ports;
  `batchpilot_connections_retired_total` (counter by `reason`: `age`, `asked`): answers that
  closed their connection so that its client reconnects through the Service — past
  `--max-connection-age-s`, or asked by the operator when a replica joined.
- `batchpilot_async_jobs` (gauge by `state`: pending, succeeded, failed): async inference jobs
  stored; `batchpilot_async_jobs_expired_total` (counter): results dropped after their TTL.
- `batchpilot_gpu_utilization_ratio`, `batchpilot_gpu_memory_used_bytes`,
  `batchpilot_gpu_memory_total_bytes` (gauges, NVML): only when a GPU exists.
- `batchpilot_batching_max_batch_size`, `batchpilot_batching_burst_batch_size`,
  `batchpilot_batching_max_queue_delay_seconds` (gauges): the settings in force.
- `batchpilot_engine_info` (gauge, always 1): engine kind, device, whether it is simulated, and
  the model variant served (original, fp16, int8).
- `batchpilot_cpu_cores` (gauge) and the standard `process_*` series: CPU utilization of the
  server, where pre/post-processing shows up before the device does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from batchpilot.api.arrivals import (
    ATTEMPT_LABEL,
    DISPERSION_SLOT_S,
    DISPERSION_SPAN_S,
    FIRST_ATTEMPT,
    RECENT_ARRIVALS_S,
    RETRY_ATTEMPT,
    SECOND_SQUARES_SLOT_S,
)
from batchpilot.runtime.arrival_rate import ArrivalDispersion, ArrivalSeconds, RecentArrivals
from batchpilot.runtime.device import Nvml
from batchpilot.runtime.engine import EngineInfo
from batchpilot.runtime.inference_stats import InferenceStatistics
from batchpilot.runtime.outcomes import BatchDone, RequestOutcome, withdrawn


def _latency_buckets() -> tuple[float, ...]:
    buckets, edge = [], 0.001
    while edge < 2.2:
        buckets.append(round(edge, 6))
        edge *= 1.15
    return (*buckets, 2.5, 5.0, 10.0)


LATENCY_BUCKETS = _latency_buckets()
REFUSAL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0)
"""Refusals take microseconds to milliseconds: the latency buckets start too high for them."""
ASYNC_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
"""An async job's time, submit to end: milliseconds on an idle replica, minutes in a burst."""

# `*_created` series double the series count and nothing here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512)


def available_cores() -> float:
    """CPU cores this process may use: its affinity, capped by a cgroup v2 quota if any."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    except (OSError, ValueError):
        return cores
    if quota != "max" and float(period) > 0:
        cores = min(cores, float(quota) / float(period))
    return cores


def batch_bucket(rows: int) -> str:
    """Power-of-two bucket of a batch size: "1", "2", "4", … (upper bound, inclusive)."""
    return str(1 << max(rows - 1, 0).bit_length())


_TIMED_OUTCOMES = frozenset({RequestOutcome.SUCCESS, RequestOutcome.TIMEOUT, RequestOutcome.ERROR})
"""Outcomes whose duration is a latency of the service (the request was taken on)."""

SHED_REASONS = ("predicted_late", "queue_full", "draining", "expired")
"""Why a request was shed: the `reason` label of `batchpilot_shed_total`."""


class _GpuCollector(Collector):
    def __init__(self, nvml: Nvml, labels: dict[str, str]) -> None:
        self._nvml = nvml
        self._labels = labels

    def collect(self) -> Iterable[GaugeMetricFamily]:
        names = [*self._labels, "gpu"]
        util = GaugeMetricFamily(
            "batchpilot_gpu_utilization_ratio", "GPU busy fraction from NVML (0-1)", labels=names
        )
        used = GaugeMetricFamily(
            "batchpilot_gpu_memory_used_bytes", "GPU memory in use from NVML", labels=names
        )
        total = GaugeMetricFamily(
            "batchpilot_gpu_memory_total_bytes", "GPU memory size from NVML", labels=names
        )
        for sample in self._nvml.sample():
            values = [*self._labels.values(), str(sample.index)]
            util.add_metric(values, sample.utilization_pct / 100)
            used.add_metric(values, sample.memory_used_bytes)
            total.add_metric(values, sample.memory_total_bytes)
        yield from (util, used, total)


class _LiveValues(Collector):
    """Series read from the data plane when scraped: busy time (a running union that a plain
    Counter could only add to after each batch), how batch times vary (absent until known) and
    the async job store."""

    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels
        self.busy_seconds: Callable[[], float] = lambda: 0.0
        self.second_squares: Callable[[], float] = lambda: 0.0
        self.counted_seconds: Callable[[], float] = lambda: 0.0
        self.batch_time_cv: Callable[[], float | None] = lambda: None
        self.async_jobs: Callable[[], Mapping[str, int]] = dict
        self.async_expired: Callable[[], int] = lambda: 0
        self.open_connections: Callable[[], int] | None = None
        self.retired_connections: Callable[[], Mapping[str, int]] = dict

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        names, values = list(self._labels), list(self._labels.values())
        busy = CounterMetricFamily(
            "batchpilot_device_busy_seconds",
            "Seconds with at least one batch computing (the union over model instances); its "
            "rate is device utilization",
            labels=names,
        )
        busy.add_metric(values, self.busy_seconds())
        squares = CounterMetricFamily(
            "batchpilot_arrival_second_squares",
            f"Sum over the seconds that ended of the valid requests that arrived in each (every "
            f"attempt), squared: over arrivals_total, the rate a request met in its "
            f"{SECOND_SQUARES_SLOT_S:g} s, on average, plus 1 for Poisson noise",
            labels=names,
        )
        squares.add_metric(values, self.second_squares())
        counted = CounterMetricFamily(
            "batchpilot_arrival_counted_seconds",
            "Seconds whose arrivals arrival_second_squares_total has counted, while the server "
            "took requests: with arrivals_total, a replica's mean rate over the same seconds",
            labels=names,
        )
        counted.add_metric(values, self.counted_seconds())
        cv = GaugeMetricFamily(
            "batchpilot_batch_time_cv",
            "How much a batch's compute time varies around the server's own t(b): the root "
            "mean square of measured over predicted, less 1, over its last ~50 batches",
            labels=names,
        )
        if (value := self.batch_time_cv()) is not None:
            cv.add_metric(values, value)
        jobs = GaugeMetricFamily(
            "batchpilot_async_jobs",
            "Async inference jobs stored, by state",
            labels=[*names, "state"],
        )
        for state, count in self.async_jobs().items():
            jobs.add_metric([*values, state], count)
        expired = CounterMetricFamily(
            "batchpilot_async_jobs_expired",
            "Async inference results dropped after their TTL",
            labels=names,
        )
        expired.add_metric(values, self.async_expired())
        yield from (busy, squares, counted, cv, jobs, expired)
        if self.open_connections is None:
            return  # (a server whose connections are not kept: the sandbox's pod host)
        connections = GaugeMetricFamily(
            "batchpilot_open_connections", "HTTP connections open, all ports", labels=names
        )
        connections.add_metric(values, self.open_connections())
        retired = CounterMetricFamily(
            "batchpilot_connections_retired",
            "Answers that closed their connection to move its client to a replica the Service "
            "picks anew, by why: its age, or the operator asked (a replica joined)",
            labels=[*names, "reason"],
        )
        counts = self.retired_connections()
        for reason in ("age", "asked"):
            retired.add_metric([*values, reason], counts.get(reason, 0))
        yield from (connections, retired)


class RuntimeMetrics:
    """Owns one registry; implements the batcher's `BatchObserver`."""

    def __init__(
        self,
        *,
        model: str,
        service: str,
        namespace: str,
        engine: EngineInfo,
        nvml: Nvml | None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        # process_cpu_seconds_total and friends: the CPU side of the performance portrait.
        ProcessCollector(registry=self.registry)
        labels = {"model": model, "isvc": service, "namespace": namespace}
        names = list(labels)
        r = self.registry

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**labels)

        self.request_duration = histogram(
            "batchpilot_request_duration_seconds",
            "Time from request arrival to response, inside the server",
            LATENCY_BUCKETS,
        )
        self.async_duration = histogram(
            "batchpilot_async_job_duration_seconds",
            "Time from an async job's submit to its end (answered, timed out or failed)",
            ASYNC_BUCKETS,
        )
        self.refusal_duration = histogram(
            "batchpilot_refusal_duration_seconds",
            "Time from request arrival to a refusal (503), inside the server",
            REFUSAL_BUCKETS,
        )
        self.queue_wait = histogram(
            "batchpilot_queue_wait_seconds",
            "Time a request waited in the queue before its batch formed",
            LATENCY_BUCKETS,
        )
        self.batch_size = histogram(
            "batchpilot_batch_size", "Rows per executed batch", BATCH_SIZE_BUCKETS
        )
        self.compute = histogram(
            "batchpilot_batch_duration_seconds", "Engine time per batch", LATENCY_BUCKETS
        )
        self._pipeline = Histogram(
            "batchpilot_pipeline_seconds",
            "Time per request in the pre/post-processing pipeline, by stage",
            [*names, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        bucketed = [*names, "batch_bucket"]
        self._compute_by_bucket = Counter(
            "batchpilot_batch_compute_seconds",
            "Engine seconds spent on batches, by power-of-two batch size bucket",
            bucketed,
            registry=r,
        )
        self._rows_by_bucket = Counter(
            "batchpilot_batch_rows", "Rows computed, by batch size bucket", bucketed, registry=r
        )
        self._batches_by_bucket = Counter(
            "batchpilot_batches", "Batches executed, by batch size bucket", bucketed, registry=r
        )
        self.engine_failures = Counter(
            "batchpilot_engine_failed_batches",
            "Batches the engine failed on (each run again in parts counts again); not in the "
            "batch size, duration and compute counters, which time the batches that ran",
            names,
            registry=r,
        ).labels(**labels)
        self.engine_failing = Gauge(
            "batchpilot_engine_failing",
            "1 while the engine fails the batch it ran at start, the device has no memory for "
            "even one row, or a run of it has lasted far past its time (the replica is not "
            "live, nor ready, meanwhile), else 0",
            names,
            registry=r,
        ).labels(**labels)
        self._outcomes = Counter(
            "batchpilot_requests", "Requests by outcome", [*names, "outcome"], registry=r
        )
        self._withdrawn = Counter(
            "batchpilot_withdrawn",
            "Arrivals their client cancelled before the SLA had passed and before their own "
            'deadline (also in requests_total{outcome="cancelled"}): no answer was owed yet, '
            "neither served nor missed",
            names,
            registry=r,
        ).labels(**labels)
        self._sla_s: float | None = None
        arrivals = Counter(
            "batchpilot_arrivals",
            "Valid requests that arrived, whatever became of them, by attempt (first, or a "
            "retry by its headers): the offered load",
            [*names, ATTEMPT_LABEL],
            registry=r,
        )
        recent = Gauge(
            "batchpilot_recent_arrivals_per_second",
            f"Valid requests that arrived in the last {RECENT_ARRIVALS_S:g} s, per second, by "
            "attempt: the offered load now",
            [*names, ATTEMPT_LABEL],
            registry=r,
        )
        self._dispersion = ArrivalDispersion()
        Gauge(
            "batchpilot_arrival_dispersion",
            f"Variance over mean of the arrivals per {DISPERSION_SLOT_S * 1e3:g} ms over the last "
            f"{DISPERSION_SPAN_S:g} s, every attempt: 1 for Poisson arrivals, more where requests "
            "come together",
            names,
            registry=r,
        ).labels(**labels).set_function(self._dispersion.dispersion)
        self._arrival_rows = Counter(
            "batchpilot_arrival_rows",
            "Rows the valid requests brought, every attempt (with arrivals_total: the mean rows "
            "a request)",
            names,
            registry=r,
        ).labels(**labels)
        self._arrival_rows_squared = Counter(
            "batchpilot_arrival_rows_squared",
            "Sum over the valid requests of their rows squared, every attempt (with "
            "arrival_rows_total and arrivals_total: how much the rows a request vary)",
            names,
            registry=r,
        ).labels(**labels)
        attempts = (FIRST_ATTEMPT, RETRY_ATTEMPT)
        self._arrivals = {a: arrivals.labels(**labels, attempt=a) for a in attempts}
        self._recent_arrivals = {a: RecentArrivals() for a in attempts}
        for attempt, rate in self._recent_arrivals.items():
            recent.labels(**labels, attempt=attempt).set_function(rate.rate)
        self.before_batcher_seconds = Counter(
            "batchpilot_before_batcher_seconds",
            "Seconds the timed requests spent inside their deadline before the batcher: waiting "
            "for the decoder and the preprocess, and preprocessed",
            names,
            registry=r,
        ).labels(**labels)
        self.batcher_seconds = Counter(
            "batchpilot_batcher_seconds",
            "Seconds the timed requests spent in the batcher, from the queue to their batch's "
            "end: request duration less this is the time outside the batcher",
            names,
            registry=r,
        ).labels(**labels)
        self._startup = Gauge(
            "batchpilot_startup_batch_seconds",
            "Mean seconds of the batches timed at start-up, by rows (1 and the largest batch "
            "limit allowed)",
            [*names, "rows"],
            registry=r,
        )
        self.admitted = Counter(
            "batchpilot_admitted", "Requests admitted into the queue", names, registry=r
        ).labels(**labels)
        shed = Counter(
            "batchpilot_shed",
            "Requests shed, by reason: predicted_late, queue_full, draining (refused at "
            "arrival), expired (deadline passed before they reached the device)",
            [*names, "reason"],
            registry=r,
        )
        self._shed = {reason: shed.labels(**labels, reason=reason) for reason in SHED_REASONS}
        # Children looked up once: `labels()` per request costs more than the increment.
        self._outcome_counters = {
            outcome: self._outcomes.labels(**labels, outcome=outcome.value)
            for outcome in RequestOutcome
        }
        self._bucket_counters: dict[str, tuple[Counter, Counter, Counter]] = {}
        self.statistics = InferenceStatistics()
        """The same requests and batches as Triton's statistics extension counts them."""
        self._live = _LiveValues(labels)
        r.register(self._live)
        self._seconds = ArrivalSeconds()
        self._live.second_squares = self._seconds.squares
        self._live.counted_seconds = self._seconds.seconds
        Gauge(
            "batchpilot_engine_instances",
            "Model instances configured: batches that may run at once",
            names,
            registry=r,
        ).labels(**labels).set(engine.instances)
        self.queue_depth = Gauge(
            "batchpilot_queue_depth", "Requests waiting in the queue", names, registry=r
        ).labels(**labels)
        self.inflight = Gauge(
            "batchpilot_inflight_requests",
            "Requests received and not yet answered",
            names,
            registry=r,
        ).labels(**labels)
        self.max_batch_size = Gauge(
            "batchpilot_batching_max_batch_size", "Batch size limit in force", names, registry=r
        ).labels(**labels)
        self.burst_batch_size = Gauge(
            "batchpilot_batching_burst_batch_size",
            "Largest batch a backlog may run, in force (the batch limit where none is set)",
            names,
            registry=r,
        ).labels(**labels)
        self.deadline = Gauge(
            "batchpilot_deadline_seconds",
            "Default deadline of a request, from its arrival, in force (0: none)",
            names,
            registry=r,
        ).labels(**labels)
        self._memory_rows = Gauge(
            "batchpilot_device_memory_batch_rows",
            "Largest batch the device is not known to lack memory for, once a batch ran out",
            names,
            registry=r,
        )
        self.max_queue_delay = Gauge(
            "batchpilot_batching_max_queue_delay_seconds",
            "Longest wait for a batch to fill, in force",
            names,
            registry=r,
        ).labels(**labels)
        # Families without a child until the values are given: no series rather than a 0 that
        # would read as an SLA nothing meets.
        self._sla = Gauge(
            "batchpilot_sla_seconds",
            "The P99 latency the service must stay under (spec.sla.latencyP99Ms)",
            names,
            registry=r,
        )
        self._over_sla_family = Counter(
            "batchpilot_requests_over_sla",
            "Requests timed (request_duration_seconds) that took longer than the SLA in force "
            "(batchpilot_sla_seconds): over their count, exactly the share P99 <= SLA allows to "
            "be 1 %, where the histogram's buckets, 15 % apart, say only which bucket P99 is in",
            names,
            registry=r,
        )
        self._over_sla: Counter | None = None
        """The family's child, from the first SLA given on."""
        self._objective = Gauge(
            "batchpilot_slo_objective_ratio",
            "The share of time the SLA must hold (spec.sla.objectivePercent / 100)",
            names,
            registry=r,
        )
        Gauge(
            "batchpilot_engine_info",
            "The engine serving the model (simulated=true: no real accelerator)",
            [*names, "engine", "device", "simulated", "variant"],
            registry=r,
        ).labels(
            **labels,
            engine=engine.kind,
            device=engine.device,
            simulated=str(engine.simulated).lower(),
            variant=engine.variant,
        ).set(1)
        Gauge(
            "batchpilot_cpu_cores",
            "CPU cores this process may use (affinity and cgroup quota): CPU utilization is "
            "rate(process_cpu_seconds_total) divided by this",
            names,
            registry=r,
        ).labels(**labels).set(available_cores())
        if nvml is not None:
            r.register(_GpuCollector(nvml, labels))
        self._labels = labels

    def track_queue_depth(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(depth()))

    def track_engine_failing(self, failing: Callable[[], bool]) -> None:
        """Where `batchpilot_engine_failing` is read from (`ModelServer.engine_failure`)."""
        self.engine_failing.set_function(lambda: 1.0 if failing() else 0.0)

    def track_batch_time_cv(self, cv: Callable[[], float | None]) -> None:
        """Where `batchpilot_batch_time_cv` is read from (the server's `BatchTiming`)."""
        self._live.batch_time_cv = cv

    def track_readiness(self, ready: Callable[[], bool]) -> None:
        """Whether the server takes requests: the arrivals' seconds count only while it does."""
        self._seconds.ready = ready

    def track_busy_seconds(self, busy_seconds: Callable[[], float]) -> None:
        """Where `batchpilot_device_busy_seconds_total` is read from (the batcher's union)."""
        self._live.busy_seconds = busy_seconds

    def track_async_jobs(
        self, counts: Callable[[], Mapping[str, int]], expired: Callable[[], int]
    ) -> None:
        """Where the async job gauges and the expiry counter are read from (the job store)."""
        self._live.async_jobs = counts
        self._live.async_expired = expired

    def track_connections(
        self, open_now: Callable[[], int], retired: Callable[[], Mapping[str, int]]
    ) -> None:
        """Where the open HTTP connections and the count of those retired are read from (the
        server's `http_protocol.OpenConnections`)."""
        self._live.open_connections = open_now
        self._live.retired_connections = retired

    def request_finished(
        self,
        outcome: RequestOutcome,
        duration_s: float | None = None,
        *,
        background: bool = False,
    ) -> None:
        """A request ended; `background`: an async job, whose time is not the SLA's."""
        self._outcome_counters[outcome].inc()
        self.statistics.request_ended(
            success=outcome is RequestOutcome.SUCCESS, duration_s=duration_s
        )
        if background:
            if duration_s is not None and outcome in _TIMED_OUTCOMES:
                self.async_duration.observe(duration_s)
            return
        if duration_s is not None:
            if outcome in _TIMED_OUTCOMES:
                self.request_duration.observe(duration_s)
                sla_s = self._sla_s
                if sla_s is not None and duration_s > sla_s and self._over_sla is not None:
                    self._over_sla.inc()
            elif outcome is RequestOutcome.REJECTED:
                self.refusal_duration.observe(duration_s)

    def startup_timed(self, seconds_by_rows: Mapping[int, float]) -> None:
        """The mean time of the batches timed at start-up, by their rows."""
        for rows, seconds in seconds_by_rows.items():
            self._startup.labels(**self._labels, rows=str(rows)).set(seconds)

    def arrived(self, rows: int = 1, *, retry: bool = False, background: bool = False) -> None:
        """One valid request of `rows` rows arrived, a retry by its headers or not: the
        counters and the last seconds' rate. A `background` one (an async job) counts in the
        totals only: the lane it waits in spreads a burst of them out."""
        attempt = RETRY_ATTEMPT if retry else FIRST_ATTEMPT
        self._arrivals[attempt].inc()
        self._arrival_rows.inc(rows)
        self._arrival_rows_squared.inc(rows * rows)
        if background:
            return
        self._recent_arrivals[attempt].arrived()
        self._dispersion.arrived()
        self._seconds.arrived()

    def arrival_cancelled(self, age_s: float, *, deadline_s: float | None) -> None:
        """An arrival its client cancelled `age_s` after it arrived (its outcome, `cancelled`,
        is counted where the request ends): counted as withdrawn where it came before the SLA
        in force and its own deadline (`outcomes.withdrawn`)."""
        if withdrawn(age_s, sla_s=self._sla_s, deadline_s=deadline_s):
            self._withdrawn.inc()

    def shed(self, reason: str) -> None:
        """One request shed; `reason` is one of `SHED_REASONS`."""
        self._shed[reason].inc()

    def pipeline_stage_done(self, stage: str, duration_s: float) -> None:
        """`stage`: "preprocess" or "postprocess"."""
        self._pipeline.labels(**self._labels, stage=stage).observe(duration_s)

    def memory_limited(self, rows: int | None) -> None:
        """The device ran out of memory for a batch larger than `rows`; None: the limit set is
        tried again (the series goes)."""
        if rows is None:
            self._memory_rows.clear()
        else:
            self._memory_rows.labels(**self._labels).set(rows)

    def settings_changed(
        self,
        *,
        max_batch_size: int,
        max_queue_delay_s: float,
        ceiling: int | None = None,
        deadline_s: float | None = None,
        sla_s: float | None = None,
        objective: float | None = None,
    ) -> None:
        self.max_batch_size.set(max_batch_size)
        # `ceiling`: the largest batch a backlog may run (the burst size), where above the limit.
        largest = max(max_batch_size, ceiling or 0)
        self.burst_batch_size.set(largest)
        # Every bucket a batch may now fall in exported at zero before its first batch: a
        # series that appears with its first count already in it starts increase() and rate()
        # from that count, so its first batches are missed, and the rows and the batches of one
        # bucket are extrapolated back to zero differently (a wrong mean batch).
        for size in range(int(batch_bucket(largest)).bit_length()):
            self._bucket(str(1 << size))
        self.max_queue_delay.set(max_queue_delay_s)
        self.deadline.set(deadline_s or 0.0)
        self._sla_s = sla_s
        if sla_s is not None and self._over_sla is None:
            self._over_sla = self._over_sla_family.labels(**self._labels)
        for gauge, value in ((self._sla, sla_s), (self._objective, objective)):
            if value is None:
                gauge.clear()
            else:
                gauge.labels(**self._labels).set(value)

    # BatchObserver
    def batch_done(self, done: BatchDone) -> None:
        self._count_batch(done.rows, done.compute_s)
        for wait in done.queue_waits_s:
            self.queue_wait.observe(wait)
        self.statistics.batch_done(done)

    def batch_failed(self, *, rows: int, requests: int, compute_s: float) -> None:
        # A failed run is no point of t(b): it may stop at the failing operator, or run long
        # before the device runs out of memory.
        self.engine_failures.inc()

    def _bucket(self, bucket: str) -> tuple[Counter, Counter, Counter]:
        counters = self._bucket_counters.get(bucket)
        if counters is None:
            counters = self._bucket_counters[bucket] = (
                self._compute_by_bucket.labels(**self._labels, batch_bucket=bucket),
                self._rows_by_bucket.labels(**self._labels, batch_bucket=bucket),
                self._batches_by_bucket.labels(**self._labels, batch_bucket=bucket),
            )
        return counters

    def _count_batch(self, rows: int, compute_s: float) -> None:
        compute, rows_total, batches = self._bucket(batch_bucket(rows))
        self.batch_size.observe(rows)
        self.compute.observe(compute_s)
        compute.inc(compute_s)
        rows_total.inc(rows)
        batches.inc()
