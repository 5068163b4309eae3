"""The Open Inference Protocol v2 gRPC service, served by grpc.aio beside the REST app.

It runs in the same process and event loop as uvicorn and calls the same `ModelServer`, so gRPC
and REST requests share one queue, batch together, count in the same metrics and fail with the
same domain errors, mapped to gRPC status codes in one table (`GRPC_STATUS`) with the REST
messages. The RPC's deadline is the request's timeout, and a cancelled RPC leaves the queue, as
a REST request does when its client disconnects. ModelStreamInfer (Triton's streaming inference)
serves each request of a stream the same way, answering each on the stream as it finishes.

`attach` ties the gRPC server to the app's lifespan: it starts after the batcher and, on
shutdown, refuses new RPCs and lets the accepted ones finish within the drain grace before the
batcher drains. `batchpilot runtime serve` calls `GrpcEndpoint.drain` already when the drain
starts, while the batcher still serves the queue; the lifespan's call then waits for its stop.

Why `drain` does not stop the server at once: a gRPC client's connection stays on the replica it
was placed on, whatever the Service's endpoints say, and stopping a grpc.aio server ends as
CANCELLED every RPC that has reached it but that its loop has not yet taken up (gRPC core,
grpc/grpc#41785; under kept-alive load, one signal in a few: bench/grpc_drain.py). A connection
that goes by age gets GOAWAY with the server running, which costs no RPC. So while draining the
server goes on serving the RPCs of the connections it has (`ModelServer.infer(kept=True)`; REST
requests get 503 from the signal on), their age retires them, their clients reconnect through
the Service to the replicas in its endpoints, and the server stops once no RPC has come for
`QUIET_S` — or at the latest the age (and its ±10 %) plus that after the signal, within half
the drain grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from batchpilot.runtime.access import AccessGate
from batchpilot.runtime.attempts import is_retry
from batchpilot.runtime.body_decoding import LARGE_JSON_BYTES, DecodeThread
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
)
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2 as pb
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2_grpc as pb_grpc
from batchpilot.runtime.grpc_api.codec import decode_infer_request, encode_infer_response
from batchpilot.runtime.outcomes import RequestOutcome, status_of
from batchpilot.runtime.server import EXTENSIONS, ModelServer, server_version
from batchpilot.runtime.validation import check_datatype

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

GRPC_STATUS: dict[type[InferenceError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    RequestTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Overloaded: grpc.StatusCode.UNAVAILABLE,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    EngineFailure: grpc.StatusCode.INTERNAL,
}
"""The gRPC status of each domain error (the REST statuses are in `outcomes.ERROR_STATUS`)."""

INTERNAL_MESSAGE = "internal server error; see the server log"

LARGE_MESSAGE_BYTES = LARGE_JSON_BYTES
"""A ModelInfer message larger than this whose data is costly to read (`_costly`) is decoded off
the event loop (`body_decoding`): splitting millions of BYTES elements, or copying typed
contents, took seconds on it, and health checks with them."""

DEADLINE_MARGIN_S = 0.01
"""A request's timeout ends this long before its RPC's deadline, so the server answers
DEADLINE_EXCEEDED itself rather than racing the client, which cancels the RPC at that deadline; a
cancellation that arrives within twice this of the deadline is the deadline, and counts as a
timeout."""

STREAM_IN_FLIGHT = 256
"""Requests of one ModelStreamInfer stream served, or answered and not yet sent, at once; reading
the stream waits beyond."""


def _costly(request: pb.ModelInferRequest) -> bool:
    """Whether turning the message's data into arrays takes long enough for the event loop to
    feel: over `LARGE_MESSAGE_BYTES` of typed contents (copied from lists) or of BYTES elements
    (split one by one). Raw numeric data is read in place, however large."""
    if request.ByteSize() <= LARGE_MESSAGE_BYTES:
        return False
    return not request.raw_input_contents or any(t.datatype == "BYTES" for t in request.inputs)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A message gRPC received for an inference RPC that is no ModelInferRequest: answered
    INVALID_ARGUMENT (in-band on a stream, which goes on), where gRPC's own deserializer fails
    the RPC UNKNOWN — the whole stream with the requests it had taken — and logs a traceback."""

    reason: str


def _tolerant(message: bytes) -> pb.ModelInferRequest | Undecodable:
    try:
        return pb.ModelInferRequest.FromString(message)
    except DecodeError as exc:
        return Undecodable(str(exc))


SERVICE = "inference.GRPCInferenceService"


class _Handlers:
    """Takes the method handlers the generated code registers, instead of a server."""

    handlers: dict[str, Any]

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def _add_servicer(servicer: InferenceService, server: grpc.aio.Server) -> None:
    """The generated registration, with `_tolerant` reading the inference RPCs' messages."""
    taken = _Handlers()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, taken)  # type: ignore[arg-type]
    handlers = taken.handlers
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer,
        request_deserializer=_tolerant,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer,
        request_deserializer=_tolerant,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]


def grpc_status(error: InferenceError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in GRPC_STATUS:
            return GRPC_STATUS[cls]
    return grpc.StatusCode.INTERNAL


def trailing_metadata(error: InferenceError) -> tuple[tuple[str, str], ...]:
    """When to retry, as REST's Retry-After says it, plus gRPC's own retry pushback for an
    overloaded server (honoured by clients with a retry policy)."""
    if isinstance(error, Overloaded):
        return (
            ("retry-after", str(max(1, math.ceil(error.retry_after_s)))),
            ("grpc-retry-pushback-ms", str(max(0, round(error.retry_after_s * 1e3)))),
        )
    if isinstance(error, ShuttingDown):
        return (("retry-after", "1"),)
    if isinstance(error, QuotaExceeded):
        return (("retry-after", str(max(1, math.ceil(error.retry_after_s)))),)
    return ()


def _key_metadata(context: Context) -> list[tuple[str, str]]:
    """The metadata that may carry an API key (gRPC gives names lower-cased)."""
    return [
        (str(key), str(value))
        for key, value in context.invocation_metadata() or ()
        if key in ("authorization", "x-api-key")
    ]


async def _abort(context: Context, error: InferenceError) -> NoReturn:
    await context.abort(grpc_status(error), str(error), trailing_metadata(error))
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """`inference.GRPCInferenceService` for one model server."""

    def __init__(
        self,
        server: ModelServer,
        *,
        access: AccessGate | None = None,
        keeps_connections: bool = False,
    ) -> None:
        """`keeps_connections`: a drain serves its connections' requests until their age
        retires them (`GrpcEndpoint.drain`)."""
        self._server = server
        self._access = access
        self._kept = keeps_connections
        self._metrics = server.metrics
        self._version = server_version()
        self._decoding = DecodeThread()
        self.last_request_at = -math.inf
        """When an inference request last came (`time.monotonic()`): a drain waits for quiet."""

    async def ServerLive(  # noqa: N802
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=await self._server.engine_live())

    async def ServerReady(  # noqa: N802
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._server.engine_live() and self._server.ready)

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        try:
            self._server.check_model(request.name, request.version)
        except InferenceError as exc:
            await _abort(context, exc)
        return pb.ModelReadyResponse(ready=self._server.ready)

    async def ServerMetadata(  # noqa: N802
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="batchpilot", version=self._version, extensions=EXTENSIONS
        )

    async def _described(self, name: str, version: str, context: Context) -> None:
        """Abort unless the caller may read the model's description (an allowed key, where keys
        are on) and `name`/`version` is the model served."""
        try:
            if self._access is not None:
                self._access.identify(_key_metadata(context))
            self._server.check_model(name, version)
        except InferenceError as exc:
            await _abort(context, exc)

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        await self._described(request.name, request.version, context)
        signature = self._server.signature
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=signature.name,
            versions=[signature.served_version],
            platform=signature.platform,
            inputs=[
                tensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in signature.inputs
            ],
            outputs=[
                tensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in signature.outputs
            ],
        )

    async def ModelConfig(  # noqa: N802
        self, request: pb.ModelConfigRequest, context: Context
    ) -> pb.ModelConfigResponse:
        await self._described(request.name, request.version, context)
        config = json_format.ParseDict(
            self._server.model_config(), pb.ModelConfig(), ignore_unknown_fields=True
        )
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(  # noqa: N802
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> pb.ModelStatisticsResponse:
        # No name: every model's, which is the one served (still a key, where keys are on).
        await self._described(request.name or self._server.signature.name, request.version, context)
        return json_format.ParseDict(self._server.statistics(), pb.ModelStatisticsResponse())

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest | Undecodable, context: Context
    ) -> pb.ModelInferResponse:
        if self._access is not None:
            try:
                self._access.admit(_key_metadata(context))
            except InferenceError as exc:  # not one of the model's requests: counted by key
                await _abort(context, exc)
        started = time.perf_counter()
        try:
            return await self._answer(request, context)
        except InferenceError as exc:
            await _abort(context, exc)
        except _Internal:
            await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
        except asyncio.CancelledError:
            # The client cancelled the RPC or its deadline passed: the request has left the queue.
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 2 * DEADLINE_MARGIN_S:
                self._metrics.request_finished(
                    RequestOutcome.TIMEOUT, time.perf_counter() - started
                )
            else:
                self._metrics.request_finished(RequestOutcome.CANCELLED)
            raise

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.ModelInferRequest | Undecodable], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Triton's streaming inference: every request read from the stream is served at once
        (up to `STREAM_IN_FLIGHT` of them served or answered and not yet taken by the stream —
        reading waits for room beyond, so a client that never reads its responses holds no
        more than that many of them in the server), through the same batcher as the others,
        and answered on the stream as it finishes. A request's error is its response's
        `error_message` ("UNAVAILABLE: …", the status its own RPC would have got) and the stream
        goes on; a caller without an allowed key is refused the stream."""
        key = _key_metadata(context)
        if self._access is not None:
            try:
                self._access.identify(key)
            except InferenceError as exc:
                await _abort(context, exc)
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        room = asyncio.Semaphore(STREAM_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest | Undecodable) -> None:
            # Its room is given back once the stream has taken its answer (below).
            answers.put_nowait(await self._stream_answer(request, key, context))

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await room.acquire()
                    task = asyncio.get_running_loop().create_task(serve(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer  # back when gRPC takes the next: its flow control let this one go
                room.release()
            await reader  # what ended the reading, if it failed
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _stream_answer(
        self,
        request: pb.ModelInferRequest | Undecodable,
        key: list[tuple[str, str]],
        context: Context,
    ) -> pb.ModelStreamInferResponse:
        """One streamed request's response: its outputs, or its error in words."""
        try:
            if self._access is not None:
                self._access.admit(key)
            return pb.ModelStreamInferResponse(infer_response=await self._answer(request, context))
        except InferenceError as exc:
            message = f"{grpc_status(exc).name}: {exc}"
        except _Internal:
            message = f"{grpc.StatusCode.INTERNAL.name}: {INTERNAL_MESSAGE}"
        except asyncio.CancelledError:
            self._metrics.request_finished(RequestOutcome.CANCELLED)
            raise
        if isinstance(request, Undecodable):
            return pb.ModelStreamInferResponse(error_message=message)
        return pb.ModelStreamInferResponse(
            error_message=message,
            infer_response=pb.ModelInferResponse(
                model_name=request.model_name, model_version=request.model_version, id=request.id
            ),
        )

    async def _answer(
        self, request: pb.ModelInferRequest | Undecodable, context: Context
    ) -> pb.ModelInferResponse:
        """`request`'s response, counted in the request metrics as it ends. Raises the
        `InferenceError` it failed with, `_Internal` for anything else (a bug: logged and counted
        as an error); a cancellation the caller counts."""
        metrics = self._metrics
        started = time.perf_counter()
        self.last_request_at = time.monotonic()
        metrics.inflight.inc()
        try:
            if isinstance(request, Undecodable):
                raise InvalidRequest(f"the message is not a ModelInferRequest: {request.reason}")
            self._server.check_model(request.model_name, request.model_version)
            remaining = context.time_remaining()
            decode = functools.partial(
                decode_infer_request,
                request,
                deadline_s=None if remaining is None else remaining - DEADLINE_MARGIN_S,
            )
            if _costly(request):
                for tensor in request.inputs:  # before the data is read, which takes seconds
                    if (spec := self._server.signature.input(tensor.name)) is not None:
                        check_datatype(spec, tensor.datatype)
                parsed = await self._decoding.run(decode)
            else:
                parsed = decode()
            retry = is_retry(context.invocation_metadata() or ())
            outputs = await self._server.infer(
                parsed, retry=retry, kept=self._kept, arrived=started
            )
            signature = self._server.signature
            response = encode_infer_response(
                model_name=signature.name,
                model_version=signature.served_version,
                request_id=parsed.id,
                outputs=outputs,
            )
        except InferenceError as exc:
            metrics.request_finished(status_of(exc)[1], time.perf_counter() - started)
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug, not the client's fault: an INTERNAL status, counted as an error so the error
            # rate the autopilot reads includes it.
            log.exception("gRPC infer request failed unexpectedly")
            metrics.request_finished(RequestOutcome.ERROR, time.perf_counter() - started)
            raise _Internal from exc
        finally:
            metrics.inflight.dec()
        metrics.request_finished(RequestOutcome.SUCCESS, time.perf_counter() - started)
        return response


class _Internal(Exception):
    """A request failed on a bug of the server's (logged): INTERNAL, with no detail."""


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    host: str
    port: int
    max_message_bytes: int
    """Largest request message accepted (--max-body-bytes); larger ones get RESOURCE_EXHAUSTED."""
    grace_s: float
    """On shutdown, how long accepted RPCs may take to finish."""
    max_connection_age_s: float | None = None
    """A connection this old (gRPC adds ±10 %) gets GOAWAY, and its RPCs `grace_s` to finish:
    the client reconnects, and the Service may place it on a replica added since; a draining
    server lets its connections go so (`GrpcEndpoint.drain`). None: never."""


QUIET_S = 0.5
"""A draining server stops once no inference request has come for this long: its clients have
gone elsewhere. (A client that sends less often than this may find it stopped: its next RPC
goes elsewhere after GOAWAY.)"""
AGE_JITTER = 1.1
"""gRPC retires a connection at its age times a factor within ±10 %."""


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcEndpoint:
    """A grpc.aio server for one model server, in the running event loop."""

    def __init__(
        self, model_server: ModelServer, config: GrpcConfig, *, access: AccessGate | None = None
    ) -> None:
        self._model_server = model_server
        self._config = config
        self._access = access
        self._server: grpc.aio.Server | None = None
        self._servicer: InferenceService | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._grace_ends_at: float | None = None
        """When a drain's grace ends (`time.monotonic`), once one has begun."""
        self.port: int | None = None
        """The bound port, once started (differs from the configured one when that is 0)."""

    async def start(self) -> None:
        config = self._config
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ]
        if config.max_connection_age_s is not None:
            options += [
                ("grpc.max_connection_age_ms", max(1, round(config.max_connection_age_s * 1000))),
                ("grpc.max_connection_age_grace_ms", round(config.grace_s * 1000)),
            ]
        server = grpc.aio.server(options=options)
        self._servicer = InferenceService(
            self._model_server, access=self._access, keeps_connections=self.keeps_connections
        )
        _add_servicer(self._servicer, server)
        address = _address(self._config.host, self._config.port)
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"gRPC cannot listen on {address}: {exc}") from None
        await server.start()
        self._server = server
        log.info(
            "gRPC (Open Inference Protocol v2) listening on %s",
            _address(self._config.host, self.port),
        )

    @property
    def keeps_connections(self) -> bool:
        """Whether `drain` serves the connections it has until their age retires them."""
        return self._config.max_connection_age_s is not None

    async def drain(self) -> None:
        """A drain's gRPC part (see the module's docstring): serve the RPCs of the connections
        there are while their age retires them, until none has come for `QUIET_S` (counted from
        the last one: a server idle at the call stops at once) or, at the latest, their age and
        that after the call, within half the grace; then `stop`."""
        started = time.monotonic()
        self._grace_ends_at = started + self._config.grace_s
        age_s = self._config.max_connection_age_s
        if age_s is not None and self._servicer is not None:
            servicer = self._servicer
            until = started + min(age_s * AGE_JITTER + QUIET_S, self._config.grace_s / 2)
            while True:  # until quiet (no request for QUIET_S), or until `until`
                now = time.monotonic()
                # Counted from the last request: an idle server stops at once.
                wake = min(servicer.last_request_at + QUIET_S, until)
                if now >= wake:
                    break
                await asyncio.sleep(wake - now)
            log.info(
                "drain: gRPC connections served for %.1f s after the signal, the last request "
                "%.1f s ago; stopping gRPC",
                time.monotonic() - started,
                time.monotonic() - servicer.last_request_at,
            )
        await self.stop()

    async def stop(self) -> None:
        """Refuse new RPCs (GOAWAY: clients take new ones elsewhere) and wait for accepted
        ones, at most what is left of the grace period — a drain's counts from its signal, so
        the RPCs it served meanwhile (a stream kept busy) do not stretch it past the grace. A
        drain calls it, the lifespan again at shutdown: a later call waits for the first one's
        stop."""
        if self._server is None:
            return
        if self._stopping is None:
            grace_s = self._config.grace_s
            if self._grace_ends_at is not None:
                grace_s = max(0.0, self._grace_ends_at - time.monotonic())
            self._stopping = asyncio.ensure_future(self._server.stop(grace_s))
        await asyncio.shield(self._stopping)


def attach(app: Any, endpoint: GrpcEndpoint) -> None:
    """Serve `endpoint` for the app's lifetime: started once the app's lifespan (the batcher)
    is up, stopped before it drains, so accepted RPCs still reach the batcher."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        async with inner(a):
            await endpoint.start()
            try:
                yield
            finally:
                await endpoint.stop()

    app.router.lifespan_context = lifespan
