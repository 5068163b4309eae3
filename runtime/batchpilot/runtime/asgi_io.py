"""Request bodies in and infer answers out at the ASGI level, for the REST endpoints.

The sync infer endpoint is a plain ASGI app (see `routes_v2`): it reads its headers from the
scope, its body from `receive` and writes a success straight to `send`, without Starlette's
request and response objects, because their per-request cost decides throughput when the model
is cheap. What it does by hand has to match what Starlette would do, so it lives here, in one
place, beside the body reading (with its size limit) that every endpoint shares.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from batchpilot.runtime.errors import InvalidRequest, RequestTooLarge, UnsupportedEncoding
from batchpilot.runtime.protocol.tensors import HEADER_LENGTH


async def read_body(request: Request, limit: int) -> bytes:
    return await receive_body(request.headers.get("content-length"), request.receive, limit)


async def receive_body(declared: str | None, receive: Receive, limit: int) -> bytes:
    """The request body, refused past `limit` bytes (by its Content-Length when it declares one);
    raises ClientDisconnect when the client goes away while sending it."""
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit:
            raise RequestTooLarge(f"the body is {declared} bytes; the limit is {limit} bytes")
        limit = -1
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if 0 <= limit < size:
                raise RequestTooLarge(f"the body is over the limit of {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def request_header_length(request: Request) -> int | None:
    """The request's Inference-Header-Content-Length; None when it has none."""
    return parse_header_length(request.headers.get(HEADER_LENGTH))


def parse_header_length(value: str | None) -> int | None:
    if value is None:
        return None
    # str.isdigit() accepts Unicode digits such as '²' (a Latin-1 header byte), which int()
    # refuses: only ASCII decimal digits make a length.
    text = value.strip()
    if not (text.isascii() and text.isdecimal()):
        raise InvalidRequest(f"Inference-Header-Content-Length {value!r:.40} is not a number")
    if len(text) > MAX_LENGTH_DIGITS:  # int() refuses past 4,300 digits; no body is that long
        raise InvalidRequest(
            f"Inference-Header-Content-Length has {len(text)} digits: longer than any body"
        )
    return int(text)


MAX_LENGTH_DIGITS = 18
"""Digits a byte count may have: 10^18 bytes is beyond any body."""

_GZIP_MAGIC = b"\x1f\x8b"
"""How every gzip member begins (RFC 1952 2.3.1)."""

_CONTENT_LENGTH = b"content-length"
_CONTENT_ENCODING = b"content-encoding"
_HEADER_LENGTH = HEADER_LENGTH.encode()


def body_headers(scope: Scope) -> tuple[str | None, str | None]:
    """Content-Length and Inference-Header-Content-Length (the first of each), as Starlette's
    `Request.headers` reads them."""
    content_length = header_length = None
    for key, value in scope["headers"]:
        if key == _CONTENT_LENGTH:
            if content_length is None:
                content_length = value.decode("latin-1")
        elif key == _HEADER_LENGTH and header_length is None:
            header_length = value.decode("latin-1")
    return content_length, header_length


_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The Content-Encodings a body may come in (tritonclient's `request_compression_algorithm`,
as Triton takes them), and the zlib window bits that read each."""


def body_coding(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The Content-Encoding to decode the body with (`_DECODERS`); None for none or identity.
    Anything else — another coding, or codings stacked — is refused (415): read as it is, a
    compressed body would be refused as "not valid UTF-8". `headers` are the ASGI scope's,
    names lower-cased."""
    for key, value in headers:
        if key == _CONTENT_ENCODING:
            sent = value.decode("latin-1")
            codings = [c.strip().lower() for c in sent.split(",")]
            codings = [c for c in codings if c and c != "identity"]
            if not codings:
                return None
            if len(codings) == 1 and codings[0] in _DECODERS:
                return codings[0]
            raise UnsupportedEncoding(
                f"Content-Encoding {sent!r} is not supported: send the body uncompressed, or in "
                "one of gzip or deflate"
            )
    return None


def decode_body(body: bytes, coding: str | None, limit: int) -> bytes:
    """`body` decoded from `coding`, refused (413) where it decodes to more than `limit` bytes —
    decoded no further than that, so a small body that inflates without end costs no memory —
    and (400) where it is not whole, valid data of that coding. A deflate body is zlib-wrapped
    (RFC 9110); raw deflate, as some clients send it, is read too. A gzip body may be several
    members one after another (RFC 1952 2.2: what concatenating gzip files, or a parallel
    compressor, makes): each is decoded in turn, within the one limit."""
    if coding is None:
        return body
    wbits = _DECODERS[coding]
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        try:
            try:
                decoder = zlib.decompressobj(wbits)
                decoded = decoder.decompress(rest, limit - size + 1)
            except zlib.error:
                if coding != "deflate":
                    raise
                decoder = zlib.decompressobj(-zlib.MAX_WBITS)
                decoded = decoder.decompress(rest, limit - size + 1)
        except zlib.error as exc:
            raise InvalidRequest(f"the body is not valid {coding} data ({exc})") from None
        size += len(decoded)
        parts.append(decoded)
        if size > limit or decoder.unconsumed_tail:
            raise RequestTooLarge(
                f"the body decodes from {coding} to more than the limit of {limit} bytes"
            )
        if not decoder.eof:
            raise InvalidRequest(f"the body is not whole {coding} data: it ends early")
        rest = decoder.unused_data
        if not rest:
            return b"".join(parts) if len(parts) > 1 else parts[0]
        if wbits != _DECODERS["gzip"] or not rest.startswith(_GZIP_MAGIC):
            raise InvalidRequest(f"the body has bytes after its {coding} data ends")


async def send_answer(send: Send, content: bytes, header_length: int | None) -> None:
    """A 200 infer answer: the headers Starlette's `Response` would send, in its order."""
    size = str(len(content)).encode()
    if header_length is None:
        headers = [(b"content-length", size), (b"content-type", b"application/json")]
    else:
        headers = [
            (_HEADER_LENGTH, str(header_length).encode()),
            (b"content-length", size),
            (b"content-type", b"application/octet-stream"),
        ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": content})


async def until_disconnected(receive: Receive, handler: asyncio.Task[Any]) -> None:
    """Cancel the request's handler when its client goes away (the body is already read).
    uvicorn says `http.disconnect` when the connection is lost; a client that only half-closes
    after its request is not gone, and the protocol (`http_protocol`) keeps its connection."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            handler.cancel(msg="client disconnected")
            return
