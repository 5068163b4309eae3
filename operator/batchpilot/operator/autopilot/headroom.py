"""Headroom from the traffic's own variability: plan for the rises the error budget cannot pay for.

A replica asked for now takes traffic only after the metrics show the need and a cold start has
passed — the reaction horizon. A rise within it that the replicas in force cannot carry costs
about one horizon outside the SLA; how often the load rises, and how high, is a property of the
service's traffic, visible in its recent history. So the autopilot keeps the offered rate per
30 s over the last hour (`RateHistory`, in `status.autopilot`) and finds the *episodes* of
rising in it: runs of 30 s buckets from which the load rose by more than the growth margin
within one horizon, each with its *reach* — the highest rate it attained.

Then it weighs idle GPU-seconds against the error budget. Planning for a level L keeps enough
replicas for L now, whatever the present rate; the rises keep coming as often as they came, and
each that reaches beyond L (less what the latency headroom absorbs) costs a horizon outside the
SLA. How many will: of n episodes with k beyond L, the next one goes beyond it with a chance of
(k + 1)/(n + 1) — ranked among those seen, the next is as likely to be the highest as any, so
even the highest level seen leaves 1/(n + 1) of them uncovered (counting k/n said none would).
The level chosen is the lowest whose uncovered rises the budget can afford: their rate × the
horizon ≤ the share of time the budget still allows outside the SLA (none while it burns faster
than the objective allows or is spent; half the objective's share while untouched, the other
half a reserve). A level counts only once it recurs: bursts that come back at varying heights
are one pattern, planned for up to the highest reach where the one below came within
`RECURRING_SPREAD` of it; one step or one flash crowd beyond that is an event, and the level
stops at the second-highest reach. And only episodes that rose from about where the
load is now count: on the way down from a peak, the rises that led up to it say nothing about
the next minutes. Levels are rates, not ratios: what on/off traffic repeats is the burst's
height, whatever the quiet before it.

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
"""Fewer rise samples than this (five minutes of history) are no basis for a pattern."""
BUDGET_RESERVE = 0.5
"""The share of the error budget never planned to be spent (variance, the unforeseen)."""
RECURRING_SPREAD = 2.0
"""Reaches within this factor of one another are one pattern recurring at varying heights (the
bursts of batch jobs differ in size); one beyond twice the one below it is an event of its
own."""
GROWTH_MARGIN = 1.05
"""Plan for at least 5 % more load than seen now: traffic moves between two decisions. A rise
within the horizon beyond it starts an episode."""


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

    def rises(self, horizon_s: float) -> list[tuple[float, float, float]]:
        """For every bucket with a full horizon after it, and a bucket seen before it: (rise,
        reach, rate) — its rate, the highest rate within the horizon after it (the reach), and
        the one over the other (from at least `FLOOR_SHARE` of the peak). The first bucket seen
        (the service's first decision, the first after the operator was away, the oldest of the
        hour kept) starts no rise: what came before it is unknown, and its reading is often a
        window the traffic began inside — the mean of the load and the silence before it. A new
        service's start read as a rise, and with one later burst made two: the peak held for
        an hour."""
        ahead = max(1, math.ceil(horizon_s / BUCKET_S))
        rates = self.rates
        floor = max(1.0, FLOOR_SHARE * self.peak)
        out = []
        for i in range(1, len(rates) - ahead):
            start = rates[i]
            if start == UNSEEN or rates[i - 1] == UNSEEN:
                continue
            later = max(rates[i + 1 : i + 1 + ahead])  # UNSEEN is below every rate
            if later != UNSEEN:
                out.append((later / (start if start > floor else floor), later, start))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"last": self.last, "rps": [round(r, 1) for r in self.rates]}

    @classmethod
    def from_dict(cls, doc: Any) -> RateHistory:
        if not isinstance(doc, dict):
            return cls()
        try:
            rates = tuple(float(r) for r in doc["rps"])
            if not all(math.isfinite(r) and (r >= 0 or r == UNSEEN) for r in rates):
                return cls()  # a status edited by hand: no rate it could have measured
            return cls(int(doc["last"]), rates[-BUCKETS:])
        except (KeyError, TypeError, ValueError):
            return cls()


def episodes(rises: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """(start, reach) of each episode of rising: samples rising beyond the growth margin within
    the horizon, together until the load falls back below halfway between the episode's start
    and its reach. A ramp, or a burst that climbs in steps, is one episode however often its
    rise pauses; only a load that came back down and rose again is a second."""
    found: list[tuple[float, float]] = []
    lowest = math.inf  # the lowest rate since the last rising sample
    for rise, reach, rate in rises:
        if rise > GROWTH_MARGIN:
            if found and lowest > (found[-1][0] + found[-1][1]) / 2:
                found[-1] = (found[-1][0], max(found[-1][1], reach))
            else:
                found.append((rate, reach))
            lowest = math.inf
        else:
            lowest = min(lowest, rate)
    return found


def affordable(objective: Objective, report: SloReport) -> float:
    """The share of time the error budget can still pay for outside the SLA: none while it burns
    faster than the objective allows (over either alert's long lookback) or is spent; otherwise
    the objective's budget share times what is left of it (all of it before any verdict), less
    a reserve: a plan that expects to spend the whole budget misses the objective half the time."""
    if any(rate > 1.0 for rate in report.burn_rates.values()):
        return 0.0
    remaining = 1.0 if report.budget_remaining is None else report.budget_remaining
    return max(0.0, min(1.0, remaining)) * objective.budget * (1 - BUDGET_RESERVE)


@dataclass(frozen=True, slots=True)
class Headroom:
    rate: float
    """The rate to plan capacity for."""
    coverage: float
    """The planned rate over the rate now (1: no recurring rise planned for)."""
    note: str


def plan_rate(
    present: float,
    history: RateHistory,
    *,
    horizon_s: float,
    affordable: float,
    absorbed: Callable[[], float] = lambda: 1.0,
) -> Headroom:
    """The load to plan for: the lowest recurring level whose uncovered episodes the budget
    can afford (`affordable`: a share of time), and at least the present plus the growth margin.

    `absorbed()` is the rise the plan already survives: capacity is planned with headroom (in
    latency or in load: `capacity.replica_capacity`), so a replica carries this many times its
    planned load before the SLA itself breaks. Only the part of a reach beyond it needs replicas
    (asked only when rises recur: it costs a capacity search)."""
    least = present * GROWTH_MARGIN
    rises = history.rises(horizon_s)
    # Episodes that rose from about where the load is now: on the way down from a peak, the
    # rises that led up to it say nothing about what the next minutes bring.
    reaches = [reach for start, reach in episodes(rises) if start < (present + reach) / 2]
    if len(rises) < MIN_RISES or len(reaches) < 2:
        return Headroom(least, 1.0, "")
    absorb = max(1.0, absorbed())
    # What each episode needs of the replicas in force: the latency headroom carries the rest.
    breaking = sorted(reach / absorb for reach in reaches if reach / absorb > least)
    if len(breaking) < 2:
        return Headroom(least, 1.0, "")
    per_second = 1.0 / (len(rises) * BUCKET_S)
    # The highest level that recurred: the highest reach where the one below came within
    # `RECURRING_SPREAD` of it (bursts of varying height), else the second-highest.
    top = breaking[-1] if breaking[-1] <= breaking[-2] * RECURRING_SPREAD else breaking[-2]
    level, short = top, 0.0
    for candidate in [least, *(b for b in breaking if b < top)]:
        # The chance the next rise goes beyond it, by its rank among those seen.
        beyond = (sum(1 for b in breaking if b > candidate) + 1) / (len(breaking) + 1)
        cost = len(breaking) * beyond * per_second * horizon_s
        if cost <= affordable:
            level = candidate
            break
        short = cost
    if level <= least:
        return Headroom(least, 1.0, "")
    note = (
        f"; planning for {level:.0f} rps: the load rose {len(reaches)} times in the last hour "
        f"within {horizon_s:.0f} s (the time to notice and start a replica), "
        f"{sum(1 for b in breaking if b >= level)} of them to {level * absorb:.0f} rps or more; "
        f"planned for less, the rises to come would keep ~{short:.1%} of the time outside the "
        f"SLA, more than the error budget affords ({affordable:.2%})"
    )
    return Headroom(level, level / max(present, 1e-9), note)
