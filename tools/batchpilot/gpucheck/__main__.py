"""`python -m batchpilot.gpucheck --out DIR`: the GPU check (`make gpu-check`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from batchpilot.gpucheck.check import Plan, run_check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchpilot.gpucheck", description=__doc__)
    parser.add_argument("--out", default="gpu-check-results", help="results folder")
    parser.add_argument("--model", choices=["auto", "resnet50", "tiny"], default="auto")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    parser.add_argument(
        "--quick", action="store_true", help="the short plan of the CPU test (seconds per step)"
    )
    parser.add_argument(
        "--intra-op-threads", type=int, default=0, help="PyTorch threads on the CPU (0: default)"
    )
    args = parser.parse_args(argv)
    run_check(
        Path(args.out),
        plan=Plan.quick() if args.quick else Plan.full(),
        model_kind=args.model,
        device=args.device,
        intra_op_threads=args.intra_op_threads,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
