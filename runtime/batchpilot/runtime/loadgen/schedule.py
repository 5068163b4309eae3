"""Offered load as pure functions: piecewise-constant rate schedules and the arrival times they
imply.

The open loop schedules every arrival in advance from these, so that a slow server cannot slow
the client down (coordinated omission); being pure, they are tested without a server.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

ArrivalProcess = Literal["poisson", "uniform"]

MAX_ARRIVALS: Final = 10_000_000
"""Arrivals are scheduled in advance; this bounds the memory that takes (~80 MB of floats)."""
MAX_RATE_RPS: Final = 1_000_000.0


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """A piecewise-constant offered rate: `points[i] = (t_seconds, rate_rps)` holds from its time
    until the next point's; the rate before the first point is 0."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a rate schedule needs at least one point")
        last = -math.inf
        for t, rate in self.points:
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"schedule time {t} must be a finite number of seconds >= 0")
            if t <= last:
                raise ValueError(f"schedule times must increase strictly; {t} follows {last}")
            if not (math.isfinite(rate) and 0 <= rate <= MAX_RATE_RPS):
                raise ValueError(f"schedule rate {rate} must be between 0 and {MAX_RATE_RPS:g}")
            last = t

    @classmethod
    def constant(cls, rate_rps: float) -> RateSchedule:
        return cls(((0.0, float(rate_rps)),))

    @classmethod
    def parse(cls, text: str) -> RateSchedule:
        """Parse ``"0:50,20:400,40:100"`` (t_seconds:rate_rps pairs)."""
        points: list[tuple[float, float]] = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            t_text, sep, rate_text = item.partition(":")
            if not sep:
                raise ValueError(f"schedule item {item!r} is not t_seconds:rate_rps")
            try:
                points.append((float(t_text), float(rate_text)))
            except ValueError:
                raise ValueError(f"schedule item {item!r} is not t_seconds:rate_rps") from None
        return cls(tuple(points))

    @classmethod
    def from_csv(cls, path: str | Path) -> RateSchedule:
        """Read the project's traffic-trace CSV: a ``t_seconds,rate_rps`` header, then rows.
        Other columns are ignored; blank lines and lines starting with ``#`` are skipped; a
        byte-order mark (a spreadsheet's UTF-8 export) is no part of the header."""
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
        reader = csv.DictReader(lines)
        fields = [name.strip() for name in reader.fieldnames or ()]
        if "t_seconds" not in fields or "rate_rps" not in fields:
            raise ValueError(f"{path}: the header must name t_seconds and rate_rps, got {fields}")
        reader.fieldnames = fields
        points: list[tuple[float, float]] = []
        for row_no, row in enumerate(reader, start=2):
            try:
                points.append((float(row["t_seconds"]), float(row["rate_rps"])))
            except (TypeError, ValueError):
                raise ValueError(f"{path}: row {row_no} is not numeric: {row}") from None
        return cls(tuple(points))

    def rate_at(self, t: float) -> float:
        rate = 0.0
        for start, r in self.points:
            if start > t:
                break
            rate = r
        return rate

    def segments(self, duration_s: float) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Segment start times within [0, duration) and their rates (a 0-rate lead-in if the
        schedule starts after 0)."""
        points = self.points if self.points[0][0] == 0 else ((0.0, 0.0), *self.points)
        kept = [(t, r) for t, r in points if t < duration_s] or [points[0]]
        starts = np.array([t for t, _ in kept], dtype=np.float64)
        rates = np.array([r for _, r in kept], dtype=np.float64)
        return starts, rates

    def expected_arrivals(self, duration_s: float) -> float:
        """The integral of the rate over [0, duration): the mean number of arrivals."""
        starts, rates = self.segments(duration_s)
        ends = np.append(starts[1:], duration_s)
        return float(np.sum(rates * (ends - starts)))

    def mean_rate(self, duration_s: float) -> float:
        return self.expected_arrivals(duration_s) / duration_s if duration_s > 0 else 0.0


def arrival_times(
    schedule: RateSchedule,
    *,
    duration_s: float,
    rng: np.random.Generator,
    process: ArrivalProcess = "poisson",
    clump: float = 1.0,
) -> np.ndarray[Any, Any]:
    """Sorted arrival offsets in [0, duration) following the schedule. With `clump` above 1
    (Poisson only), the Poisson points are clumps of a geometric number of requests of that
    mean, all sent at once: a client's fan-out, at the schedule's rate of requests.

    Works in "operational time" u = Λ(t), the integral of the rate: there a Poisson process of
    any piecewise-constant rate is a unit-rate one (its points are uniform given their count),
    and evenly spaced arrivals are u = 0, 1, 2, ...; mapping back through Λ⁻¹ is exact.
    """
    if duration_s <= 0:
        return np.empty(0, dtype=np.float64)
    starts, rates = schedule.segments(duration_s)
    ends = np.append(starts[1:], duration_s)
    cumulative = np.concatenate([[0.0], np.cumsum(rates * (ends - starts))])
    total = float(cumulative[-1])
    if total > MAX_ARRIVALS:
        raise ValueError(
            f"the schedule asks for {total:.0f} requests; at most {MAX_ARRIVALS} per run"
        )
    if clump > 1 and process != "poisson":
        raise ValueError("clumps are of Poisson arrivals")
    if process == "poisson":
        u = np.sort(rng.uniform(0.0, total / clump, size=rng.poisson(total / clump))) * clump
        if clump > 1:
            u = np.repeat(u, rng.geometric(1 / clump, size=u.shape[0]))
    elif process == "uniform":
        u = np.arange(0.0, total, 1.0)
    else:
        raise ValueError(f"unknown arrival process {process!r}")
    # cumulative[i] <= u < cumulative[i + 1] means segment i, whose rate is then > 0.
    index = np.searchsorted(cumulative, u, side="right") - 1
    times = starts[index] + (u - cumulative[index]) / rates[index]
    within: np.ndarray[Any, Any] = times[times < duration_s]
    return within
