"""An engine that fails whatever it is given (a GPU lost, a CUDA context broken by a device-side
assert) is told from a request the model cannot take, by the batch it ran at start: the replica
is then not live (the kubelet restarts it) nor ready (the Service stops sending to it), and says
why, until that batch runs again; so is one whose run has not ended long past its time (a GPU
that stopped answering). In-process over ASGI (httpx), with the simulated engine behind switches
that break it and hang it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from batchpilot.runtime import server as server_module
from batchpilot.runtime.app import create_app
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2 as pb
from batchpilot.runtime.grpc_api.service import InferenceService
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models
from tests.wrapped_engine import Wrapped

REFUSED = -999.0
"""A value the wrapped model cannot take, as an id past an embedding's table."""


class Breakable(Wrapped):
    """The simulated engine, failing every run while `broken` holds an error, and any run with
    `REFUSED` in its inputs."""

    def __init__(self, engine: SimulatedEngine) -> None:
        super().__init__(engine)
        self.broken: str | None = None
        self.hang: asyncio.Event | None = None
        """While set to an event, every run waits for it, as on a GPU that stopped answering."""

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        if self.broken is not None:
            raise RuntimeError(self.broken)
        if self.hang is not None:
            await self.hang.wait()
        if (inputs["x"] == REFUSED).any():
            raise RuntimeError("INVALID_ARGUMENT : a value out of range")
        return await super().run(inputs)


@dataclass
class Replica:
    server: ModelServer
    engine: Breakable
    client: httpx.AsyncClient

    async def infer(self, value: float) -> httpx.Response:
        row = [value, 1.0, 2.0, 3.0]
        doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": row}]}
        return await self.client.post("/v2/models/mlp/infer", json=doc)

    async def failing_gauge(self) -> float:
        metrics = (await self.client.get("/metrics")).text
        line = next(
            line for line in metrics.splitlines() if line.startswith("batchpilot_engine_failing{")
        )
        return float(line.rsplit(" ", 1)[1])


@pytest.fixture
async def replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Replica]:
    monkeypatch.setattr(server_module, "ENGINE_CHECK_EVERY_S", 0.0)  # every probe tries again
    model = onnx_models.mlp(tmp_path / "mlp.onnx", features=4, hidden=8, classes=3)
    latency = LatencyModel(alpha_s=0.0, beta_s=0.0)
    engine = Breakable(SimulatedEngine.load(model, name="mlp", latency=latency))
    metrics = RuntimeMetrics(model="mlp", service="", namespace="", engine=engine.info, nvml=None)
    server = ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=4, max_queue_delay_s=0.0),
        queue_capacity=16,
        metrics=metrics,
    )
    app = create_app(server)
    await server.learn_known_good()  # as the app's lifespan does, before it starts the batcher
    server.start()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
        yield Replica(server, engine, client)
    await server.close()


async def test_a_request_the_model_cannot_take_is_refused_and_the_replica_stays_live(
    replica: Replica,
) -> None:
    reply = await replica.infer(REFUSED)
    assert reply.status_code == 400
    assert reply.json()["error"] == (
        "the model failed on this request's inputs, while the model runs a known-good batch: "
        "INVALID_ARGUMENT : a value out of range"
    )
    assert (await replica.client.get("/v2/health/live")).status_code == 200
    assert (await replica.client.get("/v2/health/ready")).status_code == 200
    assert (await replica.infer(1.0)).status_code == 200


async def test_an_engine_that_fails_everything_is_not_live_nor_ready_until_it_runs_again(
    replica: Replica, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="batchpilot.runtime.server")
    assert (await replica.infer(1.0)).status_code == 200
    assert await replica.failing_gauge() == 0
    replica.engine.broken = "CUDA error: an illegal memory access was encountered"
    reply = await replica.infer(1.0)
    assert reply.status_code == 500
    assert "an illegal memory access" in reply.json()["error"]
    why = "the engine fails the batch it ran at start: CUDA error: an illegal memory access"
    live = await replica.client.get("/v2/health/live")
    assert live.status_code == 503
    assert live.json() == {"live": False, "error": f"{why} was encountered"}
    ready = await replica.client.get("/v2/health/ready")
    assert ready.status_code == 503
    assert ready.json()["ready"] is False
    assert await replica.failing_gauge() == 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [f"{why} was encountered: not live, not ready, until it serves again"]
    assert (await replica.infer(1.0)).status_code == 500  # at once: no parts, no check
    grpc = InferenceService(replica.server)  # gRPC's health says the same
    context: Any = None  # the health calls read nothing of it
    assert not (await grpc.ServerLive(pb.ServerLiveRequest(), context)).live
    assert not (await grpc.ServerReady(pb.ServerReadyRequest(), context)).ready

    replica.engine.broken = None  # the probes try the known-good batch again
    assert (await replica.client.get("/v2/health/live")).json() == {"live": True}
    assert (await replica.client.get("/v2/health/ready")).json() == {"ready": True}
    assert (await grpc.ServerLive(pb.ServerLiveRequest(), context)).live
    assert (await grpc.ServerReady(pb.ServerReadyRequest(), context)).ready
    assert await replica.failing_gauge() == 0
    assert "the engine serves again: live and ready" in caplog.messages
    assert (await replica.infer(1.0)).status_code == 200


async def test_an_engine_that_hangs_is_not_live_nor_ready_until_its_run_ends(
    replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No t(b) measured (no calibration here): a run is hung after HANG_MIN_S x HANG_FACTOR.
    monkeypatch.setattr(server_module, "HANG_MIN_S", 0.05)
    monkeypatch.setattr(server_module, "HANG_FACTOR", 2.0)
    replica.engine.hang = asyncio.Event()
    waiting = asyncio.create_task(replica.infer(1.0))
    deadline = time.monotonic() + 10
    while (live := await replica.client.get("/v2/health/live")).status_code == 200:
        assert time.monotonic() < deadline, "never taken to hang"
        await asyncio.sleep(0.02)
    assert live.status_code == 503
    assert live.json()["error"].startswith(
        "the engine hangs: a batch of 1 rows has run for 0 s"  # rounded: 0.1 s
    )
    assert (await replica.client.get("/v2/health/ready")).status_code == 503
    assert await replica.failing_gauge() == 1
    replica.engine.hang.set()  # the run ends after all
    assert (await waiting).status_code == 200
    assert (await replica.client.get("/v2/health/live")).json() == {"live": True}
    assert await replica.failing_gauge() == 0


async def test_a_run_that_stalls_takes_the_replica_out_of_readiness_long_before_a_restart(
    replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For the 30 s before a run is taken to hang (a restart), the replica stayed ready and every
    request sent to it waited for its deadline. Readiness goes at `STALL_MIN_S`: the Service
    sends to the others meanwhile. Liveness waits."""
    monkeypatch.setattr(server_module, "STALL_MIN_S", 0.05)
    monkeypatch.setattr(server_module, "HANG_FACTOR", 2.0)
    replica.engine.hang = asyncio.Event()
    waiting = asyncio.create_task(replica.infer(1.0))
    deadline = time.monotonic() + 10
    while (ready := await replica.client.get("/v2/health/ready")).status_code == 200:
        assert time.monotonic() < deadline, "never taken out of readiness"
        await asyncio.sleep(0.02)
    assert ready.json() == {"ready": False}
    assert (await replica.client.get("/v2/health/live")).status_code == 200
    assert await replica.failing_gauge() == 0
    replica.engine.hang.set()
    assert (await waiting).status_code == 200
    assert (await replica.client.get("/v2/health/ready")).json() == {"ready": True}
