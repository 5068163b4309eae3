"""The ceiling: what the feedback guard found, remembered.

When the guard (`feedback.overruled`) adds replicas because the window missed the SLA where the
model said the replicas in force carried the load, the model is wrong about this traffic — most
often load it does not see: spikes of a second that recur within every window, which no rate
averaged over seconds shows. Left alone, the plan would ask for the same replicas again at the
next quiet scale-down, and the service would miss again until the guard found it again: out and
in the SLA every few minutes. So the load per replica at which the SLA was missed becomes a
ceiling that plans keep below, for as long as the traffic can be expected to keep its shape.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

CEILING_MEMORY_S = 3600.0
"""How long a ceiling found by the guard stands (unless found again, or disproved): the guard's
evidence is the load the model does not see, which lasts as long as the traffic keeps its shape;
an hour is the objective's usual window, and the rate history's span."""
CEILING_MARGIN = 0.95
"""Plans keep a replica's load this far below the load at which the SLA was missed."""
FEEDBACK_STEP = 0.25
"""On feedback the guard adds this fraction of the replicas (at least one); a ceiling asks for no
more than the replicas that missed and one such step: what the guard found, kept, never more (a
ceiling read from a window of a few requests asked for eight replicas where one carried 3 rps)."""
EVIDENCE_REQUESTS = 1000
"""A window of fewer offered requests finds no ceiling (the guard still acts on it): its share
refused is a handful of requests, which a spike at its edge leaves in flight (at 2 rps, 7 of 120
read "6% refused" and held a second replica for the hour), where 1 % of a thousand is ten."""


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The load per replica at which the guard found the SLA missed with `replicas` serving (the
    model said they carried it), and when. Plans of as many replicas or fewer keep each below
    it; a window inside the SLA at that load or more per replica, on as few, disproves it."""

    at: float
    replicas: int
    rps_per_replica: float

    def stands(self, now: float) -> bool:
        return now - self.at < CEILING_MEMORY_S

    def floor(self, rate: float, planned: int) -> int:
        """The replicas for `rate` where the plan asks for `planned`: enough to keep each below
        the ceiling, where the plan would run as many replicas as missed or fewer. A plan for
        more is left alone: more replicas split the load's clumps and each one's noise between
        them, and the miss says nothing of them (a miss at one replica is no ceiling for eight)."""
        if planned > self.replicas:
            return planned
        kept = math.ceil(rate / (self.rps_per_replica * CEILING_MARGIN))
        return max(planned, min(kept, step_up(self.replicas)))


def step_up(replicas: int) -> int:
    """The replicas the guard asks for where `replicas` missed."""
    return replicas + max(1, math.ceil(FEEDBACK_STEP * replicas))


def found_ceiling(offered: float, *, serving: int, window_s: float, now: float) -> Ceiling | None:
    """The ceiling the guard found overruling the plan with `serving` replicas at `offered` rps
    over a window of `window_s` (it replaces any standing: the latest evidence); None where the
    window held fewer than `EVIDENCE_REQUESTS`."""
    if serving <= 0 or offered * window_s < EVIDENCE_REQUESTS:
        return None
    return Ceiling(now, serving, offered / serving)


def kept_ceiling(
    ceiling: Ceiling | None,
    *,
    sla_met: bool | None,
    settled: bool,
    offered: float,
    ready: int,
    now: float,
    replaced_since: Callable[[float], bool] = lambda _: False,
) -> Ceiling | None:
    """The ceiling still standing: None once its time is out; once a settled window inside
    the SLA carried as much per replica on as few replicas (the traffic no longer has what the
    guard saw); or once a slow replica was replaced since it was found (`replaced_since`): the
    miss may have been the straggler's, which no longer serves. (A fit that runs faster again is
    no such sign: a throttle that recurs every few minutes on every replica shows as one, and
    lifting the ceiling then brought the misses back.)"""
    if ceiling is None or not ceiling.stands(now):
        return None
    if replaced_since(ceiling.at):
        return None
    if (
        sla_met
        and settled
        and 0 < ready <= ceiling.replicas
        and offered / ready >= ceiling.rps_per_replica
    ):
        return None
    return ceiling
