"""Offered load over time: a piecewise-constant rate trace, and Poisson arrivals drawn from it.

Traces are the project's `t_seconds,rate_rps` CSV (the load generator reads the same files with
`RateSchedule.from_csv`): each row's rate holds from its time until the next row's. The trace
ends at its last row, whose rate is not used — so a file says how long it lasts; `duration_s`
overrides that (the last rate then holds until the end).

Arrivals are drawn one chunk of time at a time, vectorised: a Poisson count per constant-rate
segment, uniform times within it, one sort. For a piecewise-constant rate that is exactly a
Poisson process. Clumped, the Poisson events are clumps at the rate over the mean clump, each
of a geometric number of requests (1, 2, …, of that mean) arriving at once: a compound Poisson
process of the same rate, whose count over any span varies 2·mean − 1 times as much.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchpilot.simulation.replica import FloatArray


@dataclass(frozen=True, slots=True)
class Trace:
    """Rates `rates[i]` from `starts[i]` until `starts[i + 1]` (or `duration_s`)."""

    name: str
    starts: tuple[float, ...]
    rates: tuple[float, ...]
    duration_s: float

    def __post_init__(self) -> None:
        if not self.starts or len(self.starts) != len(self.rates):
            raise ValueError("a trace needs at least one (time, rate) point")
        if self.starts[0] != 0:
            raise ValueError("a trace starts at t = 0")
        if any(b <= a for a, b in zip(self.starts, self.starts[1:], strict=False)):
            raise ValueError("trace times must increase strictly")
        if any(not (math.isfinite(r) and r >= 0) for r in self.rates):
            raise ValueError("trace rates must be finite and not negative")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError("a trace must last a positive, finite time")

    @classmethod
    def from_points(
        cls, points: list[tuple[float, float]], *, name: str = "trace", duration_s: float | None
    ) -> Trace:
        """Points as in the CSV. Without `duration_s` the last point ends the trace."""
        if points and points[0][0] > 0:
            points = [(0.0, 0.0), *points]
        if duration_s is None:
            if len(points) < 2:
                raise ValueError("a one-row trace needs a duration")
            duration_s, points = points[-1][0], points[:-1]
        kept = [(t, r) for t, r in points if t < duration_s]
        return cls(
            name=name,
            starts=tuple(t for t, _ in kept),
            rates=tuple(r for _, r in kept),
            duration_s=duration_s,
        )

    @classmethod
    def from_csv(cls, path: str | Path, *, duration_s: float | None = None) -> Trace:
        """Read a `t_seconds,rate_rps` file (same parser as the load generator)."""
        from batchpilot.runtime.loadgen.schedule import RateSchedule

        schedule = RateSchedule.from_csv(path)
        return cls.from_points(list(schedule.points), name=Path(path).stem, duration_s=duration_s)

    @classmethod
    def constant(cls, rate: float, duration_s: float, *, name: str = "constant") -> Trace:
        return cls(name=name, starts=(0.0,), rates=(float(rate),), duration_s=duration_s)

    def _pieces(self, start: float, end: float) -> list[tuple[float, float, float]]:
        """(from, to, rate) of the constant-rate pieces covering [start, end)."""
        first = max(0, bisect_right(self.starts, start) - 1)
        pieces = []
        for i in range(first, len(self.starts)):
            lo = max(start, self.starts[i])
            hi = min(end, self.starts[i + 1] if i + 1 < len(self.starts) else self.duration_s)
            if lo >= end:
                break
            if hi > lo:
                pieces.append((lo, hi, self.rates[i]))
        return pieces

    def rate_at(self, t: float) -> float:
        return self.rates[max(0, bisect_right(self.starts, t) - 1)] if t < self.duration_s else 0.0

    def peak(self, start: float, end: float) -> float:
        """Highest rate in [start, end)."""
        return max((r for _, _, r in self._pieces(start, end)), default=0.0)

    def mean(self, start: float, end: float) -> float:
        """Mean rate over [start, end)."""
        if end <= start:
            return 0.0
        return sum((hi - lo) * r for lo, hi, r in self._pieces(start, end)) / (end - start)

    @property
    def max_rate(self) -> float:
        return max(self.rates)

    def arrivals(
        self, start: float, end: float, rng: np.random.Generator, *, clump: float = 1.0
    ) -> FloatArray:
        """Sorted Poisson arrival times in [start, end); with `clump` above 1, in clumps of
        that mean size, each clump's requests at one time."""
        pieces = self._pieces(start, end)
        if not pieces:
            return np.empty(0, dtype=np.float64)
        lows = np.array([lo for lo, _, _ in pieces])
        spans = np.array([hi - lo for lo, hi, _ in pieces])
        counts = rng.poisson(spans * np.array([r for _, _, r in pieces]) / clump)
        offsets = rng.random(int(counts.sum())) * np.repeat(spans, counts)
        times: FloatArray = np.repeat(lows, counts) + offsets
        if clump > 1:
            times = np.repeat(times, rng.geometric(1 / clump, size=times.shape[0]))
        times.sort()
        return times
