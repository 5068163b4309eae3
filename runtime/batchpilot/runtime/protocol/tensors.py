"""What both sides of the v2 protocol share: datatypes, the tensor, and how tensors are laid out.

The server codec (`server_codec`), the client codec (`client_codec`) and the gRPC codec
(`grpc_api.codec`) all read and write the same things: the v2 datatype names and the
little-endian numpy dtypes of their binary form, the raw layout of a tensor's elements, and BYTES
elements. Keeping them here, once, is what makes the two sides agree on them.

BYTES tensors (raw images, text, labels) are numpy object arrays of `bytes`. In JSON their
elements are strings (UTF-8); in binary each element is a 4-byte little-endian length followed by
that many bytes, as Triton and KServe encode them. KServe's ``{"b64": …}`` convention belongs to
its v1 protocol, not to v2, so it is not accepted: send bytes that are not UTF-8 as binary data.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

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

MAX_DIMS: Final = 32
"""Dimensions a tensor may have: numpy's own limit before numpy 2 (64 since). No model input
has nearly as many, and a shape of thousands would cost the product of its dimensions time."""
MAX_ELEMENTS: Final = 1 << 40
"""Elements beyond any body's room (each takes a byte at least): a shape that declares more is
refused before its product is taken whole — the product of a few hundred dimensions of 10^18
has more digits than Python will print in the error that would refuse it."""


def check_dims(shape: Sequence[Any], where: str) -> None:
    """Raises InvalidRequest where `shape` has more than `MAX_DIMS` dimensions."""
    if len(shape) > MAX_DIMS:
        raise InvalidRequest(
            f"{where}.shape has {len(shape)} dimensions; a tensor may have {MAX_DIMS} at most"
        )


def element_count(shape: Sequence[int], where: str) -> int:
    """The elements `shape` (non-negative integers) declares; raises InvalidRequest where it has
    more dimensions than `MAX_DIMS` or declares more than `MAX_ELEMENTS`."""
    check_dims(shape, where)
    if 0 in shape:
        return 0
    count = 1
    for dimension in shape:
        count *= dimension
        if count > MAX_ELEMENTS:
            raise InvalidRequest(
                f"{where}.shape declares more than {MAX_ELEMENTS} elements, more than any "
                "request can carry"
            )
    return count


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


def object_array(elements: Sequence[bytes]) -> np.ndarray[Any, Any]:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


def split_bytes(blob: memoryview, count: int, where: str) -> list[bytes]:
    """Binary BYTES data: `count` elements, each a 4-byte little-endian length and its bytes."""
    elements: list[bytes] = []
    offset, end = 0, len(blob)
    while offset < end:
        if offset + 4 > end:
            raise InvalidRequest(
                f"{where}: BYTES element {len(elements)} has a cut-off length prefix "
                f"({end - offset} of 4 bytes)"
            )
        (length,) = _LENGTH.unpack_from(blob, offset)
        offset += 4
        if offset + length > end:
            raise InvalidRequest(
                f"{where}: BYTES element {len(elements)} says {length} bytes but only "
                f"{end - offset} remain in its binary data"
            )
        elements.append(bytes(blob[offset : offset + length]))
        offset += length
        if len(elements) == count and offset < end:  # no need to split the rest to know
            raise InvalidRequest(
                f"{where}: shape needs {count} BYTES elements, the binary data holds more"
            )
    if len(elements) != count:
        raise InvalidRequest(
            f"{where}: shape needs {count} BYTES elements, the binary data holds {len(elements)}"
        )
    return elements


def json_bytes(data: Any, count: int, shape: tuple[int, ...], where: str) -> list[bytes]:
    """JSON BYTES data: strings, each sent on as its UTF-8 bytes. Flat, or nested exactly as
    the declared shape: nesting that contradicts it is refused, never reshaped."""
    if not isinstance(data, list):
        raise InvalidRequest(f"{where}: data must be a list")
    if list in set(map(type, data)):
        flat = _nested_strings(data, shape, where)
    else:
        flat = [_utf8(item, where) for item in data]
    if len(flat) != count:
        raise InvalidRequest(
            f"{where}: shape {list(shape)} needs {count} elements, data has {len(flat)}"
        )
    return flat


def _utf8(item: Any, where: str) -> bytes:
    if isinstance(item, str):
        return item.encode()
    raise InvalidRequest(
        f"{where}: BYTES data must be strings, got {type(item).__name__} {item!r:.40}; "
        "send bytes that are not UTF-8 text as binary data"
    )


def _nested_strings(data: list[Any], shape: tuple[int, ...], where: str) -> list[bytes]:
    """The strings of data nested as `shape`, in row-major order (a loop, not recursion: the
    nesting is the client's)."""
    flat: list[bytes] = []
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if depth == len(shape):
            if isinstance(node, list):
                raise nesting_mismatch(data, shape, where)
            flat.append(_utf8(node, where))
        elif not isinstance(node, list) or len(node) != shape[depth]:
            raise nesting_mismatch(data, shape, where)
        else:
            stack.extend((item, depth + 1) for item in reversed(node))
    return flat


def nesting_mismatch(data: list[Any], shape: tuple[int, ...], where: str) -> InvalidRequest:
    """The refusal of nested JSON data whose nesting is not the declared shape."""
    nested: list[int] = []
    node: Any = data
    while isinstance(node, list) and len(nested) <= len(shape):
        nested.append(len(node))
        node = node[0] if node else None
    seen = "unevenly; the shape is" if nested == list(shape) else f"as {nested} but the shape is"
    return InvalidRequest(
        f"{where}: data is nested {seen} {list(shape)}; nested data must match the shape exactly "
        "(or send it flat)"
    )


def encode_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Binary form of a BYTES tensor: each element as a 4-byte little-endian length and its
    bytes, in row-major order (str elements are written as UTF-8)."""
    chunks: list[bytes] = []
    for element in array.reshape(-1):
        raw = element.encode() if isinstance(element, str) else bytes(element)
        chunks.append(_LENGTH.pack(len(raw)))
        chunks.append(raw)
    return b"".join(chunks)


def bytes_as_json(array: np.ndarray[Any, Any], name: str) -> list[str]:
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
        raise out_of_range(outside.flat[0], dtype, what=what)


def out_of_range(value: Any, dtype: np.dtype[Any], *, what: str) -> InvalidRequest:
    info = np.iinfo(dtype)
    return InvalidRequest(
        f"{what}: {value} is out of range for {datatype_of(dtype)} ({info.min}..{info.max})"
    )


def check_bool_bytes(array: np.ndarray[Any, Any], where: str) -> None:
    """Refuse binary BOOL elements other than 0 and 1. numpy views any other byte as true, but
    hands the byte itself to the model, whose logic then computes with it (a NOT of 0x02 is
    0xfd: true again) and answers wrong without an error."""
    raw = array.view(np.uint8)
    if raw.size and raw.max() > 1:
        index = int(np.argmax(raw > 1))
        raise InvalidRequest(
            f"{where}: BOOL elements must be 0 or 1; element {index} is {int(raw[index])}"
        )


def reshaped(
    array: np.ndarray[Any, Any], shape: tuple[int, ...], where: str
) -> np.ndarray[Any, Any]:
    """`array` in `shape`. A shape with no elements matches any data size, yet numpy may still
    refuse it (too many dimensions, a dimension past its index range): that is the client's error.
    """
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise InvalidRequest(f"{where}: shape {list(shape)} cannot be used: {exc}") from None


def decode_raw_tensor(
    raw: bytes | memoryview, datatype: str, shape: tuple[int, ...], where: str
) -> np.ndarray[Any, Any]:
    """One tensor from its raw bytes, as the binary tensor extension and gRPC's
    ``raw_input_contents`` lay them out: little-endian elements in row-major order, or for BYTES
    each element as a 4-byte little-endian length and its bytes. Fixed-size data is viewed in
    place, not copied. Raises InvalidRequest when the bytes do not fit the shape."""
    count = element_count(shape, where)
    if datatype == BYTES:
        return reshaped(object_array(split_bytes(memoryview(raw), count, where)), shape, where)
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise InvalidRequest(
            f"{where}: datatype {datatype!r} is not supported; use one of "
            + ", ".join(SUPPORTED_DATATYPES)
        )
    if len(raw) != count * dtype.itemsize:
        raise InvalidRequest(
            f"{where}: raw data is {len(raw)} bytes but shape {list(shape)} of {datatype} "
            f"needs {count * dtype.itemsize}"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if datatype == "BOOL":
        check_bool_bytes(array, where)
    return reshaped(array, shape, where)


def encode_raw_tensor(array: np.ndarray[Any, Any], datatype: str) -> bytes:
    """The raw bytes of a tensor: the inverse of `decode_raw_tensor`."""
    if datatype == BYTES:
        return encode_bytes(array)
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
