"""A device out of memory for a batch: its requests run again in smaller batches rather than
fail, and no batch that large is formed again.

The batch loop with a fake engine that has memory for so many rows and a fake clock (looptime);
the error classification on the engines' own words; the server as a real process on the
simulated accelerator given a memory (`--simulated-latency …,memory_rows=N`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from batchpilot.runtime.batching import Batcher, BatchQueue, BatchSettings
from batchpilot.runtime.engine import EngineInfo, ModelSignature, TensorSpec
from batchpilot.runtime.errors import EngineFailure, RequestTooLarge, out_of_memory
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.outcomes import BatchDone
from batchpilot.runtime.protocol.server_codec import decode_request
from batchpilot.runtime.server import MEMORY_RETRY_S, ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests.runtime_process import metric, runtime_process, send

SIGNATURE = ModelSignature(
    name="double",
    platform="test",
    inputs=(TensorSpec("x", "FP32", (-1, 1)),),
    outputs=(TensorSpec("y", "FP32", (-1, 1)),),
)


class OutOfMemoryError(RuntimeError):
    """Named as PyTorch names its own (torch.cuda.OutOfMemoryError)."""


class SmallDevice:
    """Doubles its input after 1 ms a row; a batch of more than `memory_rows` rows fails as
    onnxruntime's CUDA arena does."""

    def __init__(self, memory_rows: int) -> None:
        self.memory_rows = memory_rows
        self.batches: list[int] = []

    @property
    def signature(self) -> ModelSignature:
        return SIGNATURE

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(kind="fake", device="gpu", simulated=True)

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        x = inputs["x"]
        self.batches.append(x.shape[0])
        await asyncio.sleep(0.001 * x.shape[0])
        if x.shape[0] > self.memory_rows:
            raise RuntimeError(
                "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
                "running Conv node. Name:'conv1' Status Message: Failed to allocate memory for "
                "requested buffer of size 822083584"
            )
        return {"y": x * 2}

    async def close(self) -> None:
        pass


class TestTheErrorsThatMeanOutOfMemory:
    @pytest.mark.parametrize(
        "error",
        [
            MemoryError(),
            OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            RuntimeError("Failed to allocate memory for requested buffer of size 822083584"),
            RuntimeError("CUDA error: CUDA_ERROR_OUT_OF_MEMORY"),
            RuntimeError("std::bad_alloc"),
        ],
    )
    def test_the_engines_own_words(self, error: BaseException) -> None:
        assert out_of_memory(error)

    @pytest.mark.parametrize(
        "error",
        [
            RuntimeError("Invalid rank for input: x Got: 3 Expected: 2"),
            ValueError("shape mismatch"),
            EngineFailure("the engine returned 3 rows of output 'y' for a batch of 4 rows"),
        ],
    )
    def test_other_failures_are_not(self, error: BaseException) -> None:
        assert not out_of_memory(error)


class Running:
    """A batch queue (limit 8) and its loop over `engine`; `limits` are the batch sizes the loop
    reported the device out of memory for."""

    def __init__(self, engine: SmallDevice, *, delay_s: float = 0.0) -> None:
        clock = asyncio.get_running_loop().time
        self.limits: list[int] = []
        self.queue = BatchQueue(
            settings=lambda: BatchSettings(max_batch_size=8, max_queue_delay_s=delay_s),
            capacity=100,
            clock=clock,
        )
        self.ran: list[int] = []
        """For each of `limits`, the largest batch that ran since (its half)."""

        def lacked(rows: int, ran: int) -> None:
            self.limits.append(rows)
            self.ran.append(ran)

        self.batcher = Batcher(self.queue, engine, _Ignore(), clock=clock, on_out_of_memory=lacked)

    async def __aenter__(self) -> Running:
        self.task = asyncio.get_running_loop().create_task(self.batcher.run())
        return self

    async def __aexit__(self, *_: object) -> None:
        self.queue.close()
        await self.task


@pytest.mark.looptime
class TestTheBatchLoop:
    async def test_a_batch_too_large_runs_again_in_halves_and_the_limit_is_reported(
        self,
    ) -> None:
        engine = SmallDevice(memory_rows=4)
        async with Running(engine, delay_s=0.005) as loop:
            pairs = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
            arrays = [np.array([[v] for v in pair], np.float32) for pair in pairs]
            results = await asyncio.gather(*(loop.queue.put({"x": x}, rows=2) for x in arrays))
        assert [[float(v) for v in r["y"][:, 0]] for r in results] == [
            [2.0, 4.0],
            [6.0, 8.0],
            [10.0, 12.0],
        ]
        # 6 rows failed; then the first request alone, and the other two together
        assert engine.batches == [6, 2, 4]
        assert loop.limits == [6]
        assert loop.ran == [4]

    async def test_one_request_too_large_for_the_device_fails_saying_so(self) -> None:
        engine = SmallDevice(memory_rows=4)
        async with Running(engine) as loop:
            with pytest.raises(
                EngineFailure, match="out of memory for this request's 6 rows alone"
            ):
                await loop.queue.put({"x": np.zeros((6, 1), np.float32)}, rows=6)
        assert engine.batches == [6]  # a request's rows are never split
        assert loop.limits == [6]

    async def test_one_row_out_of_memory_fails_and_lowers_no_limit(self) -> None:
        engine = SmallDevice(memory_rows=0)  # a device that has no memory left at all
        async with Running(engine) as loop:
            with pytest.raises(EngineFailure, match="even one row does not fit"):
                await loop.queue.put({"x": np.zeros((1, 1), np.float32)}, rows=1)
        assert loop.limits == []  # one row failing says nothing of what batch size fits
        # The device is full, whatever the batch: the engine fails (not ready, not live) until a
        # run goes through.
        assert loop.batcher.broken is not None
        assert "no memory for even one row" in loop.batcher.broken


class _Ignore:
    def batch_done(self, done: BatchDone) -> None:
        pass

    def batch_failed(self, **_: Any) -> None:
        pass


def test_the_simulated_device_takes_a_memory() -> None:
    model = LatencyModel.parse("alpha_ms=8,beta_ms=1.5,memory_rows=32")
    assert model.memory_rows == 32
    assert LatencyModel.parse("alpha_ms=8,beta_ms=1.5").memory_rows is None
    with pytest.raises(ValueError, match="memory_rows must be at least 1"):
        LatencyModel.parse("alpha_ms=8,beta_ms=1.5,memory_rows=0")
    with pytest.raises(ValueError, match="expected alpha_ms=A"):
        LatencyModel.parse("alpha_ms=8,beta_ms=1.5,memory_rows=2.5")


def images_body(rows: int) -> bytes:
    """A v2 infer request of `rows` zero images for the ResNet-shaped model."""
    tensor = {
        "name": "images",
        "datatype": "FP32",
        "shape": [rows, 3, 224, 224],
        "data": [0.0] * (rows * 3 * 224 * 224),
    }
    return orjson.dumps({"inputs": [tensor]})


def test_a_server_whose_device_lacks_memory_answers_every_request_and_says_so(
    image_model: Path, tmp_path: Path
) -> None:
    """Memory for 3 rows, a batch limit of 8: start-up timing finds it out, batches stay within
    it, every concurrent request is answered, and a request of more rows is refused with 413."""
    with runtime_process(
        image_model,
        "--name",
        "resnet",
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=2,beta_ms=1,memory_rows=3",
        "--max-batch-size",
        "8",
        "--max-queue-delay-ms",
        "20",
        log_dir=tmp_path,
    ) as server:
        one = images_body(1)

        def call(_: int) -> int:
            return send(server, "POST", "/v2/models/resnet/infer", one).status

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(call, range(16), timeout=60))
        assert statuses == [200] * 16
        limit = metric(server, "batchpilot_device_memory_batch_rows")
        assert 1 <= limit <= 3
        assert metric(server, "batchpilot_batching_max_batch_size") == limit
        four = images_body(4)
        reply = send(server, "POST", "/v2/models/resnet/infer", four)
        assert reply.status == 413
        assert "ran out of memory" in reply.json()["error"]
    assert "the device ran out of memory for a batch of" in server.log()


def test_the_limit_set_is_tried_again_after_a_while(image_model: Path) -> None:
    """A shortage may pass (a neighbour's process gone): after `MEMORY_RETRY_S` the limit set is
    in force again, and a failure sets the memory's limit again where it was."""
    now = [0.0]
    engine = SimulatedEngine.load(
        image_model,
        name="resnet",
        latency=LatencyModel(alpha_s=0.001, beta_s=0.0, memory_rows=3),
    )
    metrics = RuntimeMetrics(
        model="resnet", service="", namespace="", engine=engine.info, nvml=None
    )
    server = ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=8, max_queue_delay_s=0.0),
        queue_capacity=16,
        metrics=metrics,
        clock=lambda: now[0],
    )

    def gauge() -> float | None:
        return metrics.registry.get_sample_value(
            "batchpilot_device_memory_batch_rows",
            {"model": "resnet", "isvc": "", "namespace": ""},
        )

    asyncio.run(server.calibrate())  # 8 rows fail, then 4: batches of 3 at most
    assert server.in_force.max_batch_size == 3
    assert gauge() == 3
    now[0] = MEMORY_RETRY_S - 1
    assert server.in_force.max_batch_size == 3
    now[0] = MEMORY_RETRY_S
    assert server.in_force.max_batch_size == 8
    assert gauge() is None
    asyncio.run(server.calibrate())  # 8 rows fail again: straight back to 3
    assert server.in_force.max_batch_size == 3
    assert server.batching.max_batch_size == 8  # the limit set is kept, for the next retry


def small_device_server(image_model: Path, memory_rows: int, now: list[float]) -> ModelServer:
    engine = SimulatedEngine.load(
        image_model,
        name="resnet",
        latency=LatencyModel(alpha_s=0.001, beta_s=0.0, memory_rows=memory_rows),
    )
    metrics = RuntimeMetrics(
        model="resnet", service="", namespace="", engine=engine.info, nvml=None
    )
    return ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=64, max_queue_delay_s=0.0),
        queue_capacity=16,
        metrics=metrics,
        clock=lambda: now[0],
    )


def test_the_memorys_limit_is_found_by_halving_the_gap_not_a_row_at_a_time(
    image_model: Path,
) -> None:
    """Memory for 32 rows, a limit of 64. One row below each failure, traffic took 18 failed
    batches to find 32 after start-up left 63; halfway from the largest batch that ran to the
    smallest that failed, it takes five."""
    server = small_device_server(image_model, 32, [0.0])
    asyncio.run(server.calibrate())  # 64 fails, 32 runs: halfway, 48
    assert server.in_force.max_batch_size == 48
    failed = 0
    while (limit := server.in_force.max_batch_size) > 32:
        server._out_of_memory(limit, ran=limit // 2)  # as the batch loop reports it
        failed += 1
    assert limit == 32
    assert failed == 5  # 48, 40, 36, 34, 33


def test_a_request_above_the_limit_is_taken_once_the_retry_is_due(image_model: Path) -> None:
    """The retry of the limit was made where batches are formed: while only requests above the
    limit came, each was refused (413) before any batch was asked for, for good."""
    now = [0.0]
    server = small_device_server(image_model, 3, now)
    asyncio.run(server.calibrate())
    assert server.in_force.max_batch_size == 3
    four = images_body(4)
    with pytest.raises(RequestTooLarge):
        server.validate(decode_request(four))
    now[0] = MEMORY_RETRY_S
    assert server.validate(decode_request(four)) == 4
