"""The Open Inference Protocol v2 REST endpoints: server and model metadata, health, sync infer.

The metadata and health endpoints are ordinary FastAPI routes. The sync infer endpoint is the
request path of every inference, so it is a plain ASGI app (`asgi_io` does its I/O) that
`RuntimeApp` calls directly; its two routes serve the requests that take FastAPI's usual way.
Either way it parses the body once, never goes through pydantic, and answers every error itself.

With API keys (`access`), the sync infer endpoint admits a request through the gate before it
reads the body, and the model's metadata needs a key too; health, readiness and the server's
metadata stay open, as probes and load balancers call them without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from batchpilot.runtime.access import AccessGate
from batchpilot.runtime.asgi_io import (
    body_coding,
    body_headers,
    parse_header_length,
    receive_body,
    send_answer,
    until_disconnected,
)
from batchpilot.runtime.attempts import is_retry_raw
from batchpilot.runtime.body_decoding import BodyDecoder
from batchpilot.runtime.errors import InferenceError
from batchpilot.runtime.infer_dispatch import RuntimeApp
from batchpilot.runtime.outcomes import (
    KEPT_WHILE_DRAINING,
    RequestOutcome,
    disconnected,
    status_of,
)
from batchpilot.runtime.responses import (
    CLIENT_CLOSED_REQUEST,
    EncodedResult,
    encoded,
    error_response,
    json_response,
)
from batchpilot.runtime.server import EXTENSIONS, ModelServer, server_version

log = logging.getLogger(__name__)


class _AsgiEndpoint:
    """Makes Starlette's `Route` call an `(scope, receive, send)` function as an ASGI app rather
    than as a request-response endpoint."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


_GET = ["GET", "HEAD"]
"""The metadata and health routes' methods: HEAD as every HTTP server must take it (RFC 9110
§9.1), for load balancers and probes that check with it; uvicorn sends no body with it."""

_KEY_HEADERS = (b"authorization", b"x-api-key")


def key_headers(scope: Scope) -> list[tuple[str, str]]:
    """The headers that may carry an API key, decoded (ASGI gives names lower-cased)."""
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope["headers"]
        if name in _KEY_HEADERS
    ]


def add_v2_routes(
    app: RuntimeApp,
    server: ModelServer,
    *,
    max_body_bytes: int,
    decoder: BodyDecoder,
    access: AccessGate | None = None,
) -> None:
    """The v2 metadata, health and sync infer routes; also sets `app.infer_endpoint`. Bodies go
    through `decoder`. With `access`, infer and model metadata need an allowed API key, and
    infer is within quota."""
    metrics = server.metrics
    signature = server.signature
    model_name = signature.name
    model = server.check_model

    @app.api_route("/v2", methods=_GET)
    async def server_metadata() -> Response:
        return json_response(
            {
                "name": "batchpilot",
                "version": server_version(),
                "extensions": list(EXTENSIONS),
            }
        )

    def engine_failing() -> dict[str, str]:
        return {"error": server.engine_failure or ""}

    @app.api_route("/v2/health/live", methods=_GET)
    async def live() -> Response:
        if await server.engine_live():
            return json_response({"live": True})
        return json_response({"live": False, **engine_failing()}, status=503)

    @app.api_route("/v2/health/ready", methods=_GET)
    async def ready() -> Response:
        if not await server.engine_live():
            return json_response({"ready": False, **engine_failing()}, status=503)
        return json_response({"ready": server.ready}, status=200 if server.ready else 503)

    def described(name: str, request: Request) -> None:
        """Raise unless the caller may read the model's description (an allowed key, where keys
        are on) and the path names the model served."""
        if access is not None:
            access.identify(request.headers.items())
        model(name, request.path_params.get("version"))

    # Before the model's metadata, whose path would take "stats" for a model's name.
    @app.api_route("/v2/models/stats", methods=_GET)
    async def all_statistics(request: Request) -> Response:
        described(model_name, request)  # every model's: the one served
        return json_response(server.statistics())

    def model_document(suffix: str, document: Callable[[], dict[str, Any]]) -> None:
        """GET /v2/models/{name}[/versions/{version}]{suffix}: `document()`, to a caller who
        may read the model's description."""

        async def endpoint(name: str, request: Request) -> Response:
            described(name, request)
            return json_response(document())

        for path in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            app.add_api_route(path + suffix, endpoint, methods=_GET, name=suffix.strip("/"))

    model_document("/stats", server.statistics)

    @app.api_route("/v2/models/{name}", methods=_GET)
    @app.api_route("/v2/models/{name}/versions/{version}", methods=_GET)
    async def model_metadata(name: str, request: Request) -> Response:
        described(name, request)
        info = server.engine.info
        return json_response(
            {
                "name": model_name,
                "versions": [signature.served_version],
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

    model_document("/config", server.model_config)

    @app.api_route("/v2/models/{name}/ready", methods=_GET)
    @app.api_route("/v2/models/{name}/versions/{version}/ready", methods=_GET)
    async def model_ready(name: str, request: Request) -> Response:
        model(name, request.path_params.get("version"))
        return json_response(
            {"name": model_name, "ready": server.ready}, status=200 if server.ready else 503
        )

    async def infer(scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v2/models/{name}[/versions/{version}]/infer, as a plain ASGI app: the request
        path of every sync inference, so it reads headers from the scope and writes a success
        straight to `send`, without Starlette's request and response objects. A request the
        gate refuses is answered before its body is read, and is not one of the model's
        requests: it is counted by key (`access.metrics`), not in `batchpilot_requests_total`."""
        if access is not None:
            try:
                access.admit(key_headers(scope))
            except InferenceError as exc:
                await error_response(exc)(scope, receive, send)
                return
        started = time.perf_counter()
        metrics.inflight.inc()
        watcher: asyncio.Task[None] | None = None
        failure: Response | None = None
        answer: EncodedResult | None = None
        try:
            path_params = scope["path_params"]
            model(path_params["name"], path_params.get("version"))
            coding = body_coding(scope["headers"])
            content_length, header_length_text = body_headers(scope)
            body = await receive_body(content_length, receive, max_body_bytes)
            # Its deadline counts from here: how fast the client sends is its own; the decoder's
            # line, the server's (`ModelServer.infer`).
            arrived = time.perf_counter()
            handler = asyncio.current_task()
            assert handler is not None
            # Watched from here, the decode included: a large body waits for the decoder's one
            # thread, and one whose client has gone leaves the decoder's line undecoded (a
            # decode already running finishes in its thread, for no one) rather than holding a
            # place there, then arriving, for nobody.
            watcher = asyncio.get_running_loop().create_task(until_disconnected(receive, handler))
            try:
                parsed = await decoder.decode(body, coding, parse_header_length(header_length_text))
                outputs = await server.infer(
                    parsed,
                    retry=is_retry_raw(scope["headers"]),
                    kept=KEPT_WHILE_DRAINING in scope,
                    arrived=arrived,
                )
                # (a large answer is encoded in a thread: its client may go meanwhile)
                answer = await encoded(server, parsed, outputs)
            except asyncio.CancelledError:
                if not (watcher.done() and handler.uncancel() == 0):
                    raise
                metrics.request_finished(RequestOutcome.CANCELLED)
                failure = Response(status_code=CLIENT_CLOSED_REQUEST)
            else:
                metrics.request_finished(RequestOutcome.SUCCESS, time.perf_counter() - started)
        except InferenceError as exc:
            metrics.request_finished(status_of(exc)[1], time.perf_counter() - started)
            failure = error_response(exc)
        except ClientDisconnect:  # the client went away while sending the body, or was refused
            metrics.request_finished(disconnected(scope))
            failure = Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception:
            # A bug, not the client's fault: still one JSON answer, and counted as an error so
            # the error rate the autopilot reads includes it.
            log.exception("infer request failed unexpectedly")
            metrics.request_finished(RequestOutcome.ERROR, time.perf_counter() - started)
            failure = json_response(
                {"error": "internal server error; see the server log"}, status=500
            )
        finally:
            metrics.inflight.dec()
            if watcher is not None:
                watcher.cancel()
        if answer is not None:
            await send_answer(send, answer.content, answer.header_length)
        else:
            assert failure is not None
            await failure(scope, receive, send)

    # The hot path is a plain ASGI app: no dependency solving, response-model work or request
    # objects per request, which is most of FastAPI's overhead when the model itself is cheap.
    # RuntimeApp calls it directly; the routes serve requests that take the usual way.
    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.router.routes.append(Route(path, _AsgiEndpoint(infer), methods=["POST"]))
    app.infer_endpoint = infer
