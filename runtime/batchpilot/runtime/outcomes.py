"""What became of a request, and which outcome and HTTP status each domain error means; what a
batch that ran reports.

Both transports count a request the same way: the REST endpoints answer with the status from
`ERROR_STATUS`, the gRPC service maps the same errors to its own codes (`grpc_api.service`), and
both record the outcome from here in `batchpilot_requests_total`. Keeping the table out of the
HTTP app is what lets the gRPC service use it without depending on FastAPI. Pure: a table and a
lookup, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from batchpilot.runtime.async_jobs import HolderNotAnswering, JobNotFound, StoreFull
from batchpilot.runtime.errors import (
    DeadlineExceeded,
    EngineFailure,
    Forbidden,
    InferenceError,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    QuotaExceeded,
    RequestTooLarge,
    ShuttingDown,
    Unauthorized,
    UnsupportedEncoding,
)


class RequestOutcome(StrEnum):
    """How a request ended: the `outcome` label of `batchpilot_requests_total`."""

    SUCCESS = "success"
    INVALID = "invalid"
    REJECTED = "rejected"  # queue full or draining: 503
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"  # the client went away
    ERROR = "error"


REFUSED_MID_BODY = "batchpilot.refused_mid_body"
"""The ASGI scope's key for a request the HTTP layer refused while its body came, and how it
counts: `invalid` (400: framing that is not HTTP/1.1, a chunk size that is not one), `rejected`
(503: the server began to drain). The app, which sees the connection close, counts it so, not
cancelled by its client (`disconnected`)."""


KEPT_WHILE_DRAINING = "batchpilot.kept"
"""The ASGI scope's key (True) for a request a draining server still serves: the first one after
the signal on a connection opened before it, or one whose body was in at the signal
(`OpenConnections.owe_answers`)."""


def disconnected(scope: Mapping[str, object]) -> RequestOutcome:
    """How a request whose body never came whole ended: refused for its framing (`invalid`) or
    by a drain (`rejected`), or its client gone — a body cut short by a close, which a
    half-close looks like — or stalled past the body timeout (`cancelled`)."""
    refused = scope.get(REFUSED_MID_BODY)
    return refused if isinstance(refused, RequestOutcome) else RequestOutcome.CANCELLED


ERROR_STATUS: dict[type[InferenceError], tuple[int, RequestOutcome]] = {
    InvalidRequest: (400, RequestOutcome.INVALID),
    UnsupportedEncoding: (415, RequestOutcome.INVALID),
    Unauthorized: (401, RequestOutcome.INVALID),
    Forbidden: (403, RequestOutcome.INVALID),
    ModelNotFound: (404, RequestOutcome.INVALID),
    RequestTooLarge: (413, RequestOutcome.INVALID),
    Overloaded: (503, RequestOutcome.REJECTED),
    ShuttingDown: (503, RequestOutcome.REJECTED),
    DeadlineExceeded: (504, RequestOutcome.TIMEOUT),
    EngineFailure: (500, RequestOutcome.ERROR),
    StoreFull: (429, RequestOutcome.REJECTED),
    QuotaExceeded: (429, RequestOutcome.REJECTED),
    JobNotFound: (404, RequestOutcome.INVALID),
    HolderNotAnswering: (504, RequestOutcome.TIMEOUT),
}
"""The HTTP status and the outcome of each domain error (its nearest listed base class's)."""


def withdrawn(age_s: float, *, sla_s: float | None, deadline_s: float | None) -> bool:
    """Whether a request its client cancelled `age_s` after it arrived was withdrawn rather than
    missed: cancelled before the service's SLA had passed and before its own deadline. No answer
    was owed yet, and nothing says it would have been late — a hedged request whose twin was
    answered elsewhere, a caller that moved on. One cancelled later was waiting past what the
    service promised (a gRPC deadline that passed is the client's own timeout): a miss. With
    neither an SLA nor a deadline nothing was promised, and every cancellation is withdrawn."""
    return (sla_s is None or age_s < sla_s) and (deadline_s is None or age_s < deadline_s)


def status_of(error: InferenceError) -> tuple[int, RequestOutcome]:
    for cls in type(error).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return 500, RequestOutcome.ERROR


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A batch that ran and answered its requests."""

    rows: int
    compute_s: float
    """The engine's time, what t(b) is fit from (`batching.batcher`'s `LoopDelay`)."""
    queue_waits_s: tuple[float, ...]
    """Each request's wait from the queue to the batch, the background lane's aside."""
    input_s: float
    """Gathering the requests' inputs into the batch, before the engine."""
    output_s: float
    """Handing each request its rows, after the engine."""
    background_waits_s: tuple[float, ...] = ()
    """Each background request's wait (an async job's: `BatchQueue.put`), kept out of the
    SLA's queue wait."""

    @property
    def requests(self) -> int:
        return len(self.queue_waits_s) + len(self.background_waits_s)
