"""Triton's own load tool against the runtime: `perf_analyzer` over HTTP, gRPC and gRPC streaming.

    .venv/bin/python bench/perf_analyzer.py [--binary PATH/perf_analyzer] [--seconds 2]

perf_analyzer reads the model's metadata and configuration (`/v2/models/{name}/config`, gRPC
ModelConfig) before it sends, then measures, reading the server's statistics (`/stats`, gRPC
ModelStatistics) before and after each window; a server that lacks what it reads stops it at
once. This starts `batchpilot runtime serve` on the small MLP (real onnxruntime, 127.0.0.1), runs
perf_analyzer once per protocol at a few concurrencies, and prints each run's last line
(throughput and latency) with the server's side of it (its mean request time split into
overhead, queue and compute) — or its error, and exits 1.

perf_analyzer is not a Python package: it ships as a binary inside `tritonclient`'s Linux wheel
(`tritonclient-X.data/data/bin/perf_analyzer`). The wheels of 2.45 and older run on Debian 12's
glibc; they load `libb64.so.0d` (Debian's `libb64-0d`) and `libcudart.so.12` (the
`nvidia-cuda-runtime-cu12` wheel). `make install` puts the 2.45 binary and a launcher that finds
both at `.venv/bin/perf_analyzer` (hack/fetch-perf-analyzer.sh), the default here. Nothing here
downloads.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import runtime_process  # noqa: E402

RUNS = (
    ("http", ["-i", "http"], "port"),
    ("grpc", ["-i", "grpc"], "grpc_port"),
    ("grpc streaming", ["-i", "grpc", "--streaming"], "grpc_port"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--binary",
        default=str(Path(sys.executable).parent / "perf_analyzer"),
        help="the perf_analyzer executable (default: the one `make install` puts in the venv)",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement window")
    parser.add_argument("--concurrency", default="1:8:7", help="perf_analyzer's range")
    parser.add_argument(
        "--no-early-start",
        action="store_true",
        help="serve with --no-early-start: every batch fills or waits out its delay",
    )
    args = parser.parse_args()
    server_flags = ["--no-early-start"] if args.no_early_start else []
    failed = False
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as tmp:
        model = mlp(Path(tmp) / "mlp.onnx")
        with runtime_process(
            model, "--device", "cpu", *server_flags, grpc=True, log_dir=Path(tmp)
        ) as server:
            for name, flags, port in RUNS:
                command = [
                    args.binary,
                    "-m", "mlp",
                    "-u", f"127.0.0.1:{getattr(server, port)}",
                    *flags,
                    "--measurement-interval", str(round(args.seconds * 1000)),
                    "--concurrency-range", args.concurrency,
                ]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, timeout=300)
                lines = [line for line in done.stdout.splitlines() if "throughput" in line]
                server_side = [
                    line for line in done.stdout.splitlines() if "Avg request latency" in line
                ]
                if done.returncode != 0 or not lines or len(server_side) != len(lines):
                    failed = True
                    print(f"{name}: FAILED (exit {done.returncode})\n{done.stdout}{done.stderr}")
                    continue
                for line, server_line in zip(lines, server_side, strict=True):
                    print(f"{name}: {line.strip()}\n    server: {server_line.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
