"""The queue that forms batches: admission at `put`, and at `next_batch` the oldest request with
the ones behind it whose non-batch dimensions match, within the batch limit, the queue delay and
the oldest request's deadline (the package docstring tells the rules). numpy and asyncio only.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchpilot.runtime.admission import Predictor
from batchpilot.runtime.batching.population import Population
from batchpilot.runtime.errors import (
    DeadlineExceeded,
    Overloaded,
    ShuttingDown,
    TooLargeForDeadline,
)

Arrays = Mapping[str, np.ndarray[Any, Any]]

FILL_SCAN = 64
"""The most requests behind one that does not fit a batch are looked at to fill its room: a
batch forms in the event loop, which serves every connection meanwhile."""
START_MARGIN_S = 0.002
START_MARGIN_SHARE = 0.02
"""A batch waiting to fill starts this long (the larger of the two: seconds, share of the oldest
request's deadline) before the latest start that deadline allows: waking the worker (timers on
uvloop tick in whole milliseconds), concatenating the inputs and answering take time too."""


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The two knobs of dynamic batching, and the default deadline of a request; the autopilot
    turns all three while the server runs. The service's SLA and objective travel with them:
    the batcher does not read those, the metrics export them for the burn-rate alerts."""

    max_batch_size: int
    max_queue_delay_s: float
    deadline_s: float | None = None
    """Deadline of a request that does not set its own, from its arrival; None: no deadline."""
    sla_s: float | None = None
    """The P99 latency the service must stay under; None: not given."""
    objective: float | None = None
    """The share of time the SLA must hold (0.99: 99 %); None: not given."""
    burst_batch_size: int | None = None
    """The largest batch a backlog may run: where more rows wait than `max_batch_size`, the next
    batch takes up to this many of them, each still in time (with a predictor only: deadline
    admission); None: never more than `max_batch_size`."""
    calibration_rows: int | None = None
    """The largest batch limit this server may be given, which it times at start-up; None: the
    ceiling (`max_batch_size`, or the burst size if larger). The batcher does not read it."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.burst_batch_size is not None and self.burst_batch_size < 1:
            raise ValueError(f"burst_batch_size must be at least 1, got {self.burst_batch_size}")
        if self.calibration_rows is not None and self.calibration_rows < 1:
            raise ValueError(f"calibration_rows must be at least 1, got {self.calibration_rows}")
        if not 0 <= self.max_queue_delay_s <= 10:
            raise ValueError(
                f"max_queue_delay must be between 0 and 10 s, got {self.max_queue_delay_s}"
            )
        if self.deadline_s is not None and not 0 < self.deadline_s <= 3600:
            raise ValueError(
                f"the deadline must be more than 0 and at most 3600 s, got {self.deadline_s}"
            )
        if self.sla_s is not None and not 0 < self.sla_s <= 600:
            raise ValueError(f"the SLA must be more than 0 and at most 600 s, got {self.sla_s}")
        if self.objective is not None and not 0 < self.objective < 1:
            raise ValueError(
                f"the objective must be a fraction between 0 and 1 (both excluded), "
                f"got {self.objective}"
            )

    @property
    def ceiling(self) -> int:
        """The most rows a batch may hold: the batch limit, or the burst size where larger."""
        return max(self.max_batch_size, self.burst_batch_size or 0)


def shape_key(inputs: Arrays) -> Hashable:
    """Requests with the same key can share a batch: same inputs, dtypes, non-batch dims."""
    if len(inputs) == 1:
        ((name, a),) = inputs.items()
        return ((name, a.dtype.str, a.shape[1:]),)
    return tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items()))


@dataclass(eq=False, slots=True)
class Pending:
    """One queued request. Identity, not value, decides equality: two equal requests are two."""

    inputs: Arrays
    rows: int
    key: Hashable
    future: asyncio.Future[dict[str, np.ndarray[Any, Any]]]
    enqueued_at: float
    deadline: float | None
    seq: int
    """Arrival order across groups: the oldest request's group forms the next batch."""
    queued: bool = True
    predicted: float | None = None
    """When admission predicted it would be answered (its margin excluded)."""
    probe: bool = False
    """Taken whatever the prediction (`Predictor.must_probe`): it runs unless its deadline has
    passed, so that the measurements it refreshes are taken. Never more rows than the ceiling."""
    background: bool = False
    """In the background lane (`BatchQueue.put`): served in the room the SLA's requests leave."""


@dataclass(eq=False, slots=True)
class _Waiter:
    """A worker waiting in `BatchQueue.next_batch`."""

    future: asyncio.Future[bool]
    """True when its time ran out, False when woken."""
    group: deque[Pending] | None
    """The group it waits to fill (None: it waits for any request)."""
    rows: int
    """Rows that fill it."""


@dataclass(frozen=True, slots=True)
class Batch:
    items: tuple[Pending, ...]
    settings: BatchSettings
    formed_at: float

    @property
    def rows(self) -> int:
        return sum(item.rows for item in self.items)


class BatchQueue:
    """A bounded queue of requests that hands out batches."""

    def __init__(
        self,
        *,
        settings: Callable[[], BatchSettings],
        capacity: int,
        clock: Callable[[], float] = time.perf_counter,
        predictor: Predictor | None = None,
        early_start: bool = True,
    ) -> None:
        """`early_start`: a batch starts before its delay is up once everyone recently seen at
        once is outstanding (`population`); False: it fills or waits out the delay."""
        if capacity < 1:
            raise ValueError(f"queue capacity must be at least 1, got {capacity}")
        self._settings = settings
        self._capacity = capacity
        self._clock = clock
        self._predictor = predictor
        self._queued_rows = 0
        self._groups: dict[Hashable, deque[Pending]] = {}
        self._rows: dict[Hashable, int] = {}
        self._order = itertools.count()
        self._size = 0
        self._waiters: list[_Waiter] = []
        self._closed = False
        self._outstanding = 0
        """Requests queued or in a running batch: put, their futures not yet done."""
        self._population = Population() if early_start else None
        self._sizes: dict[Hashable, Counter[int]] = {}
        """How many requests of each size of more than one row each shape has queued: those
        larger than the limit run alone (`_admit`), found without walking the queue."""
        self._background: dict[Hashable, deque[Pending]] = {}
        """The background lane by shape (`put`), each oldest first."""
        self._background_size = 0

    def __len__(self) -> int:
        """Requests waiting (not yet in a batch), the background lane's not counted."""
        return self._size

    @property
    def background_queued(self) -> int:
        """Requests waiting in the background lane."""
        return self._background_size

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse new requests; the ones already queued are still served."""
        self._closed = True
        self._wake()

    def abandon(self, error: BaseException) -> int:
        """Fail every queued request with `error` (the server stops without draining)."""
        count = 0
        for group in [*self._groups.values(), *self._background.values()]:
            while group:
                item = group.popleft()
                self._dequeued(item, group)
                if not item.future.done():
                    item.future.set_exception(error)
                    count += 1
        return count

    def put(
        self,
        inputs: Arrays,
        *,
        rows: int,
        timeout_s: float | None = None,
        background: bool = False,
    ) -> asyncio.Future[dict[str, np.ndarray[Any, Any]]]:
        """Queue a request; the future resolves to its own rows of every output.

        A `background` request (an async job: its client polls for the answer, minutes are
        fine) waits in a lane of its own, behind every request of the SLA: nothing admits or
        sheds it (the job store bounds how many wait) but its deadline, and the SLA's requests
        neither count it ahead nor wait for it — it runs in the room their batches leave
        (`_fill_background`) and, when none of them waits, in batches of its own of up to the
        batch limit (`_take_background`). In one queue with them, a burst of jobs was refused
        by the SLA's deadline admission (most of a burst stored as 503s: a job's deadline was
        the SLA) or, given a longer deadline, queued ahead of the SLA's requests."""
        if self._closed:
            raise ShuttingDown()
        if background:
            return self._put_background(inputs, rows=rows, timeout_s=timeout_s)
        if self._size >= self._capacity:
            raise Overloaded(
                f"the queue is full ({self._capacity} requests waiting); retry shortly",
                reason="queue_full",
            )
        now = self._clock()
        deadline = None if timeout_s is None else now + timeout_s
        key = shape_key(inputs)
        predicted, probe = None, False
        if deadline is not None and self._predictor is not None:
            settings = self._settings()
            probe = self._predictor.must_probe(
                queued_rows=self._queued_rows, rows=rows, ceiling=settings.ceiling, now=now
            )
            predicted = self._admit(rows, key, settings, now=now, deadline=deadline, probe=probe)
        loop = asyncio.get_running_loop()
        item = Pending(
            inputs=inputs,
            rows=rows,
            key=key,
            future=loop.create_future(),
            enqueued_at=now,
            deadline=deadline,
            seq=next(self._order),
            predicted=predicted,
            probe=probe,
        )
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = deque()
            self._rows[key] = 0
        group.append(item)
        self._rows[key] += rows
        self._queued_rows += rows
        self._size += 1
        if rows > 1:
            self._sizes.setdefault(key, Counter())[rows] += 1
        self._outstanding += 1
        if self._population is not None:
            self._population.reached(self._outstanding, now)
        item.future.add_done_callback(lambda _: self._forget(item))
        if self._waiters:
            if self._everyone_here(now):
                self._wake()  # a batch waiting to fill waits for nobody now
            else:
                self._wake(group, self._rows[key])
        return item.future

    def _put_background(
        self, inputs: Arrays, *, rows: int, timeout_s: float | None
    ) -> asyncio.Future[dict[str, np.ndarray[Any, Any]]]:
        now = self._clock()
        item = Pending(
            inputs=inputs,
            rows=rows,
            key=shape_key(inputs),
            future=asyncio.get_running_loop().create_future(),
            enqueued_at=now,
            deadline=None if timeout_s is None else now + timeout_s,
            seq=next(self._order),
            background=True,
        )
        self._background.setdefault(item.key, deque()).append(item)
        self._background_size += 1
        item.future.add_done_callback(lambda _: self._forget(item))
        if any(waiter.group is None for waiter in self._waiters):
            self._wake_idle()
        return item.future

    def _wake_idle(self) -> None:
        """Wake the workers waiting for any request (none of the SLA's is queued)."""
        waiting = []
        for waiter in self._waiters:
            if waiter.future.done():
                continue
            if waiter.group is None:
                waiter.future.set_result(False)
            else:
                waiting.append(waiter)
        self._waiters = waiting

    def predicted_s(self, rows: int) -> float | None:
        """How long a request of `rows` rows put now would take to be answered, the queue and
        the batches running ahead of it (every queued row counted as its shape's, in full
        batches: the low reading), without admission's margin; None without a predictor or
        before anything was measured."""
        if self._predictor is None:
            return None
        now = self._clock()
        limit = self._settings().max_batch_size
        finish = self._predictor.finish_time(
            queued_rows=self._queued_rows, rows=rows, max_batch_size=limit, now=now
        )
        return None if finish is None else finish - now

    def _everyone_here(self, now: float) -> bool:
        """Whether the requests outstanding are everyone recently seen at once (`population`):
        nobody else is coming, and a batch waiting to fill only adds latency."""
        population = self._population
        return population is not None and population.everyone_here(self._outstanding, now)

    def check_servable(
        self, rows: int, *, timeout_s: float | None, declared_s: float | None = None
    ) -> None:
        """Refuse for good (`TooLargeForDeadline`) a request that no replica could serve in
        time, now or after any retry — no load to shed with 503 (which reads as a reason to add
        replicas) but a request to change:
        - one whose `declared_s` (the timeout its client wrote, not what is left of an RPC's
          deadline, which a call spends waiting to be taken up under load: that is load) is
          shorter than any batch the server has run (the fastest it measured, of any size);
        - one of more rows than the largest batch the server forms (`BatchSettings.ceiling`)
          that admission would predict after `timeout_s` even alone on an idle device at the
          fastest it has been measured (`Predictor.fastest_s`).
        Within the ceiling, a deadline that the fastest batch meets but the device does not now
        is admission's to refuse, for now (`put`). Only with a predictor (deadline admission)."""
        predictor = self._predictor
        if predictor is None or timeout_s is None:
            return
        quickest = predictor.timing.quickest_s
        if quickest is not None and declared_s is not None and declared_s < quickest:
            raise TooLargeForDeadline(
                f"the request's {_duration(declared_s)} deadline is shorter than any batch this "
                f"server has run (the fastest took {_duration(quickest)}): it cannot be served in "
                f"time however idle the server is; send a longer timeout"
            )
        ceiling = self._settings().ceiling
        if rows <= ceiling:
            return
        fastest = predictor.fastest_s(rows)
        if fastest is None or fastest <= timeout_s:
            return
        fit, most = 0, rows - 1  # t(b) grows with b: bisect for the most rows that fit
        while fit < most:
            middle = (fit + most + 1) // 2
            middle_s = predictor.fastest_s(middle)
            if middle_s is not None and middle_s <= timeout_s:
                fit = middle
            else:
                most = middle - 1
        within = f"at most {fit} rows a request fit in it" if fit else "not one row fits in it"
        raise TooLargeForDeadline(
            f"the request's {rows} rows would take {_duration(fastest)} alone on this server at "
            f"its fastest, more than the request's {_duration(timeout_s)} deadline: it cannot "
            f"be served in time however idle the server is ({within}); send fewer rows a "
            f"request, or a longer timeout"
        )

    def _admit(
        self,
        rows: int,
        key: Hashable,
        settings: BatchSettings,
        *,
        now: float,
        deadline: float,
        probe: bool,
    ) -> float | None:
        """Refuse the request now if it is predicted to finish after its deadline, unless it is
        a probe; returns the prediction (None: nothing measured yet, admitted)."""
        predictor = self._predictor
        assert predictor is not None
        # Its own shape's rows, and each other shape's: shapes never share a batch; and each
        # request larger than the limit, which runs alone.
        limit = settings.max_batch_size
        own = self._rows.get(key, 0)
        others = {other: queued for other, queued in self._rows.items() if other != key}
        alone = []
        for other, sizes in self._sizes.items():
            for size, count in sizes.items():
                if size > limit:
                    alone += [size] * count
                    if other == key:
                        own -= size * count
                    else:
                        others[other] -= size * count
        predicted = predictor.finish_time(
            queued_rows=own,
            rows=rows,
            max_batch_size=limit,
            now=now,
            others=others.values(),
            alone=alone,
        )
        if predicted is None:
            return None
        margin = predictor.margin_s(
            predicted=predicted,
            queued_rows=own,
            rows=rows,
            max_batch_size=settings.max_batch_size,
            now=now,
        )
        if predicted + margin > deadline and settings.ceiling > settings.max_batch_size:
            joined = self._joined(rows, key, settings.ceiling, now=now)
            if joined is not None and joined[0] < predicted:
                predicted, margin = joined
        finish = predicted + margin
        if finish > deadline and not probe:
            raise Overloaded(
                f"the server cannot answer within the request's deadline: it would finish in "
                f"{(finish - now) * 1e3:.0f} ms, {(finish - deadline) * 1e3:.0f} ms too late "
                f"({self._queued_rows} rows queued ahead); retry shortly or elsewhere",
                reason="predicted_late",
                retry_after_s=finish - deadline,
            )
        return predicted

    def _joined(
        self, rows: int, key: Hashable, ceiling: int, *, now: float
    ) -> tuple[float, float] | None:
        """When the request would be answered in the backlog's next batch, which takes every
        queued row up to the burst size (`_batch_rows`), and the margin kept for it; None where
        that batch is another shape's, or where the oldest request waiting would then finish
        late, so that the batch cannot take it (`_take`): batches of the limit are what it can
        count on then."""
        predictor = self._predictor
        assert predictor is not None
        if self._oldest_key() != key:
            return None
        queued = self._rows[key]  # its shape is the oldest: the others' batches come after
        joined = predictor.finish_time(
            queued_rows=queued, rows=rows, max_batch_size=ceiling, now=now
        )
        if joined is None:
            return None
        margin = predictor.margin_s(
            predicted=joined, queued_rows=queued, rows=rows, max_batch_size=ceiling, now=now
        )
        oldest = self._groups[key][0].deadline
        if oldest is not None and joined + margin > oldest:
            return None
        return joined, margin

    def _forget(self, item: Pending) -> None:
        """A request's future is done: answered, failed, or its caller stopped waiting
        (disconnect, deadline), in which case it leaves the queue."""
        if item.background:
            if item.queued:
                lane = self._background[item.key]
                lane.remove(item)
                self._dequeued(item, lane)
            return
        self._outstanding -= 1
        if item.queued:
            group = self._groups[item.key]
            group.remove(item)
            self._dequeued(item, group)

    def _dequeued(self, item: Pending, group: deque[Pending]) -> None:
        item.queued = False
        if item.background:
            self._background_size -= 1
            if not group:
                del self._background[item.key]
            return
        self._size -= 1
        if item.rows > 1:
            sizes = self._sizes[item.key]
            sizes[item.rows] -= 1
            if not sizes[item.rows]:
                del sizes[item.rows]
                if not sizes:
                    del self._sizes[item.key]
        self._rows[item.key] -= item.rows
        self._queued_rows -= item.rows
        if not group:
            del self._groups[item.key], self._rows[item.key]

    def _oldest_key(self) -> Hashable | None:
        if not self._groups:
            return None
        return min(self._groups, key=lambda key: self._groups[key][0].seq)

    async def next_batch(self) -> Batch | None:
        """Wait for the next batch. Returns None once the queue is closed and empty."""
        clock = self._clock
        while True:
            key = self._oldest_key()
            if key is None:
                if self._background:
                    now = clock()
                    items = self._take_background(self._settings().max_batch_size, now=now)
                    if items:
                        return Batch(items=items, settings=self._settings(), formed_at=now)
                    continue  # every request looked at had gone or expired
                if self._closed:
                    return None
                await self._wait(None, rows=0, timeout_s=None)
                continue
            settings = self._settings()
            while key in self._groups and self._rows[key] < settings.max_batch_size:
                oldest = self._groups[key][0]
                now = clock()
                remaining = self._fill_until(oldest, settings, self._rows[key]) - now
                if remaining <= 0 or self._closed:
                    break
                if self._everyone_here(now):
                    break
                timed_out = await self._wait(
                    self._groups[key], rows=settings.max_batch_size, timeout_s=remaining
                )
                # When the delay is up for the request waited on, the batch is formed. If
                # another worker took it meanwhile, the requests left behind start their own.
                if timed_out and key in self._groups and self._groups[key][0] is oldest:
                    break
            if key not in self._groups:
                continue  # every request of that group went away while we waited
            now = clock()
            items = self._take(key, self._batch_rows(key, settings, now), now=now)
            if items:
                return Batch(items=items, settings=settings, formed_at=now)

    def _batch_rows(self, key: Hashable, settings: BatchSettings, now: float) -> int:
        """The most rows the next batch of `key`'s group may take: the batch limit, or the
        burst size where more rows wait than the limit and one batch of them pays.

        A batch limit is chosen for the traffic seen: a small batch answers sooner. A burst
        leaves more rows queued than it takes. Run in batches of the limit, each batch pays the
        fixed part of t(b), α, again; taken together the rows already waiting pay it once: the
        ones behind finish sooner, the ones in front later by β for every row added, and none
        later than its deadline (`_take` stops where one would be). Where α is at least what
        a full batch's rows add (α ≥ β·limit: accelerators, large models) that is a gain on
        average, and one batch of the backlog always runs. Where the rows cost most (β·limit
        > α) it gains little and slows the front; it runs only where batches of the limit
        would make a queued request late: the youngest, behind the whole backlog, or the first
        one a batch of the limit leaves behind. Nothing waits to fill the larger batch: it
        takes what is queued. With several model instances, the ones free share the backlog
        (each takes its part: batches in parallel pay α side by side). Without a predictor no
        deadline bounds it: the limit stands.
        """
        limit = settings.max_batch_size
        predictor = self._predictor
        if predictor is None or settings.ceiling <= limit or self._rows[key] <= limit:
            return limit
        fit = predictor.timing.fit
        if fit is None:
            return limit
        # The instances free now (this worker's among them) take a part of the backlog each.
        free = max(1, predictor.ledger.instances - predictor.ledger.running)
        grown = max(limit, min(settings.ceiling, math.ceil(self._rows[key] / free)))
        if not fit.floor_rows and fit.alpha_s >= fit.beta_s * limit:
            return grown
        full = predictor.timing.seconds(limit)
        assert full is not None  # there is a fit
        instances = predictor.ledger.instances
        ahead = predictor.ledger.busy_s(predictor.timing, now) / instances

        def late(item: Pending, batch: int) -> bool:
            """Whether `item`, in the `batch`-th batch of the limit from now, misses its
            deadline (the instances share the batches)."""
            finish = now + ahead + math.ceil(batch / instances) * full
            return item.deadline is not None and finish > item.deadline

        group = self._groups[key]
        rows = 0
        for item in group:
            rows += item.rows
            if rows > limit:
                if late(item, 2):
                    return grown
                break
        if late(group[-1], math.ceil(self._rows[key] / limit)):
            return grown
        return limit

    def _fill_until(self, oldest: Pending, settings: BatchSettings, rows: int) -> float:
        """Until when a batch may wait for more rows: the queue delay after its oldest request
        arrived, and with a predictor no later than that request's deadline allows."""
        until = oldest.enqueued_at + settings.max_queue_delay_s
        if self._predictor is not None and oldest.deadline is not None:
            compute = self._predictor.timing.upper(min(rows, settings.max_batch_size))
            if compute is not None:
                budget = oldest.deadline - oldest.enqueued_at
                margin = max(START_MARGIN_S, START_MARGIN_SHARE * budget)
                margin += self._predictor.lateness.margin_s(oldest.enqueued_at)
                until = min(until, oldest.deadline - compute - margin)
        return until

    def _wake(self, group: deque[Pending] | None = None, rows: int = 0) -> None:
        """Wake the workers waiting in `next_batch` that a request just put into `group` (which
        now holds `rows` rows) concerns, or with no group all of them (the queue closed).

        A worker waiting for any request wakes; so does one waiting for its group to fill,
        when that group is now full or has gone away (its requests left). One waiting for
        another group to fill sleeps on: waking it would only send it back to sleep, which a
        filling batch would otherwise do once for every request that arrives.
        """
        waiting = []
        for waiter in self._waiters:
            if waiter.future.done():
                continue
            if (
                group is None
                or waiter.group is None
                or not waiter.group
                or (waiter.group is group and rows >= waiter.rows)
            ):
                waiter.future.set_result(False)
            else:
                waiting.append(waiter)
        self._waiters = waiting

    async def _wait(
        self, group: deque[Pending] | None, *, rows: int, timeout_s: float | None
    ) -> bool:
        """Wait until `group` holds `rows` rows or goes away (with no group: until any request
        arrives), the queue closes, or `timeout_s` seconds pass; True when the time ran out.

        One future and one loop timer: `asyncio.wait_for` would add a task and two more futures
        to every wait.
        """
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), group, rows)
        self._waiters.append(waiter)
        timer = None if timeout_s is None else loop.call_later(timeout_s, _time_up, waiter.future)
        try:
            return await waiter.future
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:  # cancelled while waiting
                self._waiters.remove(waiter)

    def _take(self, key: Hashable, max_rows: int, *, now: float) -> tuple[Pending, ...]:
        """The next batch of the group, oldest first: at most `max_rows` rows and, with a
        predictor, no more than lets every request in it meet its deadline. Requests that can no
        longer finish in time are failed here, before they reach the device."""
        group = self._groups[key]
        timing = self._predictor.timing if self._predictor is not None else None
        taken: list[Pending] = []
        rows = 0
        due = math.inf  # the earliest deadline in the batch
        while group and (not taken or rows + group[0].rows <= max_rows):
            item = group[0]
            if item.future.done():
                # Its caller stopped waiting (deadline timer, disconnect) and the callback
                # that removes it has not run yet: it leaves now.
                group.popleft()
                self._dequeued(item, group)
                continue
            deadline = math.inf if item.deadline is None else item.deadline
            if now >= deadline:
                self._expire(item, group, "the request's deadline passed while it was queued")
                continue
            if timing is not None and deadline < math.inf and not item.probe:
                alone = timing.seconds(item.rows)
                if alone is not None and now + alone > deadline:
                    self._expire(
                        item,
                        group,
                        f"the request could no longer finish within its deadline: "
                        f"{(deadline - now) * 1e3:.1f} ms were left, a batch takes "
                        f"{alone * 1e3:.1f} ms",
                    )
                    continue
                if taken:
                    # The expected time, not admission's high estimate: admission kept the
                    # spread in reserve, and cutting batches at the first jitter would cost
                    # the throughput every request behind was promised.
                    with_it = timing.seconds(rows + item.rows)
                    if with_it is not None and now + with_it > min(due, deadline):
                        break  # it waits for the next batch rather than make this one late
            group.popleft()
            self._dequeued(item, group)
            taken.append(item)
            rows += item.rows
            due = min(due, deadline)
        if taken and group and rows < max_rows:
            self._fill(group, taken, rows, max_rows, due, now=now)
        if taken and not self._groups and self._background:
            self._fill_background(key, taken, now=now)
        return tuple(taken)

    def _fill_background(self, key: Hashable, taken: list[Pending], *, now: float) -> None:
        """Fill the room a batch of the SLA's requests leaves, when none of them waits behind
        it, with background requests of its shape, oldest first: up to the batch limit — the
        size the autopilot sizes replicas for, the background's rows counted in its demand — and
        only while admission's high estimate of the batch (`upper`, and the start margin) still
        ends by the earliest deadline in it. Nothing measured: nothing added. Admission
        predicted these requests' batch without the rows added: the batcher leaves the time
        they add out of the lateness it learns (`Batcher`)."""
        lane = self._background.get(key)
        timing = self._predictor.timing if self._predictor is not None else None
        if lane is None or timing is None:
            return
        due = min(math.inf if item.deadline is None else item.deadline for item in taken)
        if due < math.inf:
            due -= max(START_MARGIN_S, START_MARGIN_SHARE * (due - now))
        limit = self._settings().max_batch_size
        rows = sum(item.rows for item in taken)
        i = 0
        while i < len(lane) and rows < limit:
            item = lane[i]
            with_it = timing.upper(rows + item.rows)
            if with_it is None or now + with_it > due:
                break  # larger batches take longer still
            if (
                rows + item.rows > limit
                or item.future.done()
                or (item.deadline is not None and now >= item.deadline)
            ):
                i += 1
                continue
            del lane[i]
            self._dequeued(item, lane)
            taken.append(item)
            rows += item.rows

    def _take_background(self, max_rows: int, *, now: float) -> tuple[Pending, ...]:
        """A batch of background requests of the oldest one's shape, oldest first, up to
        `max_rows` rows (a request of more runs alone); no SLA request waits. Ones whose
        deadline passed fail here; nothing waits to fill: the device is free, and rows gather
        while it is busy."""
        key = min(self._background, key=lambda key: self._background[key][0].seq)
        lane = self._background[key]
        taken: list[Pending] = []
        rows = 0
        while lane and (not taken or rows + lane[0].rows <= max_rows):
            item = lane.popleft()
            self._dequeued(item, lane)
            if item.future.done():
                continue
            if item.deadline is not None and now >= item.deadline:
                item.future.set_exception(
                    DeadlineExceeded("the job's deadline passed while it was queued")
                )
                continue
            taken.append(item)
            rows += item.rows
        return tuple(taken)

    def _fill(
        self,
        group: deque[Pending],
        taken: list[Pending],
        rows: int,
        max_rows: int,
        due: float,
        *,
        now: float,
    ) -> None:
        """Fill the room a batch leaves when the next request does not fit in it (or would make
        it late): with the requests behind that one that fit and keep the batch in time, oldest
        first, looking at most `FILL_SCAN` of them. Requests of varied rows would otherwise
        leave about half a large request's rows of every full batch empty; the request that did
        not fit is still the oldest waiting, and heads the next batch."""
        timing = self._predictor.timing if self._predictor is not None else None
        i, end = 1, min(len(group), 1 + FILL_SCAN)
        while i < end and rows < max_rows:
            item = group[i]
            deadline = math.inf if item.deadline is None else item.deadline
            fits = rows + item.rows <= max_rows and not item.future.done() and now < deadline
            if fits and timing is not None and deadline < math.inf and not item.probe:
                with_it = timing.seconds(rows + item.rows)
                fits = with_it is None or now + with_it <= min(due, deadline)
            if not fits:
                i += 1
                continue
            del group[i]
            end -= 1
            self._dequeued(item, group)
            taken.append(item)
            rows += item.rows
            due = min(due, deadline)

    def still_due(self, items: Sequence[Pending]) -> tuple[Pending, ...]:
        """Of `items` (a part of a batch the engine failed on, to run again), those still
        waited for: a request already answered (504 at its deadline, its caller gone) leaves,
        and one whose deadline has passed fails with `DeadlineExceeded` — parts run one after
        the other, and nothing expired reaches the device."""
        now = self._clock()
        due: list[Pending] = []
        for item in items:
            if item.future.done():
                continue
            if item.deadline is not None and now >= item.deadline:
                item.future.set_exception(
                    DeadlineExceeded(
                        "the request's deadline passed while its batch, which the engine "
                        "failed on, ran again in parts"
                    )
                )
                continue
            due.append(item)
        return tuple(due)

    def _expire(self, item: Pending, group: deque[Pending], reason: str) -> None:
        group.popleft()
        self._dequeued(item, group)
        item.future.set_exception(DeadlineExceeded(reason))


def _duration(seconds: float) -> str:
    """1.5 ms, 80 ms, 4.02 s, 163 s, 4021 s: about three significant digits, in the unit a
    person reads."""
    if seconds < 0.9995:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 99.95:
        return f"{seconds:.3g} s"
    return f"{seconds:.0f} s"


def _time_up(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)
