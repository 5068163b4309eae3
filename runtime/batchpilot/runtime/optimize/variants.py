"""Where a model's variants live, so `batchpilot optimize` and the server agree on file names.

A variant is a sibling file named `<stem>.<variant>.onnx`. The server resolves the file from the
model path and the variant name alone: switching a service to FP16 is a setting, not a new model
URI, and the variant keeps the original's inputs and outputs, so clients never notice.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal, get_args

Variant = Literal["original", "fp16", "int8"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)


def variant_path(model: Path, variant: Variant, *, out_dir: Path | None = None) -> Path:
    """The file of `variant` of `model`: the model itself for "original"."""
    if variant == "original":
        return model
    return (out_dir if out_dir is not None else model.parent) / f"{model.stem}.{variant}.onnx"


def make_command(model: Path, variant: Variant) -> str:
    """The `batchpilot optimize` command line that writes `variant` next to `model`."""
    flag = "--fp16" if variant == "fp16" else "--int8 dynamic"
    return f"batchpilot optimize {shlex.quote(str(model))} {flag}"


def _static_hint(variant: Variant) -> str:
    return " (or `--int8 static --calibration FILE.npz`)" if variant == "int8" else ""


def missing_variant_message(model: Path, variant: Variant) -> str:
    path = variant_path(model, variant)
    return (
        f"variant {variant} of {model} is missing: looked for {path}; make it with "
        f"`{make_command(model, variant)}`{_static_hint(variant)}"
    )
