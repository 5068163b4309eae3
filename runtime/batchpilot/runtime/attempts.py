"""Whether a request says it is a retry: the headers proxies and gRPC clients put on one.

A client that retries what was refused sends the same request again, and the runtime cannot tell
it from a new one by its body. Some say so in a header, and those are read here:

- `x-envoy-attempt-count`: Envoy (Istio, Envoy Gateway, Contour, …) numbers each attempt it
  makes, 1 for the first, where the route asks for it (`include_request_attempt_count`);
- `grpc-previous-rpc-attempts`: a gRPC client with a retry policy says how many attempts came
  before this one (gRFC A6); absent or 0 on the first.

A value that is not a whole number is no retry: the header is read for the metrics alone and
never fails a request. Names are lower-case, as HTTP/2, gRPC metadata and ASGI give them.
"""

from __future__ import annotations

from collections.abc import Iterable

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
