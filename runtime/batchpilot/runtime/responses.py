"""How the REST endpoints answer: JSON documents, domain errors, and encoded infer results.

Every route module answers through these, so an error says the same thing with the same status
and headers (`Retry-After` on 503s and 429s, `Connection: close` while shutting down, the
`WWW-Authenticate` challenge on 401s) wherever it is raised, and a sync infer result and a
fetched async result are the same bytes.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi.responses import Response

from batchpilot.runtime.errors import (
    InferenceError,
    Overloaded,
    QuotaExceeded,
    ShuttingDown,
    Unauthorized,
)
from batchpilot.runtime.outcomes import status_of
from batchpilot.runtime.protocol.server_codec import InferRequest, encode_response
from batchpilot.runtime.protocol.tensors import Tensor
from batchpilot.runtime.server import ModelServer

CLIENT_CLOSED_REQUEST = 499
"""Status recorded (never seen by anyone) when the client went away before its answer."""


def json_response(
    doc: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers
    )


def www_authenticate(error: Unauthorized) -> str:
    """The Bearer challenge of a 401 (RFC 6750): the error code only when a credential was sent;
    the description is the message, quotes replaced (it is a quoted string)."""
    challenge = 'Bearer realm="batchpilot"'
    if error.error is not None:
        description = str(error).replace('"', "'").replace("\\", "/")
        challenge += f', error="{error.error}", error_description="{description}"'
    return challenge


def error_response(error: InferenceError) -> Response:
    status, _ = status_of(error)
    headers = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    elif isinstance(error, ShuttingDown):
        headers["Retry-After"] = "1"
        headers["Connection"] = "close"
    elif isinstance(error, QuotaExceeded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    elif isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = www_authenticate(error)
    return json_response({"error": str(error)}, status=status, headers=headers)


@dataclass(frozen=True, slots=True)
class EncodedResult:
    """An infer response as the sync path would send it: JSON, or JSON header + binary."""

    content: bytes
    header_length: int | None


def encode_result(
    server: ModelServer, parsed: InferRequest, outputs: list[Tensor]
) -> EncodedResult:
    content, header_length = encode_response(
        model_name=server.signature.name,
        model_version=server.signature.served_version,
        request_id=parsed.id,
        outputs=outputs,
        binary=(
            [t.name for t in outputs]
            if parsed.binary_default and not parsed.requested_outputs
            else parsed.binary_outputs
        ),
    )
    return EncodedResult(content, header_length)


ENCODE_OFF_LOOP_BYTES = 256 * 1024
"""Outputs larger than this are encoded in a thread, not on the event loop: a segmentation mask
or a detector's raw boxes (23 MB as JSON took 108 ms) held every other request's answers and
batches that long."""


async def encoded(
    server: ModelServer, parsed: InferRequest, outputs: list[Tensor]
) -> EncodedResult:
    """`encode_result`, off the event loop where the outputs are large."""
    size = sum(getattr(t.data, "nbytes", 0) for t in outputs)
    if size <= ENCODE_OFF_LOOP_BYTES:
        return encode_result(server, parsed, outputs)
    return await asyncio.to_thread(encode_result, server, parsed, outputs)


def result_response(result: EncodedResult) -> Response:
    if result.header_length is None:
        return Response(result.content, media_type="application/json")
    return Response(
        result.content,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(result.header_length)},
    )
