"""The REST app around one model server: builds it and ties the server's life to it.

`create_app` puts together the app (`RuntimeApp`, with its direct infer dispatch), the routes
(`routes_v2`: v2 metadata, health and sync infer; `routes_async`: async infer; `routes_admin`:
metrics and the batching settings), the async job store, and the lifespan that starts the
batcher and drains it on shutdown. Endpoints just raise domain errors; the status of each is in
one table (`outcomes.ERROR_STATUS`), and `responses.error_response` answers with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response

from batchpilot.runtime.async_jobs import JobStore
from batchpilot.runtime.errors import InferenceError
from batchpilot.runtime.infer_dispatch import RuntimeApp
from batchpilot.runtime.responses import EncodedResult, error_response
from batchpilot.runtime.routes_admin import add_admin_routes
from batchpilot.runtime.routes_async import add_async_routes
from batchpilot.runtime.routes_v2 import add_v2_routes
from batchpilot.runtime.server import ModelServer, server_version


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


def create_app(server: ModelServer, *, config: AppConfig | None = None) -> FastAPI:
    """The HTTP app around one model server; starts its batcher and drains it on shutdown."""
    config = config or AppConfig()
    jobs: JobStore[EncodedResult] = JobStore(
        capacity=config.async_capacity, ttl_s=config.async_result_ttl_s
    )
    server.metrics.track_async_jobs(jobs.counts, lambda: jobs.expired_total)

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

    # Route order is match order (and the OpenAPI document's order).
    add_v2_routes(app, server, max_body_bytes=config.max_body_bytes)
    add_async_routes(app, server, jobs=jobs, max_body_bytes=config.max_body_bytes)
    add_admin_routes(app, server, admin_token=config.admin_token)
    return app
