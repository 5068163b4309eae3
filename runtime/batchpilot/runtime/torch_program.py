"""PyTorch programs as the torch engine receives them: which kind of archive a file is, how each
kind is loaded onto a device, and the v2 signature each one gets.

It exists apart from the engine (`torch_engine`, which runs batches on model instances) because
loading is where a user's file meets the server's contract, and where nearly every error a user
sees comes from: the file's contents decide how it is loaded (a TorchScript archive or a PT2
archive), whatever its name; a `torch.save` pickle, which needs the model's Python code to load, is
refused with the way to save a program instead; the signature comes from the program where it
carries one (torch.export), else from a small JSON document (`torch_signature`), a sidecar file or
one saved inside the archive, and the two must agree.

With `torch_engine`, the only module that imports torch (an import-linter contract says so).
"""

from __future__ import annotations

import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from batchpilot.runtime.device import DeviceChoice, DeviceUnavailable
from batchpilot.runtime.engine import ModelSignature, TensorSpec
from batchpilot.runtime.errors import first_line
from batchpilot.runtime.onnx_engine import ModelLoadError
from batchpilot.runtime.torch_signature import (
    EMBEDDED_NAME,
    SignatureDocument,
    SignatureError,
    check_inputs,
    read_sidecar,
    sidecar_path,
)

ProgramFormat = Literal["torchscript", "torch-export"]

TORCH_TO_V2: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "UINT8",
    torch.int8: "INT8",
    torch.int16: "INT16",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.float16: "FP16",
    torch.float32: "FP32",
    torch.float64: "FP64",
}
V2_TO_TORCH = {v2: dtype for dtype, v2 in TORCH_TO_V2.items()}
PLATFORMS: dict[ProgramFormat, str] = {
    "torchscript": "pytorch_libtorch",  # Triton's name for TorchScript
    "torch-export": "pytorch_export",
}


def program_format(path: Path) -> ProgramFormat:
    """Which kind of PyTorch program the file holds, read from its archive's entries."""
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = {name.split("/", 1)[-1] for name in archive.namelist()}
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelLoadError(
            f"PyTorch cannot load {path}: it is not a TorchScript or torch.export archive ({exc})"
        ) from exc
    if "archive_format" in entries or any(e.startswith("models/") for e in entries):
        return "torch-export"
    if "constants.pkl" in entries and any(e.startswith("code/") for e in entries):
        return "torchscript"
    if "data.pkl" in entries:
        raise ModelLoadError(
            f"{path} was written by torch.save (a pickled module or state_dict), which needs the "
            "model's Python code to load: save a program instead, "
            "torch.jit.script(model).save(path) or "
            "torch.export.save(torch.export.export(model, example, dynamic_shapes=...), path)"
        )
    raise ModelLoadError(f"{path} is a zip archive but neither a TorchScript nor a PT2 archive")


def choose_device(choice: DeviceChoice, *, cuda: bool) -> Literal["gpu", "cpu"]:
    """`auto` takes the GPU when PyTorch sees one; `gpu` insists and says why it cannot."""
    if choice == "cpu" or (choice == "auto" and not cuda):
        return "cpu"
    if not cuda:
        raise DeviceUnavailable(
            "device gpu was requested but PyTorch sees no CUDA device "
            "(torch.cuda.is_available() is false: no GPU, no driver, or a CPU-only PyTorch)"
        )
    return "gpu"


def _dims(shape: Sequence[Any]) -> tuple[int, ...]:
    """Concrete sizes stay, symbolic ones (torch.SymInt) become -1."""
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def _spec_of(name: str, value: Any, what: str) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise ModelLoadError(f"{what} '{name}' of the program is not a tensor ({value!r})")
    datatype = TORCH_TO_V2.get(value.dtype)
    if datatype is None:
        raise ModelLoadError(f"{what} '{name}' has dtype {value.dtype}, which is not supported")
    return TensorSpec(name, datatype, _dims(value.shape))


@dataclass(frozen=True, slots=True)
class Program:
    module: Callable[..., Any]
    format: ProgramFormat
    inputs: tuple[TensorSpec, ...] | None
    """The inputs the program carries (torch.export), or None (TorchScript)."""
    outputs: tuple[TensorSpec, ...] | None
    embedded: SignatureDocument | None
    """The document saved inside a TorchScript archive."""


def _load_torchscript(path: Path, device: torch.device) -> Program:
    extra = {EMBEDDED_NAME: ""}
    try:
        with warnings.catch_warnings():
            # PyTorch 2.10+ deprecates TorchScript; the file is what the user chose to serve.
            warnings.filterwarnings(
                "ignore", ".*torch.jit.load.* is deprecated", DeprecationWarning
            )
            module = torch.jit.load(  # type: ignore[no-untyped-call]  # not annotated in torch
                str(path), map_location=device, _extra_files=extra
            )
    except Exception as exc:
        raise ModelLoadError(
            f"PyTorch cannot load {path} as TorchScript: {first_line(exc)}"
        ) from exc
    module.eval()
    embedded = None
    if extra[EMBEDDED_NAME]:
        try:
            embedded = SignatureDocument.parse(
                extra[EMBEDDED_NAME], source=f"{path}'s embedded {EMBEDDED_NAME}"
            )
        except SignatureError as exc:
            raise ModelLoadError(str(exc)) from exc
    return Program(module, "torchscript", inputs=None, outputs=None, embedded=embedded)


def _load_export(path: Path, device: torch.device) -> Program:
    try:
        with path.open("rb") as file:  # a file object: torch.export.load insists on .pt2 names
            program = torch.export.load(file)
    except Exception as exc:
        raise ModelLoadError(
            f"PyTorch cannot load {path} as a torch.export program: {first_line(exc)}"
        ) from exc
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = tuple(
        _spec_of(name, placeholders[name].meta.get("val"), "input")
        for name in program.graph_signature.user_inputs
    )
    for spec in inputs:
        if spec.shape[:1] != (-1,):
            raise ModelLoadError(
                f"input '{spec.name}' has shape {list(spec.shape)}: dimension 0 must be a dynamic "
                "batch axis for the model to be batched (export with dynamic_shapes="
                f"{{'{spec.name}': {{0: torch.export.Dim('batch')}}}})"
            )
    (output,) = (n for n in program.graph.nodes if n.op == "output")
    values = [node.meta.get("val") for node in output.args[0]]
    out_spec = program.call_spec.out_spec
    names = (
        [str(key) for key in out_spec.context]
        if out_spec is not None and out_spec.type is dict
        else [f"output_{i}" for i in range(len(values))]
    )
    outputs = tuple(_spec_of(n, v, "output") for n, v in zip(names, values, strict=True))
    if device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return Program(program.module(), "torch-export", inputs, outputs, embedded=None)


def signature_of(program: Program, path: Path, *, name: str) -> ModelSignature:
    """The program's own inputs, the sidecar's or the embedded document's declarations; a
    sidecar wins over the embedded document and must agree with what the program carries."""
    platform = PLATFORMS[program.format]
    try:
        document = read_sidecar(path) or program.embedded
        if program.inputs is not None:
            assert program.outputs is not None
            if document is None:
                return ModelSignature(name, platform, program.inputs, program.outputs)
            if document.inputs is not None:
                check_inputs(document.inputs, program.inputs, source=document.source)
            if len(document.outputs) != len(program.outputs):
                raise SignatureError(
                    f"{document.source} declares {len(document.outputs)} outputs, the program "
                    f"returns {len(program.outputs)}"
                )
            return ModelSignature(name, platform, program.inputs, document.outputs)
        if document is None:
            raise SignatureError(
                f"a TorchScript program does not carry its inputs' names, datatypes and shapes: "
                f"declare them in {sidecar_path(path)}, or save them inside the archive as the "
                f"extra file {EMBEDDED_NAME} (docs: batchpilot.runtime.torch_signature)"
            )
        return document.signature(name=name, platform=platform)
    except SignatureError as exc:
        raise ModelLoadError(str(exc)) from exc


def load_program(path: Path, device: torch.device, *, fmt: ProgramFormat) -> Program:
    """The program in `path` (of the format `program_format` read from it), on `device`."""
    return (_load_torchscript if fmt == "torchscript" else _load_export)(path, device)
