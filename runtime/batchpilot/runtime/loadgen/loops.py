"""The two ways of offering load, and the recorder they share: when each request is sent.

The open loop sends every arrival at its scheduled time whatever is outstanding, so a slow
server cannot slow it down and hide its queueing (coordinated omission); latency is then
measured from the scheduled time. The closed loop (fixed concurrency) sends back to back. Both
take the send itself as a callable, so they know nothing of HTTP, and both stop at a hard
deadline and re-raise a bug in the generator rather than pass it off as a result.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

import numpy as np

from batchpilot.runtime.loadgen.config import LoadConfig
from batchpilot.runtime.loadgen.errors import DROPPED_CLIENT, SHED_KINDS
from batchpilot.runtime.loadgen.schedule import RateSchedule, arrival_times
from batchpilot.runtime.loadgen.stats import Outcomes

Clock = Callable[[], float]
PRECISE_CLOCK: Final[Clock] = time.perf_counter
"""Timestamps come from this clock, not the loop's: uvloop's `loop.time()` has millisecond
resolution and is cached per loop iteration, which would quantize every latency to 1 ms."""
_YIELD_EVERY: Final = 64
"""When the scheduler is behind, it launches due arrivals back to back; it yields to the loop
every this many so the requests it started get to run."""


class Recorder:
    """Appends one entry per request on the hot path; arrays are built once, at the end."""

    __slots__ = ("done", "kind", "on_record", "scheduled", "sent")

    def __init__(self) -> None:
        self.scheduled: list[float] = []
        self.sent: list[float] = []
        self.done: list[float] = []
        self.kind: list[str] = []
        self.on_record: Callable[[float, float, str], None] | None = None

    def add(self, scheduled: float, sent: float, done: float, kind: str) -> None:
        self.scheduled.append(scheduled)
        self.sent.append(sent)
        self.done.append(done)
        self.kind.append(kind)
        if self.on_record is not None:
            self.on_record(scheduled, done, kind)

    def outcomes(self) -> Outcomes:
        return Outcomes(
            scheduled=np.array(self.scheduled, dtype=np.float64),
            sent=np.array(self.sent, dtype=np.float64),
            done=np.array(self.done, dtype=np.float64),
            kind=np.array(self.kind, dtype=np.str_),
        )


def breach_watch(
    *, sla_s: float, measure_start_s: float, planned: int, stop: Callable[[], None]
) -> Callable[[float, float, str], None]:
    """A callback that calls `stop` once P99 <= SLA has become impossible: any measured error
    but a refusal, or more late answers and refusals than the 1 % that nearest-rank P99
    allows."""
    allowed_late = planned - math.ceil(planned * 0.99 - 1e-9)
    late = 0

    def on_record(scheduled: float, done: float, kind: str) -> None:
        nonlocal late
        if scheduled < measure_start_s:
            return
        if kind and kind not in SHED_KINDS:
            stop()
        elif kind or done - scheduled > sla_s:
            late += 1
            if late > allowed_late:
                stop()

    return on_record


async def open_loop(
    config: LoadConfig,
    schedule: RateSchedule,
    send: Callable[[float], Coroutine[Any, Any, None]],
    recorder: Recorder,
    *,
    clock: Clock,
    t0: float,
    deadline: float,
) -> bool:
    """Send every arrival at its scheduled time. Returns whether the run was stopped early."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng([config.seed, 1])
    warmup = arrival_times(
        RateSchedule.constant(schedule.rate_at(0.0)),
        duration_s=config.warmup_s,
        rng=rng,
        process=config.arrivals,
    )
    measured = arrival_times(
        schedule,
        duration_s=config.duration_s,
        rng=rng,
        process=config.arrivals,
        clump=config.clump,
    )
    if config.max_requests is not None:
        measured = measured[: config.max_requests]
    arrivals: list[float] = np.concatenate([warmup, measured + config.warmup_s]).tolist()

    finished: asyncio.Future[bool] = loop.create_future()  # result: whether stopped early

    def finish(stopped_early: bool) -> None:
        if not finished.done():
            finished.set_result(stopped_early)

    if config.stop_early_sla_ms is not None:
        recorder.on_record = breach_watch(
            sla_s=config.stop_early_sla_ms / 1000.0,
            measure_start_s=config.warmup_s,
            planned=len(measured),
            stop=lambda: finish(True),
        )

    outstanding: set[asyncio.Task[None]] = set()
    scheduling = True

    def on_request_done(task: asyncio.Task[None]) -> None:
        outstanding.discard(task)
        if not scheduling and not outstanding:
            finish(False)

    async def schedule_all() -> None:
        nonlocal scheduling
        launched_without_yield = 0
        for offset in arrivals:
            delay = t0 + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)
                launched_without_yield = 0
            elif launched_without_yield >= _YIELD_EVERY:
                await asyncio.sleep(0)
                launched_without_yield = 0
            if len(outstanding) >= config.max_outstanding:
                now = clock() - t0
                recorder.add(offset, math.nan, now, DROPPED_CLIENT)
                continue
            task = loop.create_task(send(offset))
            outstanding.add(task)
            task.add_done_callback(on_request_done)
            launched_without_yield += 1
        scheduling = False
        if not outstanding:
            finish(False)

    def on_scheduler_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            finish(False)  # a bug, not load: stop waiting, and raise it below

    scheduler = loop.create_task(schedule_all())
    scheduler.add_done_callback(on_scheduler_done)
    try:
        await asyncio.wait([finished], timeout=max(0.0, deadline - clock()))
    finally:
        await _cancel_all([scheduler, *outstanding])
    _raise_failure([scheduler])
    return finished.done() and finished.result()


async def closed_loop(
    config: LoadConfig,
    concurrency: int,
    send: Callable[[float], Coroutine[Any, Any, None]],
    *,
    clock: Clock,
    t0: float,
    deadline: float,
) -> bool:
    """`concurrency` workers, each sending back to back until the duration (or the request cap)
    is reached. Latency is measured from each send: a closed loop offers no schedule."""
    loop = asyncio.get_running_loop()
    end = t0 + config.warmup_s + config.duration_s
    measure_start = t0 + config.warmup_s
    remaining = config.max_requests

    async def worker() -> None:
        nonlocal remaining
        while (now := clock()) < end:
            if now >= measure_start and remaining is not None:
                if remaining <= 0:
                    return
                remaining -= 1
            await send(now - t0)

    workers = [loop.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.wait(workers, timeout=max(0.0, deadline - clock()))
    finally:
        await _cancel_all(workers)
    _raise_failure(workers)
    return False


async def _cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _raise_failure(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Re-raise the first exception of a finished task: a bug in the generator must not pass
    for a result."""
    for task in tasks:
        if task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None:
                raise exc
