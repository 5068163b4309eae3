"""Open Inference Protocol v2 gRPC messages to the data plane's requests, and tensors back.

The gRPC service hands `ModelServer.infer` the same `InferRequest` the REST codec builds, so both
protocols share validation, batching, metrics and errors; this module is the only part that knows
the protobuf messages. It does no I/O. Input data comes either as `raw_input_contents` (one bytes
entry per input, decoded by the same function as REST's binary tensor data, so every datatype
REST supports works here too) or in each input's typed `contents` field; outputs always go back
as `raw_output_contents`, which is what Triton does and what its client reads fastest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2 as pb
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.protocol.tensors import (
    BYTES,
    DATATYPES,
    SUPPORTED_DATATYPES,
    Tensor,
    check_dims,
    check_integer_range,
    decode_raw_tensor,
    element_count,
    encode_raw_tensor,
)

CONTENTS_FIELD: Final = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}
"""The field of `InferTensorContents` that carries each datatype. FP16 has none: it travels only
as raw bytes."""

_MIN_TIMEOUT_S: Final = 1e-6
"""A deadline already spent still yields a positive timeout, so it fails at once as expired."""


def decode_infer_request(
    message: pb.ModelInferRequest, *, deadline_s: float | None = None
) -> InferRequest:
    """The data plane's request for a ModelInfer message; `deadline_s` is the time the RPC has
    left, which bounds the request's timeout. Raises InvalidRequest with the reason."""
    declared_s = timeout_s = _timeout_s(message)
    if deadline_s is not None:
        deadline_s = max(deadline_s, _MIN_TIMEOUT_S)
        timeout_s = deadline_s if timeout_s is None else min(timeout_s, deadline_s)

    if not message.inputs:
        raise InvalidRequest("inputs must be a non-empty list")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; it must "
            "hold one entry per input, in the order of inputs"
        )
    inputs: list[Tensor] = []
    names: set[str] = set()
    for i, tensor in enumerate(message.inputs):
        if not tensor.name:
            raise InvalidRequest(f"inputs[{i}].name must be a non-empty string")
        where = f"input '{tensor.name}'"
        if tensor.name in names:
            raise InvalidRequest(f"{where} appears more than once")
        names.add(tensor.name)
        datatype = tensor.datatype
        if datatype not in SUPPORTED_DATATYPES:
            raise InvalidRequest(
                f"{where}: datatype {datatype!r} is not supported; use one of "
                + ", ".join(SUPPORTED_DATATYPES)
            )
        check_dims(tensor.shape, where)
        shape = tuple(tensor.shape)
        if any(d < 0 for d in shape):
            raise InvalidRequest(
                f"{where}.shape must not have negative dimensions, got {list(shape)}"
            )
        if raw:
            if tensor.HasField("contents"):
                raise InvalidRequest(
                    f"{where} has contents, but the request also has raw_input_contents; send "
                    "every input's data one way: all in raw_input_contents or all in contents"
                )
            array = decode_raw_tensor(raw[i], datatype, shape, f"{where} (raw_input_contents)")
        else:
            array = _from_contents(tensor.contents, datatype, shape, where)
        inputs.append(Tensor(tensor.name, datatype, array))

    requested: tuple[str, ...] | None = None
    if message.outputs:
        out_names: list[str] = []
        for i, output in enumerate(message.outputs):
            if not output.name:
                raise InvalidRequest(f"outputs[{i}].name must be a non-empty string")
            if "classification" in output.parameters:
                raise InvalidRequest("the classification extension is not supported")
            out_names.append(output.name)
        requested = tuple(out_names)
    return InferRequest(
        id=message.id or None,
        inputs=tuple(inputs),
        requested_outputs=requested,
        binary_outputs=frozenset(),
        binary_default=False,
        timeout_s=timeout_s,
        declared_timeout_s=declared_s,
    )


def _timeout_s(message: pb.ModelInferRequest) -> float | None:
    """Triton's `timeout` request parameter, in microseconds."""
    if "timeout" not in message.parameters:
        return None
    param = message.parameters["timeout"]
    kind = param.WhichOneof("parameter_choice")
    value: Any = getattr(param, kind) if kind is not None else None
    if kind not in ("int64_param", "uint64_param") or value <= 0:
        raise InvalidRequest(
            f"parameters.timeout must be a positive integer (µs), got {value!r}"
            + (f" ({kind})" if kind is not None else "")
        )
    return float(value) / 1e6


def _from_contents(
    contents: pb.InferTensorContents, datatype: str, shape: tuple[int, ...], where: str
) -> np.ndarray[Any, Any]:
    """An input's elements from the typed field of its datatype."""
    count = element_count(shape, where)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidRequest(
            f"{where}: {datatype} has no typed contents field; send it in raw_input_contents"
        )
    sent = [descriptor.name for descriptor, _ in contents.ListFields()]
    if other := [name for name in sent if name != field]:
        raise InvalidRequest(
            f"{where}: datatype {datatype} takes its data in contents.{field}, the request set "
            f"contents.{other[0]}"
        )
    values = getattr(contents, field)
    if not sent and count:
        raise InvalidRequest(
            f"{where} has no data: set contents.{field} or send raw_input_contents"
        )
    if len(values) != count:
        raise InvalidRequest(
            f"{where}: shape {list(shape)} needs {count} elements, contents.{field} has "
            f"{len(values)}"
        )
    array: np.ndarray[Any, Any]
    if datatype == BYTES:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
    else:
        dtype = DATATYPES[datatype]
        if dtype.kind in "iu" and dtype.itemsize < 4:
            # int_contents and uint_contents are 32-bit: narrower types must fit their range.
            wide = np.array(values, dtype=np.int64)
            what = f"{where}: contents do not fit datatype {datatype}"
            check_integer_range(wide, dtype, what=what)
            array = wide.astype(dtype)
        else:
            array = np.array(values, dtype=dtype)
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise InvalidRequest(f"{where}: shape {list(shape)} cannot be used: {exc}") from None


def encode_infer_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[Tensor],
) -> pb.ModelInferResponse:
    """A ModelInfer response with every output in raw_output_contents."""
    return pb.ModelInferResponse(
        model_name=model_name,
        model_version=model_version or "",
        id=request_id or "",
        outputs=[
            pb.ModelInferResponse.InferOutputTensor(
                name=out.name, datatype=out.datatype, shape=out.data.shape
            )
            for out in outputs
        ],
        raw_output_contents=[encode_raw_tensor(out.data, out.datatype) for out in outputs],
    )
