"""The inputs and outputs of a PyTorch program, declared where the program does not carry them.

A TorchScript file knows its code and weights but not the names, datatypes and shapes a v2 client
needs (`forward(self, x)` says nothing of `x`'s dtype or shape), so the torch engine reads them
from a small JSON document: the sidecar file `STEM.signature.json` beside the model, or the same
document saved inside a TorchScript archive as its extra file `signature.json` (one file to copy,
which is what a fetched model needs). A `torch.export` program carries its inputs' names, dtypes
and shapes itself; a sidecar there names the outputs and is checked against the program.

    {"inputs":  [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
     "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}]}

Dimension 0 is the batch axis and must be -1, as for ONNX models. This module reads and checks
the document only; whether the program agrees with it is the engine's warm-up to find out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batchpilot.runtime.engine import ModelSignature, TensorSpec

SIDECAR_SUFFIX = ".signature.json"
EMBEDDED_NAME = "signature.json"
"""The extra file of a TorchScript archive that holds the document
(`torch.jit.save(m, path, _extra_files={"signature.json": doc})`)."""

TorchDatatype = Literal["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
"""The v2 datatypes a PyTorch tensor can have and numpy can hold (no bfloat16, no BYTES)."""


class SignatureError(ValueError):
    """The signature document is missing, malformed, or does not fit the program."""


class _Tensor(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=256)
    datatype: TorchDatatype
    shape: list[int] = Field(min_length=1, max_length=16)


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: list[_Tensor] | None = Field(default=None, min_length=1, max_length=64)
    outputs: list[_Tensor] = Field(min_length=1, max_length=64)


def sidecar_path(model: Path) -> Path:
    """`resnet50.pt` → `resnet50.signature.json`, beside it."""
    return model.with_name(model.stem + SIDECAR_SUFFIX)


def _specs(tensors: list[_Tensor], what: str) -> tuple[TensorSpec, ...]:
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise SignatureError(f"{what} names must be distinct, got {names}")
    specs = []
    for t in tensors:
        if any(d < -1 for d in t.shape):
            raise SignatureError(f"{what} '{t.name}': dimensions are -1 (dynamic) or at least 0")
        if t.shape[0] != -1:
            raise SignatureError(
                f"{what} '{t.name}' has shape {t.shape}: dimension 0 must be a dynamic batch "
                "axis (-1) for the model to be batched"
            )
        specs.append(TensorSpec(t.name, t.datatype, tuple(t.shape)))
    return tuple(specs)


class SignatureDocument:
    """A parsed document: the outputs always, the inputs where it declares them."""

    def __init__(
        self, *, inputs: tuple[TensorSpec, ...] | None, outputs: tuple[TensorSpec, ...], source: str
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.source = source
        """Where it was read from, for error messages."""

    @classmethod
    def parse(cls, text: str | bytes, *, source: str) -> SignatureDocument:
        try:
            doc = _Document.model_validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}"
                for e in exc.errors()
            )
            raise SignatureError(f"{source} is not a signature document: {problems}") from None
        try:
            inputs = _specs(doc.inputs, "input") if doc.inputs is not None else None
            outputs = _specs(doc.outputs, "output")
        except SignatureError as exc:
            raise SignatureError(f"{source}: {exc}") from None
        return cls(inputs=inputs, outputs=outputs, source=source)

    def signature(self, *, name: str, platform: str) -> ModelSignature:
        if self.inputs is None:
            raise SignatureError(f"{self.source} declares no inputs, and the program carries none")
        return ModelSignature(
            name=name, platform=platform, inputs=self.inputs, outputs=self.outputs
        )


def read_sidecar(model: Path) -> SignatureDocument | None:
    """The sidecar beside `model`, or None where there is none."""
    path = sidecar_path(model)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SignatureError(f"cannot read {path}: {exc}") from exc
    return SignatureDocument.parse(text, source=str(path))


def check_inputs(
    declared: tuple[TensorSpec, ...], carried: tuple[TensorSpec, ...], *, source: str
) -> None:
    """A document's inputs against those the program carries: same names in the same order,
    same datatypes, and no declared fixed dimension where the program's differs."""
    if [s.name for s in declared] != [s.name for s in carried]:
        raise SignatureError(
            f"{source} declares inputs {[s.name for s in declared]}, the program takes "
            f"{[s.name for s in carried]}"
        )
    for d, c in zip(declared, carried, strict=True):
        if d.datatype != c.datatype:
            raise SignatureError(
                f"{source} declares input '{d.name}' as {d.datatype}, the program takes "
                f"{c.datatype}"
            )
        fits = len(d.shape) == len(c.shape) and all(
            a == b or a == -1 or b == -1 for a, b in zip(d.shape[1:], c.shape[1:], strict=True)
        )
        if not fits:
            raise SignatureError(
                f"{source} declares input '{d.name}' with shape {list(d.shape)}, the program "
                f"takes {list(c.shape)}"
            )


def document_text(inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> str:
    """The JSON document for these inputs and outputs: what a sidecar or an embedded extra file
    holds."""
    doc: dict[str, Any] = {
        "inputs": [spec.as_metadata() for spec in inputs],
        "outputs": [spec.as_metadata() for spec in outputs],
    }
    return json.dumps(doc, indent=2) + "\n"
