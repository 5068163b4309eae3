"""One load test, start to finish: offer the load, record every request, and report.

This is where the pieces meet: the session's prepared request is sent by the open or closed
loop, each outcome is recorded with the precise clock, and the statistics turn the outcomes into
a LoadReport. `run_load` is the entry point; a find-max search calls `run_with` once per probe on
one shared session. A report says whether it is a result at all (`valid`): an open loop whose
client fell behind or dropped arrivals measured less load than it names.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from batchpilot.runtime.loadgen.client import (
    TargetSession,
    send_hedged,
    send_once,
    send_retrying,
)
from batchpilot.runtime.loadgen.config import LoadConfig
from batchpilot.runtime.loadgen.errors import UNFINISHED
from batchpilot.runtime.loadgen.loops import (
    PRECISE_CLOCK,
    Clock,
    Recorder,
    closed_loop,
    open_loop,
)
from batchpilot.runtime.loadgen.stats import LatencyStats, WindowStats, summarize

_HARD_CAP_GRACE_S: Final = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    mode: Literal["open", "closed"]
    url: str
    model: str
    inputs: Mapping[str, tuple[int, ...]]
    request_bytes: int
    duration_s: float
    warmup_s: float
    elapsed_s: float
    """From the start of the measured period to the last measured completion (for an open loop
    at least the duration, which the offered schedule spans)."""
    target_rps: float | None
    """The schedule's mean rate over the duration (open loop)."""
    offered_rps: float | None
    """Arrivals actually scheduled over the duration (open loop)."""
    concurrency: int | None
    scheduled: int
    sent: int
    succeeded: int
    achieved_qps: float
    errors: Mapping[str, int]
    shed: int
    failed: int
    latency_ms: LatencyStats | None
    """From the scheduled send time (open loop), over successful requests."""
    service_latency_ms: LatencyStats | None
    """From the actual send time, over successful requests."""
    windows: tuple[WindowStats, ...]
    window_s: float
    aborted: bool = False
    """The run stopped early, once it could no longer meet the SLA (find-max probes)."""
    valid: bool = True
    """False when an open loop did not offer the load it was asked to (see invalid_reason): its
    numbers do not describe the load it names, so they are not a result."""
    invalid_reason: str | None = None
    """Why the run is invalid, in words (client-side drops, send lag); None when valid."""
    send_lag_ms: LatencyStats | None = None
    """Open loop: how late each request went out (sent - scheduled), over measured sends."""
    late_send_fraction: float | None = None
    """Open loop: the fraction of measured sends more than max_send_lag_ms late."""
    max_send_lag_ms: float | None = None
    """Open loop: the send lag P99 limit the run was judged against."""
    shed_latency_ms: LatencyStats | None = None
    """Requests refused with 503/429, from the actual send to the refusal: a server that sheds
    well answers these in milliseconds instead of letting them time out."""
    sla_ms: float | None = None
    """The SLA goodput counts against, when the run was given one."""
    goodput_rps: float | None = None
    sla_misses: int | None = None
    """Requests answered after `sla_ms`, and refused ones (503/429): misses of the SLA."""
    """With an SLA: successes within it (latency as in latency_ms) per second of elapsed_s."""
    retries: int = 0
    """Refused sends the client repeated for the measured requests (`LoadConfig.retries`):
    arrivals at the server beyond `sent`. Each request is counted once, by its last answer."""
    row_mix: str | None = None
    """The rows a request brought, where they were drawn from a mix (`Target.row_mix`): the
    sizes, their shares, mean and cv; `inputs` and `request_bytes` are then the first size's."""
    hedges: int = 0
    """Measured requests sent a second time for want of an answer (`LoadConfig.hedge_s`):
    arrivals at the server beyond `sent`, the slower of each pair cancelled. Each request is
    counted once, by its first success."""

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["inputs"] = {name: list(shape) for name, shape in self.inputs.items()}
        doc["errors"] = dict(self.errors)
        return doc


async def run_with(
    client: TargetSession, config: LoadConfig, *, clock: Clock = PRECISE_CLOCK
) -> LoadReport:
    """Run one load test on an open session (its target is the one reported)."""
    assert client.session is not None, "use `async with`"
    assert client.request is not None, "use `async with`"
    session, request, verify = client.session, client.request, client.target.verify
    recorder = Recorder()
    t0 = clock()

    retries = config.retries
    repeats = hedges = 0
    measure_start = config.warmup_s

    async def send(scheduled: float) -> None:
        sent = clock() - t0
        chosen = client.pick()  # one size of a mix, or the one request

        def on_retry() -> None:
            nonlocal repeats
            if scheduled >= measure_start:
                repeats += 1

        def on_hedge() -> None:
            nonlocal hedges
            if scheduled >= measure_start:
                hedges += 1

        try:
            if config.hedge_s is not None:
                kind = await send_hedged(
                    session,
                    chosen,
                    verify=verify,
                    hedge_s=config.hedge_s,
                    marked=retries.marked,
                    on_hedge=on_hedge,
                )
            elif retries.attempts:
                kind = await send_retrying(
                    session, chosen, verify=verify, retries=retries, on_retry=on_retry
                )
            else:
                kind = await send_once(session, chosen, verify=verify)
        except asyncio.CancelledError:
            recorder.add(scheduled, sent, clock() - t0, UNFINISHED)
            raise
        recorder.add(scheduled, sent, clock() - t0, kind)

    tries = retries.attempts + 1
    hard_deadline = (
        t0
        + config.warmup_s
        + config.duration_s
        + tries * client.target.timeout_s
        + retries.longest_s
        + (config.hedge_s or 0.0)  # a hedged request's copy may time out that much later
        + _HARD_CAP_GRACE_S
    )
    if config.schedule is not None:
        stopped_early = await open_loop(
            config, config.schedule, send, recorder, clock=clock, t0=t0, deadline=hard_deadline
        )
    else:
        assert config.concurrency is not None
        stopped_early = await closed_loop(
            config, config.concurrency, send, clock=clock, t0=t0, deadline=hard_deadline
        )
    numbers = summarize(
        recorder.outcomes(),
        measure_start_s=config.warmup_s,
        duration_s=config.duration_s,
        window_s=config.window_s,
        open_loop=config.schedule is not None,
        stopped_early=stopped_early,
        max_send_lag_ms=config.max_send_lag_ms,
        sla_ms=config.sla_ms,
    )
    return LoadReport(
        mode="open" if config.schedule is not None else "closed",
        url=client.target.url,
        model=client.target.model,
        inputs=request.inputs,
        request_bytes=len(request.body),
        duration_s=config.duration_s,
        warmup_s=config.warmup_s,
        target_rps=(config.schedule.mean_rate(config.duration_s) if config.schedule else None),
        concurrency=config.concurrency,
        window_s=config.window_s,
        aborted=stopped_early,
        retries=repeats,
        hedges=hedges,
        row_mix=(
            client.target.row_mix.describe()
            if client.target.row_mix is not None and not client.target.row_mix.single
            else None
        ),
        **numbers,
    )


async def run_load(config: LoadConfig, *, clock: Clock = PRECISE_CLOCK) -> LoadReport:
    """Run one load test as configured. Raises TargetError if the target can't be used."""
    async with TargetSession(config.target, pool_size=config.pool_size) as client:
        return await run_with(client, config, clock=clock)
