"""A keyed runtime served in this test process, over real HTTP on 127.0.0.1: the same parts
`batchpilot runtime serve --api-keys … --access-config …` assembles (the gate and its watcher
from `access.serving`, the inference app, the admin routes with the access endpoint, the
listeners told apart by `PortDispatch`), on a simulated engine, in a thread of its own.

In-process so that a test can step the file watcher itself (`watcher.check()`) instead of
waiting for its poll, and read the gate's policy and buckets directly."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry

from batchpilot.runtime.access.files import AccessWatcher
from batchpilot.runtime.access.gate import AccessGate
from batchpilot.runtime.access.serving import serving_gate
from batchpilot.runtime.app import PortDispatch, create_app
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import InferenceError
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.responses import error_response
from batchpilot.runtime.routes_admin import add_admin_routes
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine

LABELS = {"model": "mlp", "isvc": "resnet50", "namespace": "vision"}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class KeyedRuntime:
    port: int
    admin_port: int
    gate: AccessGate
    watcher: AccessWatcher
    registry: CollectorRegistry

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        admin: bool = False,
    ) -> Answer:
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.admin_port if admin else self.port, timeout=10
        )
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            response = conn.getresponse()
            return Answer(
                response.status,
                {k.lower(): v for k, v in response.getheaders()},
                response.read(),
            )
        finally:
            conn.close()

    def infer(self, key: str) -> int:
        """One infer call with `key`; its status."""
        rows = np.ones((1, 64), np.float32).tolist()
        tensor = {"name": "x", "datatype": "FP32", "shape": [1, 64], "data": rows}
        body = orjson.dumps({"inputs": [tensor]})
        headers = {"x-api-key": key, "Content-Type": "application/json"}
        return self.send("POST", "/v2/models/mlp/infer", body, headers).status

    def reloads(self, source: str, result: str) -> float:
        value = self.registry.get_sample_value(
            "batchpilot_access_reloads_total", {**LABELS, "source": source, "result": result}
        )
        return value or 0.0


def _admin_app(server: ModelServer, *, token: str, watcher: AccessWatcher) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None)

    async def handle(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, InferenceError)
        return error_response(exc)

    app.add_exception_handler(InferenceError, handle)
    add_admin_routes(app, server, admin_token=token, access=watcher)
    return app


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def keyed_runtime(model: Path, *, keys: Path, access: Path, token: str) -> Iterator[KeyedRuntime]:
    """Serve `model` (simulated, no latency) with the keys folder and access document, the admin
    token `token`; stopped on exit."""
    engine = SimulatedEngine.load(model, name="mlp", latency=LatencyModel(alpha_s=0.0, beta_s=0.0))
    metrics = RuntimeMetrics(
        model="mlp", service="resnet50", namespace="vision", engine=engine.info, nvml=None
    )
    server = ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=4, max_queue_delay_s=0.0),
        queue_capacity=64,
        metrics=metrics,
    )
    gate, watcher = serving_gate(
        keys=keys, access=access, model="mlp", registry=metrics.registry, labels=LABELS
    )
    inference = create_app(server, access=gate)
    sockets = {"inference": _bound(), "admin": _bound()}
    ports = {name: sock.getsockname()[1] for name, sock in sockets.items()}
    dispatch = PortDispatch(
        inference, {ports["admin"]: _admin_app(server, token=token, watcher=watcher)}
    )
    config = uvicorn.Config(dispatch, lifespan="on", log_level="warning", access_log=False)
    served = uvicorn.Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(served.serve(sockets=list(sockets.values()))),
        name="keyed-runtime",
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 20
    while not served.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the in-process runtime did not start")
        time.sleep(0.01)
    try:
        yield KeyedRuntime(ports["inference"], ports["admin"], gate, watcher, metrics.registry)
    finally:
        served.should_exit = True
        thread.join(timeout=30)
        for sock in sockets.values():
            sock.close()
