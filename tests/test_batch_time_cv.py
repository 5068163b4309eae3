"""Batch times that vary: the simulated accelerator's, and what a real runtime measures of its
own (`batchpilot_batch_time_cv`, how much its batches vary around its t(b))."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from batchpilot.runtime.engine import ModelSignature, TensorSpec
from batchpilot.runtime.loadgen import LoadConfig, RateSchedule, Target, run_load
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests.runtime_process import Scrape, runtime_process


class TestTheSimulatedAccelerator:
    def test_the_variation_is_part_of_the_latency_models_spelling(self) -> None:
        assert LatencyModel.parse("alpha_ms=10,beta_ms=2,cv=0.3").cv == 0.3
        assert LatencyModel.parse("alpha_ms=10,beta_ms=2").cv == 0.0
        with pytest.raises(ValueError, match="cv"):
            LatencyModel.parse("alpha_ms=10,beta_ms=2,cv=3")

    async def test_batches_take_t_b_on_average_and_vary_by_the_cv(self) -> None:
        signature = ModelSignature(
            name="m",
            platform="simulated",
            inputs=(TensorSpec("x", "FP32", (-1, 2)),),
            outputs=(TensorSpec("y", "FP32", (-1, 1)),),
        )
        engine = SimulatedEngine(signature, LatencyModel(0.0002, 0.0001, cv=0.4))
        rows = np.zeros((3, 2), dtype=np.float32)
        took = np.array([(await engine.run_timed({"x": rows})).seconds for _ in range(400)])
        assert took.mean() == pytest.approx(0.0005, rel=0.08)
        assert took.std() / took.mean() == pytest.approx(0.4, rel=0.2)
        assert "± 40%" in engine.info.detail


@pytest.mark.slow
@pytest.mark.parametrize(("cv", "low", "high"), [(0.0, 0.0, 0.12), (0.3, 0.18, 0.45)])
def test_a_runtime_measures_how_its_batch_times_vary(
    mlp_model: Path, tmp_path: Path, cv: float, low: float, high: float
) -> None:
    timing = f"alpha_ms=10,beta_ms=1,cv={cv}"
    with runtime_process(
        mlp_model, "--engine", "simulated", "--simulated-latency", timing, log_dir=tmp_path
    ) as server:
        report = asyncio.run(
            run_load(
                LoadConfig(
                    target=Target(url=server.url, model="mlp", timeout_s=5.0),
                    schedule=RateSchedule.constant(100),
                    duration_s=5.0,
                )
            )
        )
        measured = Scrape(server).value("batchpilot_batch_time_cv")
    assert report.succeeded > 0.9 * 100 * 5
    # The server's own t(b) against its batches: the engine's draws, and on two busy cores
    # the event loop's late wake-ups from the sleep that stands for a batch.
    assert low <= measured <= high
