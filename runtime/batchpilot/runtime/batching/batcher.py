"""The loop that runs the queue's batches on the engine, up to `instances` at once, answers every
request of a batch (outputs split by rows; where the engine fails, the batch runs again in parts
until the failure is pinned on the requests whose inputs cause it, or on the engine), and
accounts busy time as the union of the running batches. numpy and asyncio only.

Two durations of a batch. Busy time spans it as the event loop saw it, from its start to the
moment the loop took its outputs back: a loop too busy to take them keeps the batch's slot
occupied, and utilization shows it. Compute time, what t(b) is fit from (admission's predictions,
the autopilot's model), is the engine's own measure where it times itself (`TimedEngine`) plus
the loop's delay in taking outputs back (`LoopDelay`): the hand-off every batch pays, and under
load the loop's share, noise and all, but not a stall — a burst of a thousand requests read and
refused while a batch ran (150–360 ms against a 20 ms batch) is no property of the batch, and
once in the fit it would refuse the next bursts for a while.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from batchpilot.runtime.admission import Predictor
from batchpilot.runtime.batching.batch_queue import Batch, BatchQueue, Pending
from batchpilot.runtime.engine import Engine, Ran, TimedEngine
from batchpilot.runtime.errors import (
    EngineFailure,
    RefusedByModel,
    ShuttingDown,
    first_line,
    out_of_memory,
)
from batchpilot.runtime.outcomes import BatchDone


class BatchObserver(Protocol):
    """Where the batch loop reports what it did (the metrics adapter implements this)."""

    def batch_done(self, done: BatchDone) -> None: ...

    def batch_failed(self, *, rows: int, requests: int, compute_s: float) -> None: ...


class BusyTime:
    """Seconds during which at least one of several overlapping activities ran (their union).

    `begin`/`end` bracket each activity; while any runs, the time since the last mark is busy.
    Totals are accounted at every `end` and read up to `now`, so a long batch counts while it
    runs, and two overlapping batches count once.
    """

    def __init__(self) -> None:
        self._active = 0
        self._mark = 0.0
        self._total = 0.0

    @property
    def active(self) -> int:
        return self._active

    def begin(self, now: float) -> None:
        if self._active == 0:
            self._mark = now
        self._active += 1

    def end(self, now: float) -> None:
        if self._active == 0:
            raise RuntimeError("BusyTime.end() without a matching begin()")
        self._total += max(0.0, now - self._mark)
        self._mark = now
        self._active -= 1

    def total(self, now: float) -> float:
        """Busy seconds so far, including the running stretch up to `now`."""
        if self._active:
            return self._total + max(0.0, now - self._mark)
        return self._total


class LoopDelay:
    """The event loop's delay in taking a batch's outputs back (its span as the loop saw it less
    the engine's own time), and which delays are stalls.

    A delay is the batch's own where it is usual: the hand-off every batch pays, and under load
    the loop's share, noise included — what a prediction of the batch's end has to allow for. A
    stall is longer than both `STALL_FACTOR` times the median of the last `LOOP_DELAY_BATCHES`
    delays and the batch's own time; the batch is counted with the median delay instead.
    """

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=LOOP_DELAY_BATCHES)

    def compute_s(self, *, timed_s: float, span_s: float) -> float:
        """A batch's compute time: its engine time plus its delay, or the usual delay where its
        own was a stall (with none measured yet, a delay longer than the batch is one)."""
        delay = max(0.0, span_s - timed_s)
        usual = statistics.median(self._recent) if self._recent else 0.0
        self._recent.append(delay)
        if delay > max(STALL_FACTOR * usual, timed_s):
            return timed_s + usual
        return timed_s + delay


LOOP_DELAY_BATCHES = 31
"""Batches the usual loop delay is the median of: a stall is one batch or two per burst (the one
running while the burst is read), far from half of them."""
SYSTEMATIC_FAILURES = 8
"""Runs of the engine that failed in a row, none between them that did not, after which it is
taken to fail whatever it is given (a lost device, a broken model): a batch that fails is then
answered with the failure at once, not run again in parts. The halves run one after the
other, each half that fails halved again after them: a batch with one bad request fails twice
in a row (the batch, the half holding it), then its other half runs; it takes several bad
requests together, or an engine that fails everything, to fail eight in a row."""
STALL_FACTOR = 4.0
"""A delay this many times the usual one, and longer than the batch itself, is a stall: under
steady overload the loop's delays run to about 7× their median at the 99th percentile (0.25 ms
median, 1.8–6.5 ms P99 against 27 ms batches); reading a burst of a thousand requests takes
150–360 ms."""


class Batcher:
    """Runs batches from a queue on an engine, up to `instances` at once, and answers every
    request."""

    def __init__(
        self,
        queue: BatchQueue,
        engine: Engine,
        observer: BatchObserver,
        *,
        clock: Callable[[], float] = time.perf_counter,
        instances: int = 1,
        predictor: Predictor | None = None,
        on_out_of_memory: Callable[[int, int], None] | None = None,
    ) -> None:
        if instances < 1:
            raise ValueError(f"instances must be at least 1, got {instances}")
        self._predictor = predictor
        self._on_out_of_memory = on_out_of_memory
        self._queue = queue
        self._clock = clock
        self._engine = engine
        self._run_timed: Callable[[Mapping[str, np.ndarray[Any, Any]]], Awaitable[Ran]] | None = (
            engine.run_timed if isinstance(engine, TimedEngine) else None
        )
        self._observer = observer
        self._instances = instances
        self._busy = BusyTime()
        self._loop_delay = LoopDelay()
        self._failed_runs = 0
        """The engine's runs that failed since its last that did not."""
        self._ran = False
        """Whether any run of the engine has not failed."""
        self._known_good: Mapping[str, np.ndarray[Any, Any]] | None = None
        self._broken: str | None = None
        self._ran_rows = 0
        """The largest batch that ran (since a search for the memory's limit began)."""
        self._running: dict[int, tuple[float, int]] = {}
        """The runs on the engine now: when each started, and its rows."""
        self._runs = itertools.count()

    @property
    def instances(self) -> int:
        return self._instances

    @property
    def busy(self) -> bool:
        return self._busy.active > 0

    @property
    def running(self) -> int:
        """Batches running now."""
        return self._busy.active

    def busy_seconds(self) -> float:
        """Seconds with at least one batch running (the union over instances)."""
        return self._busy.total(self._clock())

    async def run(self) -> None:
        """Serve batches until the queue is closed and drained. With several instances, every
        worker finishes its batch before this returns; cancelling it cancels them all."""
        if self._instances == 1:
            await self._worker()
            return
        async with asyncio.TaskGroup() as workers:
            for index in range(self._instances):
                workers.create_task(self._worker(), name=f"batcher-{index}")

    async def _worker(self) -> None:
        while (batch := await self._queue.next_batch()) is not None:
            await self.run_batch(batch)

    async def run_batch(self, batch: Batch) -> None:
        """Run `batch` and answer its requests: with their rows, or where the engine fails,
        with the failure — once it is known whose it is (`_isolate`)."""
        error = await self._attempt(batch)
        if error is None:
            return
        if out_of_memory(error):
            await self._out_of_memory(batch, error)
        elif self._broken is not None:
            _fail(batch.items, _engine_failure(error))  # no parts, no check: see `check_engine`
        elif self._failing and await self._runs_others(presume=False) is None:
            _fail(batch.items, _engine_failure(error))
        elif len(batch.items) > 1:
            await self._isolate(batch)
        else:
            evidence = await self._runs_others(presume=True)
            _fail(
                batch.items,
                _engine_failure(error) if evidence is None else _refused(error, evidence),
            )

    def known_good(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> None:
        """A batch the engine ran at start (the server's warm-up inputs): what tells a request
        the model fails on from an engine that fails everything (`check_engine`)."""
        self._known_good = inputs

    def longest_run(self) -> tuple[float, int] | None:
        """The run on the engine that has lasted longest, now: its seconds so far and rows (a
        run that never ends is an engine that hangs); None while none runs."""
        if not self._running:
            return None
        started, rows = min(self._running.values())
        return self._clock() - started, rows

    @property
    def broken(self) -> str | None:
        """Why the engine is taken to fail whatever it is given — it failed the known-good
        batch, or the device has no memory for even one row, in the engine's words — or None.
        Cleared by the next run that does not fail."""
        return self._broken

    async def check_engine(self) -> bool:
        """Run the known-good batch: whether the engine runs (without one, whether it was not
        `broken`). A failure other than the device's memory marks it `broken`: every batch
        then fails at once, without parts, until a run does not; the server's health says so,
        and asks again (a probe)."""
        inputs = self._known_good
        if inputs is None:
            return self._broken is None
        started = self._clock()
        self._busy.begin(started)
        run = next(self._runs)
        self._running[run] = (started, 1)
        try:
            outputs = await self._engine.run(inputs)
            # Its rows checked as a batch's are: an engine that answers the wrong number of
            # rows fails this one too (before, it "ran", and the request was refused with 400
            # for its inputs).
            _check_rows(outputs, rows=_rows_of(inputs))
        except Exception as exc:
            self._failed_runs += 1
            if not out_of_memory(exc):  # the device full of other batches says nothing of it
                self._broken = f"the engine fails the batch it ran at start: {first_line(exc)}"
            return False
        finally:
            self._busy.end(self._clock())
            del self._running[run]
        self._ran_now()
        return True

    async def _runs_others(self, *, presume: bool) -> str | None:
        """Whether the engine runs other inputs than those it just failed on, in words for the
        refusal (None: it does not, or nothing says it does): it runs the known-good batch; or,
        without one and where `presume`, it has run a batch and is not `_failing`."""
        if self._known_good is not None:
            works = await self.check_engine()
            return "while the model runs a known-good batch" if works else None
        if presume and self._ran and not self._failing:
            return "while the engine runs others"
        return None

    def _ran_now(self) -> None:
        self._failed_runs = 0
        self._ran = True
        self._broken = None

    @property
    def _failing(self) -> bool:
        """Whether the engine's last `SYSTEMATIC_FAILURES` runs all failed: it fails whatever
        it is given, and a batch is not run again in parts to find whose inputs it fails on."""
        return self._failed_runs >= SYSTEMATIC_FAILURES

    async def _attempt(self, batch: Batch) -> BaseException | None:
        """Run `batch` once: answer its requests and return None, or return the engine's error
        and leave them unanswered (a cancelled run answers them: the server is stopping)."""
        clock = self._clock
        items = batch.items
        rows = batch.rows
        gathering = clock()
        inputs = items[0].inputs if len(items) == 1 else _concatenate(items)
        started = clock()
        self._busy.begin(started)
        run = next(self._runs)
        self._running[run] = (started, rows)
        predictor = self._predictor
        token = predictor.started(rows, started) if predictor is not None else 0
        timed: float | None = None
        try:
            try:
                if self._run_timed is not None:
                    ran = await self._run_timed(inputs)
                    outputs, timed = ran.outputs, ran.seconds
                else:
                    outputs = await self._engine.run(inputs)
            except asyncio.CancelledError:
                del self._running[run]
                self._busy.end(clock())
                if predictor is not None:
                    predictor.finished(token, rows=rows, seconds=None, now=clock())
                _fail(items, ShuttingDown("the server stopped before the batch finished"))
                raise
            _check_rows(outputs, rows=rows)
        except Exception as exc:
            del self._running[run]
            ended = clock()
            self._busy.end(ended)
            compute_s = ended - started
            if predictor is not None:
                predictor.finished(token, rows=rows, seconds=None, now=ended)
            self._observer.batch_failed(rows=rows, requests=len(items), compute_s=compute_s)
            self._failed_runs += 1
            return exc
        del self._running[run]
        self._ran_now()
        self._ran_rows = max(self._ran_rows, rows)
        ended = clock()
        self._busy.end(ended)
        compute_s = (
            ended - started
            if timed is None
            else self._loop_delay.compute_s(timed_s=timed, span_s=ended - started)
        )
        if predictor is not None:
            predictor.finished(
                token,
                rows=rows,
                seconds=compute_s,
                now=ended,
                probe=any(item.probe for item in items),
            )
            # Background rows a batch took in the room left (`BatchQueue._fill_background`)
            # were not in its requests' predictions: the time they add is no error of those.
            added = _added_s(predictor, items)
            for item in items:
                # A probe's prediction was not trusted, so its error says nothing about them; a
                # request already answered (504 at its deadline, behind a stall) waits for
                # nothing, and its seconds late would keep refusing requests for the window.
                if item.predicted is not None and not item.probe and not item.future.done():
                    predictor.lateness.observe(ended - item.predicted - added, now=ended)
        start = 0
        for item in items:
            end = start + item.rows
            if not item.future.done():
                item.future.set_result({name: out[start:end] for name, out in outputs.items()})
            start = end
        self._observer.batch_done(
            BatchDone(
                rows=rows,
                compute_s=compute_s,
                queue_waits_s=tuple(
                    batch.formed_at - item.enqueued_at for item in items if not item.background
                ),
                background_waits_s=tuple(
                    batch.formed_at - item.enqueued_at for item in items if item.background
                ),
                input_s=started - gathering,
                output_s=clock() - ended,
            )
        )
        return None

    async def _isolate(self, batch: Batch) -> None:
        """The engine failed on a batch of several requests: one request's inputs may be what
        it fails on (a token id past the vocabulary, a value a custom operator refuses), and
        the others are not to pay for it. The requests run again in halves, each half that
        fails in halves again, down to requests alone; the halves that run are answered at
        once. A request that fails alone, where others of the batch ran, is refused for its
        inputs (`RefusedByModel`, 400, in the engine's words); where none ran, only the
        known-good batch running says so (`_runs_others`), else the engine is what fails (500).
        Once the engine has failed `SYSTEMATIC_FAILURES` runs in a row, a
        failing part is not split further: one bad request costs a failed and an answered run
        per halving, a broken engine that many runs before every batch fails at once."""
        parts = deque(_halves(batch.items))
        alone: list[tuple[Pending, BaseException]] = []
        answered = 0
        failure: BaseException | None = None
        while parts:
            part = self._queue.still_due(parts.popleft())
            if not part:
                continue  # every request of it answered or expired: nothing to run it for
            # Failed runs in a row, of this split's parts: the engine fails everything, or
            # several bad requests failed in a row. The known-good batch tells: where it runs,
            # the search goes on (before, four bad requests of 32 had the 28 good ones answered
            # 500 by a healthy engine).
            if (
                failure is not None
                and self._failing
                and await self._runs_others(presume=False) is None
            ):
                _fail(part, _engine_failure(failure))
                continue
            sub = Batch(part, batch.settings, batch.formed_at)
            error = await self._attempt(sub)
            if error is None:
                answered += len(part)
            elif out_of_memory(error):
                await self._out_of_memory(sub, error)
            elif len(part) == 1:
                alone.append((part[0], error))
            else:
                failure = error
                parts.extend(_halves(part))
        evidence: str | None = None
        if answered:
            evidence = (
                f"while {answered} of the {len(batch.items) - 1} requests batched with it ran"
            )
        elif alone:
            # None of the batch ran: only the known-good batch says the engine runs (a device
            # lost between two batches is more common than a batch of bad requests only).
            evidence = await self._runs_others(presume=False)
        for item, error in alone:
            _fail([item], _engine_failure(error) if evidence is None else _refused(error, evidence))

    async def _out_of_memory(self, batch: Batch, error: BaseException) -> None:
        """The device had no memory for the batch: its requests run again in two halves, and so
        on down, rather than fail; and where a half ran, no batch that large is formed again
        (the server lowers its limit, `on_out_of_memory(rows, ran)`). A single request is never
        split (its rows are its client's): one that does not fit alone fails, saying so. Where
        even one row does not fit, the device is full whatever the batch (a leak, another
        process holding the memory): no size is to blame, and the engine is taken to fail
        (`broken`: not ready, not live) until a run goes through — before, the limit went down
        to one row, every multi-row request was refused as too large (413) and every other
        failed (500) on a replica that stayed ready."""
        rows = batch.rows
        items = batch.items
        if len(items) == 1:
            if rows == 1:
                self._broken = f"the device has no memory for even one row: {first_line(error)}"
            elif self._on_out_of_memory is not None and self._broken is None:
                self._on_out_of_memory(rows, 0)  # no batch of its rows is formed again
            advice = "send fewer rows a request" if rows > 1 else "even one row does not fit"
            _fail(
                items,
                EngineFailure(
                    f"the device ran out of memory for this request's {rows} rows alone; "
                    f"{advice} ({first_line(error)})"
                ),
            )
            return
        before, self._ran_rows = self._ran_rows, 0
        for half in _halves(items):
            if part := self._queue.still_due(half):
                await self.run_batch(Batch(part, batch.settings, batch.formed_at))
        ran, self._ran_rows = self._ran_rows, max(before, self._ran_rows)
        if self._on_out_of_memory is not None and self._broken is None:
            self._on_out_of_memory(rows, ran)


def _halves(items: tuple[Pending, ...]) -> tuple[tuple[Pending, ...], tuple[Pending, ...]]:
    half = len(items) // 2
    return items[:half], items[half:]


def _refused(error: BaseException, evidence: str) -> RefusedByModel:
    return RefusedByModel(
        f"the model failed on this request's inputs, {evidence}: {first_line(error)}"
    )


def _engine_failure(error: BaseException) -> EngineFailure:
    return error if isinstance(error, EngineFailure) else EngineFailure(f"engine error: {error}")


def _check_rows(outputs: Mapping[str, np.ndarray[Any, Any]], *, rows: int) -> None:
    """Raise `EngineFailure` where an output has not one row for each of the batch's."""
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise EngineFailure(
                f"the engine returned {array.shape[0] if array.ndim else 0} rows of "
                f"output '{name}' for a batch of {rows} rows"
            )


def _rows_of(inputs: Mapping[str, np.ndarray[Any, Any]]) -> int:
    return int(next(iter(inputs.values())).shape[0])


def _fail(items: Sequence[Pending], error: BaseException) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)


def _concatenate(items: Sequence[Pending]) -> dict[str, np.ndarray[Any, Any]]:
    names = items[0].inputs.keys()
    return {name: np.concatenate([item.inputs[name] for item in items]) for name in names}


def _added_s(predictor: Predictor, items: Sequence[Pending]) -> float:
    """The time a batch's background rows add to its requests of the SLA, by the fit: none
    where the batch is one or the other only."""
    own = sum(item.rows for item in items if not item.background)
    background = sum(item.rows for item in items if item.background)
    if not own or not background:
        return 0.0
    timing = predictor.timing
    whole, alone = timing.seconds(own + background), timing.seconds(own)
    return 0.0 if whole is None or alone is None else max(0.0, whole - alone)
