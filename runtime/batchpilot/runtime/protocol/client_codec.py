"""The client side of the v2 REST codec: what the load generator, the tests and the benchmarks
send and read.

`encode_request` builds an infer request body (JSON, or JSON header + binary tensor data) and
`decode_response` reads a response body back into tensors. It is the mirror of `server_codec`,
kept apart so that the server's module holds only what the server runs, and so a client reads
what it uses without the server's validation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from batchpilot.runtime.protocol.tensors import (
    BYTES,
    DATATYPES,
    Tensor,
    bytes_as_json,
    encode_bytes,
    json_bytes,
    object_array,
    split_bytes,
)


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
                entry["data"] = bytes_as_json(tensor.data, tensor.name)
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
                elements = split_bytes(blob[offset : offset + size], math.prod(shape), where)
                offset += size
            else:
                elements = json_bytes(out["data"], math.prod(shape), shape, where)
            array = object_array(elements).reshape(shape)
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
