"""Prometheus' answers read into an observation, where Prometheus holds only part of the window.

`rate()` divides what it sees by the whole range: a Prometheus restarted without its history 30 s
ago reads a 60 s window's rates at 37.5 / 60 of the load (its first sample, plus the half scrape
interval it extrapolates by). The window's rates are read over the part Prometheus holds, and
the observation says how much that is; the ratios (latency quantiles, mean batch) are whole.
"""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.operator.autopilot.answers import (
    RESCALE_MAX,
    Raw,
    covered_span,
    observation_from,
)
from batchpilot.operator.autopilot.observation import Observation, PodCompute


def answer(value: float) -> list[dict[str, Any]]:
    return [{"metric": {"namespace": "a", "isvc": "one"}, "value": [0, str(value)]}]


def observed(covered: float | None, interval: float | None, **extra: Any) -> Observation:
    """A 60 s window whose rates read 12.5 rps answered, 2.5 shed, 15 arrived, busy 0.25."""
    raw: Raw = {
        "reporting": answer(2),
        "qps": answer(12.5),
        "rejected": answer(2.5),
        "arrivals": answer(15.0),
        "recent": answer(20.0),
        "utilization": answer(0.25),
        "p99": answer(0.08),
        "mean_batch": answer(4.0),
    }
    if covered is not None:
        raw["covered"] = answer(covered)
    if interval is not None:
        raw["scrape_interval"] = answer(interval)
    return observation_from(
        raw,
        window_s=60,
        recent_s=30,
        seasonality=None,
        ready_replicas=2,
        at=0.0,
        **extra,
    )


class TestTheCoveredSpan:
    def test_the_whole_window_where_rate_extrapolates_to_its_start(self) -> None:
        # The first sample 14 s after the window's start, scrapes 15 s apart: 14 < 1.1 × 15.
        assert covered_span(60, 46, 15) == 60
        assert covered_span(60, 61, 15) == 60  # the sample just before the window's start

    def test_from_half_an_interval_before_the_first_sample_where_it_does_not(self) -> None:
        # Samples 30, 15 and 0 s ago: rate() saw 30 s and extrapolated 7.5 s before them.
        assert covered_span(60, 30, 15) == 37.5
        # A 300 s window with 1 s scrapes, 40 s of it held.
        assert covered_span(300, 40, 1) == 40.5

    @pytest.mark.parametrize(("covered", "interval"), [(None, 15.0), (30.0, None), (30.0, 0.0)])
    def test_not_measured_is_none(self, covered: float | None, interval: float | None) -> None:
        assert covered_span(60, covered, interval) is None


class TestTheRatesOverThePartHeld:
    def test_the_rates_read_the_load_over_the_part_prometheus_holds(self) -> None:
        seen = observed(30, 15)  # 37.5 s of the 60 s window: × 1.6
        assert seen.covered_s == 37.5
        assert seen.qps == pytest.approx(20.0)
        assert seen.rejected_qps == pytest.approx(4.0)
        assert seen.arrival_qps == pytest.approx(24.0)
        assert seen.utilization == pytest.approx(0.4)
        # the fast signal and the ratios are whole over any part
        assert (seen.recent_qps, seen.p99_s, seen.mean_batch) == (20.0, 0.08, 4.0)

    def test_a_whole_window_reads_as_prometheus_answers(self) -> None:
        seen = observed(58, 15)
        assert seen.covered_s == 60
        assert (seen.qps, seen.arrival_qps, seen.utilization) == (12.5, 15.0, 0.25)

    def test_not_measured_reads_as_prometheus_answers(self) -> None:
        seen = observed(None, None)
        assert seen.covered_s is None
        assert (seen.qps, seen.arrival_qps, seen.utilization) == (12.5, 15.0, 0.25)

    @pytest.mark.parametrize("source", ["nvml", "dcgm"])
    def test_a_utilization_averaged_from_gauges_is_whole(self, source: str) -> None:
        seen = observed(30, 15, utilization=source)
        assert seen.utilization == 0.25
        assert seen.qps == pytest.approx(20.0)

    def test_the_scaling_is_bounded(self) -> None:
        # 2.5 s of a 60 s window (1 s scrapes): read as over a tenth of it, not × 24.
        seen = observed(2, 1)
        assert seen.covered_s == 2.5
        assert seen.qps == pytest.approx(12.5 * RESCALE_MAX)


def test_the_memory_a_device_ran_out_of_is_read_as_rows() -> None:
    raw: Raw = {"reporting": answer(2), "qps": answer(10.0), "memory_rows": answer(5.0)}
    seen = observation_from(
        raw, window_s=60, recent_s=30, seasonality=None, ready_replicas=2, at=0.0
    )
    assert seen.memory_rows == 5
    del raw["memory_rows"]
    assert (
        observation_from(
            raw, window_s=60, recent_s=30, seasonality=None, ready_replicas=2, at=0.0
        ).memory_rows
        is None
    )


def test_how_many_times_a_replica_is_scraped_is_read() -> None:
    raw: Raw = {"reporting": answer(2), "qps": answer(10.0), "scrapes": answer(2.0)}
    seen = observation_from(
        raw, window_s=60, recent_s=30, seasonality=None, ready_replicas=2, at=0.0
    )
    assert seen.scrapes_per_replica == 2
    del raw["scrapes"]
    unseen = observation_from(
        raw, window_s=60, recent_s=30, seasonality=None, ready_replicas=2, at=0.0
    )
    assert unseen.scrapes_per_replica is None


def test_each_replicas_batches_are_read_by_its_pod() -> None:
    def by_pod(**values: float) -> list[dict[str, Any]]:
        return [
            {"metric": {"namespace": "a", "isvc": "one", "pod": pod}, "value": [0, str(v)]}
            for pod, v in values.items()
        ]

    raw: Raw = {
        "reporting": answer(3),
        "qps": answer(10.0),
        # batches, rows and seconds a second: pod c ran no batch; pod d's rows are missing
        "pod_batches": by_pod(a=10.0, b=5.0, c=0.0, d=1.0),
        "pod_rows": by_pod(a=40.0, b=40.0, c=0.0),
        "pod_seconds": by_pod(a=0.12, b=0.1, c=0.0, d=0.01),
    }
    seen = observation_from(
        raw, window_s=60, recent_s=30, seasonality=None, ready_replicas=3, at=0.0
    )
    assert seen.pods == (
        PodCompute("a", mean_batch=4.0, mean_seconds=pytest.approx(0.012), batches=600.0),  # type: ignore[arg-type]
        PodCompute("b", mean_batch=8.0, mean_seconds=pytest.approx(0.02), batches=300.0),  # type: ignore[arg-type]
    )
    assert observed(None, None).pods == ()
