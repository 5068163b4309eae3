"""A retry storm: does a server past its capacity keep serving it when its clients retry?

    .venv/bin/python bench/retry_storm.py [--seconds 10] [--levels 1.5,2] [--json OUT]

Clients retry what is refused, and every retry is one more arrival: a server that refuses half
of what it is offered, to clients that retry at once, is offered more again — the loop behind
metastable overloads, where a server stays down after the cause is gone because it spends
itself refusing. This starts `batchpilot runtime serve` on the MLP with the simulated
accelerator of `overload.py` (t(b) = 20 + 1·b ms, batch 8, deadline 100 ms, deadline
admission: capacity 8 / 28 ms ≈ 286 rps) and offers it open-loop Poisson load at each level
(times the capacity) from `batchpilot loadgen`, the same arrival times for every kind of
client: clients that never retry, clients that retry twice after the server's `Retry-After`
(`--retries 2`), and clients that retry four times at once (`--retries 4 --retry-delay-s 0`).
Per run: goodput (answers within 100 ms of the request's scheduled send per second) against
the capacity, the requests answered at all, the arrivals the server saw (sends and retries),
the answered requests' P50/P99 from the scheduled send (a retried request's waits included),
how fast refusals came back, and whether the client kept its schedule.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import runtime_process  # noqa: E402

from loadgen_run import open_loop  # noqa: E402

ALPHA_MS, BETA_MS, MAX_BATCH, DEADLINE_MS = 20.0, 1.0, 8, 100.0
CAPACITY_RPS = MAX_BATCH / (ALPHA_MS + BETA_MS * MAX_BATCH) * 1e3
SERVER = (
    "--engine", "simulated",
    "--simulated-latency", f"alpha_ms={ALPHA_MS:g},beta_ms={BETA_MS:g}",
    "--max-batch-size", str(MAX_BATCH),
    "--max-queue-delay-ms", "2",
    "--deadline-ms", f"{DEADLINE_MS:g}",
    "--admission", "deadline",
)  # fmt: skip
CLIENTS: tuple[tuple[str, list[str]], ...] = (
    ("never retry", []),
    ("retry twice after Retry-After", ["--retries", "2"]),
    ("retry four times at once", ["--retries", "4", "--retry-delay-s", "0"]),
)


def cell(doc: dict[str, Any]) -> str:
    latency, refused = doc["latency_ms"] or {}, doc["shed_latency_ms"] or {}
    arrivals = doc["sent"] + doc["retries"]
    valid = "" if doc["valid"] else f" (INVALID: {doc['invalid_reason']})"
    return (
        f"goodput {doc['goodput_rps'] / CAPACITY_RPS:.2f}, answered "
        f"{doc['succeeded'] / max(1, doc['scheduled']):.0%}, "
        f"{arrivals / doc['duration_s']:,.0f} arrivals/s, P50/P99 "
        f"{latency.get('p50_ms', float('nan')):.0f}/{latency.get('p99_ms', float('nan')):.0f} ms, "
        f"refused in {refused.get('p99_ms', float('nan')):.1f} ms P99{valid}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each run's duration")
    parser.add_argument("--levels", default="1.5,2", help="offered load, times the capacity")
    parser.add_argument("--json", type=Path, default=None, help="every run's report")
    args = parser.parse_args()
    levels = [float(x) for x in args.levels.split(",")]
    results: list[dict[str, Any]] = []
    print(f"capacity {CAPACITY_RPS:.0f} rps; {args.seconds:g} s per run")
    print("| offered | " + " | ".join(name for name, _ in CLIENTS) + " |")
    print("| --- |" + " --- |" * len(CLIENTS))
    with tempfile.TemporaryDirectory(prefix="retry-storm-") as tmp:
        folder = Path(tmp)
        model = mlp(folder / "mlp.onnx")
        for level in levels:
            cells = []
            for name, flags in CLIENTS:
                # A fresh server per run: what one run's refusals taught its admission stays out
                # of the next.
                with runtime_process(model, *SERVER, log_dir=folder) as server:
                    doc = open_loop(
                        server.port,
                        folder,
                        rate=level * CAPACITY_RPS,
                        seconds=args.seconds,
                        sla_ms=DEADLINE_MS,
                        flags=flags,
                    )
                results.append({"level": level, "clients": name, "report": doc})
                cells.append(cell(doc))
            print(f"| {level:g}× | " + " | ".join(cells) + " |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
