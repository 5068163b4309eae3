"""When batches start: open-loop and closed-loop traffic, with and without the early start.

    .venv/bin/python bench/batch_start.py [--seconds 8]

A batch waits up to the queue delay for more requests, unless the requests outstanding are as
many as the most the queue has recently held at once (`batchpilot.runtime.batching.population`):
a closed loop's clients are then all queued. This starts `batchpilot runtime serve` on the MLP
with the simulated engine (t(b) = 2 ms + 0.1 ms·b, so the client's two cores are not the model's
too), max batch 32, queue delay 5 ms, no deadline — once as it runs by default and once with
`--no-early-start` (every batch fills or waits out its delay, Triton's rule) — and drives each
with `batchpilot loadgen`: Poisson arrivals at three rates, closed loops of 1, 4 and 16
workers, and closed loops of 1 and 4 workers that begin right after 2 s of 3,000 rps (the
queue has just held far more requests at once than they will ever send; only the closed loop
is measured). For each it prints the achieved rate, P50 and P99 from the client, and the mean batch,
read from the server's own statistics (`/v2/models/mlp/stats`: inferences over executions in
the run), with the early start / without side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import runtime_process  # noqa: E402

SERVER = (
    "--engine", "simulated",
    "--simulated-latency", "alpha_ms=2,beta_ms=0.1",
    "--max-batch-size", "32",
    "--max-queue-delay-ms", "5",
    "--deadline-ms", "0",
)  # fmt: skip

BURST = ["--rate", "3000", "--duration", "2"]
"""What the queue has just held, for the loads that begin after it."""

LOADS: tuple[tuple[str, list[str], list[str] | None], ...] = (
    ("open, 200 rps", ["--rate", "200"], None),
    ("open, 1,000 rps", ["--rate", "1000"], None),
    ("open, 3,000 rps", ["--rate", "3000"], None),
    ("closed, 1 worker", ["--concurrency", "1"], None),
    ("closed, 4 workers", ["--concurrency", "4"], None),
    ("closed, 16 workers", ["--concurrency", "16"], None),
    ("closed, 1 worker after 3,000 rps", ["--concurrency", "1"], BURST),
    ("closed, 4 workers after 3,000 rps", ["--concurrency", "4"], BURST),
)


def counts(port: int) -> tuple[int, int]:
    """Inferences (rows) and executions (batches) so far, from the server's statistics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/mlp/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def measure(folder: Path, model: Path, flags: tuple[str, ...], seconds: float) -> list[str]:
    """A server with `flags` for each load (none inherits what the one before it taught the
    queue: it remembers 5 s of it): a cell of the table for each."""
    cells = []
    for _, load, first in LOADS:
        with runtime_process(model, *SERVER, *flags, log_dir=folder) as server:
            report = folder / "report.json"
            loadgen = [
                sys.executable, "-m", "batchpilot.runtime.cli", "loadgen",
                "--url", f"http://127.0.0.1:{server.port}", "--model", "mlp",
            ]  # fmt: skip
            if first is not None:
                subprocess.run([*loadgen, *first], capture_output=True, timeout=120)
            before = counts(server.port)
            command = [*loadgen, *load, "--duration", str(seconds), "--json", str(report)]
            subprocess.run(command, capture_output=True, timeout=seconds + 120)
            rows, batches = (a - b for a, b in zip(counts(server.port), before, strict=True))
            result = json.loads(report.read_text())
            latency = result["latency_ms"]
            valid = "" if result["valid"] else f" (INVALID: {result['invalid_reason']})"
            cells.append(
                f"{result['achieved_qps']:,.0f} req/s, P50 {latency['p50_ms']:.2f} ms, "
                f"P99 {latency['p99_ms']:.2f} ms, batch {rows / max(1, batches):.2f}{valid}"
            )
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each load's duration")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batch-start-") as tmp:
        folder = Path(tmp)
        model = mlp(folder / "mlp.onnx")
        early = measure(folder, model, (), args.seconds)
        waiting = measure(folder, model, ("--no-early-start",), args.seconds)
    print("| load | early start (default) | `--no-early-start` |")
    print("| --- | --- | --- |")
    for (name, _, _), with_it, without in zip(LOADS, early, waiting, strict=True):
        print(f"| {name} | {with_it} | {without} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
