"""What the autopilot would see: the runtime's metrics, as Prometheus would serve them.

The autopilot does not see latencies; it sees histograms and counters. The simulator counts
every request into the runtime's own series — latency and queue-wait histograms in
`LATENCY_BUCKETS` (15 % apart), requests by outcome and those over the SLA, arrivals and the
squares of their counts per second, device busy seconds, batch sizes, compute seconds, rows and
batches per power-of-two batch bucket — and builds each `Observation`
from them with the PromQL of `autopilot.prometheus.queries`: `histogram_quantile` with
Prometheus' linear interpolation for P99/P95, `sum(rate(...))` for the rates (served, refused,
arrivals over the window and over the short recent window), utilization as the busy seconds'
rate per reporting replica, compute points per batch bucket. So the control loop is tested
against the coarseness it will meet in production, not against exact percentiles.

How the counters reach the autopilot is `ClusterConfig.scrape_interval_s`:

- scraped (the default, 15 s): each replica is a Prometheus target scraped at its own phase;
  a decision sees only the samples scraped before it, `rate()` extrapolates as Prometheus does,
  series of a replica that went away leave the windows as their samples age, and the reporting
  count is the targets whose series an instant query finds (see `scrape`). A window of fewer
  than two scrapes has no rate: the autopilot then holds, as it must in production;
- exact (0): windows aligned to the control interval and complete at each decision, shortened
  to the intervals simulated so far, rates as counts over the window — the view without
  Prometheus, for tests and comparison.

Arrivals are counted when they reach a replica, served or refused, as the runtime counts them;
requests that arrive while no replica is ready reach no runtime and appear in no series. A
completion is counted when its batch ends, a refusal at arrival.

Beside that view, the ground truth per interval: exact nearest-rank P99 over every request that
finished in it (refused and shed requests count as infinitely slow), and requests inside the SLA.

The seasonal signals (today's level, and per past period its level and look-ahead peak: see
`autopilot.season`) are computed from every request the trace offered, per interval — a day
old, Prometheus' scrape phases and extrapolation change them by far less than a day changes.

Simplifications, on purpose: scrapes never fail and take no time, and a sample is queryable the
moment it is taken; Prometheus never restarts, so it holds every window whole (`covered_s` is
left unmeasured: the whole window); a replica is a target from the moment it is ready (or, for
the Deployment that exists at t = 0, from before) until it is gone; the decision queries at
exactly its tick; utilization comes from the busy-seconds counter only (no NVML or DCGM
gauges); a batch longer than a scrape interval puts its busy time into its first and last scrape
only. Admitted requests always complete: the simulated runtime predicts with the true t(b), so
it has no lateness to expire them for (see `replica`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from batchpilot.api.arrivals import (
    DISPERSION_SLOT_S,
    DISPERSION_SPAN_S,
    RECENT_ARRIVALS_S,
    SECOND_SQUARES_SLOT_S,
)
from batchpilot.operator.autopilot.observation import (
    ComputePoint,
    Observation,
    PastPeriod,
    PodCompute,
)
from batchpilot.operator.autopilot.prometheus import Seasonality
from batchpilot.runtime.metrics import LATENCY_BUCKETS
from batchpilot.simulation.replica import FloatArray, IntArray, Served
from batchpilot.simulation.scrape import Target, avg_rate, sum_irate, sum_rate
from batchpilot.simulation.service import ServiceTruth

POW2_SLOTS = 16
"""Power-of-two batch buckets 1, 2, 4, … 32768 (the runtime's `batch_bucket` label)."""

_BUCKETS = len(LATENCY_BUCKETS) + 1


class Column:
    """One scrape target's series, a column each (see `scrape.Target`)."""

    LATENCY = slice(0, _BUCKETS)
    """batchpilot_request_duration_seconds_bucket; the +Inf bucket counts what
    batchpilot_requests_total{outcome="success"} counts."""
    QUEUE_WAIT = slice(_BUCKETS, 2 * _BUCKETS)
    ARRIVALS = 2 * _BUCKETS
    REJECTED = ARRIVALS + 1
    """batchpilot_requests_total{outcome="rejected"}: shed at arrival, whatever the reason."""
    BUSY = ARRIVALS + 2
    SIZE_SUM = ARRIVALS + 3
    SIZE_COUNT = ARRIVALS + 4
    BATCHES = slice(ARRIVALS + 5, ARRIVALS + 5 + POW2_SLOTS)
    ROWS = slice(BATCHES.stop, BATCHES.stop + POW2_SLOTS)
    COMPUTE = slice(ROWS.stop, ROWS.stop + POW2_SLOTS)
    OUTSIDE = COMPUTE.stop
    """batchpilot_request_duration_seconds_sum less batchpilot_batcher_seconds_total: the
    seconds the answered requests spent outside the batcher (their rates differ by this one's)."""
    RECENT = OUTSIDE + 1
    """batchpilot_recent_arrivals_per_second × its span: the arrivals within
    `RECENT_ARRIVALS_S` before each scrape (`Target.count_recent`: increments, not a counter)."""
    RETRIED = RECENT + 1
    """batchpilot_arrivals_total{attempt="retry"}: arrivals that said they were retries (in
    neither ARRIVALS nor RECENT, which are the first attempts)."""
    DISPERSION = RETRIED + 1
    """batchpilot_arrival_dispersion as `avg_over_time` reads it: each `DISPERSION_SPAN_S`
    block's dispersion of every arrival (its slots' variance over their mean), summed at the
    block's end; with BLOCKS, their mean over the window."""
    BLOCKS = DISPERSION + 1
    """The blocks with an arrival whose dispersion DISPERSION sums."""
    VARIATION = BLOCKS + 1
    """batchpilot_batch_time_cv as `avg_over_time` reads it, squared: each batch's (time over
    t(b), less 1)², summed at its end; with TIMED, the root of their mean over the window."""
    TIMED = VARIATION + 1
    """The batches VARIATION sums."""
    SECOND_SQUARES = TIMED + 1
    """batchpilot_arrival_second_squares_total: each second's arrivals (every attempt), squared,
    added once the arrivals have moved past it, as the runtime adds it when its next second
    begins."""
    COUNTED = SECOND_SQUARES + 1
    """batchpilot_arrival_counted_seconds_total: one at the end of every second the replica is
    there (its scrapes end with it, so the rows after never count)."""
    LATE = COUNTED + 1
    """batchpilot_requests_over_sla_total: requests answered later than the SLA."""
    COUNT = LATE + 1


BATCH_COLUMNS = slice(Column.BATCHES.start, Column.COMPUTE.stop)
"""The batch counters side by side: batches, rows and compute seconds, each by bucket."""


def _batch_sums(values: FloatArray) -> tuple[float, float, float]:
    """Batches, rows and compute seconds over every bucket, from a target's `BATCH_COLUMNS`
    (`sum by (pod)`: a bucket without two samples counts nothing)."""
    batches, rows, seconds = np.nansum(values.reshape(3, POW2_SLOTS), axis=1)
    return float(batches), float(rows), float(seconds)


def _lazy_columns() -> np.ndarray[Any, np.dtype[np.bool_]]:
    lazy = np.zeros(Column.COUNT, dtype=np.bool_)
    for cols in (Column.BATCHES, Column.ROWS, Column.COMPUTE):
        lazy[cols] = True  # a batch bucket's series exists from its batch limit (`_bucket_columns`)
    return lazy


def _bucket_columns(batch_limit: int) -> IntArray:
    """The columns of every batch bucket a batch of at most `batch_limit` rows falls in: the
    runtime exports them at zero when that limit comes into force."""
    top = int(_pow2_slot(np.array([max(batch_limit, 1)]))[0])
    slots = np.arange(min(top + 1, POW2_SLOTS))
    bucketed = (Column.BATCHES, Column.ROWS, Column.COMPUTE)
    return np.concatenate([slots + cols.start for cols in bucketed])


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus' `histogram_quantile`: `counts[i]` observations in (bounds[i-1], bounds[i]],
    the last count in (bounds[-1], +Inf). NaN without observations; linear interpolation inside
    the bucket that holds the rank; the highest finite bound if the rank is in +Inf."""
    if len(counts) != len(bounds) + 1:
        raise ValueError("one count per bound, plus the +Inf bucket")
    cumulative = np.cumsum(np.asarray(counts, dtype=np.float64))
    total = float(cumulative[-1])
    if total <= 0:
        return math.nan
    rank = q * total
    b = int(np.searchsorted(cumulative, rank, side="left"))
    if b >= len(bounds):
        return float(bounds[-1])
    start = 0.0 if b == 0 else float(bounds[b - 1])
    end = float(bounds[b])
    below = 0.0 if b == 0 else float(cumulative[b - 1])
    in_bucket = float(cumulative[b]) - below
    return start + (end - start) * ((rank - below) / in_bucket)


def exact_quantile(q: float, values: FloatArray, infinite: int = 0) -> float:
    """Nearest-rank quantile of `values` plus `infinite` observations of +∞ (shed requests)."""
    total = int(values.shape[0]) + infinite
    if total == 0:
        return math.nan
    k = max(0, math.ceil(q * total) - 1)
    if k >= values.shape[0]:
        return math.inf
    return float(np.partition(values, k)[k])


def _pow2_slot(sizes: IntArray) -> IntArray:
    # (size - 1).bit_length(): 1 → 0, 2 → 1, 3..4 → 2, 5..8 → 3 — the runtime's label "1 << slot"
    return np.ceil(np.log2(sizes)).astype(np.int64)


def _count(
    table: np.ndarray[Any, Any], slots: IntArray, weights: np.ndarray[Any, Any] | None = None
) -> None:
    """table[slots] += weights (1 each without), via one bincount over the slots touched."""
    if slots.shape[0] == 0:
        return
    lo, hi = int(slots.min()), int(slots.max())
    sums = np.bincount(slots - lo, weights, minlength=hi - lo + 1)
    table[lo : hi + 1] += sums.astype(table.dtype) if table.dtype != sums.dtype else sums


@dataclass(frozen=True, slots=True)
class IntervalTruth:
    """The exact view of one control interval, for the report."""

    p99_s: float
    completed: int
    shed: int
    within_sla: int


def _number(value: float) -> float | None:
    """A PromQL result: NaN or infinite is no result."""
    return float(value) if math.isfinite(value) else None


def _quantile(q: float, bounds: list[float], counts: np.ndarray[Any, Any]) -> float | None:
    return _number(histogram_quantile(q, bounds, counts.tolist()))


class Telemetry:
    """Per-interval counters of everything the runtime exports, the ground truth, and — when
    scraped — each replica's series as Prometheus holds them."""

    def __init__(
        self,
        *,
        intervals: int,
        interval_s: float,
        sla_s: float,
        overhead_s: float,
        window_s: float = 60.0,
        recent_window_s: float = 30.0,
        scrape_interval_s: float = 0.0,
        seasonality: Seasonality | None = None,
        seed: int = 0,
        startup: tuple[ComputePoint, ...] = (),
        rows_cv: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.rows_cv = rows_cv
        """The spread of rows a request the replicas export, while any reports: the mix's own
        (the runtime counts every arrival's rows and their squares, which over a window of
        thousands of requests reads it to a few per cent); None: one size, or not exported."""
        self.startup = startup
        """The batch times every replica timed at start-up (the runtime's gauge), shown
        while any replica reports."""
        self.seasonality = seasonality
        self.sla_s = sla_s
        self.overhead_s = overhead_s
        self.window_s = window_s
        self.recent_window_s = recent_window_s
        self.scrape_interval_s = scrape_interval_s
        self.bounds = np.array(LATENCY_BUCKETS, dtype=np.float64)
        slots = intervals + 1  # the last slot takes whatever finishes after the trace ends
        self._last = intervals
        self._horizon = slots * interval_s
        exact = scrape_interval_s <= 0
        width = _BUCKETS
        # The exact view's histograms; scraped, the targets hold them.
        self.latency = np.zeros((slots if exact else 0, width), dtype=np.int64)
        self.queue_wait = np.zeros((slots if exact else 0, width), dtype=np.int64)
        self.completed = np.zeros(slots, dtype=np.int64)
        self.within_sla = np.zeros(slots, dtype=np.int64)
        self.shed = np.zeros(slots, dtype=np.int64)
        """Requests not served: refused or shed at arrival, or with no replica to arrive at."""
        self.rejected = np.zeros(slots, dtype=np.int64)
        """Requests a runtime refused (503 at arrival)."""
        self.arrived = np.zeros(slots, dtype=np.int64)
        """Requests that reached a runtime (the exact view's; scraped, the targets count)."""
        self.retried = np.zeros(slots, dtype=np.int64)
        """Of the arrivals, the retries that said so: not in `arrived` (the exact view's)."""
        self.dispersion = np.zeros((slots, 2), dtype=np.float64)
        """The exact view's `DISPERSION` and `BLOCKS`, by interval."""
        self.variation = np.zeros((slots, 2), dtype=np.float64)
        """The exact view's `VARIATION` and `TIMED`, by interval."""
        self.late = np.zeros(slots, dtype=np.int64)
        """The exact view's `LATE`, by interval."""
        self.second_squares = np.zeros(slots, dtype=np.float64)
        """The exact view's `SECOND_SQUARES`, by interval."""
        self._seconds: dict[int, tuple[int, int]] = {}
        """Per pod, the second being counted: (second number, arrivals)."""
        self._blocks: dict[int, list[float]] = {}
        """Per pod, the block being counted: [block number, arrivals, sum of squared slot
        counts]."""
        self.offered = np.zeros(slots, dtype=np.int64)
        """Every request the trace offered, reached a runtime or not (the seasonal signals)."""
        self.busy_s = np.zeros(slots, dtype=np.float64)
        self.batches = np.zeros((slots, POW2_SLOTS), dtype=np.int64)
        self.rows = np.zeros((slots, POW2_SLOTS), dtype=np.int64)
        self.compute_s = np.zeros((slots, POW2_SLOTS), dtype=np.float64)
        self._exact: dict[int, list[FloatArray]] = {}
        self.truth: list[IntervalTruth] = []
        self.targets: dict[int, Target] = {}
        """Scraped: the Prometheus targets, by pod."""
        self._phases = np.random.default_rng((seed, 0x5C2A)) if not exact else None
        self._lazy = _lazy_columns()

    @property
    def scraped(self) -> bool:
        return self._phases is not None

    def _slot(self, t: FloatArray) -> IntArray:
        return np.clip(np.floor(t / self.interval_s).astype(np.int64), 0, self._last)

    def _add(self, table: np.ndarray[Any, Any], rows: IntArray, cols: IntArray) -> None:
        """table[rows, cols] += 1 for every pair, via one bincount over the rows touched."""
        if rows.shape[0] == 0:
            return
        lo, hi = int(rows.min()), int(rows.max())
        width = table.shape[1]
        counts = np.bincount((rows - lo) * width + cols, minlength=(hi - lo + 1) * width)
        table[lo : hi + 1] += counts.reshape(hi - lo + 1, width)

    def add_target(self, pod: int, *, since: float, batch_limit: int) -> None:
        """Scraped: Prometheus scrapes `pod` from `since` on (when its server answers), its
        batch limit `batch_limit`."""
        if self._phases is None:
            return
        target = self.targets[pod] = Target(
            phase_s=float(self._phases.uniform(0.0, self.scrape_interval_s)),
            interval_s=self.scrape_interval_s,
            since=since,
            until=self._horizon + self.scrape_interval_s,
            columns=Column.COUNT,
            histograms=(
                (Column.LATENCY.start, Column.LATENCY.stop),
                (Column.QUEUE_WAIT.start, Column.QUEUE_WAIT.stop),
            ),
            lazy=self._lazy,
        )
        target.export(_bucket_columns(batch_limit), since)
        first = math.floor(since / SECOND_SQUARES_SLOT_S) + 1
        ends = np.arange(first, self._horizon / SECOND_SQUARES_SLOT_S + 2) * SECOND_SQUARES_SLOT_S
        target.add(target.rows(ends), np.full(ends.shape[0], Column.COUNTED), np.ones_like(ends))

    def batch_limit(self, pod: int, limit: int, *, at: float) -> None:
        """Scraped: `pod`'s batch limit is `limit` from `at` on."""
        target = self.targets.get(pod)
        if target is not None:
            target.export(_bucket_columns(limit), at)

    def remove_target(self, pod: int, *, at: float) -> None:
        """`pod` went away at `at`: it is scraped no more."""
        target = self.targets.get(pod)
        if target is not None:
            target.stop = min(target.stop, at)

    def record_offered(self, times: FloatArray) -> None:
        """Requests the trace offered, wherever they went."""
        _count(self.offered, self._slot(times))

    def seasonal(self, k: int) -> tuple[float | None, tuple[PastPeriod, ...]]:
        """Today's level and the past periods' (level, look-ahead peak) at the start of
        interval k, as `autopilot.prometheus.queries` asks Prometheus for them; no past periods
        unless all of them are simulated."""
        season = self.seasonality
        if season is None or k <= 0:
            return None, ()
        step = self.interval_s
        cumulative = np.concatenate([[0], np.cumsum(self.offered[:k])])

        def mean_rate(end: int, span_s: float) -> float:
            """arrivals per second over `span_s` ending at interval `end` (shortened at 0)."""
            n = max(1, min(end, round(span_s / step)))
            return float(cumulative[end] - cumulative[end - n]) / (n * step)

        stride = max(1, round(season.step_s / step))

        def median_rate(end: int) -> float:
            """The median window rate at every subquery step over the level window before
            `end` (`quantile_over_time(0.5, …)`)."""
            first = max(1, end - round(season.level_s / step))
            ends = range(end, first - 1, -stride)
            return float(np.median([mean_rate(e, self.window_s) for e in ends]))

        level = median_rate(k)
        window = round(self.window_s / step)
        past = []
        for n in range(1, season.periods + 1):
            then = k - round(n * season.period_s / step)
            if then - window < 0:
                return level, ()
            ends = range(then, then + round(season.lookahead_s / step) + 1, stride)
            ahead = max(mean_rate(min(end, k), self.window_s) for end in ends)
            past.append(
                PastPeriod(
                    ahead_qps=ahead,
                    level_qps=median_rate(then),
                    then_qps=mean_rate(then, self.window_s),
                )
            )
        return level, tuple(past)

    def record_unreached(self, count: int, at: float) -> None:
        """Requests that found no ready replica: failures no runtime counts."""
        if count:
            self.shed[min(int(at // self.interval_s), self._last)] += count

    def record_arrivals(
        self, pod: int, times: FloatArray, retried: FloatArray | None = None
    ) -> None:
        """Requests that reached `pod` (the runtime's arrivals counter), served or refused:
        first attempts at `times`, and retries that said so at `retried`."""
        target = self.targets.get(pod)
        if retried is not None and retried.shape[0]:
            if target is None:
                _count(self.retried, self._slot(retried))
            else:
                target.count(retried, Column.RETRIED)
        every = (
            times
            if retried is None or not retried.shape[0]
            else np.sort(np.concatenate([times, retried]))
        )
        self._record_slots(pod, target, every)
        self._record_seconds(pod, target, every)
        if times.shape[0] == 0:
            return
        if target is None:
            _count(self.arrived, self._slot(times))
        else:
            target.count(times, Column.ARRIVALS)
            target.count_recent(times, Column.RECENT, RECENT_ARRIVALS_S)

    def _record_seconds(self, pod: int, target: Target | None, times: FloatArray) -> None:
        """Every arrival at `times` (sorted, after the pod's earlier ones) in its second; a
        second's count squared is added at its end once the arrivals have moved past it."""
        if times.shape[0] == 0:
            return
        seconds, counts = np.unique(
            np.floor(times / SECOND_SQUARES_SLOT_S).astype(np.int64), return_counts=True
        )
        counts = counts.astype(np.int64)
        open_second = self._seconds.get(pod)
        if open_second is not None and open_second[0] == int(seconds[0]):
            counts[0] += open_second[1]
        elif open_second is not None:
            seconds = np.concatenate([[open_second[0]], seconds])
            counts = np.concatenate([[open_second[1]], counts])
        self._seconds[pod] = (int(seconds[-1]), int(counts[-1]))
        if seconds.shape[0] < 2:
            return
        ends = (seconds[:-1] + 1).astype(np.float64) * SECOND_SQUARES_SLOT_S
        squares = (counts[:-1] ** 2).astype(np.float64)
        if target is None:
            np.add.at(self.second_squares, self._slot(ends), squares)
            return
        rows = target.rows(ends)
        target.add(rows, np.full(rows.shape[0], Column.SECOND_SQUARES), squares)

    def _record_slots(self, pod: int, target: Target | None, times: FloatArray) -> None:
        """Every arrival at `times` (sorted) in its slot and `DISPERSION_SPAN_S` block; a block
        is counted once the arrivals have moved past it, as the gauge reads it at its end."""
        if times.shape[0] == 0:
            return
        slots, counts = np.unique(np.floor(times / DISPERSION_SLOT_S), return_counts=True)
        per_block = round(DISPERSION_SPAN_S / DISPERSION_SLOT_S)
        blocks = (slots // per_block).astype(np.int64)
        weights = counts.astype(np.float64)
        open_block = self._blocks.get(pod)
        ended_at: list[float] = []
        values: list[float] = []
        for block in np.unique(blocks).tolist():
            mine = blocks == block
            arrived, squares = float(weights[mine].sum()), float((weights[mine] ** 2).sum())
            if open_block is not None and open_block[0] == block:
                open_block[1] += arrived
                open_block[2] += squares
                continue
            if open_block is not None:
                ended_at.append((open_block[0] + 1) * DISPERSION_SPAN_S)
                values.append(open_block[2] / open_block[1] - open_block[1] / per_block)
            open_block = [float(block), arrived, squares]
        if open_block is not None:
            self._blocks[pod] = open_block
        if not ended_at:
            return
        ends, found = np.array(ended_at), np.array(values)
        if target is None:
            rows = self._slot(ends)
            np.add.at(self.dispersion[:, 0], rows, found)
            np.add.at(self.dispersion[:, 1], rows, 1.0)
            return
        rows = target.rows(ends)
        columns = np.repeat([Column.DISPERSION, Column.BLOCKS], rows.shape[0])
        target.add(
            np.concatenate([rows, rows]), columns, np.concatenate([found, np.ones_like(found)])
        )

    def record(
        self,
        served: Sequence[tuple[int, Served]],
        *,
        truth: ServiceTruth,
        paces: Mapping[int, float] | None = None,
    ) -> None:
        """Count the batches (and their requests) that replicas ran, by when they finished, and
        the requests they refused, by when they arrived. `served`: (pod, what it did), its
        batch sizes in requests of `truth.rows_per_request` rows each. `paces`: each pod's
        batch times as a multiple of t(b), where not 1 (a slowdown): a runtime's batch-time
        spread is around its own times."""
        latencies: list[FloatArray] = []
        slots: list[IntArray] = []
        for pod, result in served:
            target = self.targets.get(pod)
            if result.shed or result.refused:
                refused = np.concatenate([result.shed_at, result.refused_at])
                slot = self._slot(refused)
                _count(self.shed, slot)
                _count(self.rejected, slot)
                if target is not None:
                    target.count(refused, Column.REJECTED)
            if not result.batches:
                continue
            sizes = result.sizes
            rows = result.rows if result.rows is not None else sizes * truth.rows_per_request
            dispatched = result.dispatched_at
            seconds = result.seconds
            ended = dispatched + seconds
            batch_slot = self._slot(ended)
            pace = 1.0 if paces is None else paces.get(pod, 1.0)
            deviation = seconds / ((truth.alpha_s + truth.beta_s * rows) * pace) - 1.0
            pow2 = _pow2_slot(rows)
            np.add.at(self.busy_s, batch_slot, seconds)
            self._add(self.batches, batch_slot, pow2)
            for table, values in ((self.rows, rows), (self.compute_s, seconds)):
                np.add.at(table, (batch_slot, pow2), values)
            slot = np.repeat(batch_slot, sizes)
            waits = np.repeat(dispatched, sizes) - result.arrivals
            latency = np.repeat(ended, sizes) - result.arrivals + self.overhead_s
            latency_bucket = np.searchsorted(self.bounds, latency, side="left")
            wait_bucket = np.searchsorted(self.bounds, waits, side="left")
            late = latency > self.sla_s
            if target is None:
                _count(self.late, slot, late)
                self._add(self.latency, slot, latency_bucket)
                self._add(self.queue_wait, slot, wait_bucket)
                np.add.at(self.variation[:, 0], batch_slot, deviation * deviation)
                np.add.at(self.variation[:, 1], batch_slot, 1.0)
            else:
                self._scrape_batches(
                    target,
                    result,
                    rows,
                    ended,
                    deviation,
                    pow2,
                    latency_bucket,
                    wait_bucket,
                    late,
                )
            latencies.append(latency)
            slots.append(slot)
        if not latencies:
            return
        latency = np.concatenate(latencies)
        slot = np.concatenate(slots)
        _count(self.completed, slot)
        _count(self.within_sla, slot, latency <= self.sla_s)
        lo, hi = int(slot.min()), int(slot.max())
        if lo == hi:
            self._exact.setdefault(lo, []).append(latency)
        else:
            for k in range(lo, hi + 1):
                self._exact.setdefault(k, []).append(latency[slot == k])

    def _scrape_batches(
        self,
        target: Target,
        served: Served,
        rows_run: IntArray,
        ended: FloatArray,
        deviation: FloatArray,
        pow2: IntArray,
        latency_bucket: IntArray,
        wait_bucket: IntArray,
        late: np.ndarray[Any, np.dtype[np.bool_]],
    ) -> None:
        """Add one call's batches to a target's series: requests when their batch ends, busy
        seconds as they pass (a scrape during a batch sees the part run so far; a batch longer
        than a scrape interval is split between its first scrape and its last only).
        `deviation`: each batch's time over t(b), less 1."""
        sizes = served.sizes
        seconds = served.seconds
        ended_row = target.rows(ended)
        started_row = target.rows(served.dispatched_at)
        first_part = np.minimum(ended, target.origin + started_row * target.interval_s) - (
            served.dispatched_at
        )
        request_row = np.repeat(ended_row, sizes)
        batch = np.ones(sizes.shape[0])
        rows = np.concatenate([request_row] * 4 + [started_row, ended_row] + [ended_row] * 7)
        cols = np.concatenate(
            [
                Column.LATENCY.start + latency_bucket,
                Column.QUEUE_WAIT.start + wait_bucket,
                np.full(request_row.shape[0], Column.OUTSIDE),
                np.full(request_row.shape[0], Column.LATE),
                np.full(sizes.shape[0], Column.BUSY),
                np.full(sizes.shape[0], Column.BUSY),
                np.full(sizes.shape[0], Column.SIZE_SUM),
                np.full(sizes.shape[0], Column.SIZE_COUNT),
                Column.BATCHES.start + pow2,
                Column.ROWS.start + pow2,
                Column.COMPUTE.start + pow2,
                np.full(sizes.shape[0], Column.VARIATION),
                np.full(sizes.shape[0], Column.TIMED),
            ]
        )
        weights = np.concatenate(
            [
                np.ones(2 * request_row.shape[0]),
                np.full(request_row.shape[0], self.overhead_s),
                late.astype(np.float64),
                first_part,
                seconds - first_part,
                rows_run,
                batch,
                batch,
                rows_run,
                seconds,
                deviation * deviation,
                batch,
            ]
        )
        target.add(rows, cols, weights)

    def close(self, upto: int) -> None:
        """Intervals before `upto` will get no more completions: compute their exact truth."""
        for k in range(len(self.truth), min(upto, self._last + 1)):
            parts = self._exact.pop(k, [])
            values = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
            shed = int(self.shed[k])
            self.truth.append(
                IntervalTruth(
                    p99_s=exact_quantile(0.99, values, shed),
                    completed=int(self.completed[k]),
                    shed=shed,
                    within_sla=int(self.within_sla[k]),
                )
            )

    def observe(self, k: int, *, ready: int, reporting: int) -> Observation:
        """The observation at the start of interval k, over the window that ends there.
        `ready`: the Deployment's ready replicas; `reporting`: the replicas whose metrics the
        exact view counts (ready and draining; scraped, the targets tell)."""
        if self.scraped:
            seen = self._observe_scraped(k, ready=ready)
        else:
            seen = self._observe_exact(k, ready=ready, reporting=reporting)
        if self.seasonality is None:
            return seen
        level, past = self.seasonal(k)
        return replace(seen, level_qps=level, past=past)

    def _observe_exact(self, k: int, *, ready: int, reporting: int) -> Observation:
        now = k * self.interval_s
        span = max(1, min(k, round(self.window_s / self.interval_s)))
        lo = k - span
        seconds = span * self.interval_s
        recent = max(1, min(k, round(self.recent_window_s / self.interval_s)))
        latency = self.latency[lo:k].sum(axis=0)
        waits = self.queue_wait[lo:k].sum(axis=0)
        batches = self.batches[lo:k].sum(axis=0)
        rows = self.rows[lo:k].sum(axis=0)
        compute = self.compute_s[lo:k].sum(axis=0)
        bounds = self.bounds.tolist()
        total_batches = int(batches.sum())
        completed = float(self.completed[lo:k].sum())
        points = tuple(
            ComputePoint(
                mean_batch=float(rows[i]) / float(batches[i]),
                mean_seconds=float(compute[i]) / float(batches[i]),
                batches=float(batches[i]),
            )
            for i in range(POW2_SLOTS)
            if batches[i] > 0
        )
        return Observation(
            at=now,
            window_s=self.window_s,
            p99_s=_quantile(0.99, bounds, latency),
            p95_s=_quantile(0.95, bounds, latency),
            qps=completed / seconds,
            rejected_qps=float(self.rejected[lo:k].sum()) / seconds,
            queue_p99_s=_quantile(0.99, bounds, waits),
            late_share=float(self.late[lo:k].sum()) / completed if completed else None,
            counted_sla_min_s=self.sla_s if completed else None,
            counted_sla_max_s=self.sla_s if completed else None,
            utilization=(
                float(self.busy_s[lo:k].sum()) / seconds / reporting if reporting else None
            ),
            mean_batch=float(rows.sum()) / total_batches if total_batches else None,
            rows_per_request=float(rows.sum()) / completed if completed else None,
            outside_s=self.overhead_s if completed else None,
            startup=self.startup if reporting else (),
            compute=points,
            ready_replicas=ready,
            reporting_replicas=reporting,
            arrival_qps=float(self.arrived[lo:k].sum()) / seconds,
            retried_qps=float(self.retried[lo:k].sum()) / seconds,
            arrival_dispersion=_dispersion([self.dispersion[lo:k].sum(axis=0)]),
            arrival_second_squares=float(self.second_squares[lo:k].sum()) / seconds,
            arrival_counted_seconds=float(reporting),
            batch_time_cv=_variation(self.variation[lo:k].sum(axis=0)),
            request_rows_cv=self.rows_cv if reporting else None,
            recent_qps=float(self.arrived[k - recent : k].sum()) / (recent * self.interval_s),
            recent_window_s=self.recent_window_s,
        )

    def _observe_scraped(self, k: int, *, ready: int) -> Observation:
        now = k * self.interval_s
        window = self.window_s
        # A target gone longer ago than a window (and its staleness markers) shows in nothing.
        forgotten = now - max(window, self.recent_window_s, 3 * self.scrape_interval_s)
        kept = {pod: t for pod, t in self.targets.items() if t.origin < now and t.stop > forgotten}
        targets = list(kept.values())
        reporting = sum(1 for t in targets if t.present(now))
        rates = sum_rate(targets, now, window, slice(0, Column.COUNT))
        recent = sum_irate(
            targets, now, self.recent_window_s, slice(Column.ARRIVALS, Column.ARRIVALS + 1)
        )
        bounds = self.bounds.tolist()

        def buckets(cols: slice) -> np.ndarray[Any, Any]:
            """Bucket rates from the rates of the cumulative `le` series, made monotonic as
            `histogram_quantile` makes them (extrapolation may differ between buckets)."""
            cumulative = np.fmax.accumulate(np.nan_to_num(rates[cols], nan=0.0))
            return np.diff(cumulative, prepend=0.0)

        busy = _number(avg_rate(targets, now, window, Column.BUSY))
        size_count = _number(rates[Column.SIZE_COUNT])
        size_sum = _number(rates[Column.SIZE_SUM])
        batches, rows, compute = rates[Column.BATCHES], rates[Column.ROWS], rates[Column.COMPUTE]
        points = tuple(
            ComputePoint(
                mean_batch=float(rows[i] / batches[i]),
                mean_seconds=float(compute[i] / batches[i]),
                batches=float(batches[i]) * window,
            )
            for i in range(POW2_SLOTS)
            if batches[i] > 0 and math.isfinite(rows[i]) and math.isfinite(compute[i])
        )
        counted = reporting > 0  # no replica reports: the request rates are missing too
        pods, recent_pods = [], []
        for pod, target in kept.items():
            # sum by (pod) over the batch buckets: NaN where the target has no two samples
            ran, rows_run, took = _batch_sums(target.increase(now, window, BATCH_COLUMNS))
            if ran > 0:
                pods.append(PodCompute(str(pod), rows_run / ran, took / ran, ran))
            if not target.present(now):
                continue  # `irate(…) and series`: a replica gone has no fresh rate
            per_s, rows_s, took_s = _batch_sums(
                target.last_rate(now, self.recent_window_s, BATCH_COLUMNS)
            )
            if per_s > 0:
                recent_pods.append(
                    PodCompute(
                        str(pod), rows_s / per_s, took_s / per_s, per_s * self.scrape_interval_s
                    )
                )
        fast = _number(recent[0]) if counted else None
        # the runtime's gauge, as the last scrape of each replica read it
        readings = [
            t.last_increment(now, slice(Column.RECENT, Column.RECENT + 1))[0]
            for t in targets
            if t.present(now)
        ]
        gauge = sum(r for r in readings if math.isfinite(r)) / RECENT_ARRIVALS_S
        served = _number(rates[Column.LATENCY.stop - 1]) if counted else None
        late = _number(rates[Column.LATE])
        outside = _number(rates[Column.OUTSIDE])
        return Observation(
            at=now,
            window_s=window,
            p99_s=_quantile(0.99, bounds, buckets(Column.LATENCY)),
            p95_s=_quantile(0.95, bounds, buckets(Column.LATENCY)),
            qps=served,
            rejected_qps=_number(rates[Column.REJECTED]) if counted else None,
            queue_p99_s=_quantile(0.99, bounds, buckets(Column.QUEUE_WAIT)),
            late_share=None if late is None or not served else late / served,
            counted_sla_min_s=self.sla_s if counted else None,
            counted_sla_max_s=self.sla_s if counted else None,
            utilization=busy if counted else None,
            mean_batch=(size_sum / size_count if size_sum is not None and size_count else None),
            rows_per_request=(size_sum / served if size_sum is not None and served else None),
            outside_s=outside / served if outside is not None and served else None,
            startup=self.startup if counted else (),
            compute=points,
            ready_replicas=ready,
            reporting_replicas=reporting,
            arrival_qps=_number(rates[Column.ARRIVALS]) if counted else None,
            retried_qps=_number(rates[Column.RETRIED]) if counted else None,
            arrival_dispersion=_dispersion(
                [
                    t.increase(now, window, slice(Column.DISPERSION, Column.BLOCKS + 1))
                    for t in targets
                ]
            )
            if counted
            else None,
            batch_time_cv=(
                _variation(rates[Column.VARIATION : Column.TIMED + 1]) if counted else None
            ),
            arrival_second_squares=_number(rates[Column.SECOND_SQUARES]) if counted else None,
            arrival_counted_seconds=_number(rates[Column.COUNTED]) if counted else None,
            request_rows_cv=self.rows_cv if counted else None,
            recent_qps=fast,
            recent_window_s=None if fast is None else self.scrape_interval_s,
            now_qps=gauge if counted and any(math.isfinite(r) for r in readings) else None,
            pods=tuple(pods),
            recent_pods=tuple(recent_pods),
        )


def _variation(summed: FloatArray) -> float | None:
    """How batch times varied around t(b) over the window: the root of the mean squared
    deviation from (sum of squares, batches) or their rates; None where no batch ended."""
    squares, batches = float(summed[0]), float(summed[1])
    if not (math.isfinite(squares) and math.isfinite(batches) and batches > 0):
        return None
    return math.sqrt(max(0.0, squares) / batches)


def _dispersion(increases: Sequence[FloatArray]) -> float | None:
    """The mean dispersion of the blocks the window holds, from each replica's (sum of its
    blocks' dispersions, blocks); None where no block ended in it."""
    total = blocks = 0.0
    for summed, count in increases:
        if math.isfinite(summed) and math.isfinite(count) and count > 0:
            total, blocks = total + summed, blocks + count
    return total / blocks if blocks > 0 else None
