"""The request a load test sends, built from the model's v2 metadata: pure, no I/O.

The client shares a small machine with the server under test, so it must not be the
bottleneck: one random request per target is built and encoded up front and every send reuses
it. Responses are checked against the metadata only with `--verify`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from yarl import URL

from batchpilot.runtime.loadgen.errors import TargetError
from batchpilot.runtime.protocol.client_codec import decode_response, encode_request
from batchpilot.runtime.protocol.tensors import DATATYPES, HEADER_LENGTH, Tensor


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    """-1 marks a dynamic axis; axis 0 is the batch axis."""


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def from_json(cls, doc: Any) -> ModelMetadata:
        """Parse a v2 model metadata document; TargetError says what was wrong."""
        try:
            return cls(
                name=str(doc["name"]),
                platform=str(doc.get("platform", "")),
                inputs=tuple(_spec(raw) for raw in doc["inputs"]),
                outputs=tuple(_spec(raw) for raw in doc.get("outputs") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TargetError(f"the model metadata is not v2 metadata ({exc!r}): {doc}") from None


def _spec(raw: Mapping[str, Any]) -> TensorSpec:
    shape = tuple(int(d) for d in raw["shape"])
    return TensorSpec(name=str(raw["name"]), datatype=str(raw["datatype"]), shape=shape)


def request_shape(spec: TensorSpec, *, rows: int) -> tuple[int, ...]:
    """The shape to send: -1 becomes `rows` on the batch axis and 1 elsewhere; fixed axes stay."""
    return tuple((rows if axis == 0 else 1) if d == -1 else d for axis, d in enumerate(spec.shape))


def random_inputs(
    metadata: ModelMetadata,
    *,
    rows: int,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int,
) -> tuple[Tensor, ...]:
    """One random tensor per model input, of the model's datatype. Integers are small and
    non-negative, so models that index with them (embeddings, class ids) accept them."""
    unknown = set(shapes) - {spec.name for spec in metadata.inputs}
    if unknown:
        raise TargetError(
            f"--shape names {sorted(unknown)}, but the model's inputs are "
            f"{[spec.name for spec in metadata.inputs]}"
        )
    batched = [spec for spec in metadata.inputs if spec.shape[:1] == (-1,)]
    if rows != 1 and not batched and not shapes:
        # Some inputs may legitimately have no batch axis, but if none has one, `rows` would be
        # ignored without a word.
        raise TargetError(
            f"no input of {metadata.name!r} has a dynamic batch axis, so rows={rows} does not "
            "fit; give the shapes explicitly (--shape NAME=D,D,...)"
        )
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in metadata.inputs:
        dtype = DATATYPES.get(spec.datatype)
        if dtype is None:
            raise TargetError(
                f"input {spec.name!r} has datatype {spec.datatype}, which the load generator "
                "cannot fill (it supports " + ", ".join(DATATYPES) + ")"
            )
        shape = shapes[spec.name] if spec.name in shapes else request_shape(spec, rows=rows)
        data: np.ndarray[Any, Any]
        if dtype.kind == "f":
            data = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            data = rng.random(shape) < 0.5
        else:
            data = rng.integers(0, 10, size=shape).astype(dtype)
        tensors.append(Tensor(spec.name, spec.datatype, data))
    return tuple(tensors)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """The one request every send reuses: encoded once, up front."""

    url: URL
    body: bytes
    headers: Mapping[str, str]
    inputs: Mapping[str, tuple[int, ...]]
    expected_outputs: tuple[TensorSpec, ...]
    batch_rows: int | None


def prepare_request(
    url: str, metadata: ModelMetadata, inputs: Sequence[Tensor], *, binary: bool
) -> PreparedRequest:
    body, header_length = encode_request(inputs, binary=binary, binary_outputs=binary)
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(header_length),
        }
    first = inputs[0].data.shape if inputs else ()
    return PreparedRequest(
        url=URL(url) / "v2" / "models" / metadata.name / "infer",
        body=body,
        headers=headers,
        inputs={t.name: tuple(t.data.shape) for t in inputs},
        expected_outputs=metadata.outputs,
        batch_rows=first[0] if first else None,
    )


def response_is_valid(request: PreparedRequest, body: bytes, headers: Mapping[str, str]) -> bool:
    """Decode a response (`--verify`): every declared output present, with the request's rows on
    the batch axis where that axis is dynamic."""
    try:
        length = headers.get(HEADER_LENGTH)
        outputs = decode_response(body, header_length=int(length) if length else None)
    except Exception:  # any way a body can fail to decode is the same verdict
        return False
    for spec in request.expected_outputs:
        out = outputs.get(spec.name)
        if out is None:
            return False
        dynamic_batch = bool(spec.shape) and spec.shape[0] == -1
        if (
            dynamic_batch
            and request.batch_rows is not None
            and (not out.data.shape or out.data.shape[0] != request.batch_rows)
        ):
            return False
    return True
