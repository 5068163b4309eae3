"""Overload on the simulated accelerator: does the SLA hold for the requests a server admits?

The rest of the benchmark asks how much load a server carries within the SLA. This asks what
happens past that point, where every real service ends up sooner or later (a burst, a lost
replica, a slow autoscaler). A server that only bounds its queue lets every request wait behind
all the others until its deadline passes, and then computes answers nobody waits for any more:
goodput collapses. Deadline admission (`--admission deadline`, the default) refuses at arrival,
with 503 + Retry-After, what it predicts cannot finish in time, and should keep serving about
its capacity within the SLA however hard it is pushed.

One `batchpilot runtime serve` process per admission mode (`deadline`, `queue`), both on the
simulated accelerator t(b) = 20 ms + 1 ms·b, max batch 8, 2 ms max queue delay, 100 ms
deadline (capacity 8 / 28 ms ≈ 286 rps) with the MLP's signature, take open-loop Poisson load
from `batchpilot.runtime.loadgen` at 1.5×, 2× and 4× the capacity. A third, `burst`, is
deadline admission with a burst size of 32 (`--burst-batch-size`, what the operator sets from
`scaling.maxBatchSize`): the same batch limit, and a backlog run in one batch of up to 32 rows
(32 / 52 ms ≈ 615 rps) — what a replica does with a burst before the autopilot has seen it.
The modes take turns first within each level (and get the same arrival times), so whatever
else the shared machine does hits them alike. Each cell reports the admitted requests' P99 from
the scheduled send, goodput (answers within the SLA per second) against the capacity, how fast
refusals were answered, the answers by status, the server's own arrivals and shed reasons (two
/metrics scrapes around the run), the client's send lag and the CPU other processes took
(`cpu_meter`). A run whose client fell behind its schedule is INVALID, with the reason, not a
result: on a two-core machine a Python client may not keep 4× the capacity, and that is
reported, not hidden.

`offered_load` (one metered open-loop run against one server) is shared with
bench/classifier_case.py. bench/run.py runs this section with `--only overload`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import loaddriver
from batchpilot.runtime.loadgen import LoadConfig, LoadReport, RateSchedule, Target, run_load
from cpu_meter import CpuMeter, QuietPolicy
from servers import (
    Running,
    admission_counts,
    batch_stats,
    batching_server,
    counts_between,
    quantile_bound_ms,
)

ALPHA_MS = 20.0
BETA_MS = 1.0
MAX_BATCH = 8
MAX_QUEUE_DELAY_MS = 2.0
DEADLINE_MS = 100.0
LEVELS = (1.5, 2.0, 4.0)
"""Offered load, in multiples of the capacity."""
BURST = 32
"""The `burst` mode's burst size."""
MODES = ("deadline", "queue", "burst")
CLIENT_TIMEOUT_S = 5.0
"""Far beyond the deadline: every request the servers answer is answered before it."""


def capacity(alpha_ms: float, beta_ms: float, max_batch: int) -> tuple[float, int]:
    """The device's throughput, max over b <= max_batch of b / t(b), and the b that gives it."""
    per_batch = {b: b / (alpha_ms + beta_ms * b) * 1e3 for b in range(1, max_batch + 1)}
    best = max(per_batch, key=lambda b: per_batch[b])
    return per_batch[best], best


def server_args(mode: str) -> list[str]:
    burst = ["--burst-batch-size", str(BURST)] if mode == "burst" else []
    return [
        *burst,
        "--engine",
        "simulated",
        "--simulated-latency",
        f"alpha_ms={ALPHA_MS:g},beta_ms={BETA_MS:g}",
        "--max-batch-size",
        str(MAX_BATCH),
        "--max-queue-delay-ms",
        f"{MAX_QUEUE_DELAY_MS:g}",
        "--deadline-ms",
        f"{DEADLINE_MS:g}",
        "--admission",
        "deadline" if mode == "burst" else mode,
    ]


def _ms(stats: Any, field: str = "p99_ms") -> float | None:
    return None if stats is None else round(float(getattr(stats, field)), 3)


def offered_load(
    server: Running,
    *,
    model: str,
    rate_rps: float,
    seconds: float,
    sla_ms: float,
    seed: int,
    quiet: QuietPolicy,
    pids: Sequence[int],
    timeout_s: float = CLIENT_TIMEOUT_S,
    max_outstanding: int = 2000,
) -> dict[str, Any]:
    """One open-loop Poisson run at `rate_rps` for `seconds` (no warm-up inside the run, so the
    server's counters cover exactly the measured requests), metered for other processes' CPU.

    Waits (within the run-wide budget) for other processes to go quiet first; a run they
    disturbed anyway is kept and marked, not repeated: these runs are long."""
    import run  # bench/run.py: the client's event loop (uvloop) is shared

    quiet.wait(pids, say=f"the {rate_rps:,.0f} rps run")
    before = admission_counts(server.url)
    meter = CpuMeter(pids)
    report: LoadReport = run.run_async(
        run_load(
            LoadConfig(
                target=Target(url=server.url, model=model, timeout_s=timeout_s),
                schedule=RateSchedule.constant(rate_rps),
                duration_s=seconds,
                sla_ms=sla_ms,
                seed=seed,
                max_outstanding=max_outstanding,
            )
        )
    )
    use = meter.stop()
    after = admission_counts(server.url)
    disturbed = not quiet.is_quiet(use)
    if disturbed:
        quiet.disturbed += 1
    errors = dict(report.errors)
    latency = report.latency_ms
    server = counts_between(before, after)
    return {
        "rate_rps": round(rate_rps, 1),
        "offered_rps": None if report.offered_rps is None else round(report.offered_rps, 1),
        "seconds": seconds,
        "sla_ms": sla_ms,
        "valid": report.valid,
        "invalid_reason": report.invalid_reason,
        "send_lag_p99_ms": _ms(report.send_lag_ms),
        "late_send_fraction": report.late_send_fraction,
        "max_send_lag_ms": report.max_send_lag_ms,
        "scheduled": report.scheduled,
        "sent": report.sent,
        "status": {
            "200": report.succeeded,
            "503": errors.pop("503", 0),
            "504": errors.pop("504", 0),
            "other": errors,
        },
        "admitted_p50_ms": _ms(latency, "p50_ms"),
        "admitted_p99_ms": _ms(latency),
        "admitted_p99_method": "successful answers, from the scheduled send time",
        "service_p99_ms": _ms(report.service_latency_ms),
        "goodput_rps": None if report.goodput_rps is None else round(report.goodput_rps, 1),
        "refusal_p99_ms": _ms(report.shed_latency_ms),
        "refusal_max_ms": _ms(report.shed_latency_ms, "max_ms"),
        # the server's own measures, to its histogram's bucket edges: what the client adds shows
        "server_admitted_p99_le_ms": quantile_bound_ms(server, "latency", 0.99),
        "server_refusal_p99_le_ms": quantile_bound_ms(server, "refusal", 0.99),
        "server": server,
        "cpu": None if use is None else use.as_dict(),
        "disturbed": disturbed,
        "loadgen": {k: v for k, v in report.to_dict().items() if k != "windows"},
        "windows": [
            {
                "t": w.start_s,
                "offered_rps": w.offered_rps,
                "served_rps": w.served_rps,
                "errors": w.errors,
                "p99_ms": w.p99_ms,
            }
            for w in report.windows
        ],
    }


def describe(label: str, cell: dict[str, Any], *, reference_rps: float) -> str:
    """One line per run, as it finishes."""
    status = cell["status"]
    head = f"  {label}: offered {cell['offered_rps'] or 0:,.0f} rps"
    if not cell["valid"]:
        return f"{head}: INVALID ({cell['invalid_reason']})"
    p99 = cell["admitted_p99_ms"]
    refusal = cell["refusal_p99_ms"]
    goodput = cell["goodput_rps"] or 0.0
    return (
        f"{head}: admitted P99 {'-' if p99 is None else f'{p99:.1f}'} ms, goodput "
        f"{goodput:,.0f} rps ({goodput / reference_rps:.2f}), refusals P99 "
        f"{'-' if refusal is None else f'{refusal:.1f}'} ms; 200/503/504 {status['200']}/"
        f"{status['503']}/{status['504']}; send lag P99 {cell['send_lag_p99_ms']} ms; in the "
        f"server P99 <= {_text(cell.get('server_admitted_p99_le_ms'))} ms admitted, <= "
        f"{_text(cell.get('server_refusal_p99_le_ms'))} ms refused"
    )


def _text(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f}"


def _warm(server: Running, model: Path) -> None:
    import run

    request = run.one_row_request(server.url, model)
    run.run_async(
        loaddriver.closed_loop_latency(
            request.url, body=request.body, headers=request.headers, count=50, max_s=3
        )
    )


def measure(
    model: Path,
    *,
    seconds: float,
    settle_s: float,
    sla_ms: float,
    quiet: QuietPolicy,
    log_dir: Path,
) -> dict[str, Any]:
    """Every level × mode cell; `model` is the MLP (the simulated engine uses its signature)."""
    capacity_rps, capacity_batch = capacity(ALPHA_MS, BETA_MS, MAX_BATCH)
    print(
        f"\n== overload: simulated accelerator t(b) = {ALPHA_MS:g} ms + {BETA_MS:g} ms x b, max"
        f" batch {MAX_BATCH}, deadline {DEADLINE_MS:g} ms: capacity {capacity_rps:,.0f} rps; "
        f"{seconds:g} s per run at {', '.join(f'{x:g}x' for x in LEVELS)}",
        flush=True,
    )
    started = time.monotonic()
    cells: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        servers = {
            mode: stack.enter_context(batching_server(model, *server_args(mode), log_dir=log_dir))
            for mode in MODES
        }
        pids = [s.pid for s in servers.values()]
        for server in servers.values():
            _warm(server, model)
        for index, level in enumerate(LEVELS):
            turn = index % len(MODES)
            order = MODES[turn:] + MODES[:turn]
            for mode in order:
                time.sleep(settle_s)  # the previous run's stragglers: 100 ms deadlines
                cell = offered_load(
                    servers[mode],
                    model=model.stem,
                    rate_rps=level * capacity_rps,
                    seconds=seconds,
                    sla_ms=sla_ms,
                    seed=index,  # the same arrival times for every mode
                    quiet=quiet,
                    pids=pids,
                    max_outstanding=max(2000, math.ceil(level * capacity_rps * 2)),
                )
                cell["level"] = level
                cell["admission"] = mode
                cell["goodput/capacity"] = (
                    None if cell["goodput_rps"] is None else cell["goodput_rps"] / capacity_rps
                )
                cells[f"{level:g}x/{mode}"] = cell
                print(describe(f"{level:g}x, {mode}", cell, reference_rps=capacity_rps), flush=True)
        batches = {mode: batch_stats(server.url) for mode, server in servers.items()}
    return {
        "model": f"{model.name}: the MLP's signature (the simulated engine never runs it)",
        "alpha_ms": ALPHA_MS,
        "beta_ms": BETA_MS,
        "max_batch_size": MAX_BATCH,
        "max_queue_delay_ms": MAX_QUEUE_DELAY_MS,
        "deadline_ms": DEADLINE_MS,
        "capacity_rps": capacity_rps,
        "capacity_batch": capacity_batch,
        "sla_ms": sla_ms,
        "seconds_per_run": seconds,
        "levels": list(LEVELS),
        "modes": list(MODES),
        "burst_batch_size": BURST,
        "arrivals": "open loop, Poisson, batchpilot.runtime.loadgen; the same arrival times for "
        "every mode at a level; each mode goes first at one level",
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "cells": cells,
        "batches": batches,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
