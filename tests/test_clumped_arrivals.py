"""Requests sent in clumps: the load generator's clumps, and what a real runtime measures of them
(`batchpilot_arrival_dispersion`, the variance over the mean of its arrivals per 10 ms)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchpilot.runtime.loadgen import LoadConfig, RateSchedule, Target, arrival_times, run_load
from tests.runtime_process import Scrape, runtime_process

SIMULATED = ("--engine", "simulated", "--simulated-latency", "alpha_ms=1,beta_ms=0.1")


class TestTheLoadGeneratorsClumps:
    @pytest.mark.parametrize("clump", [1.0, 3.0, 6.0])
    def test_the_rate_is_the_schedules_and_clumps_go_at_once(self, clump: float) -> None:
        times = arrival_times(
            RateSchedule.parse("0:100,50:300"),
            duration_s=100,
            rng=np.random.default_rng(5),
            clump=clump,
        )
        assert times.shape[0] == pytest.approx(50 * 100 + 50 * 300, rel=0.05)
        assert np.unique(times).shape[0] == pytest.approx(times.shape[0] / clump, rel=0.1)

    @pytest.mark.parametrize(
        "config",
        [
            {"clump": 0.5},
            {"clump": 2.0, "arrivals": "uniform"},
            {"clump": 2.0, "concurrency": 4, "schedule": None},
        ],
    )
    def test_clumps_other_than_of_poisson_arrivals_are_refused(
        self, config: dict[str, Any]
    ) -> None:
        base = {"schedule": RateSchedule.constant(10)} | config
        with pytest.raises(ValueError, match="clump"):
            LoadConfig(target=Target(url="http://127.0.0.1:1", model="m"), duration_s=1, **base)


@pytest.mark.slow
@pytest.mark.parametrize(("clump", "low", "high"), [(1.0, 0.6, 2.5), (6.0, 7.0, 20.0)])
def test_a_runtime_measures_how_its_arrivals_clump(
    mlp_model: Path, tmp_path: Path, clump: float, low: float, high: float
) -> None:
    with runtime_process(mlp_model, *SIMULATED, log_dir=tmp_path) as server:
        report = asyncio.run(
            run_load(
                LoadConfig(
                    target=Target(url=server.url, model="mlp", timeout_s=5.0),
                    schedule=RateSchedule.constant(150),
                    duration_s=6.0,
                    clump=clump,
                    max_send_lag_ms=50.0,
                )
            )
        )
        dispersion = Scrape(server).value("batchpilot_arrival_dispersion")
    assert report.succeeded > 0.9 * 150 * 6
    # Geometric clumps of mean m: 2m − 1 where they reach the runtime within a slot (on two
    # busy cores a clump's sends spread over a few milliseconds, and some straddle slots; and
    # the client's loop, when it stalls, sends what fell due in a bunch: Poisson reads up to
    # about 1.4 then).
    assert low <= dispersion <= high


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "low", "high"), [("0:120", 0.7, 1.25), (None, 1.25, 2.0)])
def test_a_runtime_counts_the_rate_its_arrivals_met_in_their_second(
    mlp_model: Path, tmp_path: Path, schedule: str | None, low: float, high: float
) -> None:
    """`batchpilot_arrival_second_squares_total` over the arrivals, less Poisson's 1: the rate a
    request met in its second; against the mean over the seconds counted, 1 for a steady rate
    and 1.67 for one that swings between 200 and 20 a second, two seconds each (less, as the
    runtime's seconds straddle the swings, and the idle edges of the scrapes count)."""
    swings = ",".join(f"{t}:{200 if t % 4 == 0 else 20}" for t in range(0, 8, 2))
    with runtime_process(mlp_model, *SIMULATED, log_dir=tmp_path) as server:
        start = Scrape(server)
        asyncio.run(
            run_load(
                LoadConfig(
                    target=Target(url=server.url, model="mlp", timeout_s=5.0),
                    schedule=RateSchedule.parse(schedule or swings),
                    duration_s=8.0,
                    max_send_lag_ms=50.0,
                )
            )
        )
        end = Scrape(server)

    def grew(name: str) -> float:
        return end.value(name) - start.value(name)

    squares = grew("batchpilot_arrival_second_squares_total")
    counted = grew("batchpilot_arrival_counted_seconds_total")
    arrived = sum(
        end.value("batchpilot_arrivals_total", attempt=a)
        - start.value("batchpilot_arrivals_total", attempt=a)
        for a in ("first", "retry")
    )
    assert 7 <= counted <= 10
    assert low <= (squares / arrived - 1) / (arrived / counted) <= high
