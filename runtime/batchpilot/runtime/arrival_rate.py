"""The arrival rate of the last few seconds, and how its arrivals clump, exported as gauges
read at each scrape.

The arrival counter tells Prometheus how many requests came between two scrapes; a step in the
load shows in its rate averaged with what came before it. This keeps the arrivals of the last
`span_s` seconds in buckets of `bucket_s` (a ring: one integer add per arrival, a sum over the
buckets per scrape), so the scrape reads the rate of the last seconds only
(`batchpilot.api.arrivals`).

`ArrivalDispersion` counts the same arrivals in slots of a hundredth of a second: the variance
of a slot's count over its mean is 1 for Poisson arrivals and grows with the requests that come
together (a client's fan-out, a gateway that forwards in bursts), which queue behind each other
where Poisson arrivals of the same rate would not (`batchpilot.api.arrivals`).

`ArrivalSeconds` counts them per second and sums the squares of the seconds that ended: the
rate the arrivals met, as opposed to the window's mean (`batchpilot.api.arrivals`).

Pure: the clock is an argument.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from batchpilot.api.arrivals import (
    DISPERSION_SLOT_S,
    DISPERSION_SPAN_S,
    RECENT_ARRIVALS_S,
    SECOND_SQUARES_SLOT_S,
)


class _Slots:
    """Arrival counts per time slot for the last `span_s` seconds: a ring of places, each
    stamped with the slot it counts and restarted when a later slot comes to it."""

    def __init__(
        self, *, span_s: float, slot_s: float, clock: Callable[[], float], name: str
    ) -> None:
        if not 0 < slot_s < span_s:
            raise ValueError(f"need 0 < {name} < span_s, got {slot_s} and {span_s}")
        self.slot_s = slot_s
        self.size = math.ceil(span_s / slot_s)
        self._counts = [0] * self.size
        self._stamps = [-1] * self.size
        """The slot number each place counts (-1: none yet)."""
        self.clock = clock

    def add(self, count: int = 1) -> None:
        slot = int(self.clock() / self.slot_s)
        place = slot % self.size
        if self._stamps[place] != slot:
            self._stamps[place] = slot
            self._counts[place] = 0
        self._counts[place] += count

    def counts(self, oldest: int, newest: int) -> Iterator[int]:
        """The counts of the slots from `oldest` to `newest`, both included, that had an
        arrival (the others counted none)."""
        for count, stamp in zip(self._counts, self._stamps, strict=True):
            if oldest <= stamp <= newest:
                yield count


class RecentArrivals:
    """Arrivals per second over the last `span_s` seconds (over the time since the start, where
    that is shorter), to a bucket's precision."""

    def __init__(
        self,
        *,
        span_s: float = RECENT_ARRIVALS_S,
        bucket_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._buckets = _Slots(span_s=span_s, slot_s=bucket_s, clock=clock, name="bucket_s")
        self._started = clock()

    def arrived(self, count: int = 1) -> None:
        self._buckets.add(count)

    def rate(self) -> float:
        """Arrivals per second over the last `span_s` seconds: the current bucket, part gone,
        and the full ones before it."""
        buckets = self._buckets
        now = buckets.clock()
        bucket = int(now / buckets.slot_s)
        total = sum(buckets.counts(bucket - buckets.size + 1, bucket))
        covered = (buckets.size - 1) * buckets.slot_s + (now - bucket * buckets.slot_s)
        covered = min(covered, now - self._started)
        return total / covered if covered > 0 else 0.0


class ArrivalDispersion:
    """The variance over the mean of the arrivals per `slot_s` slot, over the last `span_s`
    seconds of whole slots (since the start, where that is shorter); 1 where nothing arrived.
    One integer add per arrival; a pass over the slots per read."""

    def __init__(
        self,
        *,
        span_s: float = DISPERSION_SPAN_S,
        slot_s: float = DISPERSION_SLOT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots = _Slots(span_s=span_s, slot_s=slot_s, clock=clock, name="slot_s")
        self._first = int(clock() / slot_s) + 1
        """The first whole slot since the start."""

    def arrived(self) -> None:
        self._slots.add()

    def dispersion(self) -> float:
        """Variance over mean of the whole slots' counts (a slot no arrival stamped counts 0)."""
        slots = self._slots
        current = int(slots.clock() / slots.slot_s)
        oldest = max(current - slots.size, self._first)
        seen = current - oldest
        if seen <= 0:
            return 1.0
        total = squares = 0
        for count in slots.counts(oldest, current - 1):
            total += count
            squares += count * count
        if total == 0:
            return 1.0
        mean = total / seen
        return (squares / seen - mean * mean) / mean


class ArrivalSeconds:
    """The sum over the slots (seconds) that have ended of the arrivals in each, squared, and
    the time those slots span while the server took requests: counters. One integer add per
    arrival; the slot that is running joins once it has ended.

    `ready`: whether the server takes requests. Seconds it did not (warming up, draining, an
    engine that fails) are not counted: no request was sent to it then, and counted they would
    read as a replica idle beside busy ones — load that came unevenly. The slots since the last
    arrival or read are counted by whether it is ready at the next (within a scrape interval)."""

    def __init__(
        self,
        *,
        slot_s: float = SECOND_SQUARES_SLOT_S,
        clock: Callable[[], float] = time.monotonic,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        if slot_s <= 0:
            raise ValueError(f"need slot_s > 0, got {slot_s}")
        self._slot_s = slot_s
        self._clock = clock
        self.ready = ready
        self._slot = int(clock() / slot_s)
        self._count = 0
        self._squares = 0
        self._counted = 0

    def _roll(self) -> None:
        slot = int(self._clock() / self._slot_s)
        if slot != self._slot:
            self._squares += self._count * self._count
            if self.ready():
                self._counted += slot - self._slot
            self._slot, self._count = slot, 0

    def arrived(self) -> None:
        self._roll()
        self._count += 1

    def squares(self) -> int:
        """Σ over the ended slots of their arrivals squared."""
        self._roll()
        return self._squares

    def seconds(self) -> float:
        """The seconds the ended slots span while the server was ready, since the start."""
        self._roll()
        return self._counted * self._slot_s
