"""`batchpilot optimize MODEL.onnx`: write FP16 and INT8 variants and report how they compare.

Glue: flags → plan (pure) → conversions into temporary files → check each variant opens with
the original's signature → rename them all → measure and compare (on the same rows, with the
same session settings) → table on stdout, JSON with --json. Bad input is one line on stderr and
exit status 2, before anything is written; a conversion that fails on valid input is exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from batchpilot.runtime.engine import ModelSignature
from batchpilot.runtime.onnx_engine import (
    ModelLoadError,
    SessionConfig,
    open_session,
    signature_of,
)
from batchpilot.runtime.optimize import convert, measure
from batchpilot.runtime.optimize.plan import (
    ConversionFailed,
    EvalSource,
    Job,
    OptimizeError,
    check_arrays,
    plan_jobs,
    random_inputs,
)
from batchpilot.runtime.optimize.report import Measured, Report, as_json, compare_outputs, table

PROG = "batchpilot optimize"
RANDOM_EVAL_ROWS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("model", type=Path, metavar="MODEL.onnx", help="the FP32 model")
    a("--fp16", action="store_true", help="write <stem>.fp16.onnx (inputs/outputs keep types)")
    a(
        "--int8",
        choices=["dynamic", "static"],
        help="write <stem>.int8.onnx: dynamic (weights only, no data needed) or static "
        "(activations too, needs --calibration)",
    )
    a(
        "--calibration",
        type=Path,
        metavar="FILE.npz",
        help="rows for static INT8: one array per model input, named like it, rows on axis 0",
    )
    a(
        "--eval-inputs",
        type=Path,
        metavar="FILE.npz",
        help="rows to compare outputs on (default: the calibration rows, else random inputs)",
    )
    a("--out-dir", type=Path, metavar="DIR", help="where to write variants (default: beside MODEL)")
    a("--json", type=Path, metavar="OUT", help="also write the report as JSON here")
    a(
        "--batches",
        default="1,8",
        metavar="B,B",
        help="batch sizes to measure throughput at (default 1,8)",
    )
    a(
        "--measure-s",
        type=float,
        default=2.0,
        help="timing per model and batch size, in seconds (default 2; 0: skip timing)",
    )
    a("--intra-op-threads", type=int, default=0, help="onnxruntime intra-op threads (0: default)")
    a(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where the variants are measured, as `runtime serve --device` (default auto)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        report = optimize(args)
    except OptimizeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ConversionFailed as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    print(table(report))
    if args.json is not None:
        _write_json(args.json, as_json(report))
    return 0


def optimize(args: argparse.Namespace) -> Report:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the converted graphs' warnings are noise on a CLI
    model_path: Path = args.model
    batches = _batches(args.batches)
    if args.measure_s < 0:
        raise OptimizeError("--measure-s must be 0 or more")
    if args.intra_op_threads < 0:
        raise OptimizeError("--intra-op-threads must be 0 or more")
    jobs = plan_jobs(
        model_path,
        fp16=args.fp16,
        int8=args.int8,
        calibration=args.calibration,
        out_dir=args.out_dir,
    )
    model = convert.load_model(model_path)
    config = SessionConfig(intra_op_threads=args.intra_op_threads, inter_op_threads=1)
    providers = _providers(args.device, ort.get_available_providers())
    signature = _signature(model_path, providers=providers, config=config)
    calibration = _arrays(args.calibration, signature, "--calibration")
    evaluation = _arrays(args.eval_inputs, signature, "--eval-inputs")
    if args.json is not None:
        convert.check_writable(args.json.parent)
    for directory in sorted({job.target.parent for job in jobs}):
        convert.check_writable(directory)

    skipped: list[str] = []
    made: list[Job] = []
    with convert.pending([job.target for job in jobs]) as temps:
        for job in jobs:
            temp = convert.temporary_beside(job.target)
            temps[job.target] = temp
            try:
                convert.convert(
                    job, source=model_path, model=model, into=temp, calibration=calibration
                )
                _check_variant(temp, job, signature, providers=providers, config=config)
            except OptimizeError as exc:
                if job.explicit:
                    raise OptimizeError(f"{job.variant}: {exc}") from exc
                skipped.append(f"{job.variant} ({job.method}): {exc}")
                del temps[job.target]
                temp.unlink(missing_ok=True)
                continue
            made.append(job)
        if not made:
            raise OptimizeError("no variant can be made: " + "; ".join(skipped))
        convert.commit(temps, mode=model_path.stat().st_mode & 0o777)

    source: EvalSource
    if evaluation is not None:
        source, rows = "eval-inputs", evaluation
    elif calibration is not None:
        source, rows = "calibration", calibration
    else:
        source, rows = "random", random_inputs(signature.inputs, rows=RANDOM_EVAL_ROWS)
    paths: dict[str, Path] = {"original": model_path, **{j.variant: j.target for j in made}}
    sessions = measure.open_sessions(paths, providers=providers, config=config)
    outputs = {name: measure.run_rows(s, rows) for name, s in sessions.items()}
    speed: dict[str, dict[int, float]] = {name: {} for name in sessions}
    if args.measure_s > 0:
        speed = measure.side_by_side(sessions, rows, batches=batches, seconds=args.measure_s)
    original = Measured("original", str(model_path), model_path.stat().st_size, speed["original"])
    variants = tuple(
        Measured(
            job.variant,
            str(job.target),
            job.target.stat().st_size,
            speed[job.variant],
            method=job.method,
            outputs=compare_outputs(outputs["original"], outputs[job.variant]),
        )
        for job in made
    )
    return Report(
        model=str(model_path),
        original=original,
        variants=variants,
        eval_source=source,
        eval_rows=len(next(iter(rows.values()))),
        session={
            "providers": list(providers),
            "intra_op_threads": config.intra_op_threads,
            "inter_op_threads": config.inter_op_threads,
            "graph_optimization": config.graph_optimization,
            "measure_s": args.measure_s,
        },
        skipped=tuple(skipped),
    )


def _batches(text: str) -> list[int]:
    try:
        batches = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        batches = []
    if not batches or batches[0] < 1:
        raise OptimizeError(f"--batches {text!r}: give batch sizes of 1 or more, like 1,8")
    return batches


def _providers(device: str, available: list[str]) -> list[str]:
    from batchpilot.runtime.device import DeviceUnavailable, Nvml, choose_providers

    gpu_present = device != "cpu" and Nvml.probe() is not None
    try:
        _, providers = choose_providers(
            device,  # type: ignore[arg-type]  # argparse's choices are the DeviceChoice values
            gpu_present=gpu_present,
            available=available,
        )
    except DeviceUnavailable as exc:
        raise OptimizeError(str(exc)) from exc
    return providers


def _signature(path: Path, *, providers: list[str], config: SessionConfig) -> ModelSignature:
    try:
        session = open_session(path, providers=providers, config=config)
        return signature_of(session, name=path.stem, platform="onnxruntime_onnx")
    except ModelLoadError as exc:
        raise OptimizeError(str(exc)) from exc


def _arrays(
    path: Path | None, signature: ModelSignature, flag: str
) -> dict[str, np.ndarray[Any, Any]] | None:
    if path is None:
        return None
    what = f"{flag} {path}"
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise OptimizeError(f"{what} cannot be read as .npz: {exc}") from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise OptimizeError(f"{what} is a single array: save one array per input with np.savez")
    try:
        with loaded:
            arrays = {name: loaded[name] for name in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise OptimizeError(f"{what} cannot be read as .npz: {exc}") from exc
    return check_arrays(arrays, signature.inputs, source=what)


def _check_variant(
    path: Path, job: Job, original: ModelSignature, *, providers: list[str], config: SessionConfig
) -> None:
    """The variant opens here and serves exactly the original's inputs and outputs."""
    try:
        session = open_session(path, providers=providers, config=config)
        got = signature_of(session, name=original.name, platform=original.platform)
    except ModelLoadError as exc:
        raise ConversionFailed(
            f"the {job.variant} variant does not load with {', '.join(providers)}: {exc}"
        ) from exc
    if (got.inputs, got.outputs) != (original.inputs, original.outputs):
        raise ConversionFailed(
            f"the {job.variant} variant changed the model's signature: inputs "
            f"{[s.as_metadata() for s in got.inputs]}, outputs "
            f"{[s.as_metadata() for s in got.outputs]}"
        )


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temp.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
