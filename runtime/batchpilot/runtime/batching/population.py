"""How many requests the server has recently held at once, so that a batch stops waiting for
requests nobody is going to send.

A batch waits up to the queue delay for more requests to join it. Against clients that send
their next request only once the last is answered — a pool of N workers, a service calling in
a loop, Triton's perf_analyzer at concurrency N — nobody joins once all N are queued: without
this, every batch of such a closed loop waits out the whole delay (5 ms a request at
concurrency 1 to 7 on the MLP: 90 % of its time in the server). The queue counts its
*outstanding* requests (queued or in a running batch) and remembers the most it has held at
once within a horizon; where the outstanding requests are again as many as that, and that many
was seen before, everyone who has been here at once is here now, and the batch starts.

Traffic that arrives on its own clock (open loop) rarely brings the outstanding count back to
the most it has been within the horizon while a batch fills, so it waits as before; a first
request, or a count never seen before (a rising load), always waits: one sighting is no
pattern. A population that shrinks is forgotten once a smaller count has come back
`SETTLED_REACHES` times without the larger one showing (a closed loop right after a burst: tens
of milliseconds, not the horizon), and within the horizon in any case. Pure: no I/O, times from
the caller.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

HORIZON_S = 5.0
"""How long the most requests held at once is remembered after it was last seen."""
SETTLED_REACHES = 8
"""How often a smaller count must come back, the larger ones not showing in between, before
those are forgotten: a closed loop of N reaches N once a round, every round; arrivals on their
own clock rarely reach one count this often with nothing above it in between (for a count in
the upper tail of what a batch gathers, the chance is the share of its rounds that stop at it
to the power of this)."""


@dataclass(slots=True)
class _Level:
    value: int
    seen_at: float
    """When this many were last held at once."""
    times: int
    """How often this many were reached while remembered (a reach: the count rose to it)."""


class Population:
    """The most requests held at once within `horizon_s`, and how often it was reached: a
    sliding maximum (levels kept decreasing in value, increasing in time)."""

    def __init__(
        self, *, horizon_s: float = HORIZON_S, settled_reaches: int = SETTLED_REACHES
    ) -> None:
        self._horizon_s = horizon_s
        self._settled_reaches = settled_reaches
        self._levels: deque[_Level] = deque()

    def reached(self, count: int, now: float) -> None:
        """The outstanding requests rose to `count` (one arrived)."""
        levels = self._levels
        while levels and levels[-1].value < count:
            levels.pop()
        if levels and levels[-1].value == count:
            level = levels[-1]
            level.seen_at = now
            level.times += 1
            if level.times >= self._settled_reaches:
                # Every larger count was last seen before this one began to come back, and it
                # has come back often since: the population is this many now.
                while len(levels) > 1:
                    levels.popleft()
        else:
            levels.append(_Level(count, now, 1))

    def everyone_here(self, count: int, now: float) -> bool:
        """Whether `count` outstanding requests are as many as the most held at once within the
        horizon, and that many were held at least twice: nobody else is expected to come."""
        levels = self._levels
        while levels and levels[0].seen_at < now - self._horizon_s:
            levels.popleft()
        if not levels:
            return False
        peak = levels[0]
        return count >= peak.value and peak.times >= 2
