"""A daily pattern as a forecast floor: the rise that came at this time on each of the last days.

The headroom (`headroom.py`) learns how the load rises from the last hour, so it cannot see a
rise that happens once a day — the 09:00 batch job, the evening peak's first minutes — until it
has cost a reaction horizon outside the SLA. Prometheus remembers yesterday: the arrival rate
in the minutes after this time one period ago (`PastPeriod.ahead_qps`, the highest one-minute
rate in the look-ahead) is a forecast of the next minutes, once it is scaled to today's traffic.

Scaled by level, not by the rate of this minute: each past period's hour before this time is
compared with today's (`level_qps`: the median one-minute rate over the hour, which a burst in
it does not move), so a quieter Sunday forecasts a quieter peak, and a rise that came a few
minutes earlier today than yesterday is not counted twice (a ratio of this minute's rates would
multiply it). Only a rise every past period shows counts — the lowest of
their forecasts is the floor: one period's flash crowd is an event, a rise at the same time in
all of them is a pattern. A period that does not answer (not enough history yet) means no
forecast at all.

Pure: arithmetic on the numbers the observer read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batchpilot.operator.autopilot.observation import PastPeriod

LEVEL_FLOOR_QPS = 1.0
"""Levels below this are taken as this: between idle hours the ratio says nothing."""
MAX_LEVEL_SCALE = 2.0
"""Today's traffic at most this many times a past period's: a jump in level is not a season,
and the forecast it would scale is a floor the autopilot pays replicas for."""


@dataclass(frozen=True, slots=True)
class Forecast:
    rate: float
    """The floor to plan capacity for: the lowest past period's look-ahead peak, scaled."""
    periods: int
    scale: float
    """Today's level over that period's (clamped)."""


def seasonal_forecast(level_qps: float | None, past: Sequence[PastPeriod]) -> Forecast | None:
    """The load the next minutes bring if today repeats every past period, scaled to today's
    level (`level_qps`: today's mean arrival rate over the level window); None without a level
    today or without past periods."""
    if level_qps is None or not past:
        return None
    today = max(level_qps, LEVEL_FLOOR_QPS)
    best: Forecast | None = None
    for period in past:
        scale = min(MAX_LEVEL_SCALE, today / max(period.level_qps, LEVEL_FLOOR_QPS))
        rate = period.ahead_qps * scale
        if best is None or rate < best.rate:
            best = Forecast(rate=rate, periods=len(past), scale=scale)
    return best
