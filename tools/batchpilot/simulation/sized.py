"""One replica serving requests of varied rows: `replica.Replica`'s rules, counted in rows.

`Replica` counts in requests of one size, a request of k rows costing β·k; that is exact where
every request brings k rows, and is how it runs hours of traffic in seconds. Clients that batch
on their side send varied rows (`RowMix`), and then what a batch holds, what admission predicts
and what a backlog's batch takes are rows, not requests. This replica follows the runtime's
batcher and admission (`batchpilot.runtime.batching`) rule for rule in rows, one event at a time
— slower than `Replica`'s runs of arrivals, and only used where the rows vary:

- each arrival draws its rows from the mix (the replica's own seeded draws: sizes are
  independent of when requests come);
- a batch starts with the oldest waiting request and dispatches once the rows waiting reach the
  limit or the oldest has waited `delay_s`, never before the device is free nor before `since`;
  it takes requests oldest first while their rows fit (the first always: one over the limit
  runs alone), then fills the room the first that did not fit leaves with the requests behind
  it that fit, oldest first (`sizes.take`, as `sizes.serve` forms batches);
- with a deadline, a request is refused at arrival (`predicted_late`) when the device's busy
  time left, plus full batches of the limit for the rows queued ahead and its own, is later than
  its deadline — or, with a burst size, in time in batches of the burst size with the oldest
  waiting still in time; a request that finds `capacity` waiting is shed;
- with a deadline and a burst size, a backlog of more rows than the limit runs in one batch of
  up to `burst` rows, its oldest still in time, where the fixed cost pays for it or the limit
  would make the first request it leaves behind, or the youngest, late (`Replica`'s rule).

Its batch sizes (`Served.sizes`) are requests, `Served.rows` the rows of each batch.

Pure: numpy and arithmetic.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from batchpilot.api.request_rows import RowMix
from batchpilot.simulation.replica import Served, Variation, rows_within
from batchpilot.simulation.sizes import take


class SizedReplica:
    """A server whose requests bring varied rows: an admission check and a bounded FIFO queue
    in front of one device that runs one batch at a time. `max_batch` and `burst` are rows."""

    def __init__(
        self,
        *,
        alpha_s: float,
        beta_s: float,
        mix: RowMix,
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
        self.alpha_s = alpha_s
        self.beta_s = beta_s
        self.max_batch = max_batch
        self.delay_s = delay_s
        self.capacity = capacity
        self.deadline_s = deadline_s
        self.burst = burst
        self.free_at = start
        self._queue: deque[tuple[float, int]] = deque()
        """(arrival, rows) of each request waiting, oldest first."""
        self._queued_rows = 0
        self._sizes = np.array(mix.rows, dtype=np.int64)
        self._shares = np.array(mix.shares)
        self._rng = np.random.default_rng(seed)
        self._drawn: list[int] = []
        self._variation = Variation(cv, seed) if cv > 0 else None

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def idle_at(self, t: float) -> bool:
        return not self._queue and self.free_at <= t

    def _rows(self) -> int:
        if not self._drawn:
            self._drawn = self._rng.choice(self._sizes, size=1024, p=self._shares).tolist()
        return self._drawn.pop()

    def serve(self, arrivals: list[float], *, since: float, until: float) -> Served:
        """Admit or refuse `arrivals` (sorted, all in [since, until)) and run every batch that
        dispatches before `until` (`Replica.serve`'s contract)."""
        alpha, beta, limit, delay = self.alpha_s, self.beta_s, self.max_batch, self.delay_s
        deadline = self.deadline_s
        reach = limit
        if deadline is not None and self.burst is not None and self.burst > limit:
            reach = self.burst
        full_s = alpha + beta * limit
        queue = self._queue
        dispatched: list[float] = []
        sizes: list[int] = []
        rows_run: list[int] = []
        seconds: list[float] = []
        served: list[float] = []
        shed: list[float] = []
        refused: list[float] = []
        pos, n, now = 0, len(arrivals), since
        while True:
            dispatch = math.inf
            if queue:
                oldest = queue[0][0]
                start = max(self.free_at, oldest, since, now)
                dispatch = start if self._queued_rows >= limit else max(start, oldest + delay)
            if pos < n and arrivals[pos] <= dispatch:
                now = arrivals[pos]
                self._admit(now, reach, full_s, shed, refused)
                pos += 1
                continue
            if dispatch >= until:
                break
            batch = self._take(dispatch, limit, reach, full_s)
            rows = sum(r for _, r in batch)
            took = alpha + beta * rows
            if self._variation is not None:
                took *= self._variation.draw()
            dispatched.append(dispatch)
            sizes.append(len(batch))
            rows_run.append(rows)
            seconds.append(took)
            served.extend(t for t, _ in batch)
            self.free_at = dispatch + took
            now = dispatch
        return Served(
            dispatched_at=np.array(dispatched, dtype=np.float64),
            sizes=np.array(sizes, dtype=np.int64),
            arrivals=np.array(served, dtype=np.float64),
            seconds=np.array(seconds, dtype=np.float64),
            shed_at=np.array(shed, dtype=np.float64),
            refused_at=np.array(refused, dtype=np.float64),
            rows=np.array(rows_run, dtype=np.int64),
        )

    def _admit(
        self, t: float, reach: int, full_s: float, shed: list[float], refused: list[float]
    ) -> None:
        """One arrival at `t`: queued, shed (the queue is full) or refused (predicted late)."""
        queue = self._queue
        if len(queue) >= self.capacity:
            shed.append(t)
            return
        rows = self._rows()
        deadline = self.deadline_s
        if deadline is not None:
            alpha, beta, limit = self.alpha_s, self.beta_s, self.max_batch
            busy = self.free_at - t if self.free_at > t else 0.0
            ahead = self._queued_rows + rows
            in_time = ahead <= rows_within(deadline - busy, alpha, beta, limit, full_s)
            if not in_time and reach > limit and queue:
                # In time in batches of the burst size, with the oldest waiting still in time.
                budget = queue[0][0] + deadline - max(self.free_at, t)
                in_time = ahead <= rows_within(budget, alpha, beta, reach, alpha + beta * reach)
            if not in_time and not queue and busy == 0.0:
                in_time = alpha + beta * rows <= deadline  # alone on an idle device
            if not in_time:
                refused.append(t)
                return
        queue.append((t, rows))
        self._queued_rows += rows

    def _take(
        self, dispatch: float, limit: int, reach: int, full_s: float
    ) -> list[tuple[float, int]]:
        """The batch dispatched at `dispatch`: up to the limit's rows, or a backlog's up to
        `reach` where `Replica`'s burst rule says so; filled from behind the first request
        that does not fit."""
        queue = self._queue
        most = limit
        deadline = self.deadline_s
        if reach > limit and self._queued_rows > limit and deadline is not None:
            alpha, beta = self.alpha_s, self.beta_s
            left_behind, total = queue[-1][0], 0
            for t, r in queue:
                total += r
                if total > limit:
                    left_behind = t
                    break
            batches = -(-self._queued_rows // limit)
            if (
                alpha >= beta * limit
                or dispatch + 2 * full_s > left_behind + deadline
                or dispatch + batches * full_s > queue[-1][0] + deadline
            ):
                room = queue[0][0] + deadline - dispatch - alpha
                most = min(reach, max(limit, int(room / beta) if beta > 0 else reach))
        batch, rows = take(queue, _rows_of, most)
        self._queued_rows -= rows
        return batch


def _rows_of(request: tuple[float, int]) -> int:
    return request[1]
