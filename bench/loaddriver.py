"""The benchmark's load: "the highest QPS at P99 <= SLA" and the latency at low load.

One search, two ways to run a probe, so the benchmark works whether or not the project's load
generator is installed:

- `loadgen`: `batchpilot.runtime.loadgen.run_load`, the project's own open loop;
- `bench`: the compact open loop below.

Both offer Poisson arrivals at a constant rate, send each request at its scheduled time whatever
is outstanding, and measure latency from the scheduled time (so a slow server cannot slow the
client down and hide its queueing). A probe passes only with no error of any kind and P99 <= SLA,
and stops as soon as it can no longer pass. The search ramps the rate up by 2x until a probe
fails, then bisects geometrically. Every probe and every search is bounded in time.

The machine may be shared: each probe is metered (`cpu_meter`), and one during which other
processes used the CPU is repeated after they go quiet, within a bounded budget; the probes
report what the others used, so a disturbed result is visible as such.

The client shares a two-core machine with the server, so it is kept cheap: the body is encoded
once, one aiohttp session with a connection pool is reused, responses are read, not decoded.
Latency at low load (`closed_loop_latency`) is timed with `time.perf_counter`, one request at a
time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

from batchpilot.runtime.protocol import Tensor, encode_request
from cpu_meter import CpuMeter, QuietPolicy

Driver = Literal["loadgen", "bench"]


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One v2 infer request, encoded once and reused for every send."""

    base_url: str
    model: str
    url: str
    body: bytes
    headers: Mapping[str, str]


def prepare(
    base_url: str, model: str, inputs: Mapping[str, np.ndarray[Any, Any]]
) -> PreparedRequest:
    tensors = [Tensor(name, "FP32", array) for name, array in inputs.items()]
    body, header_length = encode_request(tensors, binary=True, binary_outputs=True)
    assert header_length is not None
    return PreparedRequest(
        base_url=base_url,
        model=model,
        url=f"{base_url}/v2/models/{model}/infer",
        body=body,
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(header_length),
        },
    )


@dataclass(frozen=True, slots=True)
class Probe:
    rate_rps: float
    passed: bool
    scheduled: int
    succeeded: int
    achieved_qps: float
    p50_ms: float | None
    p99_ms: float | None
    errors: dict[str, int]
    stopped_early: bool
    others_cores: float | None = None
    """CPU used by other processes during the probe, in cores."""
    ours_cores: float | None = None
    """CPU used by the client and the server during the probe, in cores."""
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate_rps": round(self.rate_rps, 1),
            "passed": self.passed,
            "scheduled": self.scheduled,
            "succeeded": self.succeeded,
            "achieved_qps": round(self.achieved_qps, 1),
            "p50_ms": _round(self.p50_ms),
            "p99_ms": _round(self.p99_ms),
            "errors": self.errors,
            "stopped_early": self.stopped_early,
            "others_cores": _round(self.others_cores, 2),
            "ours_cores": _round(self.ours_cores, 2),
            "attempts": self.attempts,
        }


@dataclass(frozen=True, slots=True)
class SearchSettings:
    sla_ms: float = 100.0
    start_rps: float = 50.0
    probe_s: float = 5.0
    warmup_s: float = 0.5
    """Sent at the probe's rate before the measured period, not counted."""
    precision: float = 0.05
    """Stop when the lowest failing rate is within this fraction of the best passing one."""
    max_probes: int = 12
    budget_s: float = 90.0
    """Probing time of one search (time spent waiting for quiet is not counted)."""
    settle_s: float = 0.5
    timeout_s: float = 5.0
    """Per-request timeout; a probe's hard cap is warm-up + duration + this + 1 s."""
    max_outstanding: int = 1024


@dataclass(slots=True)
class SearchResult:
    best_rps: float | None
    stopped_because: str
    driver: Driver
    elapsed_s: float
    probes: list[Probe] = field(default_factory=list)

    @property
    def best_probe(self) -> Probe | None:
        passed = [p for p in self.probes if p.passed]
        return max(passed, key=lambda p: p.rate_rps) if passed else None

    @property
    def worst_others_cores(self) -> float | None:
        values = [p.others_cores for p in self.probes if p.others_cores is not None]
        return max(values) if values else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "best_rps": _round(self.best_rps),
            "stopped_because": self.stopped_because,
            "driver": self.driver,
            "elapsed_s": round(self.elapsed_s, 1),
            "worst_others_cores": _round(self.worst_others_cores, 2),
            "probes": [p.as_dict() for p in self.probes],
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def nearest_rank(sorted_ms: np.ndarray[Any, Any], percent: float) -> float:
    """The textbook percentile: the smallest sample with `percent` % of samples at or below."""
    rank = max(1, math.ceil(len(sorted_ms) * percent / 100.0 - 1e-9))
    return float(sorted_ms[min(rank, len(sorted_ms)) - 1])


def next_rate(start: float, passed: float, failed: float | None, precision: float) -> float | None:
    """Exponential ramp until a probe fails, then geometric bisection (None: done)."""
    if failed is None:
        return start if passed == 0 else passed * 2
    if passed == 0:
        return failed / 2 if failed / 2 >= 0.5 else None
    if failed / passed - 1 <= precision:
        return None
    return math.sqrt(passed * failed)


RunProbe = Callable[[float, int], Awaitable[Probe]]


async def search(
    run_probe: RunProbe,
    settings: SearchSettings,
    *,
    driver: Driver,
    quiet: QuietPolicy,
    server_pids: Sequence[int],
) -> SearchResult:
    """Ramp, then bisect; each probe metered and repeated if other processes disturbed it."""
    started = time.monotonic()
    waited_before = quiet.waited_s
    passed_rps, failed_rps = 0.0, None
    result = SearchResult(best_rps=None, stopped_because="converged", driver=driver, elapsed_s=0)
    worst_probe_s = settings.warmup_s + settings.probe_s + settings.timeout_s + settings.settle_s
    while True:
        rate = next_rate(settings.start_rps, passed_rps, failed_rps, settings.precision)
        if rate is None:
            result.stopped_because = "converged" if passed_rps else "nothing_passes"
            break
        if len(result.probes) >= settings.max_probes:
            result.stopped_because = "max_probes"
            break
        probing_s = time.monotonic() - started - (quiet.waited_s - waited_before)
        if probing_s + worst_probe_s > settings.budget_s:
            result.stopped_because = "time_budget"
            break
        probe = await _metered_probe(
            run_probe, rate, len(result.probes), settings, quiet, server_pids
        )
        result.probes.append(probe)
        if probe.passed:
            passed_rps = max(passed_rps, rate)
        elif failed_rps is None or rate < failed_rps:
            failed_rps = rate
    result.best_rps = passed_rps or None
    result.elapsed_s = time.monotonic() - started
    return result


async def _metered_probe(
    run_probe: RunProbe,
    rate: float,
    index: int,
    settings: SearchSettings,
    quiet: QuietPolicy,
    pids: Sequence[int],
) -> Probe:
    attempt = 0
    while True:
        attempt += 1
        await asyncio.sleep(settings.settle_s)  # let a failed probe's backlog drain
        await quiet.wait_async(pids, say=f"the {rate:.0f} QPS probe")
        meter = CpuMeter(pids)
        probe = await run_probe(rate, index * 10 + attempt)
        use = meter.stop()
        if use is not None:
            probe = dataclasses.replace(
                probe, others_cores=use.others_cores, ours_cores=use.ours_cores, attempts=attempt
            )
        if quiet.is_quiet(use):
            return probe
        if attempt > quiet.retries or quiet.waited_s >= quiet.wait_budget_s:
            quiet.disturbed += 1
            return probe
        quiet.repeated += 1
        assert use is not None
        print(
            f"    the {rate:.0f} QPS probe was disturbed (other processes used "
            f"{use.others_cores:.2f} cores): repeating it",
            flush=True,
        )


# --- The bench's own open loop ------------------------------------------------------------------


async def open_loop_probe(
    session: aiohttp.ClientSession,
    request: PreparedRequest,
    *,
    rate_rps: float,
    settings: SearchSettings,
    seed: int,
) -> Probe:
    """One open-loop run at a constant Poisson rate; stops early once P99 <= SLA is lost."""
    rng = np.random.default_rng(seed)
    warmup = np.sort(rng.uniform(0, settings.warmup_s, rng.poisson(rate_rps * settings.warmup_s)))
    measured_n = max(1, int(rng.poisson(rate_rps * settings.probe_s)))
    measured = settings.warmup_s + np.sort(rng.uniform(0, settings.probe_s, measured_n))
    arrivals = np.concatenate([warmup, measured]).tolist()
    first_measured = len(warmup)
    allowed_late = measured_n - math.ceil(measured_n * 0.99 - 1e-9)
    sla_s = settings.sla_ms / 1e3

    loop = asyncio.get_running_loop()
    stop: asyncio.Future[bool] = loop.create_future()  # result: stopped early
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    late = 0
    outstanding: set[asyncio.Task[None]] = set()
    scheduling_done = False
    clock = time.perf_counter
    t0 = clock() + 0.005

    def finish(early: bool) -> None:
        if not stop.done():
            stop.set_result(early)

    async def send(index: int, scheduled: float) -> None:
        nonlocal late
        try:
            async with session.post(request.url, data=request.body, headers=request.headers) as r:
                await r.read()
                kind = "" if r.status == 200 else str(r.status)
        except TimeoutError:
            kind = "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            kind = type(exc).__name__
        if index < first_measured:
            return
        if kind:
            errors[kind] += 1
            finish(True)
            return
        latency = clock() - scheduled
        latencies.append(latency)
        if latency > sla_s:
            late += 1
            if late > allowed_late:
                finish(True)

    def done_callback(task: asyncio.Task[None]) -> None:
        outstanding.discard(task)
        if not outstanding and scheduling_done:
            finish(False)

    async def schedule() -> None:
        nonlocal scheduling_done
        for index, offset in enumerate(arrivals):
            scheduled = t0 + offset
            delay = scheduled - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(outstanding) >= settings.max_outstanding:
                if index >= first_measured:
                    errors["client_overloaded"] += 1
                    finish(True)
                continue
            task = loop.create_task(send(index, scheduled))
            outstanding.add(task)
            task.add_done_callback(done_callback)
        scheduling_done = True
        if not outstanding:
            finish(False)

    scheduler = loop.create_task(schedule())
    cap = settings.warmup_s + settings.probe_s + settings.timeout_s + 1.0
    try:
        await asyncio.wait([stop], timeout=cap)
    finally:
        for task in [scheduler, *outstanding]:
            task.cancel()
        await asyncio.gather(scheduler, *outstanding, return_exceptions=True)
    if not stop.done():
        errors["unfinished"] += 1
    stopped_early = stop.done() and stop.result()
    values = np.sort(np.asarray(latencies)) * 1e3
    elapsed = max(clock() - t0 - settings.warmup_s, settings.probe_s)
    p99 = nearest_rank(values, 99) if len(values) else None
    return Probe(
        rate_rps=rate_rps,
        passed=not stopped_early and not errors and p99 is not None and p99 <= settings.sla_ms,
        scheduled=measured_n,
        succeeded=len(values),
        achieved_qps=len(values) / elapsed,
        p50_ms=nearest_rank(values, 50) if len(values) else None,
        p99_ms=p99,
        errors=dict(errors),
        stopped_early=stopped_early,
    )


# --- The project's load generator -------------------------------------------------------------


def loadgen_available() -> bool:
    """Whether `batchpilot.runtime.loadgen` offers what `loadgen_probe` calls."""
    try:
        from batchpilot.runtime import loadgen
    except ImportError:
        return False
    names = ("run_load", "LoadConfig", "Target", "RateSchedule", "probe_passes")
    if not all(hasattr(loadgen, n) for n in names):
        return False
    return _stop_early_field(loadgen.LoadConfig) is not None


def _stop_early_field(config_class: Any) -> str | None:
    fields = {f.name for f in dataclasses.fields(config_class)}
    for name in ("stop_early_sla_ms", "abort_on_sla_ms"):
        if name in fields:
            return name
    return None


async def loadgen_probe(
    request: PreparedRequest, *, rate_rps: float, settings: SearchSettings, seed: int
) -> Probe:
    """One probe through `batchpilot.runtime.loadgen.run_load` (binary tensors, one row)."""
    from batchpilot.runtime import loadgen

    stop_field = _stop_early_field(loadgen.LoadConfig)
    assert stop_field is not None
    stop_early: dict[str, Any] = {stop_field: settings.sla_ms}  # renamed once already
    config = loadgen.LoadConfig(
        target=loadgen.Target(
            url=request.base_url, model=request.model, rows=1, timeout_s=settings.timeout_s
        ),
        duration_s=settings.probe_s,
        schedule=loadgen.RateSchedule.constant(rate_rps),
        warmup_s=settings.warmup_s,
        max_outstanding=settings.max_outstanding,
        seed=seed,
        **stop_early,
    )
    report = await loadgen.run_load(config)
    latency = report.latency_ms
    return Probe(
        rate_rps=rate_rps,
        passed=loadgen.probe_passes(report, sla_ms=settings.sla_ms),
        scheduled=report.scheduled,
        succeeded=report.succeeded,
        achieved_qps=report.achieved_qps,
        p50_ms=latency.p50_ms if latency else None,
        p99_ms=latency.p99_ms if latency else None,
        errors=dict(report.errors),
        stopped_early=report.aborted,
    )


async def find_max(
    request: PreparedRequest,
    settings: SearchSettings,
    *,
    driver: Driver,
    quiet: QuietPolicy,
    server_pids: Sequence[int],
) -> SearchResult:
    """The highest rate with P99 <= SLA and no errors, by the chosen driver."""
    if driver == "loadgen":

        async def run_loadgen(rate: float, seed: int) -> Probe:
            return await loadgen_probe(request, rate_rps=rate, settings=settings, seed=seed)

        return await search(
            run_loadgen, settings, driver=driver, quiet=quiet, server_pids=server_pids
        )
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=settings.max_outstanding),
        timeout=aiohttp.ClientTimeout(total=settings.timeout_s),
    ) as session:

        async def run_bench(rate: float, seed: int) -> Probe:
            return await open_loop_probe(
                session, request, rate_rps=rate, settings=settings, seed=seed
            )

        return await search(
            run_bench, settings, driver=driver, quiet=quiet, server_pids=server_pids
        )


# --- Low-load latency ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencySample:
    count: int
    p50_ms: float
    p99_ms: float
    mean_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "p50_ms": round(self.p50_ms, 4),
            "p99_ms": round(self.p99_ms, 4),
            "mean_ms": round(self.mean_ms, 4),
        }


async def closed_loop_latency(
    url: str,
    *,
    body: bytes | None,
    headers: Mapping[str, str] | None = None,
    count: int,
    max_s: float,
    warmup: int = 50,
) -> LatencySample:
    """One request at a time over one kept-alive connection (POST with `body`, else GET)."""
    samples: list[float] = []
    clock = time.perf_counter
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=10)
    ) as session:
        deadline = clock() + max_s
        for i in range(warmup + count):
            if clock() > deadline:
                break
            start = clock()
            if body is None:
                async with session.get(url) as r:
                    await r.read()
                    status = r.status
            else:
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    status = r.status
            if status != 200:
                raise RuntimeError(f"{url} answered {status}")
            if i >= warmup:
                samples.append(clock() - start)
    values = np.sort(np.asarray(samples)) * 1e3
    return LatencySample(
        count=len(values),
        p50_ms=nearest_rank(values, 50),
        p99_ms=nearest_rank(values, 99),
        mean_ms=float(values.mean()),
    )
