"""A request's deadline counts from its arrival: preprocessing spends the request's own time, and
a request whose deadline passed while it was preprocessed never enters the batch queue."""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from batchpilot.api.pipeline import ImagePreprocess, PipelineConfig, Preprocess
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import DeadlineExceeded
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.pipeline.pipeline import build_pipeline
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.protocol.tensors import Tensor
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models

SLOW_PREPROCESS_S = 0.05


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ModelServer]:
    """Images in, on a zero-latency simulated engine, with a preprocess stage that takes 50 ms."""
    model = onnx_models.image_signature(tmp_path / "classifier.onnx", classes=4)
    engine = SimulatedEngine.load(
        model, name="classifier", latency=LatencyModel(alpha_s=0.0, beta_s=0.0)
    )
    config = PipelineConfig(preprocess=Preprocess(image=ImagePreprocess(input="images")))
    pipeline = build_pipeline(config, engine.signature, model_dir=tmp_path)
    stage = pipeline.preprocess
    assert stage is not None

    def slow(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        time.sleep(SLOW_PREPROCESS_S)  # stands for a large image being decoded and resized
        return stage(inputs)

    metrics = RuntimeMetrics(
        model="classifier", service="", namespace="", engine=engine.info, nvml=None
    )
    served = ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=4, max_queue_delay_s=0.0),
        queue_capacity=8,
        metrics=metrics,
        pipeline=dataclasses.replace(pipeline, preprocess=slow),
        pipeline_threads=1,
    )
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
    with pytest.raises(DeadlineExceeded, match="deadline passed while its inputs were preproc"):
        await server.infer(image_request(timeout_s=0.02))
    assert batches_run(server) == 0


async def test_a_deadline_with_time_left_after_preprocessing_is_served(
    server: ModelServer,
) -> None:
    (probabilities,) = await server.infer(image_request(timeout_s=5.0))
    assert probabilities.data.shape == (1, 4)
    assert batches_run(server) == 1
