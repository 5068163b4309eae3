"""Whether a request says it is a retry: the headers proxies and gRPC clients put on one.

A client that retries what was refused sends the same request again, and the runtime cannot tell
it from a new one by its body. Some say so in a header, and those are read here:

- `x-envoy-attempt-count`: Envoy (Istio, Envoy Gateway, Contour, …) numbers each attempt it
  makes, 1 for the first, where the route asks for it (`include_request_attempt_count`);
- `grpc-previous-rpc-attempts`: a gRPC client with a retry policy says how many attempts came
  before this one (gRFC A6); absent or 0 on the first.

A value that is not a whole number is no retry: the header is read for the metrics alone and
never fails a request. Names are lower-case, as HTTP/2, gRPC metadata and ASGI give them.

Most clients say nothing, and many load generators and naive clients send what was refused again
at once, on the same connection, ignoring Retry-After. Such a resend is told apart here
(`Resends`, one per HTTP connection): the same body on the connection that was just refused. It
is a retry, not demand; and one sent before the Retry-After it was given is refused again at
once, before its body is decoded or admission weighs it — a storm of resends otherwise took the
room freed by each batch from clients that waited as told (one at 21 % of capacity got 4 % of
its requests served), and counted as demand twelve times the real.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

ENVOY_ATTEMPT_COUNT = "x-envoy-attempt-count"
GRPC_PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"

_FIRST_ATTEMPT = {ENVOY_ATTEMPT_COUNT: 1, GRPC_PREVIOUS_ATTEMPTS: 0}
"""Each header's value on a first attempt: anything above it is a retry."""
_ENCODED = {name.encode("latin-1"): first for name, first in _FIRST_ATTEMPT.items()}


def _above(value: str | bytes, first: int) -> bool:
    try:
        return int(value) > first
    except ValueError:
        return False


def is_retry(headers: Iterable[tuple[str, str | bytes]]) -> bool:
    """Whether `headers` (gRPC metadata: lower-case names) mark a retry."""
    for name, value in headers:
        first = _FIRST_ATTEMPT.get(name)
        if first is not None and _above(value, first):
            return True
    return False


def is_retry_raw(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether an ASGI scope's `headers` (bytes, lower-case names) mark a retry."""
    for name, value in headers:
        first = _ENCODED.get(name)
        if first is not None and _above(value, first):
            return True
    return False


RESENDS = "batchpilot.resends"
"""The scope key of a request's connection's `Resends` (the HTTP protocol puts it there)."""
RESEND_GRACE_S = 2.0
"""How long after its Retry-After a resend of the refused body still counts as a retry (one that
waited as told): past it, the same body is taken for a new request."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal with Retry-After on a connection: of which body, how many rows, until when."""

    digest: bytes
    rows: int
    at: float
    until: float


class Resends:
    """The last refusal with Retry-After on one connection, to tell a resend of its body."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: Refused | None = None

    def refused(self, body: bytes, *, rows: int, retry_after_s: float, now: float) -> None:
        """`body` was refused at `now`, told to wait `retry_after_s` (as the header says it)."""
        self._last = Refused(_digest(body), rows, now, now + retry_after_s)

    def served(self) -> None:
        """A request on the connection was served: its client waits no more."""
        self._last = None

    def resend(self, body: bytes, now: float) -> Refused | None:
        """The refusal `body` resends (the same body, within its Retry-After and
        `RESEND_GRACE_S`), else None."""
        last = self._last
        if last is None or now > last.until + RESEND_GRACE_S:
            return None
        return last if _digest(body) == last.digest else None


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()
