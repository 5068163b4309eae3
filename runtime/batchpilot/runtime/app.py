"""The REST apps around one model server: builds them and ties the server's life to them.

`create_app` puts together the inference app (`RuntimeApp`, with its direct infer dispatch), its
routes (`routes_v2`: v2 metadata, health and sync infer; `routes_async`: async infer), the async
job store, and the lifespan that starts the batcher and drains it on shutdown. The platform's
endpoints (`routes_admin`) are apps of their own, one per listener: `create_admin_app` (the
batching settings, the operator's) and `create_metrics_app` (Prometheus's scrape; on the
inference listener instead when it has no port of its own). `PortDispatch` hands each request to
the app of the port it arrived on, so a caller of the model never reaches the admin endpoint,
whatever token it holds, and each port can be fenced for its one audience (a NetworkPolicy).
Endpoints just raise domain errors; the status of each is in one table (`outcomes.ERROR_STATUS`),
and `responses.error_response` answers with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from batchpilot.runtime.access import AccessGate
from batchpilot.runtime.access.files import AccessWatcher
from batchpilot.runtime.async_jobs import JobStore
from batchpilot.runtime.body_decoding import BodyDecoder
from batchpilot.runtime.errors import InferenceError
from batchpilot.runtime.http_protocol import OpenConnections
from batchpilot.runtime.infer_dispatch import RuntimeApp
from batchpilot.runtime.job_relay import JobRelay
from batchpilot.runtime.job_routes import JobRoutes
from batchpilot.runtime.responses import EncodedResult, error_response, json_response
from batchpilot.runtime.routes_admin import add_admin_routes, add_metrics_route
from batchpilot.runtime.routes_async import add_async_routes
from batchpilot.runtime.routes_v2 import add_v2_routes
from batchpilot.runtime.server import ModelServer, server_version


@dataclass(frozen=True, slots=True)
class AppConfig:
    max_body_bytes: int = 64 * 1024 * 1024
    drain_grace_s: float = 25.0
    """On shutdown, how long queued requests may take to finish."""
    async_result_ttl_s: float = 300.0
    """How long a finished async inference result is kept."""
    async_capacity: int = 1024
    """Async jobs stored (pending or finished) before submits get 429."""
    async_max_bytes: int = 512 * 1024 * 1024
    """Bytes of async results stored before submits get 429 too."""
    metrics: bool = True
    """Serve `GET /metrics` on the inference listener (False: the metrics have their own)."""


def create_app(
    server: ModelServer,
    *,
    config: AppConfig | None = None,
    access: AccessGate | None = None,
    job_routes: JobRoutes | None = None,
) -> FastAPI:
    """The inference app around one model server; starts its batcher and drains it on
    shutdown. `access`: the API key gate (None: open to every caller that reaches the port);
    `job_routes`: async job ids that name this replica, so that its peers pass on requests for
    its jobs and it passes on theirs (None: ids served where they arrive)."""
    config = config or AppConfig()
    relay = None if job_routes is None else JobRelay(job_routes)
    jobs: JobStore[EncodedResult] = JobStore(
        capacity=config.async_capacity,
        ttl_s=config.async_result_ttl_s,
        new_id=None if job_routes is None else job_routes.new_id,
        max_bytes=config.async_max_bytes,
        size_of=lambda result: len(result.content),
    )
    server.metrics.track_async_jobs(jobs.counts, lambda: jobs.expired_total)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if server.admission == "deadline":
            await server.calibrate()
        await server.learn_known_good()
        server.start()
        yield
        await server.drain(grace_s=config.drain_grace_s)
        await server.close()
        # Async jobs were served by the drain (or failed by the close); let them record it.
        if work := [job.work for job in jobs.pending() if job.work is not None]:
            await asyncio.wait(work, timeout=5)
        if relay is not None:
            await relay.close()

    app = RuntimeApp(
        title="batchpilot runtime",
        version=server_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = server
    app.state.async_jobs = jobs

    app.add_exception_handler(InferenceError, _handle_error)
    app.add_exception_handler(HTTPException, _handle_routing_error)

    # Route order is match order (and the OpenAPI document's order).
    decoder = BodyDecoder(max_body_bytes=config.max_body_bytes)
    add_v2_routes(app, server, max_body_bytes=config.max_body_bytes, decoder=decoder, access=access)
    add_async_routes(
        app,
        server,
        jobs=jobs,
        max_body_bytes=config.max_body_bytes,
        decoder=decoder,
        access=access,
        relay=relay,
    )
    if config.metrics:
        add_metrics_route(app, server)
    return app


def create_admin_app(
    server: ModelServer,
    *,
    admin_token: str | None,
    access: AccessWatcher | None = None,
    connections: OpenConnections | None = None,
) -> FastAPI:
    """The admin listener's app: the batching settings, the access document and the open
    connections (`admin_token`: the bearer token that may change them, None refuses every
    change; `access`: what keeps the API key gate current, None when the server checks no keys;
    `connections`: the server's open HTTP connections, None where it does not keep them)."""
    app = _platform_app("batchpilot runtime admin")
    add_admin_routes(app, server, admin_token=admin_token, access=access, connections=connections)
    return app


def create_metrics_app(server: ModelServer) -> FastAPI:
    """The metrics listener's app: `GET /metrics`."""
    app = _platform_app("batchpilot runtime metrics")
    add_metrics_route(app, server)
    return app


def _platform_app(title: str) -> FastAPI:
    app = FastAPI(title=title, version=server_version(), docs_url=None, redoc_url=None)
    app.add_exception_handler(InferenceError, _handle_error)
    app.add_exception_handler(HTTPException, _handle_routing_error)
    return app


async def _handle_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, InferenceError)
    return error_response(exc)


async def _handle_routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals — no such path (404), a method the path does not take (405,
    with `Allow`) — in the shape of every other error, `{"error": ...}`, not FastAPI's
    `{"detail": ...}`."""
    assert isinstance(exc, HTTPException)
    return json_response(
        {"error": f"{request.method} {request.url.path}: {exc.detail}"},
        status=exc.status_code,
        headers=dict(exc.headers or {}),
    )


class PortDispatch:
    """ASGI: each request goes to the app of the local port it arrived on (`by_port`), any other
    to the inference app — the safe default, which has no platform endpoints. Lifespan events go
    to the inference app alone: it owns the model server's life."""

    def __init__(self, inference: ASGIApp, by_port: Mapping[int, ASGIApp]) -> None:
        self.inference = inference
        self.by_port = dict(by_port)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.inference
        if scope["type"] in {"http", "websocket"}:
            local = scope.get("server")
            if local is not None:
                app = self.by_port.get(local[1], self.inference)
        await app(scope, receive, send)
