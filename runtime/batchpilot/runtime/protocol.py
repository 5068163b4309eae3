"""Open Inference Protocol v2 (KServe / Triton REST) codec, with the binary tensor extension.

This module turns request bytes into numpy arrays and arrays into response bytes; it does no I/O,
so the same code serves the HTTP endpoint, the load generator and the tests. It is on the hot path
of every request: it parses the JSON header once (orjson), views binary tensor data in place
(`numpy.frombuffer`, no copy) and validates each input once, with a message a person can act on.

Binary tensor extension, as Triton and tritonclient implement it: when the request carries the
header ``Inference-Header-Content-Length: N``, the first N bytes of the body are the JSON header
and the rest is raw little-endian tensor data, in the order of the inputs whose
``parameters.binary_data_size`` says how many bytes each takes. Outputs are returned in binary
when the request asks for it (``parameters.binary_data_output`` for all outputs, or
``outputs[i].parameters.binary_data`` for one).

BYTES tensors (raw images, text, labels) are numpy object arrays of `bytes`. In JSON their
elements are strings (UTF-8); in binary each element is a 4-byte little-endian length followed by
that many bytes, as Triton and KServe encode them. KServe's ``{"b64": …}`` convention belongs to
its v1 protocol, not to v2, so it is not accepted: send bytes that are not UTF-8 as binary data.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

from batchpilot.runtime.errors import InvalidRequest

HEADER_LENGTH: Final = "inference-header-content-length"
"""HTTP header that says how many leading body bytes are the JSON header (lower-cased)."""

DATATYPES: Final[Mapping[str, np.dtype[Any]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
"""v2 datatype names of fixed-size elements and the little-endian numpy dtypes their binary form
uses. BYTES, the one variable-size datatype, is handled apart (see `BYTES`)."""

BYTES: Final = "BYTES"
"""v2 datatype of variable-length byte strings; its arrays have dtype object, elements `bytes`."""

SUPPORTED_DATATYPES: Final = (*DATATYPES, BYTES)

_LENGTH = struct.Struct("<I")

_DATATYPE_OF_KIND: Final = {dt.str.lstrip("<|="): name for name, dt in DATATYPES.items()}


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The v2 datatype name of a numpy dtype."""
    name = _DATATYPE_OF_KIND.get(dtype.newbyteorder("<").str.lstrip("<|="))
    if name is None:
        raise InvalidRequest(f"datatype {dtype} has no Open Inference Protocol v2 name")
    return name


@dataclass(frozen=True, slots=True)
class Tensor:
    """A named tensor; `data` always has the shape and dtype the v2 header declared."""

    name: str
    datatype: str
    data: np.ndarray[Any, Any]


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


def _fail(message: str) -> InvalidRequest:
    return InvalidRequest(message)


def _as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(f"{where} must be true or false, got {value!r}")
    return value


def _as_params(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(f"{where} must be a JSON object")
    return value


def _shape_of(raw: Any, where: str) -> tuple[int, ...]:
    # A plain loop: on every request, where a generator under all()/any() costs more than
    # the checks.
    if not isinstance(raw, list):
        raise _fail(f"{where}.shape must be a list of integers, got {raw!r}")
    negative = False
    for d in raw:
        if not isinstance(d, int) or isinstance(d, bool):
            raise _fail(f"{where}.shape must be a list of integers, got {raw!r}")
        if d < 0:
            negative = True
    if negative:
        raise _fail(f"{where}.shape must not have negative dimensions, got {raw}")
    return tuple(raw)


def decode_request(body: bytes, *, header_length: int | None = None) -> InferRequest:
    """Parse a v2 infer request body. Raises InvalidRequest with the reason."""
    blob: bytes | memoryview
    if header_length is None:
        header, blob = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise _fail(
                f"Inference-Header-Content-Length is {header_length} but the body has "
                f"{len(body)} bytes"
            )
        # A view, not a copy: tensors are read from the request body in place.
        header, blob = body[:header_length], memoryview(body)[header_length:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise _fail(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _fail("request body must be a JSON object")

    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _fail("id must be a string")
    params = _as_params(doc.get("parameters"), "parameters")
    binary_default = _as_bool(params.get("binary_data_output", False), "binary_data_output")
    timeout_s: float | None = None
    if "timeout" in params:
        timeout = params["timeout"]
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise _fail(f"parameters.timeout must be a positive integer (µs), got {timeout!r}")
        timeout_s = timeout / 1e6

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _fail("inputs must be a non-empty list")
    inputs: list[Tensor] = []
    names: set[str] = set()
    offset = 0
    view = memoryview(blob)
    for i, raw in enumerate(raw_inputs):
        where = f"inputs[{i}]"
        if not isinstance(raw, dict):
            raise _fail(f"{where} must be a JSON object")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{where}.name must be a non-empty string")
        where = f"input '{name}'"
        if name in names:
            raise _fail(f"{where} appears more than once")
        names.add(name)
        datatype = raw.get("datatype")
        dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
        if dtype is None and datatype != BYTES:
            raise _fail(
                f"{where}: datatype {datatype!r} is not supported; use one of "
                + ", ".join(SUPPORTED_DATATYPES)
            )
        shape = _shape_of(raw.get("shape"), where)
        count = math.prod(shape)
        in_params = _as_params(raw.get("parameters"), f"{where}.parameters")
        size = in_params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _fail(f"{where}: binary_data_size must be a non-negative integer")
            if "data" in raw:
                raise _fail(f"{where} has both binary_data_size and JSON data")
        if dtype is None:  # BYTES
            if size is not None:
                if offset + size > len(blob):
                    raise _fail(
                        f"{where}: binary data ends at byte {offset + size} but only "
                        f"{len(blob)} bytes follow the JSON header"
                    )
                elements = _split_bytes(view[offset : offset + size], count, where)
                offset += size
            elif "data" not in raw:
                raise _fail(f"{where} has neither data nor parameters.binary_data_size")
            else:
                elements = _json_bytes(raw["data"], count, shape, where)
            inputs.append(Tensor(name, BYTES, _reshaped(_object_array(elements), shape, where)))
            continue
        if size is not None:
            if size != count * dtype.itemsize:
                raise _fail(
                    f"{where}: binary_data_size is {size} bytes but shape {list(shape)} of "
                    f"{datatype} needs {count * dtype.itemsize}"
                )
            if offset + size > len(blob):
                raise _fail(
                    f"{where}: binary data ends at byte {offset + size} but only "
                    f"{len(blob)} bytes follow the JSON header"
                )
            array = _reshaped(
                np.frombuffer(view[offset : offset + size], dtype=dtype), shape, where
            )
            offset += size
        else:
            if "data" not in raw:
                raise _fail(f"{where} has neither data nor parameters.binary_data_size")
            array = _json_array(raw["data"], dtype, shape, count, where)
        inputs.append(Tensor(name, datatype, array))  # type: ignore[arg-type]
    if offset != len(blob):
        raise _fail(
            f"{len(blob) - offset} bytes of binary data follow the inputs that no input claims"
        )

    requested: tuple[str, ...] | None = None
    binary_outputs: set[str] = set()
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise _fail("outputs must be a list")
        out_names: list[str] = []
        for i, raw in enumerate(raw_outputs):
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise _fail(f"outputs[{i}] must be an object with a string name")
            out_name = raw["name"]
            out_params = _as_params(raw.get("parameters"), f"output '{out_name}'.parameters")
            if "classification" in out_params:
                raise _fail("the classification extension is not supported")
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
    )


def _object_array(elements: Sequence[bytes]) -> np.ndarray[Any, Any]:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


def _split_bytes(blob: memoryview, count: int, where: str) -> list[bytes]:
    """Binary BYTES data: `count` elements, each a 4-byte little-endian length and its bytes."""
    elements: list[bytes] = []
    offset, end = 0, len(blob)
    while offset < end:
        if offset + 4 > end:
            raise _fail(
                f"{where}: BYTES element {len(elements)} has a cut-off length prefix "
                f"({end - offset} of 4 bytes)"
            )
        (length,) = _LENGTH.unpack_from(blob, offset)
        offset += 4
        if offset + length > end:
            raise _fail(
                f"{where}: BYTES element {len(elements)} says {length} bytes but only "
                f"{end - offset} remain in its binary data"
            )
        elements.append(bytes(blob[offset : offset + length]))
        offset += length
    if len(elements) != count:
        raise _fail(
            f"{where}: shape needs {count} BYTES elements, the binary data holds {len(elements)}"
        )
    return elements


def _json_bytes(data: Any, count: int, shape: tuple[int, ...], where: str) -> list[bytes]:
    """JSON BYTES data: strings (flat or nested), each sent on as its UTF-8 bytes."""
    if not isinstance(data, list):
        raise _fail(f"{where}: data must be a list")
    flat: list[bytes] = []
    stack: list[Any] = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        elif isinstance(item, str):
            flat.append(item.encode())
        else:
            raise _fail(
                f"{where}: BYTES data must be strings, got {type(item).__name__} {item!r:.40}; "
                "send bytes that are not UTF-8 text as binary data"
            )
    if len(flat) != count:
        raise _fail(f"{where}: shape {list(shape)} needs {count} elements, data has {len(flat)}")
    return flat


_END: Final = object()


def encode_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Binary form of a BYTES tensor: each element as a 4-byte little-endian length and its
    bytes, in row-major order (str elements are written as UTF-8)."""
    chunks: list[bytes] = []
    for element in array.reshape(-1):
        raw = element.encode() if isinstance(element, str) else bytes(element)
        chunks.append(_LENGTH.pack(len(raw)))
        chunks.append(raw)
    return b"".join(chunks)


def _bytes_as_json(array: np.ndarray[Any, Any], name: str) -> list[str]:
    texts: list[str] = []
    for element in array.reshape(-1):
        if isinstance(element, str):
            texts.append(element)
            continue
        try:
            texts.append(bytes(element).decode())
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"output '{name}' holds bytes that are not UTF-8 text; ask for it as binary data"
            ) from None
    return texts


def check_integer_range(values: np.ndarray[Any, Any], dtype: np.dtype[Any], *, what: str) -> None:
    """Refuse integer `values` that `dtype` cannot hold (numpy would wrap them around silently);
    the error starts with `what`."""
    info = np.iinfo(dtype)
    outside = values[(values < info.min) | (values > info.max)]
    if outside.size:
        raise _fail(f"{what}: {outside.flat[0]} is outside its range {info.min}..{info.max}")


def _json_array(
    data: Any, dtype: np.dtype[Any], shape: tuple[int, ...], count: int, where: str
) -> np.ndarray[Any, Any]:
    """JSON numbers as `dtype`, refusing what numpy would silently convert: strings, nulls,
    booleans outside BOOL, fractions into integers, values out of the datatype's range."""
    if not isinstance(data, list):
        raise _fail(f"{where}: data must be a list")
    name = datatype_of(dtype)
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _fail(f"{where}: data does not fit datatype {name}: {exc}") from None
    kind = raw.dtype.kind if raw.size else dtype.kind
    if dtype.kind == "b":
        if kind != "b":
            raise _fail(f"{where}: BOOL data must be true or false")
    elif kind not in "iuf":
        raise _fail(f"{where}: data does not fit datatype {name}: {name} data must be numbers")
    elif dtype.kind in "iu" and kind == "f":
        raise _fail(f"{where}: data does not fit datatype {name}: {name} data must be integers")
    if raw.size and dtype.kind in "iu":
        check_integer_range(raw, dtype, what=f"{where}: data does not fit datatype {name}")
    with np.errstate(over="ignore"):
        array = raw.astype(dtype)
    if dtype.kind == "f" and raw.size and not np.array_equal(np.isfinite(array), np.isfinite(raw)):
        raise _fail(f"{where}: data does not fit datatype {name}: values overflow {name}")
    if array.size != count:
        raise _fail(f"{where}: shape {list(shape)} needs {count} elements, data has {array.size}")
    return _reshaped(array, shape, where)


def _reshaped(
    array: np.ndarray[Any, Any], shape: tuple[int, ...], where: str
) -> np.ndarray[Any, Any]:
    """`array` in `shape`. A shape with no elements matches any data size, yet numpy may still
    refuse it (too many dimensions, a dimension past its index range): that is the client's error.
    """
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise _fail(f"{where}: shape {list(shape)} cannot be used: {exc}") from None


def decode_raw_tensor(
    raw: bytes | memoryview, datatype: str, shape: tuple[int, ...], where: str
) -> np.ndarray[Any, Any]:
    """One tensor from its raw bytes, as the binary tensor extension and gRPC's
    ``raw_input_contents`` lay them out: little-endian elements in row-major order, or for BYTES
    each element as a 4-byte little-endian length and its bytes. Fixed-size data is viewed in
    place, not copied. Raises InvalidRequest when the bytes do not fit the shape."""
    count = math.prod(shape)
    if datatype == BYTES:
        return _reshaped(_object_array(_split_bytes(memoryview(raw), count, where)), shape, where)
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise _fail(
            f"{where}: datatype {datatype!r} is not supported; use one of "
            + ", ".join(SUPPORTED_DATATYPES)
        )
    if len(raw) != count * dtype.itemsize:
        raise _fail(
            f"{where}: raw data is {len(raw)} bytes but shape {list(shape)} of {datatype} "
            f"needs {count * dtype.itemsize}"
        )
    return _reshaped(np.frombuffer(raw, dtype=dtype), shape, where)


def encode_raw_tensor(array: np.ndarray[Any, Any], datatype: str) -> bytes:
    """The raw bytes of a tensor: the inverse of `decode_raw_tensor`."""
    if datatype == BYTES:
        return encode_bytes(array)
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()


def encode_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[Tensor],
    binary: Iterable[str],
) -> tuple[bytes, int | None]:
    """Encode a v2 infer response.

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
                entry["data"] = _bytes_as_json(array, out.name)
        elif out.name in binary_names:
            raw = np.ascontiguousarray(array, dtype=DATATYPES[out.datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = np.ascontiguousarray(
                array.reshape(-1), dtype=DATATYPES[out.datatype].newbyteorder("=")
            )
        entries.append(entry)
    doc["outputs"] = entries
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def encode_request(
    inputs: Sequence[Tensor],
    *,
    binary: bool = True,
    binary_outputs: bool = True,
    outputs: Sequence[str] | None = None,
    request_id: str | None = None,
    timeout_s: float | None = None,
) -> tuple[bytes, int | None]:
    """Encode a v2 infer request (the client side: load generator, tests, benchmarks)."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    params: dict[str, Any] = {}
    if binary_outputs:
        params["binary_data_output"] = True
    if timeout_s is not None:
        params["timeout"] = max(1, round(timeout_s * 1e6))
    if params:
        doc["parameters"] = params
    chunks: list[bytes] = []
    entries = []
    for tensor in inputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.data.shape),
        }
        if tensor.datatype == BYTES:
            if binary:
                raw = encode_bytes(tensor.data)
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = _bytes_as_json(tensor.data, tensor.name)
            entries.append(entry)
            continue
        dtype = DATATYPES[tensor.datatype]
        if binary:
            raw = np.ascontiguousarray(tensor.data, dtype=dtype).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = np.ascontiguousarray(
                tensor.data.reshape(-1), dtype=dtype.newbyteorder("=")
            )
        entries.append(entry)
    doc["inputs"] = entries
    if outputs is not None:
        doc["outputs"] = [
            {"name": name, "parameters": {"binary_data": binary_outputs}} for name in outputs
        ]
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def decode_response(body: bytes, *, header_length: int | None = None) -> dict[str, Tensor]:
    """Decode a v2 infer response into tensors by output name (the client side)."""
    header = body if header_length is None else body[:header_length]
    blob = memoryview(body)[len(header) :]
    doc = orjson.loads(header)
    result: dict[str, Tensor] = {}
    offset = 0
    for out in doc["outputs"]:
        shape = tuple(out["shape"])
        size = (out.get("parameters") or {}).get("binary_data_size")
        if out["datatype"] == BYTES:
            where = f"output '{out['name']}'"
            if size is not None:
                elements = _split_bytes(blob[offset : offset + size], math.prod(shape), where)
                offset += size
            else:
                elements = _json_bytes(out["data"], math.prod(shape), shape, where)
            array = _object_array(elements).reshape(shape)
            result[out["name"]] = Tensor(out["name"], BYTES, array)
            continue
        dtype = DATATYPES[out["datatype"]]
        if size is not None:
            array = np.frombuffer(blob[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        else:
            array = np.asarray(out["data"], dtype=dtype).reshape(shape)
        result[out["name"]] = Tensor(out["name"], out["datatype"], array)
    return result
