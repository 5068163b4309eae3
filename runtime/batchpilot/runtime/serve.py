"""`batchpilot runtime serve`: load the model, serve it, drain on SIGTERM.

The model is loaded and warmed up before the port opens, so a pod never answers for a model it
cannot run: a model that fails to load is one clear log line and exit status 1. On SIGTERM the
server stops taking new requests (503 with Connection: close, readiness fails), finishes every
request already queued, keeps its port open a short linger longer so that no client finds its
connection reset or refused, and exits 0 within the grace period; a second signal forces the exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn

from batchpilot.runtime.access.files import AccessFileError
from batchpilot.runtime.access.serving import serving_gate
from batchpilot.runtime.app import (
    AppConfig,
    PortDispatch,
    create_admin_app,
    create_app,
    create_metrics_app,
)
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.device import DeviceUnavailable, Nvml
from batchpilot.runtime.draining import CloseWhenDraining
from batchpilot.runtime.engines import build_engine
from batchpilot.runtime.graceful import DrainingServer
from batchpilot.runtime.live_settings import ConfigFileWatcher
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.onnx_engine import ModelLoadError
from batchpilot.runtime.outcomes import RequestOutcome
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.settings import RuntimeSettings

log = logging.getLogger("batchpilot.runtime")


def serve(settings: RuntimeSettings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    nvml = Nvml.probe()
    try:
        engine = build_engine(settings, nvml=nvml)
    except (ModelLoadError, DeviceUnavailable, ValueError, OSError) as exc:
        log.error("model %s cannot be served: %s", settings.model_path, exc)
        return 1
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
            log.error("model %s cannot be served: %s", settings.model_path, exc)
            return 1
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
    )
    model_server = ModelServer(
        engine,
        batching=BatchSettings(
            max_batch_size=settings.max_batch_size,
            max_queue_delay_s=settings.max_queue_delay_ms / 1e3,
            deadline_s=settings.deadline_ms / 1e3 if settings.deadline_ms else None,
        ),
        queue_capacity=settings.queue_capacity,
        metrics=metrics,
        admission=settings.admission,
        pipeline=pipeline,
        pipeline_threads=settings.pipeline_threads,
    )
    access = None
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
            log.error("model %s cannot be served: %s", settings.model_path, exc)
            return 1
    app = create_app(
        model_server,
        access=access,
        config=AppConfig(
            max_body_bytes=settings.max_body_bytes,
            drain_grace_s=settings.drain_grace_s,
            async_result_ttl_s=settings.async_result_ttl_s,
            async_capacity=settings.async_capacity,
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
        _attach_background(app, watcher.run(interval_s=settings.config_poll_s))
    if access is not None:
        _attach_background(app, access_watcher.run(interval_s=settings.config_poll_s))
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
            ),
            access=access,
        )
        attach(app, endpoint)
        on_drain.append(endpoint.stop)  # GOAWAY when the drain starts; the batcher still runs

    try:
        listeners = _listen(settings)
    except OSError as exc:
        log.error("model %s cannot be served: %s", settings.model_path, exc)
        return 1
    ports = {name: sock.getsockname()[1] for name, sock in listeners.items()}
    log.info(
        "listening on %s: %s",
        settings.host,
        ", ".join(f"{name} {port}" for name, port in ports.items()),
    )
    platform = {ports["admin"]: create_admin_app(model_server, admin_token=settings.token())}
    if "metrics" in ports:
        platform[ports["metrics"]] = create_metrics_app(model_server)
    closing = CloseWhenDraining(PortDispatch(app, platform))
    config = uvicorn.Config(
        closing,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, math.ceil(settings.drain_grace_s)),
        timeout_keep_alive=30,
    )
    server = DrainingServer(
        config,
        model_server=model_server,
        closing=closing,
        grace_s=settings.drain_grace_s,
        linger_s=settings.drain_linger_s,
        on_drain=on_drain,
    )
    # Everything loaded so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise stall the event loop for tens of milliseconds.
    gc.collect()
    gc.freeze()
    server.run(sockets=list(listeners.values()))
    if not server.started:
        return 1
    _log_final_tally(metrics)
    return 0


def _listen(settings: RuntimeSettings) -> dict[str, socket.socket]:
    """The HTTP listeners, bound (not yet listening: connections are refused until the server
    starts): inference, admin and, when it has a port of its own, metrics. Raises `OSError`
    (naming the listener) when a port cannot be had; none stays bound then."""
    wanted = {"inference": settings.port, "admin": settings.admin_port}
    if settings.metrics_port is not None:
        wanted["metrics"] = settings.metrics_port
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    bound: dict[str, socket.socket] = {}
    try:
        for name, port in wanted.items():
            sock = socket.socket(family=family)
            bound[name] = sock
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((settings.host, port))
            except OSError as exc:
                raise OSError(
                    exc.errno, f"the {name} port {settings.host}:{port}: {exc.strerror}"
                ) from exc
            sock.set_inheritable(True)
    except OSError:
        for sock in bound.values():
            sock.close()
        raise
    return bound


def _log_final_tally(metrics: RuntimeMetrics) -> None:
    """One line at exit that counts every answered request by outcome, so whoever stopped the
    server can check that a drain lost nothing: what clients received must add up to this."""
    tally = dict.fromkeys((outcome.value for outcome in RequestOutcome), 0)
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "batchpilot_requests_total":
                tally[sample.labels["outcome"]] += int(sample.value)
    log.info(
        "stopped; requests by outcome: %s",
        " ".join(f"{outcome}={count}" for outcome, count in tally.items()),
    )


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `batchpilot runtime serve`; each overrides its BATCHPILOT_* variable."""
    a = parser.add_argument
    a("--model", dest="model_path", help="ONNX model file (BATCHPILOT_MODEL_PATH)")
    a("--name", dest="model_name", help="model name in the v2 API (default: file stem)")
    a(
        "--variant",
        dest="model_variant",
        choices=["original", "fp16", "int8"],
        help="serve <stem>.<variant>.onnx beside --model, made by `batchpilot optimize` "
        "(default original; BATCHPILOT_MODEL_VARIANT)",
    )
    a("--host", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, help="port of the inference API (default 8080)")
    a(
        "--admin-port",
        type=int,
        help="port of the admin endpoint, PUT /admin/batching, on --host; never answered on "
        "--port (default 8082; BATCHPILOT_ADMIN_PORT)",
    )
    a(
        "--metrics-port",
        type=int,
        help="port of GET /metrics alone, on --host (default: /metrics on --port; "
        "BATCHPILOT_METRICS_PORT)",
    )
    a(
        "--grpc-port",
        type=int,
        help="port of the Open Inference Protocol v2 gRPC service, on --host (off when unset; "
        "BATCHPILOT_GRPC_PORT)",
    )
    a("--max-batch-size", type=int, help="rows per batch, at most (default 8)")
    a("--max-queue-delay-ms", type=float, help="longest wait for a batch to fill (default 5)")
    a("--queue-capacity", type=int, help="requests waiting before 503 (default 1024)")
    a(
        "--deadline-ms",
        type=float,
        help="deadline of a request that sets none (the v2 `timeout` parameter, the gRPC "
        "deadline), from its arrival; 0: none (default 1000; changeable live as deadlineMs in "
        "the batching document; BATCHPILOT_DEADLINE_MS)",
    )
    a("--request-timeout-ms", dest="deadline_ms", type=float, help=argparse.SUPPRESS)
    a(
        "--admission",
        choices=["deadline", "queue"],
        help="deadline: refuse at arrival (503 + Retry-After) a request predicted to finish "
        "after its deadline, and size batches to it; queue: only the queue bound (default "
        "deadline; BATCHPILOT_ADMISSION)",
    )
    a(
        "--engine",
        choices=["onnx", "simulated", "torch"],
        help="onnx (default), torch (a TorchScript .pt or torch.export .pt2 program; the torch "
        "extra) or simulated accelerator",
    )
    a(
        "--simulated-latency",
        metavar="alpha_ms=A,beta_ms=B",
        help="per-batch time of the simulated accelerator, t(b) = A + B*b milliseconds",
    )
    a("--device", choices=["auto", "cpu", "gpu"], help="where the model runs (default auto)")
    a(
        "--intra-op-threads",
        type=int,
        help="onnxruntime's (or PyTorch's, on the CPU) intra-op threads (0: default)",
    )
    a("--inter-op-threads", type=int, help="onnxruntime inter-op threads (0: default)")
    a("--graph-optimization", choices=["disabled", "basic", "extended", "all"])
    a(
        "--accelerator",
        choices=["default", "tensorrt"],
        help="tensorrt: onnxruntime's TensorRT provider before CUDA, where a GPU and the provider "
        "exist, else a warning and the usual choice (default default; BATCHPILOT_ACCELERATOR)",
    )
    a(
        "--tensorrt-cache-dir",
        help="where TensorRT keeps built engines (default <tmp>/batchpilot-tensorrt; "
        "BATCHPILOT_TENSORRT_CACHE_DIR)",
    )
    a(
        "--instances",
        type=int,
        help="model instances, batches that run at once (1-16, default 1; BATCHPILOT_INSTANCES)",
    )
    a(
        "--async-result-ttl-s",
        type=float,
        help="seconds a finished async inference result is kept (default 300)",
    )
    a(
        "--async-capacity",
        type=int,
        help="async jobs stored, pending or finished, before submits get 429 (default 1024)",
    )
    a("--max-body-bytes", type=int, help="largest request body accepted (default 64 MiB)")
    a("--batching-config", help="JSON file with maxBatchSize/maxQueueDelayMs, re-read on change")
    a(
        "--pipeline-config",
        help="JSON pre/post-processing pipeline: raw images or text in, labelled top-k out "
        "(BATCHPILOT_PIPELINE_CONFIG)",
    )
    a("--pipeline-threads", type=int, help="pre/post-processing threads (default: CPU count)")
    a("--admin-token-file", help="file holding the bearer token for PUT /admin/batching")
    a(
        "--api-keys",
        help="folder of API keys, one file per key named by its key id (a mounted Secret): "
        "inference then needs 'Authorization: Bearer <key>' or 'x-api-key: <key>'; re-read on "
        "change (BATCHPILOT_API_KEYS)",
    )
    a(
        "--access-config",
        help="JSON access document: allowedKeyIds, defaultQuota, keyQuotas, totalQuota; re-read "
        "on change (BATCHPILOT_ACCESS_CONFIG)",
    )
    a("--drain-grace-s", type=float, help="on SIGTERM, time allowed to finish queued requests")
    a(
        "--drain-linger-s",
        type=float,
        help="on SIGTERM, how long the port stays open once the queue is empty, answering 503 "
        "with Connection: close; part of --drain-grace-s (default 1; BATCHPILOT_DRAIN_LINGER_S)",
    )
    a("--log-level", choices=["debug", "info", "warning", "error"])


def main(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "command"}
    try:
        settings = RuntimeSettings(**overrides)
    except ValueError as exc:
        print(f"batchpilot runtime serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return serve(settings)
