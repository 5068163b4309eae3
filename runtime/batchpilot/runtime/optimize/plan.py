"""What `batchpilot optimize` will make, and whether the user's arrays fit the model.

Pure: decided from the flags and the model's signature before any conversion starts, so bad
input fails in one clear line with nothing written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from batchpilot.runtime.engine import TensorSpec
from batchpilot.runtime.optimize.variants import Variant, variant_path
from batchpilot.runtime.protocol.tensors import DATATYPES

Method = Literal["fp16", "int8-dynamic", "int8-static"]
Int8Mode = Literal["dynamic", "static"]
EvalSource = Literal["eval-inputs", "calibration", "random"]


class OptimizeError(Exception):
    """Bad input to `batchpilot optimize`: the message says what is wrong (exit status 2)."""


class ConversionFailed(Exception):
    """A conversion failed on input that looked valid (exit status 1)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One variant to write."""

    variant: Variant
    method: Method
    target: Path
    explicit: bool
    """Asked for by a flag: failing to make it is an error. Otherwise it is skipped with a note."""


def plan_jobs(
    model: Path,
    *,
    fp16: bool,
    int8: Int8Mode | None,
    calibration: Path | None,
    out_dir: Path | None,
) -> list[Job]:
    """The variants to make. No variant flag means every variant that can be made: FP16, and
    INT8 static when calibration data is given, dynamic otherwise."""
    if int8 == "static" and calibration is None:
        raise OptimizeError(
            "--int8 static needs --calibration FILE.npz: one array per model input, named like "
            "the input, rows on axis 0 (or use --int8 dynamic, which needs no data)"
        )
    explicit = fp16 or int8 is not None
    jobs = []
    if fp16 or not explicit:
        jobs.append(Job("fp16", "fp16", variant_path(model, "fp16", out_dir=out_dir), explicit))
    if int8 is not None or not explicit:
        mode = int8 or ("static" if calibration is not None else "dynamic")
        method: Method = "int8-static" if mode == "static" else "int8-dynamic"
        jobs.append(Job("int8", method, variant_path(model, "int8", out_dir=out_dir), explicit))
    return jobs


def check_arrays(
    arrays: Mapping[str, np.ndarray[Any, Any]], inputs: Sequence[TensorSpec], *, source: str
) -> dict[str, np.ndarray[Any, Any]]:
    """`arrays` as the model's inputs: one per input, same rows, matching dimensions.

    Values are cast to the input's type within the same kind (float64 → float32, as numpy saves
    Python floats), never across kinds, which would change what the data means.
    """
    expected = {spec.name for spec in inputs}
    missing = sorted(expected - arrays.keys())
    extra = sorted(arrays.keys() - expected)
    if missing or extra:
        raise OptimizeError(
            f"{source} does not match the model's inputs {sorted(expected)}: "
            + "; ".join(
                part
                for part in (
                    f"missing {missing}" if missing else "",
                    f"unexpected {extra}" if extra else "",
                )
                if part
            )
        )
    out: dict[str, np.ndarray[Any, Any]] = {}
    rows: int | None = None
    for spec in inputs:
        array = np.asarray(arrays[spec.name])
        shape = list(array.shape)
        if array.ndim != len(spec.shape) or any(
            want >= 0 and got != want for want, got in zip(spec.shape[1:], shape[1:], strict=False)
        ):
            raise OptimizeError(
                f"{source}: array '{spec.name}' has shape {shape}, the model's input has "
                f"{list(spec.shape)} (-1: any size; axis 0 holds the rows)"
            )
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            raise OptimizeError(
                f"{source}: array '{spec.name}' has {shape[0]} rows, the others have {rows}"
            )
        want_dtype = DATATYPES[spec.datatype]
        if array.dtype != want_dtype:
            if array.dtype.kind != want_dtype.kind:
                raise OptimizeError(
                    f"{source}: array '{spec.name}' holds {array.dtype}, the model's input is "
                    f"{spec.datatype}"
                )
            array = array.astype(want_dtype)
        out[spec.name] = array
    if not rows:
        raise OptimizeError(f"{source} has no rows: axis 0 of every array must be at least 1")
    return out


def random_inputs(
    inputs: Sequence[TensorSpec], *, rows: int, seed: int = 0
) -> dict[str, np.ndarray[Any, Any]]:
    """Deterministic noise shaped like the model's inputs; dynamic dimensions past the batch
    axis become 1. Integer inputs take small values, so indices stay in range."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for spec in inputs:
        shape = (rows, *(d if d >= 0 else 1 for d in spec.shape[1:]))
        dtype = DATATYPES[spec.datatype]
        if dtype.kind == "f":
            out[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            out[spec.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            out[spec.name] = rng.integers(0, 10, shape).astype(dtype)
    return out


def take_rows(
    arrays: Mapping[str, np.ndarray[Any, Any]], start: int, count: int
) -> dict[str, np.ndarray[Any, Any]]:
    """`count` rows from `start`, wrapping around when the arrays have fewer."""
    total = len(next(iter(arrays.values())))
    index = (np.arange(start, start + count) % total).astype(np.intp)
    return {name: np.ascontiguousarray(array[index]) for name, array in arrays.items()}
