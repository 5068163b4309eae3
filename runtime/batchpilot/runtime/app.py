"""The REST endpoints: Open Inference Protocol v2 (sync and async infer), metrics, and the
batching admin endpoint.

Endpoints are thin: read the body, hand it to the codec and the data plane, return bytes. Domain
errors are mapped to status codes in one table (`outcomes.ERROR_STATUS`); endpoints just raise.
The infer path parses the body once and never goes through pydantic, FastAPI's middleware or its
router (`RuntimeApp` hands it the request directly), because per-request overhead is what decides
throughput when the model itself is cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette._utils import get_route_path
from starlette.requests import ClientDisconnect
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from batchpilot.runtime.async_jobs import Job, JobNotFound, JobState, JobStore
from batchpilot.runtime.errors import (
    EngineFailure,
    InferenceError,
    InvalidRequest,
    Overloaded,
    RequestTooLarge,
    ShuttingDown,
    Unauthorized,
)
from batchpilot.runtime.live_settings import batching_doc, parse_batching
from batchpilot.runtime.outcomes import RequestOutcome, status_of
from batchpilot.runtime.protocol.server_codec import InferRequest, decode_request, encode_response
from batchpilot.runtime.protocol.tensors import HEADER_LENGTH, Tensor
from batchpilot.runtime.server import ModelServer, server_version

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499
"""Status recorded (never seen by anyone) when the client went away before its answer."""


@dataclass(frozen=True, slots=True)
class AppConfig:
    max_body_bytes: int = 64 * 1024 * 1024
    admin_token: str | None = None
    """Bearer token for changing settings; None disables changes through HTTP."""
    drain_grace_s: float = 25.0
    """On shutdown, how long queued requests may take to finish."""
    async_result_ttl_s: float = 300.0
    """How long a finished async inference result is kept."""
    async_capacity: int = 1024
    """Async jobs stored (pending or finished) before submits get 429."""


def error_response(error: InferenceError) -> Response:
    status, _ = status_of(error)
    headers = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    elif isinstance(error, ShuttingDown):
        headers["Retry-After"] = "1"
        headers["Connection"] = "close"
    return _json({"error": str(error)}, status=status, headers=headers)


def _json(doc: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers
    )


async def _read_body(request: Request, limit: int) -> bytes:
    return await _receive_body(request.headers.get("content-length"), request.receive, limit)


async def _receive_body(declared: str | None, receive: Receive, limit: int) -> bytes:
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


def _header_length(request: Request) -> int | None:
    return _parse_header_length(request.headers.get(HEADER_LENGTH))


def _parse_header_length(value: str | None) -> int | None:
    if value is None:
        return None
    # str.isdigit() accepts Unicode digits such as '²' (a Latin-1 header byte), which int()
    # refuses: only ASCII decimal digits make a length.
    text = value.strip()
    if not (text.isascii() and text.isdecimal()):
        raise InvalidRequest(f"Inference-Header-Content-Length {value!r} is not a number")
    return int(text)


_CONTENT_LENGTH = b"content-length"
_HEADER_LENGTH = HEADER_LENGTH.encode()


def _body_headers(scope: Scope) -> tuple[str | None, str | None]:
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


async def _send_answer(send: Send, content: bytes, header_length: int | None) -> None:
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


async def _until_disconnected(receive: Receive, handler: asyncio.Task[Any]) -> None:
    """Cancel the request's handler when its client goes away (the body is already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            handler.cancel(msg="client disconnected")
            return


class _AsgiEndpoint:
    """Makes Starlette's `Route` call an `(scope, receive, send)` function as an ASGI app rather
    than as a request-response endpoint."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
"""The sync infer endpoint's paths, as its two routes match them."""


class RuntimeApp(FastAPI):
    """FastAPI, with `POST /v2/models/{name}[/versions/{version}]/infer` handed straight to its
    endpoint.

    A request otherwise passes through a dozen ASGI layers (error, telemetry, body-limit and
    exception middleware, the exit stack, route matching against every route), each one a
    coroutine frame resumed at every await of the request: a large share of a request's cost
    when the model is cheap. The endpoint answers every error itself, so those layers have
    nothing to do for it. Anything they would do differently goes the usual way: other methods
    and paths, apps with user middleware, and apps with FastAPI's OpenTelemetry instrumentation
    switched on. That last is decided once, at the first infer request, with the check
    `FastAPI.__call__` makes (OpenTelemetry providers are set once, at process start).
    """

    infer_endpoint: ASGIApp | None = None
    _telemetry_on: bool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.infer_endpoint
        if (
            endpoint is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and not self.user_middleware
        ):
            if self.root_path:
                scope["root_path"] = self.root_path
            match = INFER_PATH.fullmatch(get_route_path(scope))
            if match is not None and not self._telemetry_enabled():
                scope["app"] = self
                params = match.groupdict()
                if params["version"] is None:
                    del params["version"]
                scope["path_params"] = params
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _telemetry_enabled(self) -> bool:
        if self._telemetry_on is None:
            telemetry = getattr(self, "_native_telemetry", None)
            self._telemetry_on = telemetry is not None and bool(telemetry.enabled())
        return self._telemetry_on


def create_app(server: ModelServer, *, config: AppConfig | None = None) -> FastAPI:
    """The HTTP app around one model server; starts its batcher and drains it on shutdown."""
    config = config or AppConfig()
    metrics = server.metrics
    signature = server.signature
    model_name = signature.name
    jobs: JobStore[EncodedResult] = JobStore(
        capacity=config.async_capacity, ttl_s=config.async_result_ttl_s
    )
    metrics.track_async_jobs(jobs.counts, lambda: jobs.expired_total)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if server.admission == "deadline":
            await server.calibrate()
        server.start()
        yield
        await server.drain(grace_s=config.drain_grace_s)
        await server.close()
        # Async jobs were served by the drain (or failed by the close); let them record it.
        if work := [job.work for job in jobs.pending() if job.work is not None]:
            await asyncio.wait(work, timeout=5)

    app = RuntimeApp(
        title="batchpilot runtime",
        version=server_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = server

    async def handle_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, InferenceError)
        return error_response(exc)

    app.add_exception_handler(InferenceError, handle_error)

    model = server.check_model

    @app.get("/v2")
    async def server_metadata() -> Response:
        return _json(
            {
                "name": "batchpilot",
                "version": server_version(),
                "extensions": ["binary_tensor_data", "batchpilot_batching"],
            }
        )

    @app.get("/v2/health/live")
    async def live() -> Response:
        return _json({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return _json({"ready": server.ready}, status=200 if server.ready else 503)

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str) -> Response:
        model(name)
        info = server.engine.info
        return _json(
            {
                "name": model_name,
                "versions": [signature.version] if signature.version else [],
                "platform": signature.platform,
                "inputs": [spec.as_metadata() for spec in signature.inputs],
                "outputs": [spec.as_metadata() for spec in signature.outputs],
                "parameters": {
                    "engine": info.kind,
                    "device": info.device,
                    "simulated": info.simulated,
                    "providers": list(info.providers),
                    "detail": info.detail,
                    "variant": info.variant,
                    "max_batch_size": server.batching.max_batch_size,
                    "max_queue_delay_ms": server.batching.max_queue_delay_s * 1e3,
                    "deadline_ms": (server.batching.deadline_s or 0.0) * 1e3,
                    "admission": server.admission,
                    "instances": info.instances,
                    # With a pipeline, inputs/outputs above are its ends; this is the model's.
                    **({"pipeline": server.pipeline.summary} if server.pipeline else {}),
                },
            }
        )

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str) -> Response:
        model(name)
        return _json(
            {"name": model_name, "ready": server.ready}, status=200 if server.ready else 503
        )

    async def infer(scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v2/models/{name}[/versions/{version}]/infer, as a plain ASGI app: the request
        path of every sync inference, so it reads headers from the scope and writes a success
        straight to `send`, without Starlette's request and response objects."""
        started = time.perf_counter()
        metrics.inflight.inc()
        watcher: asyncio.Task[None] | None = None
        failure: Response | None = None
        answer: EncodedResult | None = None
        try:
            model(scope["path_params"]["name"])
            content_length, header_length_text = _body_headers(scope)
            body = await _receive_body(content_length, receive, config.max_body_bytes)
            parsed = decode_request(body, header_length=_parse_header_length(header_length_text))
            handler = asyncio.current_task()
            assert handler is not None
            watcher = asyncio.get_running_loop().create_task(_until_disconnected(receive, handler))
            try:
                outputs = await server.infer(parsed)
            except asyncio.CancelledError:
                if not (watcher.done() and handler.uncancel() == 0):
                    raise
                metrics.request_finished(RequestOutcome.CANCELLED)
                failure = Response(status_code=CLIENT_CLOSED_REQUEST)
            else:
                answer = _encode_result(server, parsed, outputs)
                metrics.request_finished(RequestOutcome.SUCCESS, time.perf_counter() - started)
        except InferenceError as exc:
            metrics.request_finished(status_of(exc)[1], time.perf_counter() - started)
            failure = error_response(exc)
        except ClientDisconnect:  # the client went away while sending the body
            metrics.request_finished(RequestOutcome.CANCELLED)
            failure = Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception:
            # A bug, not the client's fault: still one JSON answer, and counted as an error so
            # the error rate the autopilot reads includes it.
            log.exception("infer request failed unexpectedly")
            metrics.request_finished(RequestOutcome.ERROR, time.perf_counter() - started)
            failure = _json({"error": "internal server error; see the server log"}, status=500)
        finally:
            metrics.inflight.dec()
            if watcher is not None:
                watcher.cancel()
        if answer is not None:
            await _send_answer(send, answer.content, answer.header_length)
        else:
            assert failure is not None
            await failure(scope, receive, send)

    # The hot path is a plain ASGI app: no dependency solving, response-model work or request
    # objects per request, which is most of FastAPI's overhead when the model itself is cheap.
    # RuntimeApp calls it directly; the routes serve requests that take the usual way.
    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.router.routes.append(Route(path, _AsgiEndpoint(infer), methods=["POST"]))
    app.infer_endpoint = infer

    _add_async_routes(app, server=server, jobs=jobs, config=config, check_model=model)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/batching")
    async def get_batching() -> Response:
        return _json(batching_doc(server.batching))

    @app.put("/admin/batching")
    async def put_batching(request: Request) -> Response:
        _authorize(request, config.admin_token)
        body = await _read_body(request, 64 * 1024)
        settings = parse_batching(body, current=server.batching)
        server.set_batching(settings, source="admin endpoint")
        return _json(batching_doc(settings))

    return app


@dataclass(frozen=True, slots=True)
class EncodedResult:
    """An infer response as the sync path would send it: JSON, or JSON header + binary."""

    content: bytes
    header_length: int | None


def _encode_result(
    server: ModelServer, parsed: InferRequest, outputs: list[Tensor]
) -> EncodedResult:
    content, header_length = encode_response(
        model_name=server.signature.name,
        model_version=server.signature.version,
        request_id=parsed.id,
        outputs=outputs,
        binary=(
            [t.name for t in outputs]
            if parsed.binary_default and not parsed.requested_outputs
            else parsed.binary_outputs
        ),
    )
    return EncodedResult(content, header_length)


def _result_response(result: EncodedResult) -> Response:
    if result.header_length is None:
        return Response(result.content, media_type="application/json")
    return Response(
        result.content,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(result.header_length)},
    )


ASYNC_MAX_WAIT_S = 30.0
"""Longest long poll (`?wait_s=`) of an async result."""


def _wait_s(request: Request) -> float:
    text = request.query_params.get("wait_s")
    if text is None:
        return 0.0
    try:
        wait_s = float(text)
    except ValueError:
        wait_s = math.nan
    if not 0 <= wait_s <= ASYNC_MAX_WAIT_S:  # NaN fails this too
        raise InvalidRequest(
            f"wait_s must be a number of seconds from 0 to {ASYNC_MAX_WAIT_S:g}, got {text!r}"
        )
    return wait_s


def _add_async_routes(
    app: FastAPI,
    *,
    server: ModelServer,
    jobs: JobStore[EncodedResult],
    config: AppConfig,
    check_model: Callable[[str], None],
) -> None:
    """Async inference: submit now (202 + job id), fetch the result later, or discard it.

    A job runs through `ModelServer.infer`, the same batcher as a sync request, from a
    background task; its outcome is counted in the request metrics like a sync request's, with
    its latency from submit to completion.
    """
    metrics = server.metrics
    model_name = server.signature.name

    async def run_job(job: Job[EncodedResult], parsed: InferRequest, started: float) -> None:
        metrics.inflight.inc()
        try:
            outputs = await server.infer(parsed)
            result = _encode_result(server, parsed, outputs)
        except InferenceError as exc:
            metrics.request_finished(status_of(exc)[1], time.perf_counter() - started)
            jobs.fail(job, exc)
            return
        except asyncio.CancelledError:
            metrics.request_finished(RequestOutcome.CANCELLED)
            raise
        except Exception:
            log.exception("async infer job %s failed unexpectedly", job.id)
            metrics.request_finished(RequestOutcome.ERROR, time.perf_counter() - started)
            jobs.fail(job, EngineFailure("internal server error; see the server log"))
            return
        finally:
            metrics.inflight.dec()
        metrics.request_finished(RequestOutcome.SUCCESS, time.perf_counter() - started)
        jobs.succeed(job, result)

    def location(job_id: str) -> str:
        return f"/v2/models/{model_name}/infer/async/{job_id}"

    def not_found(job_id: str) -> JobNotFound:
        return JobNotFound(
            f"no async job '{job_id}' for model '{model_name}': it was never submitted, was "
            f"deleted, or its result expired (results are kept {jobs.ttl_s:g} s after they "
            "finish)"
        )

    async def submit(request: Request) -> Response:
        started = time.perf_counter()
        try:
            check_model(request.path_params["name"])
            if not server.ready:
                raise ShuttingDown("the server is shutting down and accepts no new requests")
            body = await _read_body(request, config.max_body_bytes)
            parsed = decode_request(body, header_length=_header_length(request))
            server.validate(parsed)  # a bad request fails now, not when its job runs
            job = jobs.submit()
        except InferenceError as exc:
            metrics.request_finished(status_of(exc)[1], time.perf_counter() - started)
            return error_response(exc)
        except ClientDisconnect:
            metrics.request_finished(RequestOutcome.CANCELLED)
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        job.work = asyncio.get_running_loop().create_task(
            run_job(job, parsed, started), name=f"async-job-{job.id}"
        )
        return _json(
            {"id": job.id, "model_name": model_name, "status": "queued"},
            status=202,
            headers={"Location": location(job.id)},
        )

    async def fetch(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            check_model(request.path_params["name"])
            wait_s = _wait_s(request)
            job = jobs.get(job_id)
            if job is not None and not job.done and wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(job.finished.wait(), wait_s)
                job = jobs.get(job_id)
            if job is None:
                raise not_found(job_id)
        except InferenceError as exc:
            return error_response(exc)
        if job.state is JobState.PENDING:
            return _json(
                {"id": job.id, "model_name": model_name, "status": "pending"},
                status=202,
                headers={"Location": location(job.id), "Retry-After": "1"},
            )
        if job.state is JobState.FAILED:
            assert isinstance(job.error, InferenceError)
            return error_response(job.error)
        assert job.result is not None
        return _result_response(job.result)

    async def discard(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            check_model(request.path_params["name"])
            job = jobs.discard(job_id)
            if job is None:
                raise not_found(job_id)
        except InferenceError as exc:
            return error_response(exc)
        status = "deleted" if job.done else "cancelled"
        return _json({"id": job_id, "model_name": model_name, "status": status})

    routes = app.router.routes
    for path in (
        "/v2/models/{name}/infer/async",
        "/v2/models/{name}/versions/{version}/infer/async",
    ):
        routes.append(Route(path, submit, methods=["POST"]))
    routes.append(Route("/v2/models/{name}/infer/async/{job_id}", fetch, methods=["GET"]))
    routes.append(Route("/v2/models/{name}/infer/async/{job_id}", discard, methods=["DELETE"]))


def _authorize(request: Request, token: str | None) -> None:
    if token is None:
        raise Unauthorized(
            "changing settings over HTTP is disabled: the server has no admin token configured"
        )
    sent = request.headers.get("authorization", "")
    scheme, _, value = sent.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
        raise Unauthorized("a valid 'Authorization: Bearer <token>' header is required")
