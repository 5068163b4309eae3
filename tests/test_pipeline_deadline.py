"""A request's deadline counts from its arrival: preprocessing spends the request's own time, and
a request whose deadline passed while it was preprocessed never enters the batch queue. The
preprocess has a gate of its own (stage_gate.py): a burst is refused at once where it would wait
past its deadlines for the stage, and answered 504 at its deadline where it did wait."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from batchpilot.api.pipeline import ImagePreprocess, PipelineConfig, Postprocess, Preprocess, TopK
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import DeadlineExceeded, Overloaded
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.pipeline.pipeline import build_pipeline
from batchpilot.runtime.pipeline.stage_gate import StageGate
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.protocol.tensors import Tensor
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models

SLOW_PREPROCESS_S = 0.05


def image_server(
    tmp_path: Path,
    wrap: Callable[[Any], Any],
    *,
    alpha_s: float = 0.0,
    postprocess: Postprocess | None = None,
) -> ModelServer:
    """Images in, on a simulated engine (zero latency unless `alpha_s`), queue of 8, the
    preprocess on one thread: the pipeline's own stage as `wrap` makes it."""
    model = onnx_models.image_signature(tmp_path / "classifier.onnx", classes=4)
    engine = SimulatedEngine.load(
        model, name="classifier", latency=LatencyModel(alpha_s=alpha_s, beta_s=0.0)
    )
    config = PipelineConfig(
        preprocess=Preprocess(image=ImagePreprocess(input="images")), postprocess=postprocess
    )
    pipeline = build_pipeline(config, engine.signature, model_dir=tmp_path)
    assert pipeline.preprocess is not None
    metrics = RuntimeMetrics(
        model="classifier", service="", namespace="", engine=engine.info, nvml=None
    )
    return ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=4, max_queue_delay_s=0.0),
        queue_capacity=8,
        metrics=metrics,
        pipeline=dataclasses.replace(pipeline, preprocess=wrap(pipeline.preprocess)),
        pipeline_threads=1,
    )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ModelServer]:
    """A preprocess stage that takes 50 ms."""

    def slowed(stage: Any) -> Any:
        def slow(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
            time.sleep(SLOW_PREPROCESS_S)  # stands for a large image being decoded and resized
            return stage(inputs)  # type: ignore[no-any-return]

        return slow

    served = image_server(tmp_path, slowed)
    served.start()
    yield served
    await served.close()


def image_request(timeout_s: float | None) -> InferRequest:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 100, 50)).save(buffer, format="PNG")
    images = np.array([buffer.getvalue()], dtype=object)
    return InferRequest(
        id=None,
        inputs=(Tensor("images", "BYTES", images),),
        requested_outputs=None,
        binary_outputs=frozenset(),
        binary_default=False,
        timeout_s=timeout_s,
    )


def batches_run(server: ModelServer) -> float:
    return sum(
        sample.value
        for family in server.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "batchpilot_batch_size_count"
    )


async def test_a_deadline_spent_in_preprocessing_never_reaches_the_queue(
    server: ModelServer,
) -> None:
    # 20 ms of deadline, 50 ms of preprocessing: out of time before the queue.
    with pytest.raises(DeadlineExceeded, match="deadline passed while its inputs waited for"):
        await server.infer(image_request(timeout_s=0.02))
    assert batches_run(server) == 0


async def test_a_deadline_with_time_left_after_preprocessing_is_served(
    server: ModelServer,
) -> None:
    (probabilities,) = await server.infer(image_request(timeout_s=5.0))
    assert probabilities.data.shape == (1, 4)
    assert batches_run(server) == 1


class HeldStage:
    """A preprocess that waits until the test lets it go, counting its runs."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self.go = threading.Event()
        self.runs = 0

    def __call__(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        self.runs += 1
        assert self.go.wait(timeout=10)
        return self.stage(inputs)  # type: ignore[no-any-return]


@pytest.fixture
async def held(tmp_path: Path) -> AsyncIterator[tuple[ModelServer, HeldStage]]:
    stages: list[HeldStage] = []

    def holding(stage: Any) -> HeldStage:
        stages.append(HeldStage(stage))
        return stages[0]

    served = image_server(tmp_path, holding)
    served.start()
    yield served, stages[0]
    stages[0].go.set()
    await served.close()


def counted(server: ModelServer, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in server.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def test_requests_waiting_for_the_stage_get_504_at_their_deadline_and_are_not_run(
    held: tuple[ModelServer, HeldStage],
) -> None:
    """The stage is stuck on the first request; the ones behind it are answered at their
    deadline, not when it is done, and the thread skips them once it is free."""
    server, stage = held
    first = asyncio.create_task(server.infer(image_request(timeout_s=None)))
    behind = [asyncio.create_task(server.infer(image_request(timeout_s=0.05))) for _ in range(4)]
    done, _ = await asyncio.wait(behind, timeout=10)
    assert len(done) == 4
    for task in done:
        with pytest.raises(DeadlineExceeded, match="waited for the preprocess"):
            task.result()
    assert not first.done()  # still in the stage: the four were answered before it was done
    stage.go.set()
    (probabilities,) = await first
    assert probabilities.data.shape == (1, 4)
    assert stage.runs == 1  # the four expired before the thread took them up
    assert server.stage_gate.inside == 0
    assert counted(server, "batchpilot_arrivals_total") == 5
    assert counted(server, "batchpilot_shed_total", reason="expired") == 4


async def test_a_burst_the_stage_cannot_take_in_time_is_refused_at_once(
    held: tuple[ModelServer, HeldStage],
) -> None:
    server, stage = held
    server.stage_gate.ran(0.05)  # the stage's recent mean: 50 ms a request, on one thread
    waiting = [asyncio.create_task(server.infer(image_request(timeout_s=0.12))) for _ in range(2)]
    await asyncio.sleep(0)  # both admitted: done in 50 and 100 ms, inside 120
    assert server.stage_gate.inside == 2
    with pytest.raises(
        Overloaded, match="would wait past its deadline for the preprocess: 150 ms"
    ) as refused:
        await server.infer(image_request(timeout_s=0.12))  # 150 ms
    assert refused.value.reason == "predicted_late"
    assert counted(server, "batchpilot_shed_total", reason="predicted_late") == 1
    assert counted(server, "batchpilot_arrivals_total") == 1  # the demand is counted
    stage.go.set()
    await asyncio.gather(*waiting, return_exceptions=True)


class Stepped:
    """A preprocess that waits until let go, saying when each run enters and the first leaves."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self.go = threading.Event()
        self.entered = [threading.Event(), threading.Event()]
        self.first_left = threading.Event()
        self.runs = 0

    def __call__(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        run = self.runs
        self.runs += 1
        self.entered[min(run, 1)].set()
        assert self.go.wait(timeout=10)
        try:
            return self.stage(inputs)  # type: ignore[no-any-return]
        finally:
            if run == 0:
                self.first_left.set()


async def test_the_time_before_the_batcher_inside_the_deadline_is_counted(
    server: ModelServer,
) -> None:
    # The deadline's clock counts the preprocess (50 ms here): the operator takes only the rest
    # of the time outside the batcher off the SLA for the pods' deadline.
    await server.infer(image_request(timeout_s=5.0))
    before = counted(server, "batchpilot_before_batcher_seconds_total")
    in_batcher = counted(server, "batchpilot_batcher_seconds_total")
    assert before >= SLOW_PREPROCESS_S
    assert in_batcher < before


async def test_an_answered_batchs_postprocess_does_not_wait_behind_the_preprocess(
    tmp_path: Path,
) -> None:
    # One thread each: A's batch (300 ms) is answered while B holds the preprocess's thread.
    # In one pool, A's postprocess waited for B's preprocess, and every one admitted behind it.
    stages: list[Stepped] = []

    def stepped(stage: Any) -> Stepped:
        stages.append(Stepped(stage))
        return stages[0]

    server = image_server(tmp_path, stepped, alpha_s=0.3, postprocess=Postprocess(top_k=TopK(k=2)))
    server.start()
    (stage,) = stages
    try:
        stage.go.set()
        first = asyncio.create_task(server.infer(image_request(timeout_s=None)))
        assert await asyncio.to_thread(stage.first_left.wait, 5)
        stage.go.clear()
        second = asyncio.create_task(server.infer(image_request(timeout_s=None)))
        assert await asyncio.to_thread(stage.entered[1].wait, 5)  # B holds the thread
        assert await asyncio.wait_for(first, timeout=5)
        assert not second.done()
    finally:
        stage.go.set()
    await second
    await server.close()


def test_the_gate_learns_the_stage_per_row_and_takes_a_request_on_an_empty_stage() -> None:
    # Three requests of 12 photos taught 2.4 s a request: every one-photo request, on an idle
    # stage, was refused for good.
    gate = StageGate(threads=1, capacity=8)
    gate.ran(2.4, rows=12)  # 200 ms a row
    assert gate.mean_s == pytest.approx(0.2)
    gate.admit(1.0)  # the stage empty: taken whatever the prediction
    gate.admit(1.0)  # 1 row ahead, then its own: 400 ms
    with pytest.raises(Overloaded):
        gate.admit(1.0, rows=4)  # 2 rows ahead and 4: 1.2 s
    gate.left()
    gate.left()
    gate.ran(30.0)  # an odd run: the next on an empty stage is taken, and measures it again
    gate.admit(0.1)


def test_the_gate_keeps_the_time_the_batch_takes_after_the_stage() -> None:
    # 50 ms a request with one ahead: out of the stage at 100 ms. With 120 ms left and a batch
    # of 100 ms after, the batch queue would refuse it then, its preprocess spent for nothing.
    gate = StageGate(threads=1, capacity=8)
    gate.ran(0.05)
    gate.admit(1.0)
    with pytest.raises(Overloaded, match="its batch 100 ms after"):
        gate.admit(0.12, reserve_s=0.1)
    gate.admit(0.12)


def test_the_gate_predicts_whole_rounds_of_the_stage_over_its_threads() -> None:
    gate = StageGate(threads=2, capacity=5)
    gate.admit(0.01)  # nothing measured yet: nothing predicted
    gate.left()
    gate.ran(0.1)
    assert gate.predicted_s() == pytest.approx(0.1)
    for _ in range(4):  # 0.1, 0.1, 0.2, 0.2 s
        gate.admit(0.25)
    assert gate.predicted_s() == pytest.approx(0.3)
    with pytest.raises(Overloaded) as late:
        gate.admit(0.25)
    assert late.value.reason == "predicted_late"
    gate.admit(None)  # no deadline: only the bound
    with pytest.raises(Overloaded) as full:
        gate.admit(None)
    assert full.value.reason == "queue_full"
    gate.left()
    assert gate.inside == 4
    gate.ran(0.2)
    assert gate.mean_s == pytest.approx(0.1 + 0.2 * 0.1)
