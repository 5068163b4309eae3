"""The server side of the v2 REST codec: request bytes in, response bytes out.

`decode_request` turns an infer request body into numpy arrays and `encode_response` the outputs
into the response body; they do no I/O, so the HTTP endpoints and the tests call the same code.
This is on the hot path of every request: it parses the JSON header once (orjson), views binary
tensor data in place (`numpy.frombuffer`, no copy) and validates each input once, with a message
a person can act on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.protocol.tensors import (
    BYTES,
    DATATYPES,
    SUPPORTED_DATATYPES,
    Tensor,
    bytes_as_json,
    check_bool_bytes,
    check_dims,
    check_integer_range,
    datatype_of,
    element_count,
    encode_bytes,
    json_bytes,
    nesting_mismatch,
    object_array,
    out_of_range,
    reshaped,
    split_bytes,
)


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    inputs: tuple[Tensor, ...]
    requested_outputs: tuple[str, ...] | None
    """Names of the outputs to return, in order; None means all of the model's outputs."""
    binary_outputs: frozenset[str]
    """Outputs to return as binary data."""
    binary_default: bool
    """Whether outputs not named in the request are returned as binary data."""
    timeout_s: float | None
    """Deadline relative to arrival (Triton's ``timeout`` parameter, in microseconds)."""
    declared_timeout_s: float | None = None
    """The ``timeout`` parameter as the client wrote it, before an RPC's deadline, which elapses
    while the call waits to be taken up, bounded it into `timeout_s`: what the request would be
    given on any replica (`BatchQueue.check_servable`)."""


def _as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where} must be true or false, got {value!r}")
    return value


def _as_params(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be a JSON object")
    return value


def _shape_of(raw: Any, where: str) -> tuple[int, ...]:
    # A plain loop: on every request, where a generator under all()/any() costs more than
    # the checks.
    if not isinstance(raw, list):
        raise InvalidRequest(f"{where}.shape must be a list of integers, got {raw!r:.80}")
    check_dims(raw, where)
    negative = False
    for d in raw:
        if not isinstance(d, int) or isinstance(d, bool):
            raise InvalidRequest(f"{where}.shape must be a list of integers, got {raw!r:.80}")
        if d < 0:
            negative = True
    if negative:
        raise InvalidRequest(f"{where}.shape must not have negative dimensions, got {raw}")
    return tuple(raw)


def decode_request(body: bytes, *, header_length: int | None = None) -> InferRequest:
    """Parse a v2 infer request body. Raises InvalidRequest with the reason."""
    blob: bytes | memoryview
    if header_length is None:
        header, blob = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise InvalidRequest(
                f"Inference-Header-Content-Length is {header_length} but the body has "
                f"{len(body)} bytes"
            )
        # A view, not a copy: tensors are read from the request body in place.
        header, blob = body[:header_length], memoryview(body)[header_length:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object")

    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest("id must be a string")
    params = _as_params(doc.get("parameters"), "parameters")
    binary_default = _as_bool(params.get("binary_data_output", False), "binary_data_output")
    timeout_s: float | None = None
    if "timeout" in params:
        timeout = params["timeout"]
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise InvalidRequest(
                f"parameters.timeout must be a positive integer (µs), got {timeout!r}"
            )
        timeout_s = timeout / 1e6

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("inputs must be a non-empty list")
    inputs: list[Tensor] = []
    names: set[str] = set()
    offset = 0
    view = memoryview(blob)
    for i, raw in enumerate(raw_inputs):
        where = f"inputs[{i}]"
        if not isinstance(raw, dict):
            raise InvalidRequest(f"{where} must be a JSON object")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{where}.name must be a non-empty string")
        where = f"input '{name}'"
        if name in names:
            raise InvalidRequest(f"{where} appears more than once")
        names.add(name)
        datatype = raw.get("datatype")
        dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
        if dtype is None and datatype != BYTES:
            raise InvalidRequest(
                f"{where}: datatype {datatype!r} is not supported; use one of "
                + ", ".join(SUPPORTED_DATATYPES)
            )
        shape = _shape_of(raw.get("shape"), where)
        count = element_count(shape, where)
        in_params = _as_params(raw.get("parameters"), f"{where}.parameters")
        size = in_params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidRequest(f"{where}: binary_data_size must be a non-negative integer")
            if "data" in raw:
                raise InvalidRequest(f"{where} has both binary_data_size and JSON data")
        if dtype is None:  # BYTES
            if size is not None:
                if offset + size > len(blob):
                    raise InvalidRequest(
                        f"{where}: binary data ends at byte {offset + size} but only "
                        f"{len(blob)} bytes follow the JSON header"
                    )
                elements = split_bytes(view[offset : offset + size], count, where)
                offset += size
            elif "data" not in raw:
                raise InvalidRequest(f"{where} has neither data nor parameters.binary_data_size")
            else:
                elements = json_bytes(raw["data"], count, shape, where)
            inputs.append(Tensor(name, BYTES, reshaped(object_array(elements), shape, where)))
            continue
        if size is not None:
            if size != count * dtype.itemsize:
                raise InvalidRequest(
                    f"{where}: binary_data_size is {size} bytes but shape {list(shape)} of "
                    f"{datatype} needs {count * dtype.itemsize}"
                )
            if offset + size > len(blob):
                raise InvalidRequest(
                    f"{where}: binary data ends at byte {offset + size} but only "
                    f"{len(blob)} bytes follow the JSON header"
                )
            array = np.frombuffer(view[offset : offset + size], dtype=dtype)
            if datatype == "BOOL":
                check_bool_bytes(array, where)
            array = reshaped(array, shape, where)
            offset += size
        else:
            if "data" not in raw:
                raise InvalidRequest(f"{where} has neither data nor parameters.binary_data_size")
            array = _json_array(raw["data"], dtype, shape, count, where)
        inputs.append(Tensor(name, datatype, array))  # type: ignore[arg-type]
    if offset != len(blob):
        raise InvalidRequest(
            f"{len(blob) - offset} bytes of binary data follow the inputs that no input claims"
        )

    requested: tuple[str, ...] | None = None
    binary_outputs: set[str] = set()
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidRequest("outputs must be a list")
        out_names: list[str] = []
        for i, raw in enumerate(raw_outputs):
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise InvalidRequest(f"outputs[{i}] must be an object with a string name")
            out_name = raw["name"]
            out_params = _as_params(raw.get("parameters"), f"output '{out_name}'.parameters")
            if "classification" in out_params:
                raise InvalidRequest("the classification extension is not supported")
            if _as_bool(
                out_params.get("binary_data", binary_default),
                f"output '{out_name}' binary_data",
            ):
                binary_outputs.add(out_name)
            out_names.append(out_name)
        requested = tuple(out_names)
    return InferRequest(
        id=request_id,
        inputs=tuple(inputs),
        requested_outputs=requested,
        binary_outputs=frozenset(binary_outputs),
        binary_default=binary_default,
        timeout_s=timeout_s,
        declared_timeout_s=timeout_s,
    )


def _json_array(
    data: Any, dtype: np.dtype[Any], shape: tuple[int, ...], count: int, where: str
) -> np.ndarray[Any, Any]:
    """JSON numbers as `dtype`, refusing what numpy would silently convert: strings, nulls,
    booleans outside BOOL, fractions into integers, values out of the datatype's range, and
    nesting that contradicts the declared shape (flat data fits any shape of its size)."""
    if not isinstance(data, list):
        raise InvalidRequest(f"{where}: data must be a list")
    name = datatype_of(dtype)
    what = f"{where}: data does not fit datatype {name}"
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidRequest(f"{what}: {exc}") from None
    kind = raw.dtype.kind if raw.size else dtype.kind
    if dtype.kind == "b":
        if kind != "b":
            raise InvalidRequest(f"{where}: BOOL data must be true or false")
    elif kind not in "iuf":
        raise InvalidRequest(f"{what}: {name} data must be numbers")
    elif _holds_bool(raw, data):  # numpy reads true as 1 among numbers
        raise InvalidRequest(f"{what}: {name} data must be numbers, not true or false")
    elif dtype.kind in "iu" and kind == "f":
        raise _not_integers(data, dtype, what)
    if raw.ndim > 1 and raw.shape != shape:
        raise nesting_mismatch(data, shape, where)
    if raw.size and dtype.kind in "iu":
        check_integer_range(raw, dtype, what=what)
    with np.errstate(over="ignore"):
        array = raw.astype(dtype)
    if dtype.kind == "f" and raw.size and not np.array_equal(np.isfinite(array), np.isfinite(raw)):
        raise InvalidRequest(f"{what}: values overflow {name}")
    if array.size != count:
        raise InvalidRequest(
            f"{where}: shape {list(shape)} needs {count} elements, data has {array.size}"
        )
    return reshaped(array, shape, where)


def _holds_bool(raw: np.ndarray[Any, Any], data: list[Any]) -> bool:
    """Whether numeric JSON data holds true or false anywhere. Only data with a 0 or a 1 can
    (numpy made them of the booleans), so only that is scanned element by element."""
    if not raw.size or not ((raw == 0) | (raw == 1)).any():
        return False
    return any(type(value) is bool for value in _leaves(data))


def _not_integers(data: list[Any], dtype: np.dtype[Any], what: str) -> InvalidRequest:
    """Why numbers numpy read as floats do not fit an integer datatype: a fraction (or a
    float), or whole numbers outside its range (integers past 64 bits arrive as floats, and
    numpy reads 64-bit integers of both signs together as floats)."""
    info = np.iinfo(dtype)
    for value in _leaves(data):
        if isinstance(value, float) and not value.is_integer():
            break
        if not info.min <= int(value) <= info.max:
            return out_of_range(int(value), dtype, what=what)
    name = datatype_of(dtype)
    return InvalidRequest(f"{what}: {name} data must be integers")


def _leaves(data: list[Any]) -> Iterator[Any]:
    """The values of nested JSON lists, in order (a loop: the nesting is the client's)."""
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            yield value
        else:
            stack.pop()


def encode_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[Tensor],
    binary: Iterable[str],
) -> tuple[bytes, int | None]:
    """Encode a v2 infer response. A floating-point output holding NaN or infinity can only be
    sent as binary data: JSON has no such numbers, and writing them as null would lose which.

    Returns the body and, when any output is binary, the length of its JSON header (the value of
    Inference-Header-Content-Length); None means the body is plain JSON.
    """
    binary_names = set(binary)
    doc: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        doc["model_version"] = model_version
    if request_id is not None:
        doc["id"] = request_id
    chunks: list[bytes] = []
    entries = []
    for out in outputs:
        array = out.data
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": out.datatype,
            "shape": list(array.shape),
        }
        if out.datatype == BYTES:
            if out.name in binary_names:
                raw = encode_bytes(array)
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = bytes_as_json(array, out.name)
        elif out.name in binary_names:
            raw = np.ascontiguousarray(array, dtype=DATATYPES[out.datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            flat = np.ascontiguousarray(
                array.reshape(-1), dtype=DATATYPES[out.datatype].newbyteorder("=")
            )
            if flat.dtype.kind == "f" and not np.isfinite(flat).all():
                # JSON has no NaN or infinity (orjson would write null, for all three alike)
                raise InvalidRequest(
                    f"output '{out.name}' holds NaN or infinity, which JSON cannot carry; ask "
                    "for it as binary data (parameters.binary_data_output, or the output's "
                    "binary_data)"
                )
            entry["data"] = flat
        entries.append(entry)
    doc["outputs"] = entries
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
