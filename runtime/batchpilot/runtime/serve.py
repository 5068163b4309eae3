"""`batchpilot runtime serve`: load the model, serve it, drain on SIGTERM.

The model is loaded and warmed up before the port opens, so a pod never answers for a model it
cannot run: a model that fails to load is one clear log line and exit status 1. On SIGTERM the
server stops taking new requests (503 with Connection: close, readiness fails), finishes every
request already queued, keeps its port open a short linger longer so that no client finds its
connection reset or refused, and exits 0 within the grace period; a second signal forces the exit.
The parts come from `assembly` (which the sandbox's pod host shares); this module binds the
listeners, runs them behind one `DrainingServer`, and reports the tally at exit. With the
simulated engine, SIGUSR1 throttles the pretend device (`SimulatedEngine.throttle`).
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import resource
import signal
import socket
import sys
from collections.abc import Mapping

import uvicorn

from batchpilot.runtime.app import PortDispatch
from batchpilot.runtime.assembly import CannotServe, assemble
from batchpilot.runtime.device import Nvml
from batchpilot.runtime.draining import CloseWhenDraining
from batchpilot.runtime.graceful import DrainingServer
from batchpilot.runtime.http_protocol import (
    ConnectionLimits,
    LimitedHttpToolsProtocol,
    OpenConnections,
)
from batchpilot.runtime.instances import running_on_threads
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.outcomes import RequestOutcome
from batchpilot.runtime.settings import RuntimeSettings
from batchpilot.runtime.simulated import SimulatedEngine

log = logging.getLogger("batchpilot.runtime")


def serve(settings: RuntimeSettings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    allow_open_files(settings.max_connections or None)
    try:
        parts = assemble(settings, nvml=Nvml.probe())
    except CannotServe as exc:
        log.error("model %s cannot be served: %s", settings.model_path, exc)
        return 1
    try:
        listeners = bind_listeners(settings)
    except OSError as exc:
        log.error("model %s cannot be served: %s", settings.model_path, exc)
        return 1
    ports = {name: sock.getsockname()[1] for name, sock in listeners.items()}
    log.info(
        "listening on %s: %s",
        settings.host,
        ", ".join(f"{name} {port}" for name, port in ports.items()),
    )
    engine = parts.model_server.engine
    if isinstance(engine, SimulatedEngine):
        # The pretend device's fault: it throttles (the sandbox's --throttle-pod).
        signal.signal(signal.SIGUSR1, lambda *_: engine.throttle())
    connections = OpenConnections()
    parts.model_server.metrics.track_connections(connections.__len__, lambda: connections.retired)
    closing = CloseWhenDraining(
        PortDispatch(parts.app, parts.platform_apps(ports, connections=connections))
    )
    config = uvicorn.Config(
        closing,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=LimitedHttpToolsProtocol.with_limits(
            connection_limits(settings, ports=ports), connections
        ),
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, math.ceil(settings.drain_grace_s)),
    )
    server = DrainingServer(
        config,
        model_server=parts.model_server,
        closing=closing,
        grace_s=settings.drain_grace_s,
        linger_s=settings.drain_linger_s,
        on_drain=parts.on_drain,
        unfetched=parts.unfetched,
        hold_s=settings.async_drain_hold_s,
        connections=connections,
    )
    # Everything loaded so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise stall the event loop for tens of milliseconds.
    gc.collect()
    gc.freeze()
    server.run(sockets=list(listeners.values()))
    if not server.started:
        return 1
    _log_final_tally(parts.metrics)
    if running_on_threads():
        # The interpreter joins the engine's threads at exit: a run that never ends (a GPU that
        # hangs) would keep the process until the kubelet's SIGKILL.
        log.warning("an engine run has not ended: exiting without waiting for it")
        logging.shutdown()
        os._exit(1)
    return 0


OPEN_FILES_BESIDES_CONNECTIONS = 256
"""Files the process holds besides its connections: listeners, the model, libraries, threads'
pipes, gRPC's sockets."""


def allow_open_files(max_connections: int | None) -> None:
    """Raise the soft limit on open files to the hard one. A connection the process has no file
    for is not answered 503, as one past `--max-connections` is: its accept fails and the client
    is reset — and connections past that cap hold a file each until they send a request, so the
    cap alone does not keep the count under the limit. Containers often start with a soft limit
    of 1024 (containerd 2's default) under a far higher hard one, which a process may not raise:
    a hard limit under `max_connections` is only warned about."""
    infinite = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)
    needed = None if max_connections is None else max_connections + OPEN_FILES_BESIDES_CONNECTIONS
    if needed is not None and soft != infinite and soft < needed:
        log.warning(
            "open files are limited to %d (ulimit -n): past about %d connections clients are "
            "reset, not answered 503; raise the limit, or set --max-connections under it",
            soft,
            max(0, soft - OPEN_FILES_BESIDES_CONNECTIONS),
        )


def connection_limits(settings: RuntimeSettings, *, ports: Mapping[str, int]) -> ConnectionLimits:
    """The HTTP limits `settings` ask for. `ports`: the bound listeners' ports by name
    (`bind_listeners`); `--max-connections` holds the inference listener's connections alone —
    the admin and metrics ports' few callers (the operator, Prometheus) are answered however
    many the model's callers hold."""
    uncapped = frozenset(port for name, port in ports.items() if name != "inference")
    return ConnectionLimits(
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        min_body_rate=settings.min_body_bytes_per_s or None,
        write_timeout_s=settings.write_timeout_s,
        keep_alive_timeout_s=settings.keep_alive_timeout_s,
        max_connections=settings.max_connections or None,
        max_connection_age_s=settings.max_connection_age_s or None,
        uncapped_ports=uncapped,
    )


def bind_listeners(settings: RuntimeSettings) -> dict[str, socket.socket]:
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
    log.info("stopped; requests by outcome: %s", outcome_tally(metrics))


def outcome_tally(metrics: RuntimeMetrics) -> str:
    """Every answered request counted by outcome: `success=N rejected=N …`."""
    tally = dict.fromkeys((outcome.value for outcome in RequestOutcome), 0)
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "batchpilot_requests_total":
                tally[sample.labels["outcome"]] += int(sample.value)
    return " ".join(f"{outcome}={count}" for outcome, count in tally.items())


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
    a(
        "--calibration-rows",
        type=int,
        help="rows of the larger batch timed at start-up, beside 1 row (64 at most): the largest "
        "batch limit this server may be given, so that t(b) has a slope before traffic (default: "
        "--max-batch-size; BATCHPILOT_CALIBRATION_ROWS)",
    )
    a(
        "--burst-batch-size",
        type=int,
        help="rows a batch may take beyond --max-batch-size where more rows than that wait, "
        "each request still in time (deadline admission); changeable live as burstBatchSize in "
        "the batching document (default: none; BATCHPILOT_BURST_BATCH_SIZE)",
    )
    a("--max-queue-delay-ms", type=float, help="longest wait for a batch to fill (default 5)")
    a(
        "--no-early-start",
        dest="early_start",
        action="store_const",
        const=False,
        help="every batch fills or waits out --max-queue-delay-ms, even when every client seen "
        "at once recently is already queued (default: it starts then; "
        "BATCHPILOT_EARLY_START=false)",
    )
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
        metavar="alpha_ms=A,beta_ms=B[,memory_rows=N]",
        help="per-batch time of the simulated accelerator, t(b) = A + B*b milliseconds; "
        "memory_rows: a batch of more rows fails as out of device memory",
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
    a(
        "--async-max-bytes",
        type=int,
        help="bytes of async results stored before submits get 429 too (default 512 MiB)",
    )
    a(
        "--async-deadline-s",
        type=float,
        help="deadline of an async job that sets no timeout, from its submit: jobs wait behind "
        "the SLA's requests, in the room their batches leave (0-600, default 300)",
    )
    a("--max-body-bytes", type=int, help="largest request body accepted (default 64 MiB)")
    a(
        "--max-header-bytes",
        type=int,
        help="largest request line and headers of an HTTP request: more is answered 431 and "
        "the connection closed (default 65536; BATCHPILOT_MAX_HEADER_BYTES)",
    )
    a(
        "--header-timeout-s",
        type=float,
        help="time an HTTP request's headers may take from its first byte: more is answered 408 "
        "and the connection closed (default 5; BATCHPILOT_HEADER_TIMEOUT_S)",
    )
    a(
        "--body-timeout-s",
        type=float,
        help="longest pause between bytes of an HTTP request's body: more is answered 408 and "
        "the connection closed (default 30; BATCHPILOT_BODY_TIMEOUT_S)",
    )
    a(
        "--min-body-bytes-per-s",
        type=int,
        help="once an HTTP request's body has taken 5 s, the slowest it may have come on "
        "average: slower is answered 408 and the connection closed, so that a client trickling "
        "a body cannot hold a connection for hours (default 1024; 0: any; "
        "BATCHPILOT_MIN_BODY_BYTES_PER_S)",
    )
    a(
        "--write-timeout-s",
        type=float,
        help="longest an HTTP answer may wait for its client to read any of it (the socket's "
        "buffers full): more closes the connection (default 30; BATCHPILOT_WRITE_TIMEOUT_S)",
    )
    a(
        "--keep-alive-timeout-s",
        type=float,
        help="an HTTP connection with no request for this long is closed (default 30; "
        "BATCHPILOT_KEEP_ALIVE_TIMEOUT_S)",
    )
    a(
        "--max-connection-age-s",
        type=float,
        help="an HTTP connection this old (±10 %%) is closed after its next answer (Connection: "
        "close) and a gRPC one gets GOAWAY, so clients reconnect and a Service spreads them over "
        "replicas added since; 0: never (default 30; BATCHPILOT_MAX_CONNECTION_AGE_S)",
    )
    a(
        "--max-connections",
        type=int,
        help="open HTTP connections on the inference port beyond which a request there is "
        "answered 503 and its connection closed (the admin and metrics ports are not held to "
        "it); 0: no limit (default 4096; BATCHPILOT_MAX_CONNECTIONS)",
    )
    a("--batching-config", help="JSON file with maxBatchSize/maxQueueDelayMs, re-read on change")
    a(
        "--pipeline-config",
        help="JSON pre/post-processing pipeline: raw images or text in, labelled top-k out "
        "(BATCHPILOT_PIPELINE_CONFIG)",
    )
    a("--pipeline-threads", type=int, help="pre/post-processing threads (default: CPU count)")
    a("--admin-token-file", help="file holding the bearer token for PUT /admin/batching")
    a(
        "--advertise-host",
        help="this replica's address as its peers reach it (the pod IP): with an admin token, "
        "async job ids name it and the other replicas pass fetches of its jobs on to it "
        "(BATCHPILOT_ADVERTISE_HOST; the operator sets it)",
    )
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
    a(
        "--async-drain-hold-s",
        type=float,
        help="on SIGTERM, how long (from the signal) the port stays open while finished async "
        "results have not been fetched; part of --drain-grace-s (default 20; "
        "BATCHPILOT_ASYNC_DRAIN_HOLD_S)",
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
