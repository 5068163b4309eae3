"""Headroom from the traffic's own variability: plan for the load the next reaction time may bring.

A replica asked for now takes traffic only after the next decision notices the need and a cold
start has passed — the reaction horizon. Capacity planned for the rate just seen is too little
whenever the load rises within that horizon, and how often and how far it rises is a property
of the service's traffic, visible in its recent history: smooth traffic rises a few per cent
within a minute, on/off traffic ten times. So the autopilot keeps the offered rate per 30 s over
the last hour (`RateHistory`, in `status.autopilot`) and plans for a high quantile of the rise
seen within one horizon (max over the next horizon / the rate at its start), applied to the rate
now — capped by the hour's peak, so that one past step does not make every later rate look six
times larger. A rise counts only once it recurs: one step or one flash crowd in the hour is an
event, two are a pattern worth paying idle replicas for.

The quantile follows the error budget (`exceedance`): rises that happened more often than the
budget allows are planned for; while the budget burns faster than allowed the plan covers rarer
rises, and while it is healthy only commoner ones. Idle GPU-seconds are bought exactly where the
objective needs them: a burst that recurs within the hour keeps its replicas through the quiet
between, one that does not is let go.

Pure: arithmetic on tuples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchpilot.operator.autopilot.slo import Objective, SloReport

BUCKET_S = 30.0
"""The history's resolution: the highest offered rate seen in each 30 s."""
BUCKETS = 120
"""An hour of history."""
UNSEEN = -1.0
"""A bucket no decision saw (the operator was down)."""
FLOOR_SHARE = 0.05
"""Rises are measured from at least this share of the hour's peak: from an idle minute the
ratio is unbounded, while what matters is the load the next minutes bring."""
MIN_RISES = 10
"""Fewer rise samples than this (five minutes of history) are no basis for a quantile."""
GROWTH_MARGIN = 1.05
"""Plan for at least 5 % more load than seen now: traffic moves between two decisions."""
BURNING_FACTOR = 0.25
"""While the budget burns faster than allowed, plan for rises this many times rarer."""
HEALTHY_FACTOR = 10.0
"""While over half the budget is left and it burns no faster than allowed, plan only for rises
this many times commoner than the budget."""


@dataclass(frozen=True, slots=True)
class RateHistory:
    """The highest offered rate per `BUCKET_S` for the newest `BUCKETS` buckets, oldest first,
    the newest being bucket number `last` (bucket k covers [k·30 s, (k+1)·30 s))."""

    last: int = 0
    rates: tuple[float, ...] = ()

    def add(self, now: float, rate: float) -> RateHistory:
        index = math.floor(now / BUCKET_S)
        rates = list(self.rates)
        if not rates or index > self.last:
            gap = min(BUCKETS, index - self.last) if rates else 1
            rates += [UNSEEN] * (gap - 1) + [rate]
            return RateHistory(index, tuple(rates[-BUCKETS:]))
        rates[-1] = max(rates[-1], rate)
        return RateHistory(self.last, tuple(rates))

    @property
    def peak(self) -> float:
        return max(self.rates, default=0.0)

    def recurring_rise(self, horizon_s: float, quantile: float) -> float:
        """The `quantile` of the rises within `horizon_s`, but no higher than the second-highest
        episode of rising (a run of buckets whose rise exceeds the growth margin): a rise that
        happened once in the hour is an event, not yet a pattern; twice, it recurs. 1.0 with
        too little history to tell."""
        rises = self.rises(horizon_s)
        if len(rises) < MIN_RISES:
            return 1.0
        ranked = sorted(rises)
        at_quantile = ranked[min(len(ranked) - 1, math.ceil(quantile * len(ranked)) - 1)]
        peaks: list[float] = []
        running = False
        for rise in rises:
            if rise > GROWTH_MARGIN:
                if running:
                    peaks[-1] = max(peaks[-1], rise)
                else:
                    peaks.append(rise)
                running = True
            else:
                running = False
        recurring = sorted(peaks)[-2] if len(peaks) >= 2 else 1.0
        return max(1.0, min(at_quantile, recurring))

    def rises(self, horizon_s: float) -> list[float]:
        """For every bucket with a full horizon after it: the highest rate within the horizon
        after it over its own rate (from at least `FLOOR_SHARE` of the peak)."""
        ahead = max(1, math.ceil(horizon_s / BUCKET_S))
        rates = self.rates
        floor = max(1.0, FLOOR_SHARE * self.peak)
        out = []
        for i in range(len(rates) - ahead):
            start = rates[i]
            if start == UNSEEN:
                continue
            later = max(rates[i + 1 : i + 1 + ahead])  # UNSEEN is below every rate
            if later != UNSEEN:
                out.append(later / (start if start > floor else floor))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"last": self.last, "rps": [round(r, 1) for r in self.rates]}

    @classmethod
    def from_dict(cls, doc: Any) -> RateHistory:
        if not isinstance(doc, dict):
            return cls()
        try:
            rates = tuple(float(r) for r in doc["rps"])
            return cls(int(doc["last"]), rates[-BUCKETS:])
        except (KeyError, TypeError, ValueError):
            return cls()


def exceedance(objective: Objective, report: SloReport) -> float:
    """How often a rise may outrun the plan: the objective's budget share, less while the
    budget burns faster than allowed (or is spent), more while it is healthy."""
    base = objective.budget
    burning = any(rate > 1.0 for rate in report.burn_rates.values())
    remaining = report.budget_remaining
    if burning or (remaining is not None and remaining < 0):
        return base * BURNING_FACTOR
    if remaining is not None and remaining > 0.5:
        return min(0.5, base * HEALTHY_FACTOR)
    return base


@dataclass(frozen=True, slots=True)
class Headroom:
    rate: float
    """The rate to plan capacity for."""
    rise: float
    """The quantile of the rises within one horizon (1: none learned)."""
    quantile: float
    note: str


def plan_rate(
    present: float,
    history: RateHistory,
    *,
    horizon_s: float,
    exceedance: float,
    absorbed: Callable[[], float] = lambda: 1.0,
) -> Headroom:
    """The load to plan for: `present` times the (1 − exceedance) quantile of the rises within
    `horizon_s` that recur (`RateHistory.recurring_rise`), at most the hour's peak (or the
    present) plus the growth margin, at least the present plus it.

    `absorbed()` is the rise the plan already survives: capacity is planned for a P99 below the
    SLA (`SLA_HEADROOM`), so a replica carries this many times its planned load before the SLA
    itself breaks. Only the part of a rise beyond it needs replicas (asked only when a rise
    beyond the growth margin is to be planned for: it costs a capacity search)."""
    quantile = 1.0 - exceedance
    least = present * GROWTH_MARGIN
    rise = history.recurring_rise(horizon_s, quantile)
    base = max(present, FLOOR_SHARE * history.peak)
    ceiling = max(history.peak, present) * GROWTH_MARGIN
    if base * rise <= least:
        return Headroom(least, rise, quantile, "")
    rate = max(least, min(base * rise / max(1.0, absorbed()), ceiling))
    note = ""
    if rate > least:
        note = (
            f"; planning for {rate:.0f} rps: in the last hour the load rose {rise:.2f}× within "
            f"{horizon_s:.0f} s (the time to notice and start a replica) more than once and "
            f"more often than {exceedance:.1%} of the time"
        )
    return Headroom(rate, rise, quantile, note)
