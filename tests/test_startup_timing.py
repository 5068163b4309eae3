"""The batches a server times at start-up: 1 row and the largest batch limit it may be given,
exported for the autopilot; the limit in force where the larger batch cannot run; none, and
served all the same, where no batch runs. In-process, on a simulated engine that refuses
batches above a size (as a device out of memory would)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests.wrapped_engine import Wrapped


class AtMost(Wrapped):
    """A simulated engine (t(b) = 2 + 0.1·b ms) that fails batches of more than `rows` rows."""

    def __init__(self, model: Path, rows: int) -> None:
        latency = LatencyModel(alpha_s=0.002, beta_s=0.0001)
        super().__init__(SimulatedEngine.load(model, name="mlp", latency=latency))
        self._rows = rows
        self.sizes: list[int] = []

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        rows = next(iter(inputs.values())).shape[0]
        self.sizes.append(rows)
        if rows > self._rows:
            raise MemoryError(f"out of memory for {rows} rows")
        return await super().run(inputs)


def timed_at_start_up(
    engine: AtMost,
    *,
    limit: int,
    calibration_rows: int | None,
    in_document: int | None = None,
) -> dict[str, float]:
    """What the server exports after its start-up timing: seconds by rows. `in_document`: the
    batching document's `calibrationRows` (the operator's, read from the mounted file)."""
    metrics = RuntimeMetrics(model="mlp", service="", namespace="", engine=engine.info, nvml=None)
    batching = BatchSettings(
        max_batch_size=limit, max_queue_delay_s=0.0, calibration_rows=in_document
    )
    server = ModelServer(
        engine,
        batching=batching,
        queue_capacity=16,
        metrics=metrics,
        calibration_rows=calibration_rows,
    )
    asyncio.run(server.calibrate())
    text = generate_latest(metrics.registry).decode()
    return {
        sample.labels["rows"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "batchpilot_startup_batch_seconds"
    }


def test_the_largest_limit_allowed_is_timed_up_to_64_rows(mlp_model: Path) -> None:
    engine = AtMost(mlp_model, rows=1000)
    timed = timed_at_start_up(engine, limit=1, calibration_rows=200)
    assert set(timed) == {"1", "64"}
    assert 0 < timed["1"] < timed["64"]  # t(1) = 2.1 ms, t(64) = 8.4 ms
    # one of each size first (the warm-up: a shape's first batch may select kernels and
    # allocate memory), then two rounds timed
    assert engine.sizes == [64, 1, 1, 64, 1, 64]


def test_the_batching_documents_rows_are_timed_where_no_argument_says(mlp_model: Path) -> None:
    # The operator writes the spec's ceiling into the document, not the pod's arguments: a
    # change of it rolls no pod, and a new pod reads it when it starts.
    timed = timed_at_start_up(
        AtMost(mlp_model, 1000), limit=1, calibration_rows=None, in_document=32
    )
    assert set(timed) == {"1", "32"}
    argument = timed_at_start_up(
        AtMost(mlp_model, 1000), limit=1, calibration_rows=16, in_document=32
    )
    assert set(argument) == {"1", "16"}


def test_without_a_ceiling_the_limit_in_force_is_timed(mlp_model: Path) -> None:
    assert set(timed_at_start_up(AtMost(mlp_model, 1000), limit=8, calibration_rows=None)) == {
        "1",
        "8",
    }


def test_where_the_larger_batch_cannot_run_the_limit_in_force_is_timed(
    mlp_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    timed = timed_at_start_up(AtMost(mlp_model, rows=16), limit=8, calibration_rows=64)
    assert set(timed) == {"1", "8"}
    assert "batches of 1 and 64 rows failed: out of memory for 64 rows" in caplog.text


def test_where_no_batch_runs_nothing_is_exported_and_it_says_so(
    mlp_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert timed_at_start_up(AtMost(mlp_model, rows=0), limit=8, calibration_rows=64) == {}
    assert "start-up timing of batches skipped" in caplog.text
