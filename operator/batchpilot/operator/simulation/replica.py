"""One replica's batch loop as a sequence of events — the queueing core of the simulator.

It follows the runtime's batcher (`batchpilot.runtime.batching`) rule for rule, for requests of
one row each: a batch starts with the oldest waiting request and dispatches as soon as it holds
`max_batch` requests or the oldest has waited `delay_s`, but never before the device is free
(one batch at a time); a request that finds `capacity` requests waiting is shed (503). Settings
are read once per batch, so the cluster may change them between calls.

Nothing ticks. Each batch costs a handful of operations on one sorted list of arrival times: its
dispatch time is the latest of "device free", "oldest arrival" and the earlier of "the batch is
full" (an index into the list) and "the oldest has waited long enough". Between two dispatches
the queue only grows, so shedding is exact too: of the arrivals between two dispatches, the
first ones up to the queue's free space get in, the rest are shed. Per-request work (latencies,
histograms) is left to the caller, vectorised over the batches this returns.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True, slots=True)
class Served:
    """What a replica did during one call: its batches, and the requests in them, in order."""

    dispatched_at: FloatArray
    """Start of each batch on the device."""
    sizes: IntArray
    """Requests in each batch."""
    arrivals: FloatArray
    """Arrival time of every request in those batches, batch by batch (FIFO)."""
    shed: int
    """Requests refused because the queue was full."""

    @property
    def batches(self) -> int:
        return int(self.sizes.shape[0])


class Replica:
    """A server: a bounded FIFO queue in front of one device that runs one batch at a time."""

    __slots__ = ("_queue", "alpha_s", "beta_s", "capacity", "delay_s", "free_at", "max_batch")

    def __init__(
        self,
        *,
        alpha_s: float,
        beta_s: float,
        max_batch: int,
        delay_s: float,
        capacity: int = 1024,
        start: float = 0.0,
    ) -> None:
        if capacity < 1 or max_batch < 1:
            raise ValueError("capacity and max_batch must be at least 1")
        self.alpha_s = alpha_s
        self.beta_s = beta_s
        self.max_batch = max_batch
        self.delay_s = delay_s
        self.capacity = capacity
        self.free_at = start
        """When the device finishes its current batch."""
        self._queue: list[float] = []
        """Arrival times of the requests waiting, oldest first."""

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def idle_at(self, t: float) -> bool:
        """Nothing queued and nothing running at time t."""
        return self.waiting == 0 and self.free_at <= t

    def serve(self, arrivals: list[float], *, since: float, until: float) -> Served:
        """Admit `arrivals` (sorted, all in [since, until)) and run every batch that dispatches
        before `until`. Batches dispatching later wait for the next call, which may bring more
        arrivals and new settings; no batch dispatches before `since` (settings read then)."""
        # One list: the requests still queued, then the new arrivals. [head, pos) is the queue,
        # [pos, n) the arrivals not yet admitted.
        line = self._queue + arrivals if self._queue else arrivals[:]
        alpha, beta = self.alpha_s, self.beta_s
        capacity = self.capacity
        limit, delay = min(self.max_batch, capacity), self.delay_s
        free = self.free_at
        n = len(line)
        head = 0
        pos = len(self._queue)
        shed = 0
        dispatched: list[float] = []
        sizes: list[int] = []
        # Every pass but the last dispatches at least one request: this many passes suffice.
        for _ in range(n + 1):
            if head == pos:
                if pos >= n:
                    break
                pos += 1  # an empty queue always has room
            oldest = line[head]
            start = free if free > oldest else oldest
            if start < since:
                start = since
            if pos - head >= limit:
                dispatch = start
            else:
                # Full when the limit-th request from the oldest arrives (it finds room: the
                # queue is shorter than the limit), or the oldest has waited long enough.
                ready = oldest + delay
                fill = head + limit - 1
                if fill < n and line[fill] < ready:
                    ready = line[fill]
                dispatch = start if start > ready else ready
            if dispatch >= until:
                break
            if pos < n and line[pos] <= dispatch:
                arrived = bisect_right(line, dispatch, pos, n)
                if arrived - head > capacity:  # between two dispatches the queue only grows
                    keep = head + capacity
                    shed += arrived - keep
                    del line[keep:arrived]
                    n -= arrived - keep
                    arrived = keep
                pos = arrived
            size = pos - head
            if size > limit:
                size = limit
            head += size
            dispatched.append(dispatch)
            sizes.append(size)
            free = dispatch + alpha + beta * size
        else:
            raise AssertionError("the batch loop did not terminate")  # pragma: no cover
        if n - head > capacity:  # no dispatch before `until`: the rest queue up, if there is room
            shed += n - head - capacity
            del line[head + capacity :]
        self._queue = line[head:]
        self.free_at = free
        return Served(
            dispatched_at=np.array(dispatched, dtype=np.float64),
            sizes=np.array(sizes, dtype=np.int64),
            arrivals=np.array(line[:head], dtype=np.float64),
            shed=shed,
        )
