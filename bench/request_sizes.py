"""The latency model on requests of varied rows, against the runtime's batcher running them.

    .venv/bin/python bench/request_sizes.py [--seed 6] [--requests 60000] [--procs 2]
        [--mixes 1:9,16:1;1:19,32:1;...] [--json out.json]
    .venv/bin/python bench/request_sizes.py --runtime [--seconds 20]

Clients that batch on their side send varied rows a request. The autopilot's model
(`service_model.predict`) reads the mean rows a request and, since the rows' spread is measured
(`batchpilot_arrival_rows_squared_total`), their coefficient of variation. For each physics
(α, β), mix of rows, batch limit, queue delay and load (a share of what full batches of the
limit carry), this serves Poisson arrivals of the mix with `batchpilot.simulation.sizes` (the
batcher rule for rule, in rows: one request over the limit runs alone, and the room one that
does not fit leaves is filled from behind it) and
compares P99 with the model's, planned by the mean alone (no spread: the model before it was
measured) and with the spread; and P99 where batches close on a request that does not fit
(the batcher before it filled their room), over P99 with the fill. A point where the model says
"overloaded" (infinite P99) is counted apart: above 1, the truth was not. Prints per mix the
median error and the 10th/90th percentiles of both, and the points either reads short by more
than 25 %: what would plan too few replicas.

`--runtime` checks the reference against the runtime itself: `batchpilot runtime serve` on the
MLP with a simulated accelerator (t(b) = 20 + 2·b ms, batch limit 16, queue delay 2 ms, no
deadline) offered open-loop Poisson load at half of what full batches carry by `batchpilot
loadgen --rows MIX`, for one size and for mixes; its clients' P99 (from the actual send: the
HTTP round trip included) beside the reference's on the same physics and the model's two
readings.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from batchpilot.api.request_rows import RowMix
from batchpilot.operator.autopilot.service_model import LatencyFit, predict
from batchpilot.simulation.sizes import FILL_SCAN, latencies

PHYSICS = {
    "textbook": (0.00152, 0.00225),
    "fixed-cost": (0.020, 0.0005),
    "mid": (0.005, 0.002),
}
MIXES = ("4", "1:9,16:1", "1:19,32:1", "1:4,8:1", "1:1,2:1,4:1,8:1,16:1", "4:1,8:1", "2:1,3:1,4:1")
LIMITS = (16, 64)
DELAYS = (0.002, 0.010)
LOADS = (0.3, 0.6, 0.85)

Job = tuple[str, str, int, float, float, int, int]


def run(job: Job) -> tuple[str, str, int, float, float, float, float, float, float]:
    """(physics, mix, limit, delay, load, simulated P99, P99 by the mean, P99 with the spread,
    simulated P99 with batches that close on a request that does not fit)."""
    physics, mix_text, limit, delay_s, load, requests, seed = job
    alpha_s, beta_s = PHYSICS[physics]
    mix = RowMix.parse(mix_text)
    rate = load * limit / (alpha_s + beta_s * limit) / mix.mean

    def simulated(fill_scan: int) -> float:
        served = latencies(
            rate, mix, alpha_s=alpha_s, beta_s=beta_s, max_batch=limit, delay_s=delay_s,
            requests=requests, seed=seed, fill_scan=fill_scan,
        )  # fmt: skip
        return float(np.percentile(served[requests // 50 :], 99))

    truth = simulated(FILL_SCAN)

    def p99(cv: float) -> float:
        model = LatencyFit(alpha_s, beta_s, True, rows_per_request=mix.mean, rows_cv=cv)
        return predict(model, rate=rate, replicas=1, max_batch=limit, delay_s=delay_s).p99_s

    return physics, mix_text, limit, delay_s, load, truth, p99(0.0), p99(mix.cv), simulated(0)


RUNTIME_PHYSICS = (0.020, 0.002, 16, 0.002)
"""α, β, batch limit, queue delay of the runtime check: batches of tens of milliseconds, far
above the timers' and the HTTP round trip's milliseconds."""
RUNTIME_MIXES = ("2", "1:9,16:1", "1:4,8:1", "1:1,2:1,4:1,8:1")


def against_the_runtime(seconds: float, seed: int) -> list[dict[str, object]]:
    """The runtime's clients' P99 for each of `RUNTIME_MIXES`, beside the reference's and the
    model's."""
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))  # tests/ holds the model builder and the server process helper
    from tests.onnx_models import mlp
    from tests.runtime_process import runtime_process

    from loadgen_run import open_loop

    alpha_s, beta_s, limit, delay_s = RUNTIME_PHYSICS
    print(
        f"one replica, t(b) = {alpha_s * 1e3:g} + {beta_s * 1e3:g}·b ms, batch limit {limit}, "
        f"queue delay {delay_s * 1e3:g} ms, half of what full batches carry; {seconds:g} s each"
    )
    print(
        "| rows a request | rps | runtime P99 | reference P99 | model: by the mean "
        "| with the spread |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="request-sizes-") as tmp:
        folder = Path(tmp)
        model = mlp(folder / "mlp.onnx")
        config = folder / "batching.json"
        config.write_text(json.dumps({"maxBatchSize": limit, "maxQueueDelayMs": delay_s * 1e3}))
        server = (
            "--engine", "simulated", "--batching-config", str(config),
            "--simulated-latency", f"alpha_ms={alpha_s * 1e3:g},beta_ms={beta_s * 1e3:g}",
        )  # fmt: skip
        for text in RUNTIME_MIXES:
            mix = RowMix.parse(text)
            rate = 0.5 * limit / (alpha_s + beta_s * limit) / mix.mean
            with runtime_process(model, *server, log_dir=folder) as replica:
                doc = open_loop(
                    replica.port, folder, rate=rate, seconds=seconds, sla_ms=1000,
                    flags=["--rows", text, "--seed", str(seed)],
                )  # fmt: skip
            measured = doc["service_latency_ms"]["p99_ms"] / 1e3
            served = latencies(
                rate, mix, alpha_s=alpha_s, beta_s=beta_s, max_batch=limit, delay_s=delay_s,
                requests=60_000, seed=seed,
            )  # fmt: skip
            reference = float(np.percentile(served[1000:], 99))
            readings = [
                predict(
                    LatencyFit(alpha_s, beta_s, True, rows_per_request=mix.mean, rows_cv=cv),
                    rate=rate, replicas=1, max_batch=limit, delay_s=delay_s,
                ).p99_s
                for cv in (0.0, mix.cv)
            ]  # fmt: skip
            print(
                f"| {text} | {rate:.0f} | {measured * 1e3:.0f} ms | {reference * 1e3:.0f} ms "
                f"| {readings[0] * 1e3:.0f} ms | {readings[1] * 1e3:.0f} ms |"
            )
            out.append(
                {"mix": text, "rps": rate, "runtimeP99S": measured, "referenceP99S": reference,
                 "byMeanS": readings[0], "withSpreadS": readings[1], "report": doc}
            )  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--requests", type=int, default=60_000)
    parser.add_argument("--mixes", default=";".join(MIXES), help="mixes, ';' between them")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--runtime", action="store_true", help="check against the runtime")
    parser.add_argument("--seconds", type=float, default=20.0, help="--runtime: per run")
    args = parser.parse_args()
    if args.runtime:
        checked = against_the_runtime(args.seconds, args.seed)
        if args.json is not None:
            args.json.write_text(json.dumps({"runtime": checked}, indent=1) + "\n")
        return 0
    mixes = args.mixes.split(";")
    try:
        for text in mixes:
            RowMix.parse(text)
    except ValueError as exc:
        parser.error(str(exc))
    began = time.perf_counter()
    jobs: list[Job] = [
        (physics, mix, limit, delay, load, args.requests, args.seed)
        for physics, mix, limit, delay, load in itertools.product(
            PHYSICS, mixes, LIMITS, DELAYS, LOADS
        )
    ]
    with Pool(args.procs) as pool:
        results = pool.map(run, jobs)
    print(
        f"{'mix':<24} {'mean':>5} {'cv':>5}  {'by the mean: median [p10, p90]':>32} {'short':>6}"
        f"  {'with the spread: median [p10, p90]':>36} {'short':>6} {'inf':>4}"
        f"  {'no fill: P99 x median [max]':>28}"
    )
    rows = []
    for text in mixes:
        mix = RowMix.parse(text)
        mine = [r for r in results if r[1] == text]
        cells = []
        row: dict[str, object] = {"mix": text, "mean": mix.mean, "cv": mix.cv}
        for name, column in (("byMean", 6), ("withSpread", 7)):
            read = [(float(r[column]), r[5]) for r in mine]
            finite = [model / truth - 1 for model, truth in read if math.isfinite(model)]
            overloaded = sum(1 for model, _ in read if not math.isfinite(model))
            short = sum(1 for e in finite if e < -0.25)
            p10, median, p90 = np.percentile(finite, [10, 50, 90]) if finite else (0, 0, 0)
            row[name] = {
                "median": median, "p10": p10, "p90": p90, "short25": short,
                "overloaded": overloaded, "points": len(mine),
            }  # fmt: skip
            cells.append((median, p10, p90, short, overloaded))
        closing = [r[8] / r[5] for r in mine]
        row["noFill"] = {"median": float(np.median(closing)), "max": max(closing)}
        rows.append(row)
        (m0, a0, b0, s0, _), (m1, a1, b1, s1, o1) = cells
        print(
            f"{text:<24} {mix.mean:>5.2f} {mix.cv:>5.2f}  "
            f"{m0:>+13.0%} [{a0:>+5.0%}, {b0:>+5.0%}] {s0:>6}"
            f"  {m1:>+17.0%} [{a1:>+5.0%}, {b1:>+5.0%}] {s1:>6} {o1:>4}"
            f"  {np.median(closing):>19.2f} [{max(closing):>6.1f}]"
        )
    print(
        f"({len(jobs)} points: {', '.join(PHYSICS)}; limits {LIMITS}; delays "
        f"{tuple(int(d * 1e3) for d in DELAYS)} ms; loads {LOADS}; {args.requests} requests "
        f"each, seed {args.seed}; {time.perf_counter() - began:.0f} s)"
    )
    if args.json is not None:
        points = [
            dict(zip(("physics", "mix", "limit", "delayS", "load", "p99S", "byMeanS",
                      "withSpreadS", "noFillP99S"), r, strict=True))
            for r in results
        ]  # fmt: skip
        args.json.write_text(json.dumps({"mixes": rows, "points": points}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
