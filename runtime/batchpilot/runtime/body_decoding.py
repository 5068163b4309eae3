"""Request bodies into inference requests, the large ones off the event loop and one at a time.

Decoding a JSON body holds the event loop for as long as it takes: about 3 s for 60 MiB of
numbers (orjson's parse, then the data's conversion to arrays), and a compressed body is that
large from a few kilobytes on the wire (gzip inflates numbers a thousand times). While a loop
decodes, nothing else on it moves: health checks time out (the kubelet marks the pod unready, or
restarts it), answers wait, and every request in flight pays the stall. So a body whose JSON is
larger than `LARGE_JSON_BYTES`, or that comes compressed, is decoded in the decoder's one worker
thread: the loop goes on between the decoder's steps (the parse itself still holds the
interpreter, about a second for 60 MiB; inflating and converting arrays do not), and at most one
such body's parse — up to a few hundred megabytes of Python objects for the largest — is held
at once. Beyond `WAITING_MAX` large bodies waiting for the decoder, the next is refused at once
with 503 (`Overloaded`, "queue_full"): load, which more replicas serve, rather than a queue of
bodies that holds their memory while their deadlines pass. Binary tensor data is not JSON: a body
of it with a small JSON header is decoded in place, as every small body is. gRPC's messages come
parsed, but their data is still to be turned into arrays (BYTES elements split one by one, typed
contents copied from lists): its service runs a large message's through a `DecodeThread` too.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from batchpilot.runtime.asgi_io import decode_body
from batchpilot.runtime.errors import Overloaded
from batchpilot.runtime.protocol.server_codec import InferRequest, decode_request

LARGE_JSON_BYTES = 1 << 20
"""JSON up to this size is decoded on the event loop: a millisecond or two, less than the hop to
a thread and back costs a burst of small requests."""

WAITING_MAX = 8
"""Large bodies that may wait for the decoder; the next is refused (503)."""

T = TypeVar("T")


class DecodeThread:
    """`await thread.run(decode)`: `decode()` in one worker thread, behind the others waiting
    for it — at most `WAITING_MAX`, the next refused at once (`Overloaded`). Cancelled (its
    client gone), a run leaves the line at once: a `decode` not yet started never runs, and one
    running finishes in the thread, its result dropped."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="decode")
        self._waiting = 0

    async def run(self, decode: Callable[[], T]) -> T:
        if self._waiting >= WAITING_MAX:
            raise Overloaded(
                f"the server is decoding {self._waiting} large requests already; retry shortly "
                f"or elsewhere (binary tensor data decodes without this wait)",
                reason="queue_full",
            )
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, decode)
        finally:
            self._waiting -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class BodyDecoder:
    """`await decoder.decode(body, coding, header_length)`: the request in `body`, as
    `asgi_io.decode_body` then `decode_request` make it (their errors too)."""

    def __init__(self, *, max_body_bytes: int) -> None:
        self._limit = max_body_bytes
        self._thread = DecodeThread()

    async def decode(
        self, body: bytes, coding: str | None, header_length: int | None
    ) -> InferRequest:
        json_bytes = len(body) if header_length is None else header_length
        if coding is None and json_bytes <= LARGE_JSON_BYTES:
            return decode_request(body, header_length=header_length)
        return await self._thread.run(functools.partial(self._decode, body, coding, header_length))

    def _decode(self, body: bytes, coding: str | None, header_length: int | None) -> InferRequest:
        return decode_request(decode_body(body, coding, self._limit), header_length=header_length)

    def close(self) -> None:
        self._thread.close()
