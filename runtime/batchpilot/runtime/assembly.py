"""Everything one runtime serves, built from its settings before any socket exists: `assemble`.

`batchpilot runtime serve` assembles one model server and runs it behind a uvicorn of its own
(`serve`); the sandbox's pod host assembles many simulated ones and runs them all on one event
loop. Both get the same parts from the same settings here — the engine and pipeline, the
metrics, the model server, the API key gate, the inference app (its lifespan starts the batcher,
and gRPC when asked), the admin and metrics apps, the watchers of the mounted files — so a
hosted pod answers exactly as a process would. A model that cannot be served raises
`CannotServe`, whose text is the reason a person reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from batchpilot.runtime.access.files import AccessFileError, AccessWatcher
from batchpilot.runtime.access.serving import serving_gate
from batchpilot.runtime.app import AppConfig, create_admin_app, create_app, create_metrics_app
from batchpilot.runtime.async_jobs import JobStore
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.device import DeviceUnavailable, Nvml
from batchpilot.runtime.engines import build_engine
from batchpilot.runtime.http_protocol import OpenConnections
from batchpilot.runtime.job_routes import JobRoutes, lifetime
from batchpilot.runtime.live_settings import ConfigFileWatcher
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.onnx_engine import ModelLoadError
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.settings import RuntimeSettings

# The serving process's logger: its lines read the same whoever assembles.
log = logging.getLogger("batchpilot.runtime")


class CannotServe(Exception):
    """The model cannot be served with these settings; the text says why."""


class FileWatcher(Protocol):
    """A watcher of mounted files (the batching config, the API keys and access document)."""

    def check(self) -> bool: ...

    async def run(self, *, interval_s: float) -> None: ...


@dataclass(frozen=True)
class Assembled:
    """One model server and the apps around it, not yet serving: entering the inference app's
    lifespan starts the batcher (and gRPC), leaving it drains and closes them."""

    settings: RuntimeSettings
    metrics: RuntimeMetrics
    model_server: ModelServer
    app: FastAPI
    """The inference app."""
    watchers: tuple[FileWatcher, ...]
    """Checked once already; polled for the app's lifetime unless assembled with
    `poll_files=False`, when whoever runs the app polls them (`check()`)."""
    on_drain: tuple[Callable[[], Awaitable[None]], ...]
    """To start when a drain starts: gRPC's GOAWAY (the batcher keeps running)."""
    access: AccessWatcher | None = None
    """What keeps the API key gate current: the admin app's `/admin/access` (None: no keys)."""

    def unfetched(self) -> int:
        """Async results nobody has read yet, pending jobs included: a drain holds for them."""
        jobs: JobStore[Any] = self.app.state.async_jobs
        return jobs.unfetched()

    def platform_apps(
        self, ports: Mapping[str, int], *, connections: OpenConnections | None = None
    ) -> dict[int, ASGIApp]:
        """The platform listeners' apps by port (`ports`: the bound listeners by name): the
        admin app always, the metrics app when there is a metrics listener (`connections`: the
        server's open HTTP connections, which the admin app may retire). Reads the admin
        token, so it raises `OSError` when its file cannot be read."""
        apps: dict[int, ASGIApp] = {
            ports["admin"]: create_admin_app(
                self.model_server,
                admin_token=self.settings.token(),
                access=self.access,
                connections=connections,
            )
        }
        if "metrics" in ports:
            apps[ports["metrics"]] = create_metrics_app(self.model_server)
        return apps


def assemble(
    settings: RuntimeSettings,
    *,
    nvml: Nvml | None,
    poll_files: bool = True,
    registry: CollectorRegistry | None = None,
) -> Assembled:
    """Load the model and build its server and apps (`registry`: where its metrics go; a new
    one by default). Raises `CannotServe` when the model, its pipeline or its API keys cannot
    be used."""
    try:
        engine = build_engine(settings, nvml=nvml)
    except (ModelLoadError, DeviceUnavailable, ValueError, OSError) as exc:
        raise CannotServe(str(exc)) from exc
    pipeline = None
    if settings.pipeline_config is not None:
        # Imported here: servers without a pipeline never load Pillow or tokenizers.
        from batchpilot.runtime.pipeline.pipeline import PipelineConfigError, load_pipeline

        try:
            pipeline = load_pipeline(
                settings.pipeline_config,
                engine.signature,
                model_dir=settings.model_path.absolute().parent,
            )
        except PipelineConfigError as exc:
            raise CannotServe(str(exc)) from exc
        log.info(
            "pipeline %s: inputs %s, outputs %s",
            settings.pipeline_config,
            ", ".join(f"{s.name}:{s.datatype}{list(s.shape)}" for s in pipeline.signature.inputs),
            ", ".join(f"{s.name}:{s.datatype}{list(s.shape)}" for s in pipeline.signature.outputs),
        )
    info = engine.info
    log.info(
        "serving model '%s' on %s (%s%s), inputs %s",
        settings.model_name,
        info.device,
        info.detail or info.kind,
        ", SIMULATED: no real accelerator" if info.simulated else "",
        ", ".join(f"{s.name}:{s.datatype}{list(s.shape)}" for s in engine.signature.inputs),
    )
    metrics = RuntimeMetrics(
        model=settings.model_name,
        service=settings.isvc_name,
        namespace=settings.isvc_namespace,
        engine=info,
        nvml=nvml,
        registry=registry,
    )
    model_server = ModelServer(
        engine,
        batching=BatchSettings(
            max_batch_size=settings.max_batch_size,
            max_queue_delay_s=settings.max_queue_delay_ms / 1e3,
            deadline_s=settings.deadline_ms / 1e3 if settings.deadline_ms else None,
            burst_batch_size=settings.burst_batch_size,
        ),
        queue_capacity=settings.queue_capacity,
        early_start=settings.early_start,
        metrics=metrics,
        admission=settings.admission,
        pipeline=pipeline,
        pipeline_threads=settings.pipeline_threads,
        calibration_rows=settings.calibration_rows,
        max_body_bytes=settings.max_body_bytes,
        background_deadline_s=settings.async_deadline_s,
    )
    watchers: list[FileWatcher] = []
    access = None
    access_watcher: AccessWatcher | None = None
    if settings.api_keys is not None:
        try:
            access, access_watcher = serving_gate(
                keys=settings.api_keys,
                access=settings.access_config,
                model=settings.model_name,
                registry=metrics.registry,
                labels={
                    "model": settings.model_name,
                    "isvc": settings.isvc_name,
                    "namespace": settings.isvc_namespace,
                },
            )
        except AccessFileError as exc:
            raise CannotServe(str(exc)) from exc
    app = create_app(
        model_server,
        access=access,
        job_routes=job_routes(settings),
        config=AppConfig(
            max_body_bytes=settings.max_body_bytes,
            drain_grace_s=settings.drain_grace_s,
            async_result_ttl_s=settings.async_result_ttl_s,
            async_capacity=settings.async_capacity,
            async_max_bytes=settings.async_max_bytes,
            metrics=settings.metrics_port is None,
        ),
    )
    if settings.batching_config is not None:
        watcher = ConfigFileWatcher(
            settings.batching_config,
            current=lambda: model_server.batching,
            apply=lambda s: model_server.set_batching(s, source=str(settings.batching_config)),
        )
        watcher.check()  # the file's settings are in force before the first request
        watchers.append(watcher)
    if access_watcher is not None:
        watchers.append(access_watcher)
    if poll_files:
        for each in watchers:
            _attach_background(app, each.run(interval_s=settings.config_poll_s))
    on_drain: list[Callable[[], Awaitable[None]]] = []
    if settings.grpc_port is not None:
        # Imported here: servers without gRPC never load grpcio.
        from batchpilot.runtime.grpc_api.service import GrpcConfig, GrpcEndpoint, attach

        endpoint = GrpcEndpoint(
            model_server,
            GrpcConfig(
                host=settings.host,
                port=settings.grpc_port,
                max_message_bytes=settings.max_body_bytes,
                grace_s=settings.drain_grace_s,
                max_connection_age_s=grpc_connection_age_s(settings),
            ),
            access=access,
        )
        attach(app, endpoint)
        on_drain.append(endpoint.drain)  # its connections go by age; the batcher still runs
    return Assembled(
        settings=settings,
        metrics=metrics,
        model_server=model_server,
        app=app,
        watchers=tuple(watchers),
        on_drain=tuple(on_drain),
        access=access_watcher,
    )


def grpc_connection_age_s(settings: RuntimeSettings) -> float | None:
    """gRPC's connection age: `max_connection_age_s`, at most half the drain's grace, so that a
    draining server's connections go by age within it (`GrpcEndpoint.drain`); None: never."""
    return min(settings.max_connection_age_s, settings.drain_grace_s / 2) or None


def job_routes(settings: RuntimeSettings) -> JobRoutes | None:
    """Async job ids that name this replica, where it has an address its peers reach and a key
    they share (the admin token); None otherwise. Raises `CannotServe` when the token's file
    cannot be read."""
    if not settings.advertise_host:
        return None
    try:
        token = settings.token()
    except OSError as exc:
        raise CannotServe(f"cannot read the admin token: {exc}") from exc
    if token is None:
        log.warning(
            "advertise host %s without an admin token: async job ids do not name this replica "
            "(the replicas share no key to sign them); fetch results from the replica that took "
            "the job",
            settings.advertise_host,
        )
        return None
    routes = JobRoutes.from_token(
        token,
        host=settings.advertise_host,
        port=settings.port,
        lifetime_s=lifetime(
            result_ttl_s=settings.async_result_ttl_s, drain_hold_s=settings.async_drain_hold_s
        ),
    )
    log.info("async job ids name this replica at %s: its peers pass on fetches", routes.address)
    return routes


def _attach_background(app: Any, job: Any) -> None:
    """Run `job` for the app's lifetime, wrapped around the app's own lifespan."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(job)
        try:
            async with inner(a):
                yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.router.lifespan_context = lifespan
