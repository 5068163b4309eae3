"""What the autopilot would see: the runtime's metrics, as Prometheus would serve them.

The autopilot does not see latencies; it sees histograms. The simulator records every request
into the runtime's own buckets (`LATENCY_BUCKETS`, 15 % apart) per control interval, and builds
each `Observation` the way `autopilot.prometheus.PrometheusObserver` does from PromQL: bucket
counts summed over the window and `histogram_quantile` with Prometheus' linear interpolation for
P99/P95, rates as counts over the window, utilization as busy seconds per second per reporting
replica, compute points per power-of-two batch bucket. So the control loop is tested against
the coarseness it will meet in production, not against exact percentiles.

Beside that view, the ground truth per interval: exact nearest-rank P99 over every request that
finished in it (shed requests count as infinitely slow), and requests inside the SLA.

Simplifications, on purpose: windows are aligned to the control interval and complete at each
decision (Prometheus' scrape lag and `rate()` extrapolation are left out); a request is counted
in the interval in which it finishes, as the runtime's counters are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.simulation.replica import FloatArray, IntArray, Served
from batchpilot.runtime.metrics import LATENCY_BUCKETS

POW2_SLOTS = 16
"""Power-of-two batch buckets 1, 2, 4, … 32768 (the runtime's `batch_bucket` label)."""


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


@dataclass(frozen=True, slots=True)
class IntervalTruth:
    """The exact view of one control interval, for the report."""

    p99_s: float
    completed: int
    shed: int
    within_sla: int


class Telemetry:
    """Per-interval counters of everything the runtime exports, plus the exact truth."""

    def __init__(
        self, *, intervals: int, interval_s: float, sla_s: float, overhead_s: float
    ) -> None:
        self.interval_s = interval_s
        self.sla_s = sla_s
        self.overhead_s = overhead_s
        self.bounds = np.array(LATENCY_BUCKETS, dtype=np.float64)
        slots = intervals + 1  # the last slot takes whatever finishes after the trace ends
        self._last = intervals
        width = len(LATENCY_BUCKETS) + 1
        self.latency = np.zeros((slots, width), dtype=np.int64)
        self.queue_wait = np.zeros((slots, width), dtype=np.int64)
        self.completed = np.zeros(slots, dtype=np.int64)
        self.within_sla = np.zeros(slots, dtype=np.int64)
        self.shed = np.zeros(slots, dtype=np.int64)
        self.busy_s = np.zeros(slots, dtype=np.float64)
        self.batches = np.zeros((slots, POW2_SLOTS), dtype=np.int64)
        self.rows = np.zeros((slots, POW2_SLOTS), dtype=np.int64)
        self.compute_s = np.zeros((slots, POW2_SLOTS), dtype=np.float64)
        self._exact: dict[int, list[FloatArray]] = {}
        self.truth: list[IntervalTruth] = []

    def _slot(self, t: FloatArray) -> IntArray:
        return np.minimum(np.floor(t / self.interval_s).astype(np.int64), self._last)

    def _add(self, table: np.ndarray[Any, Any], rows: IntArray, cols: IntArray) -> None:
        """table[rows, cols] += 1 for every pair, via one bincount over the rows touched."""
        if rows.shape[0] == 0:
            return
        lo, hi = int(rows.min()), int(rows.max())
        width = table.shape[1]
        counts = np.bincount((rows - lo) * width + cols, minlength=(hi - lo + 1) * width)
        table[lo : hi + 1] += counts.reshape(hi - lo + 1, width)

    def record_shed(self, count: int, at: float) -> None:
        if count:
            self.shed[min(int(at // self.interval_s), self._last)] += count

    def record(self, served: Sequence[Served], *, alpha_s: float, beta_s: float) -> None:
        """Count the batches (and their requests) that replicas ran, by when they finished."""
        runs = [s for s in served if s.batches]
        if not runs:
            return
        dispatched = np.concatenate([s.dispatched_at for s in runs])
        sizes = np.concatenate([s.sizes for s in runs])
        arrivals = np.concatenate([s.arrivals for s in runs])
        seconds = alpha_s + beta_s * sizes
        ended = dispatched + seconds
        batch_slot = self._slot(ended)
        pow2 = _pow2_slot(sizes)
        np.add.at(self.busy_s, batch_slot, seconds)
        self._add(self.batches, batch_slot, pow2)
        for table, values in ((self.rows, sizes), (self.compute_s, seconds)):
            np.add.at(table, (batch_slot, pow2), values)

        slot = np.repeat(batch_slot, sizes)
        waits = np.repeat(dispatched, sizes) - arrivals
        latency = np.repeat(ended, sizes) - arrivals + self.overhead_s
        self._add(self.latency, slot, np.searchsorted(self.bounds, latency, side="left"))
        self._add(self.queue_wait, slot, np.searchsorted(self.bounds, waits, side="left"))
        np.add.at(self.completed, slot, 1)
        np.add.at(self.within_sla, slot, latency <= self.sla_s)
        lo, hi = int(slot.min()), int(slot.max())
        if lo == hi:
            self._exact.setdefault(lo, []).append(latency)
        else:
            for k in range(lo, hi + 1):
                self._exact.setdefault(k, []).append(latency[slot == k])

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

    def observe(
        self,
        k: int,
        *,
        window_s: float,
        ready: int,
        reporting: int,
    ) -> Observation:
        """The observation at the start of interval k, over the window that ends there."""
        now = k * self.interval_s
        span = max(1, min(k, round(window_s / self.interval_s)))
        lo = k - span
        seconds = span * self.interval_s
        latency = self.latency[lo:k].sum(axis=0)
        waits = self.queue_wait[lo:k].sum(axis=0)
        batches = self.batches[lo:k].sum(axis=0)
        rows = self.rows[lo:k].sum(axis=0)
        compute = self.compute_s[lo:k].sum(axis=0)
        bounds = self.bounds.tolist()

        def quantile(q: float, counts: IntArray) -> float | None:
            value = histogram_quantile(q, bounds, counts.tolist())
            return None if math.isnan(value) else value

        total_batches = int(batches.sum())
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
            window_s=window_s,
            p99_s=quantile(0.99, latency),
            p95_s=quantile(0.95, latency),
            qps=float(self.completed[lo:k].sum()) / seconds,
            rejected_qps=float(self.shed[lo:k].sum()) / seconds,
            queue_p99_s=quantile(0.99, waits),
            utilization=(
                float(self.busy_s[lo:k].sum()) / seconds / reporting if reporting else None
            ),
            mean_batch=float(rows.sum()) / total_batches if total_batches else None,
            compute=points,
            ready_replicas=ready,
        )
