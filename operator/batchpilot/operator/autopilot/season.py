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
all of them is a pattern; and only a *rise*, a look-ahead peak well above that period's rate at
this time (`RISE`): a burst already under way then is not one the next minutes bring (today's
reaction already sees it, if it is here), and counting it would let two days' unrelated bursts
that merely overlap pass for a pattern. A period that does not answer (not enough history yet)
means no forecast at all.

Pure: arithmetic on the numbers the observer read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batchpilot.operator.autopilot.observation import PastPeriod

LEVEL_FLOOR_QPS = 1.0
"""Levels below this are taken as this: between idle hours the ratio says nothing."""
RISE = 1.25
"""A look-ahead peak counts as a rise from this many times the rate at this time, then: about
what the latency headroom absorbs without a new replica (capacity is planned for 0.8 of the
SLA), so smaller rises need no forecast."""
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
    level (`level_qps`: today's median one-minute arrival rate over the level window); None
    without a level today, without past periods, or unless every one of them rose."""
    if level_qps is None or not past:
        return None
    today = max(level_qps, LEVEL_FLOOR_QPS)
    if any(p.ahead_qps <= RISE * max(p.then_qps, LEVEL_FLOOR_QPS) for p in past):
        return None  # some period did not rise at this time: no pattern
    best: Forecast | None = None
    for period in past:
        scale = min(MAX_LEVEL_SCALE, today / max(period.level_qps, LEVEL_FLOOR_QPS))
        rate = period.ahead_qps * scale
        if best is None or rate < best.rate:
            best = Forecast(rate=rate, periods=len(past), scale=scale)
    return best
