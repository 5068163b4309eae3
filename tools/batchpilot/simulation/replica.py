"""One replica's batch loop as a sequence of events — the queueing core of the simulator.

It follows the runtime's batcher (`batchpilot.runtime.batching`) rule for rule, for requests of
one row each: a batch starts with the oldest waiting request and dispatches as soon as it holds
`max_batch` requests or the oldest has waited `delay_s`, but never before the device is free
(one batch at a time). Settings are read once per batch, so the cluster may change them between
calls.

Admission happens at arrival, as in the runtime's queue (`batchpilot.runtime.admission`):

- with a deadline (`deadline_s`, the runtime's default deadline), a request is refused (503,
  `predicted_late`) when its predicted finish is later than its arrival plus the deadline. The
  prediction is the runtime's: the time the device is still busy with the batch it runs, plus
  full batches for the rows queued ahead, plus its own batch — here with the true t(b) = α + β·b,
  so the simulated runtime predicts as well as a runtime whose fit has converged (no spread, no
  lateness margin, no probes);
- whatever the deadline, a request that finds `capacity` requests waiting is shed (503,
  `queue_full`): the last resort, and the only rule without a deadline.

With a deadline and a burst size (`burst`, the runtime's `burstBatchSize`), a backlog of more
than `max_batch` requests runs in one batch, as the runtime's queue forms it — where α ≥ β ·
`max_batch`, or where batches of the limit would make the youngest waiting request, or the first
one a batch of the limit leaves behind, late: every waiting request up to `burst`, no more than
lets the oldest finish in time (never fewer than the limit). Admission predicts as the
runtime's does: a request is in time if batches of the limit serve it in time, or if batches of
`burst` do and the oldest waiting would still finish in time behind them all (the runtime's
stand-in for "the batch can take it").

A batch may take longer or shorter than t(b) (`cv`: a log-normal factor of mean 1 on each, as
a real device's batches vary, `Variation`); admission still predicts with t(b), as the runtime
predicts with its mean, and knows when the batch in flight ends.

Not modelled: the batcher's own use of deadlines otherwise (a batch dispatched early, or capped
below the limit, so that its oldest request stays in time) and expiry in the queue. An admitted
request whose batch then waits out the queue delay, or grows past the size predicted for it, may
finish a few milliseconds past its deadline; it is served all the same. Under a backlog batches are
full and dispatch at once, so the prediction is exact.

Nothing ticks. Each batch costs a handful of operations on the sorted arrival times: its
dispatch time is the latest of "device free", "oldest arrival" and the earlier of "the batch is
full" and "the oldest has waited long enough". Between two dispatches the device's busy time and
the queue ahead change only by arrivals, so admission is decided for runs of arrivals at once:
with `w` requests waiting, every arrival is admitted while the device's remaining busy time
leaves room for `w + 1` rows within the deadline, refused before the moment it does — a bisect
finds that moment. Per-request work (latencies, histograms) is left to the caller, vectorised
over the batches this returns.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


def _no_times() -> FloatArray:
    return np.empty(0, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Served:
    """What a replica did during one call: its batches, the requests in them in order, and the
    requests it refused at arrival."""

    dispatched_at: FloatArray
    """Start of each batch on the device."""
    sizes: IntArray
    """Requests in each batch."""
    arrivals: FloatArray
    """Arrival time of every request in those batches, batch by batch (FIFO)."""
    seconds: FloatArray
    """Each batch's time on the device: t(b), times its draw of the variation where there is
    one."""
    shed_at: FloatArray = field(default_factory=_no_times)
    """Arrival times of the requests shed because the queue was full."""
    refused_at: FloatArray = field(default_factory=_no_times)
    """Arrival times of the requests refused as predicted to finish after their deadline."""
    rows: IntArray | None = None
    """Rows in each batch, where requests bring varied rows (`sized.SizedReplica`); None:
    `sizes` times the rows every request brings."""

    @property
    def batches(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def shed(self) -> int:
        return int(self.shed_at.shape[0])

    @property
    def refused(self) -> int:
        return int(self.refused_at.shape[0])


class Replica:
    """A server: an admission check and a bounded FIFO queue in front of one device that runs one
    batch at a time."""

    __slots__ = (
        "_queue",
        "_variation",
        "alpha_s",
        "beta_s",
        "burst",
        "capacity",
        "deadline_s",
        "delay_s",
        "free_at",
        "max_batch",
    )

    def __init__(
        self,
        *,
        alpha_s: float,
        beta_s: float,
        max_batch: int,
        delay_s: float,
        capacity: int = 1024,
        deadline_s: float | None = None,
        burst: int | None = None,
        start: float = 0.0,
        cv: float = 0.0,
        seed: int = 0,
    ) -> None:
        if capacity < 1 or max_batch < 1:
            raise ValueError("capacity and max_batch must be at least 1")
        if cv < 0:
            raise ValueError("the compute time's coefficient of variation must not be negative")
        self.burst = burst
        """The most requests a backlog's batch may take (with a deadline); None: the limit."""
        self.alpha_s = alpha_s
        self.beta_s = beta_s
        self.max_batch = max_batch
        self.delay_s = delay_s
        self.capacity = capacity
        self.deadline_s = deadline_s
        """Refuse at arrival what would finish later than this after arriving; None: never."""
        self.free_at = start
        """When the device finishes its current batch."""
        self._queue: list[float] = []
        """Arrival times of the requests waiting, oldest first."""
        self._variation = Variation(cv, seed) if cv > 0 else None
        """Each batch's time is t(b) times a draw of this (mean 1); None: exactly t(b)."""

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def idle_at(self, t: float) -> bool:
        """Nothing queued and nothing running at time t."""
        return self.waiting == 0 and self.free_at <= t

    def serve(self, arrivals: list[float], *, since: float, until: float) -> Served:
        """Admit or refuse `arrivals` (sorted, all in [since, until)) and run every batch that
        dispatches before `until`. Batches dispatching later wait for the next call, which may
        bring more arrivals and new settings; no batch dispatches before `since` (settings read
        then)."""
        # `queue` holds the admitted requests: [0, head) dispatched by this call, [head, end)
        # waiting. `arrivals[pos:]` have not arrived yet at the point the loop has reached.
        queue = self._queue
        head = 0
        pos = 0
        n = len(arrivals)
        alpha, beta = self.alpha_s, self.beta_s
        capacity = self.capacity
        limit, delay = min(self.max_batch, capacity), self.delay_s
        deadline = self.deadline_s
        # Batches of `reach` under a backlog: the limit, or the burst size where it grows them.
        reach, due = limit, 0.0
        if deadline is not None and self.burst is not None and self.burst > limit:
            reach, due = min(self.burst, capacity), deadline
        full_s = alpha + beta * limit
        # Up to this many waiting, an arrival is admitted whatever the device is running: the
        # common case takes no arithmetic. The device is busy for at most a full batch ahead of
        # an arrival (one batch at a time, of `reach` at most), or what remains of the last
        # call's, if longer.
        busiest = max(alpha + beta * reach, self.free_at - since)
        safe = (
            capacity
            if deadline is None
            else min(capacity, rows_within(deadline - busiest, alpha, beta, limit, full_s))
        )
        free = self.free_at
        dispatched: list[float] = []
        sizes: list[int] = []
        seconds: list[float] = []
        variation = self._variation

        gate = _Gate(
            arrivals,
            queue,
            capacity=capacity,
            deadline=deadline,
            alpha=alpha,
            beta=beta,
            limit=limit,
            reach=reach,
        )

        # Every pass but the last dispatches at least one request: this many passes suffice.
        for _ in range(len(queue) + n + 1):
            waiting = len(queue) - head
            if waiting == 0:
                if pos >= n:
                    break
                first = arrivals[pos]
                if (
                    safe >= 1
                    or deadline is None
                    or (free - first if free > first else 0.0) + alpha + beta <= deadline
                ):
                    queue.append(first)  # an empty queue always has room
                    pos += 1
                else:
                    pos = gate.admit(pos, n, 1, head=head, free=free)
                    if len(queue) == head:
                        break
                waiting = 1
            oldest = queue[head]
            start = free if free > oldest else oldest
            if start < since:
                start = since
            # The dispatch if every arrival until then is admitted: full when the limit-th
            # request from the oldest arrives, or when the oldest has waited long enough.
            if waiting >= limit:
                dispatch = start
            else:
                ready = oldest + delay
                fill = pos + limit - 1 - waiting
                if fill < n and arrivals[fill] < ready:
                    ready = arrivals[fill]
                dispatch = start if start > ready else ready
            if pos < n and arrivals[pos] <= dispatch:
                arrived = bisect_right(arrivals, dispatch, pos, n)
                # The last of them finds the longest queue; the first, the longest busy time.
                first = arrivals[pos]
                total = waiting + arrived - pos
                if total > safe and (
                    total > capacity
                    or (
                        deadline is not None
                        and (free - first if free > first else 0.0)
                        + finish_s(total, alpha, beta, limit, full_s)
                        > deadline
                    )
                ):
                    # Some are refused, which may delay the dispatch: admit one by one.
                    if waiting < limit:
                        ready = oldest + delay
                        stop = bisect_right(arrivals, ready, pos, n)
                        pos = gate.admit(pos, stop, limit - waiting, head=head, free=free)
                        if len(queue) - head >= limit:
                            ready = queue[head + limit - 1]
                        dispatch = start if start > ready else ready
                    arrived = bisect_right(arrivals, dispatch, pos, n)
                    if dispatch < until:
                        pos = gate.admit(pos, arrived, n, head=head, free=free)
                elif dispatch < until:
                    queue.extend(arrivals[pos:arrived])
                    pos = arrived
            if dispatch >= until:
                break
            size = len(queue) - head
            if size > limit:
                # A backlog: one batch of it, up to the burst size, its oldest still in time.
                most = limit
                if reach > limit and (
                    alpha >= beta * limit
                    or dispatch + 2 * full_s > queue[head + limit] + due
                    or dispatch + -(-size // limit) * full_s > queue[-1] + due
                ):
                    room = queue[head] + due - dispatch - alpha
                    most = min(reach, max(limit, int(room / beta) if beta > 0 else reach))
                size = min(size, most)
            head += size
            dispatched.append(dispatch)
            sizes.append(size)
            took = alpha + beta * size
            if variation is not None:
                took *= variation.draw()
            seconds.append(took)
            free = dispatch + took
        else:
            raise AssertionError("the batch loop did not terminate")  # pragma: no cover
        gate.admit(pos, n, n, head=head, free=free)  # no dispatch before `until`
        self._queue = queue[head:]
        self.free_at = free
        return Served(
            dispatched_at=np.array(dispatched, dtype=np.float64),
            sizes=np.array(sizes, dtype=np.int64),
            arrivals=np.array(queue[:head], dtype=np.float64),
            seconds=np.array(seconds, dtype=np.float64),
            shed_at=np.array(gate.shed_at, dtype=np.float64),
            refused_at=np.array(gate.refused_at, dtype=np.float64),
        )


class Variation:
    """A batch's time on a real device varies around t(b): kernels contend for memory
    bandwidth, the host thread that launches them is descheduled, clocks move with temperature.
    Each batch draws a factor of mean 1 and coefficient of variation `cv` from a log-normal
    distribution (a right tail: a batch can take twice as long, never no time), independent of
    the others; drawn in blocks, from the replica's own seed."""

    __slots__ = ("_block", "_next", "_rng", "_sigma")

    BLOCK = 1024

    def __init__(self, cv: float, seed: int) -> None:
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._rng = np.random.default_rng(seed)
        self._block: list[float] = []
        self._next = 0

    def draw(self) -> float:
        if self._next >= len(self._block):
            sigma = self._sigma
            self._block = self._rng.lognormal(-sigma * sigma / 2, sigma, self.BLOCK).tolist()
            self._next = 0
        factor = self._block[self._next]
        self._next += 1
        return factor


class _Gate:
    """Admission at arrival, for runs of arrivals between two dispatches (the device busy until
    `free`, the queue holding `queue[head:]`): the runtime's deadline check, then the bounded
    queue."""

    __slots__ = (
        "alpha",
        "arrivals",
        "beta",
        "capacity",
        "deadline",
        "full_s",
        "limit",
        "queue",
        "reach",
        "reach_s",
        "refused_at",
        "shed_at",
    )

    def __init__(
        self,
        arrivals: list[float],
        queue: list[float],
        *,
        capacity: int,
        deadline: float | None,
        alpha: float,
        beta: float,
        limit: int,
        reach: int,
    ) -> None:
        self.arrivals = arrivals
        self.queue = queue
        self.capacity = capacity
        self.deadline = deadline
        self.alpha = alpha
        self.beta = beta
        self.limit = limit
        self.reach = reach
        self.reach_s = alpha + beta * reach
        self.full_s = alpha + beta * limit
        self.shed_at: list[float] = []
        self.refused_at: list[float] = []

    def admit(self, pos: int, stop: int, want: int, *, head: int, free: float) -> int:
        """Admit (to `queue`) or refuse `arrivals[pos:stop]` in order until `want` are admitted;
        returns the index of the first arrival not considered."""
        arrivals, queue, capacity, deadline = (
            self.arrivals,
            self.queue,
            self.capacity,
            self.deadline,
        )
        alpha, beta, limit, full_s = self.alpha, self.beta, self.limit, self.full_s
        admitted = 0
        while pos < stop and admitted < want:
            waiting = len(queue) - head
            take = capacity - waiting
            if take <= 0:  # the queue is full until the next dispatch
                self.shed_at.extend(arrivals[pos:stop])
                return stop
            if deadline is not None:
                first = arrivals[pos]
                busy = free - first if free > first else 0.0
                # From here on arrivals are in time while the rows ahead and their own fit the
                # budget the running batch leaves (it only shrinks as they arrive).
                fits = rows_within(deadline - busy, alpha, beta, limit, full_s) - waiting
                if self.reach > limit and waiting > 0:
                    # Or it is in time in batches of the burst size, which the backlog runs as
                    # long as the oldest waiting finishes in time with it.
                    start = free if free > first else first
                    budget = queue[head] + deadline - start
                    joins = rows_within(budget, alpha, beta, self.reach, self.reach_s)
                    fits = max(fits, joins - waiting)
                if fits <= 0:
                    # With `waiting` ahead, one arriving at `free - slack` or later fits.
                    slack = deadline - finish_s(waiting + 1, alpha, beta, limit, full_s)
                    if slack < 0:
                        self.refused_at.extend(arrivals[pos:stop])
                        return stop
                    later = max(pos + 1, bisect_left(arrivals, free - slack, pos, stop))
                    self.refused_at.extend(arrivals[pos:later])
                    pos = later
                    continue
                take = min(take, fits)
            take = min(take, want - admitted, stop - pos)
            queue.extend(arrivals[pos : pos + take])
            pos += take
            admitted += take
        return pos


def finish_s(rows: int, alpha: float, beta: float, limit: int, full_s: float) -> float:
    """Device time for `rows` queued rows, the last one's included, as the runtime predicts it:
    full batches of `limit` (the rows arriving meanwhile fill the last), or one batch of them."""
    if rows >= limit:
        return -(-rows // limit) * full_s
    return alpha + beta * rows


def rows_within(budget: float, alpha: float, beta: float, limit: int, full_s: float) -> int:
    """The most rows whose `finish_s` is within `budget` (0: not even one)."""
    if budget >= full_s:
        return int(budget // full_s) * limit
    if beta > 0 and budget >= alpha + beta:
        return min(limit - 1, int((budget - alpha) / beta))
    return 0
