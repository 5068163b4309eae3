"""Small PyTorch programs for the torch engine's tests, made here (no downloads).

`mlp` computes exactly what `onnx_models.mlp` does (same weights, same seed), so the two engines
are checked against one another; `multi_io` is `onnx_models.multi_io` in TorchScript. Each
TorchScript file gets its signature as a sidecar (`STEM.signature.json`) unless asked to embed
it or to leave it out. This module imports no onnx: the GPU check's machine has none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from batchpilot.runtime.engine import TensorSpec
from batchpilot.runtime.torch_signature import EMBEDDED_NAME, document_text, sidecar_path

Declare = Literal["sidecar", "embedded", "none"]

MLP_INPUTS = (TensorSpec("x", "FP32", (-1, 64)),)
MLP_OUTPUTS = (TensorSpec("logits", "FP32", (-1, 16)),)


class Mlp(torch.nn.Module):
    """x [N, 64] → logits [N, 16], two dense layers with ReLU: `onnx_models.mlp`'s weights."""

    def __init__(self, *, features: int = 64, hidden: int = 256, classes: int = 16) -> None:
        super().__init__()
        rng = np.random.default_rng(7)
        w1 = rng.standard_normal((features, hidden)).astype(np.float32) * 0.1
        w2 = rng.standard_normal((hidden, classes)).astype(np.float32) * 0.1
        self.first = torch.nn.Linear(features, hidden)
        self.second = torch.nn.Linear(hidden, classes)
        with torch.no_grad():
            self.first.weight.copy_(torch.from_numpy(w1.T.copy()))
            self.first.bias.zero_()
            self.second.weight.copy_(torch.from_numpy(w2.T.copy()))
            self.second.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


class MultiIo(torch.nn.Module):
    """`onnx_models.multi_io`: six inputs of six datatypes, each output a function of one."""

    def forward(
        self,
        f32: torch.Tensor,
        f16: torch.Tensor,
        i64: torch.Tensor,
        i32: torch.Tensor,
        u8: torch.Tensor,
        flag: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return f32 * 2, f16 + 1, i64 * 3, i32 + 1, u8.clone(), torch.logical_not(flag)


MULTI_IO_SHAPES = {
    "f32": ("FP32", (4,)),
    "f16": ("FP16", (4,)),
    "i64": ("INT64", (2,)),
    "i32": ("INT32", (3,)),
    "u8": ("UINT8", (3,)),
    "flag": ("BOOL", (2,)),
}


def save_script(
    module: torch.nn.Module,
    path: Path,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    *,
    declare: Declare = "sidecar",
) -> Path:
    """Script `module` to `path` with its signature where `declare` says."""
    scripted = torch.jit.script(module.eval())
    text = document_text(inputs, outputs)
    extra = {EMBEDDED_NAME: text} if declare == "embedded" else {}
    scripted.save(str(path), _extra_files=extra)
    if declare == "sidecar":
        sidecar_path(path).write_text(text)
    return path


def mlp(path: Path, *, declare: Declare = "sidecar") -> Path:
    return save_script(Mlp(), path, MLP_INPUTS, MLP_OUTPUTS, declare=declare)


def fixed_batch(path: Path) -> Path:
    """The mlp, declared with a batch of exactly 1: it cannot be batched."""
    return save_script(
        Mlp(),
        path,
        (TensorSpec("x", "FP32", (1, 64)),),
        (TensorSpec("logits", "FP32", (1, 16)),),
    )


def multi_io(path: Path) -> Path:
    inputs = tuple(TensorSpec(n, dt, (-1, *shape)) for n, (dt, shape) in MULTI_IO_SHAPES.items())
    outputs = tuple(
        TensorSpec(f"{n}_out", dt, (-1, *shape)) for n, (dt, shape) in MULTI_IO_SHAPES.items()
    )
    return save_script(MultiIo(), path, inputs, outputs)


class MlpByName(torch.nn.Module):
    """The mlp returning a dict, so an exported program names its outputs itself."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.mlp(x)}


def exported(module: torch.nn.Module, path: Path, *, rows: int = 2, dynamic: bool = True) -> Path:
    """`torch.export` of a module taking one FP32 [N, 64] input `x`; dynamic batch unless
    `dynamic` is false."""
    example = (torch.zeros(rows, 64),)
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=4096)}} if dynamic else None
    program = torch.export.export(module.eval(), example, dynamic_shapes=shapes)
    torch.export.save(program, str(path))
    return path
