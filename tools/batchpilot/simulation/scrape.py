"""What Prometheus keeps of the runtime's counters, and what `rate()` makes of it.

Prometheus does not read a counter continuously: it scrapes each replica (a target) every
`interval_s`, at a phase of its own, and keeps the values as samples stamped with the scrape
time. A query at T sees the samples scraped before T. `rate(x[w])` takes, per series, the first
and the last sample inside (T − w, T] and extrapolates their difference towards the range's
edges as Prometheus' `extrapolatedRate` does (`extrapolated_increase`); a series with fewer than
two samples in the range gives nothing, and `sum(rate(...))` adds what the targets give. So what
the autopilot sees trails the traffic by up to a scrape interval, and a window's rate is an
estimate whose error depends on where the scrapes fell.

A replica that goes away is scraped no more: its samples leave the rate windows as they age
(the last one at most a window after it went), and its series leave instant vectors (`count()`)
when Prometheus writes their staleness markers — one scrape interval after the first scrape
that would have come, plus 10 %, as Prometheus' scrape loop does (`Target.present`).

Storage: one array per target, a row per scrape and a column per series. An event (a request
arriving, a batch ending) is added to the row of the first scrape that sees it; rows become
counter values (running sums) when a query first reads them, and no later event can reach them
then: everything recorded afterwards happened after the query. Memory and work grow with
scrapes × series, never with requests.

Pure: numpy and arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from batchpilot.simulation.replica import FloatArray

EXTRAPOLATION_THRESHOLD = 1.1
"""A range edge closer to its nearest sample than this many average sample intervals is
extrapolated to; a farther one, half an interval (Prometheus' `extrapolatedRate`)."""

STALE_MARKER_DELAY = 1.1
"""Scrape intervals after the scrape that did not happen until Prometheus writes the staleness
markers of a target that went away (its scrape loop waits for the next tick, then 10 % more)."""

LOOKBACK_S = 300.0
"""Prometheus' lookback delta: an instant vector holds a series' latest sample this old at most."""

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


def extrapolated_increase(
    *,
    first: FloatArray,
    last: FloatArray,
    first_t: FloatArray | float,
    last_t: float,
    samples: FloatArray | int,
    start: float,
    end: float,
) -> FloatArray:
    """Prometheus' `increase()` over the range (start, end] of counters whose first and last
    samples in it are `first` at `first_t` and `last` at `last_t`, `samples` samples in all (no
    counter resets: a simulated replica never restarts). NaN where there are fewer than two.

    The difference is stretched to the range's edges: to an edge when it lies closer to the
    nearest sample than 1.1 average intervals between the samples, else by half an interval
    (the series presumably started or ended there); and never back past the point where the
    counter, continued at its slope, would be zero (a counter that started inside the range)."""
    first_at = np.asarray(first_t, dtype=np.float64)
    count = np.asarray(samples, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sampled = last_t - first_at
        average = sampled / (count - 1.0)
        threshold = EXTRAPOLATION_THRESHOLD * average
        to_start = first_at - start
        to_start = np.where(to_start >= threshold, average / 2.0, to_start)
        gap = end - last_t
        to_end = np.where(gap >= threshold, average / 2.0, gap)
        result = last - first
        to_zero = np.where(result > 0, sampled * first / result, to_start)
        to_start = np.minimum(to_start, to_zero)
        increase = result * (sampled + to_start + to_end) / sampled
    out: FloatArray = np.where((count >= 2) & (sampled > 0), increase, np.nan)
    return out


class Target:
    """One replica's series, as Prometheus scrapes them: scrape `j` at `phase_s + j·interval_s`,
    from the first one at or after `since` (the replica answers scrapes), while it exists."""

    def __init__(
        self,
        *,
        phase_s: float,
        interval_s: float,
        since: float,
        until: float,
        columns: int,
        histograms: Sequence[tuple[int, int]] = (),
        lazy: BoolArray | None = None,
    ) -> None:
        """`until`: no query reads past it (events later count in the last row). `histograms`:
        column ranges holding the buckets of one histogram, each bucket's own count, which
        Prometheus sees cumulated (`le`). `lazy`: columns of series that exist only from their
        first non-zero value (a labelled counter the runtime creates at its first increment)."""
        self.interval_s = interval_s
        self.origin = phase_s + math.ceil((since - phase_s) / interval_s) * interval_s
        """Time of the first scrape (row 0)."""
        rows = max(1, math.ceil((until - self.origin) / interval_s) + 1)
        self.values = np.zeros((rows, columns), dtype=np.float64)
        self.done = -1
        """Rows up to this one hold counter values; the later ones, increments."""
        self.stop = math.inf
        """When the replica went away: no scrape at or after it."""
        self.histograms = tuple(histograms)
        self.lazy = np.zeros(columns, dtype=np.bool_) if lazy is None else lazy
        self.born = np.where(self.lazy, rows, 0)
        """First row of each series (lazy ones: the first non-zero row; `rows` until then)."""

    def time(self, row: int) -> float:
        return self.origin + row * self.interval_s

    def export(self, cols: np.ndarray[Any, Any], at: float) -> None:
        """Lazy series `cols` exist from `at` on, at zero until their first event: seen from the
        first scrape at or after it."""
        row = int(self.rows(np.array([at]))[0])
        self.born[cols] = np.minimum(self.born[cols], row)

    def rows(self, times: FloatArray) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The row of the first scrape at or after each time (events at a scrape count in it)."""
        rows = np.ceil((times - self.origin) / self.interval_s).astype(np.int64)
        # Events before the first scrape count in it, events past `until` in the last row. None
        # reaches a settled row (it happened before a query that read it), barring rounding.
        return np.clip(rows, max(0, self.done + 1), self.values.shape[0] - 1)

    def add(
        self, rows: np.ndarray[Any, Any], cols: np.ndarray[Any, Any], weights: FloatArray
    ) -> None:
        """values[rows, cols] += weights for every triple: one bincount over the rows touched."""
        if rows.shape[0] == 0:
            return
        lo, hi = int(rows.min()), int(rows.max())
        width = self.values.shape[1]
        sums = np.bincount((rows - lo) * width + cols, weights, minlength=(hi - lo + 1) * width)
        self.values[lo : hi + 1] += sums.reshape(hi - lo + 1, width)

    def count(self, times: FloatArray, col: int) -> None:
        """One event in series `col` at each of `times`."""
        if times.shape[0] == 0:
            return
        self._count_rows(self.rows(times), col)

    def _count_rows(self, rows: np.ndarray[Any, np.dtype[np.int64]], col: int) -> None:
        """One event in series `col` in each of `rows`."""
        if rows.shape[0] == 0:
            return
        lo, hi = int(rows.min()), int(rows.max())
        self.values[lo : hi + 1, col] += np.bincount(rows - lo, minlength=hi - lo + 1)

    def count_recent(self, times: FloatArray, col: int, within_s: float) -> None:
        """One event in series `col` at each of `times` that falls within `within_s` before the
        scrape that sees it: the series' increments from scrape to scrape are then a gauge's
        readings, the events of the last `within_s` at each scrape (at most an interval)."""
        if times.shape[0] == 0:
            return
        rows = self.rows(times)
        self._count_rows(rows[self.origin + rows * self.interval_s - times < within_s], col)

    def last_increment(self, at: float, cols: slice) -> FloatArray:
        """The increment between the last two samples scraped before `at` (NaN: fewer than
        two): a `count_recent` series' last reading."""
        width = len(range(*cols.indices(self.values.shape[1])))
        last = self._last_row(at)
        if last < 1:
            return np.full(width, np.nan)
        self._settle(last)
        values = self.values[:, cols]
        return np.asarray(values[last] - values[last - 1], dtype=np.float64)

    def _settle(self, upto: int) -> None:
        """Turn rows up to `upto` into counter values."""
        if upto <= self.done:
            return
        block = self.values[self.done + 1 : upto + 1]
        for a, b in self.histograms:
            np.cumsum(block[:, a:b], axis=1, out=block[:, a:b])
        np.cumsum(block, axis=0, out=block)
        if self.done >= 0:
            block += self.values[self.done]
        unborn = np.flatnonzero(self.born == self.values.shape[0])
        if unborn.size:
            nonzero = block[:, unborn] > 0
            seen = nonzero.any(axis=0)
            self.born[unborn[seen]] = self.done + 1 + nonzero.argmax(axis=0)[seen]
        self.done = upto

    def _last_row(self, at: float) -> int:
        """The last row scraped before `at` (-1: none yet)."""
        before = min(at, self.stop)
        return min(
            math.ceil((before - self.origin) / self.interval_s) - 1, self.values.shape[0] - 1
        )

    def increase(self, at: float, range_s: float, cols: slice) -> FloatArray:
        """`increase(series[range_s])` at `at` for the columns `cols` (NaN: no value)."""
        width = len(range(*cols.indices(self.values.shape[1])))
        last = self._last_row(at)
        lo = max(0, math.floor((at - range_s - self.origin) / self.interval_s) + 1)
        if last - lo < 1:
            return np.full(width, np.nan)
        self._settle(last)
        first = np.maximum(self.born[cols], lo)
        count = last - first + 1
        values = self.values[:, cols]
        first_v = values[np.minimum(first, last), np.arange(width)]
        return extrapolated_increase(
            first=first_v,
            last=values[last],
            first_t=self.origin + first * self.interval_s,
            last_t=self.time(last),
            samples=count,
            start=at - range_s,
            end=at,
        )

    def last_rate(self, at: float, range_s: float, cols: slice) -> FloatArray:
        """`irate(series[range_s])` at `at`: the rate between the last two samples scraped in
        the range (NaN: fewer than two)."""
        width = len(range(*cols.indices(self.values.shape[1])))
        last = self._last_row(at)
        lo = max(0, math.floor((at - range_s - self.origin) / self.interval_s) + 1)
        if last - lo < 1:
            return np.full(width, np.nan)
        self._settle(last)
        values = self.values[:, cols]
        born = self.born[cols]
        rate: FloatArray = (values[last] - values[last - 1]) / self.interval_s
        return np.where(born <= last - 1, rate, np.nan)

    def present(self, at: float) -> bool:
        """Whether its series are in an instant vector at `at`: scraped before, and neither
        marked stale (the marker comes one interval after the scrape that did not happen, plus
        10 %) nor older than the lookback."""
        last = self._last_row(at)
        if last < 0:
            return False
        if math.isfinite(self.stop):
            missed = self.origin + math.ceil((self.stop - self.origin) / self.interval_s) * (
                self.interval_s
            )
            if at >= missed + STALE_MARKER_DELAY * self.interval_s:
                return False
        return at - self.time(last) <= LOOKBACK_S


def _sum(per_target: list[FloatArray], width: int) -> FloatArray:
    """`sum(...)` over targets, column by column: NaN where no target has a value."""
    if not per_target:
        return np.full(width, np.nan)
    stacked = np.vstack(per_target)
    seen = ~np.isnan(stacked)
    total: FloatArray = np.where(seen.any(axis=0), np.where(seen, stacked, 0.0).sum(axis=0), np.nan)
    return total


def sum_rate(targets: Iterable[Target], at: float, range_s: float, cols: slice) -> FloatArray:
    """`sum(rate(series[range_s]))` at `at` for the columns `cols` (a slice with a start and a
    stop): NaN where no target has two samples of the series in the range."""
    increases = [target.increase(at, range_s, cols) for target in targets]
    return _sum(increases, cols.stop - cols.start) / range_s


def avg_rate(targets: Iterable[Target], at: float, range_s: float, column: int) -> float:
    """`avg(rate(series[range_s]))` at `at` for one column: the mean over the targets with two
    samples of it in the range (NaN: none has)."""
    rates = [target.increase(at, range_s, slice(column, column + 1))[0] for target in targets]
    seen = [r for r in rates if not math.isnan(r)]
    return sum(seen) / len(seen) / range_s if seen else math.nan


def sum_irate(targets: Iterable[Target], at: float, range_s: float, cols: slice) -> FloatArray:
    """`sum(irate(series[range_s]))` at `at`: NaN where no target has two samples in range."""
    rates = [target.last_rate(at, range_s, cols) for target in targets]
    return _sum(rates, cols.stop - cols.start)
