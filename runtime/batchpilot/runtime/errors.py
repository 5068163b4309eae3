"""The runtime's error vocabulary.

Every failure a caller can cause or observe is one of these; the HTTP layer maps each class to a
status code in one table (`outcomes.ERROR_STATUS`, which gRPC reads the outcome from too), and
endpoints just raise. Messages are written for the person reading the client's log: they say what
was wrong and what was expected.
"""

from __future__ import annotations


class InferenceError(Exception):
    """Base class: a request could not be served."""


class InvalidRequest(InferenceError):
    """The request is malformed or does not match the model (400)."""


class TooLargeForDeadline(InvalidRequest):
    """The request has more rows than the server could serve within its deadline even alone, on
    an idle device, at the fastest the device has been measured, or a deadline shorter than any
    batch the server has run (400): retrying cannot help, fewer rows a request or a longer
    deadline can."""


class UnsupportedEncoding(InvalidRequest):
    """The body is sent with a Content-Encoding the server does not decode: anything but
    identity (415)."""


class RefusedByModel(InvalidRequest):
    """The engine failed on this request's inputs (400, in the engine's words): run alone, while
    requests batched with it ran; or alone in its batch, while the engine runs others (it has
    run a batch and has not failed every run of late). A value the model cannot take: a token
    id past its vocabulary, an index out of range. The same request would fail on every
    replica."""


class ModelNotFound(InferenceError):
    """The request names a model this server does not serve (404)."""


class RequestTooLarge(InferenceError):
    """The body is over the configured limit (413)."""


class Overloaded(InferenceError):
    """The server cannot take the request now; the client should retry later (503 with
    Retry-After). `reason` says why, in the words of the shed metric: "queue_full" (the queue
    bound) or "predicted_late" (it would finish after its deadline)."""

    def __init__(
        self, message: str, *, reason: str = "queue_full", retry_after_s: float = 1.0
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class ShuttingDown(InferenceError):
    """The server is draining and accepts no new requests (503)."""

    def __init__(self, message: str = "the server is shutting down and accepts no new requests"):
        super().__init__(message)


class DeadlineExceeded(InferenceError):
    """The request's deadline passed before it could be served (504)."""


class EngineFailure(InferenceError):
    """The engine failed on the batch this request was part of (500)."""


OUT_OF_MEMORY_MARKERS = (
    "out of memory",  # CUDA's, PyTorch's, cuDNN's
    "failed to allocate memory",  # onnxruntime's arena
    "cuda_error_out_of_memory",
    "bad_alloc",  # C++ allocations in the engine
    "outofmemory",
)


def first_line(error: BaseException) -> str:
    """An exception's first line, for a message of ours (its type where it says nothing)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def out_of_memory(error: BaseException) -> bool:
    """Whether an engine's error says the device ran out of memory for the batch: a batch
    smaller may run (as opposed to a model or input that fails at any size)."""
    if isinstance(error, MemoryError) or "OutOfMemory" in type(error).__name__:
        return True
    text = str(error).lower()
    return any(marker in text for marker in OUT_OF_MEMORY_MARKERS)


class Unauthorized(InferenceError):
    """The caller did not prove who it is: no key or token, or one the server does not know
    (401, with a `WWW-Authenticate: Bearer` challenge). `error` is RFC 6750's code for the
    challenge: "invalid_token" for a credential that was sent and is wrong, None when none was
    sent."""

    def __init__(self, message: str, *, error: str | None = None) -> None:
        super().__init__(message)
        self.error = error


class Forbidden(InferenceError):
    """The caller is known and may not do this: an API key not allowed on this model (403)."""


class QuotaExceeded(InferenceError):
    """The caller is over its rate limit (429 with Retry-After): `retry_after_s` is how long
    until the limit lets a request through."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
