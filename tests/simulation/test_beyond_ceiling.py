"""A load past what maxReplicas carry: the batch limit that answers the most in time.

Past the ceiling no configuration meets the SLA; the runtime refuses what would finish late, and
what it answers in time is what the replicas' full batches carry. On t(b) = 10 + 1·b ms behind
5 ms, the plan's limit below saturation is 24 rows (706 rps a replica at full batches); 32 rows
(762 rps) still fit the SLA with one batch in flight and then one's own (5 + 2 · 42 ms), 48 do
not (121 ms). `bench/beyond_ceiling.py` measures the same on six physics beside the bounds.
"""

from __future__ import annotations

from functools import cache

import pytest

from batchpilot.simulation import ClusterConfig, Scenario, Trace, simulate
from batchpilot.simulation.report import SimulationResult
from batchpilot.simulation.service import ServiceTruth

MID = ServiceTruth.parse("alpha_ms=10,beta_ms=1,overhead_ms=5")
REPLICAS = 3
FULL_32 = 32 / 0.042
"""Requests a second a replica answers at full batches of 32 rows."""
BEYOND_AT = 300.0


@cache
def run() -> SimulationResult:
    # 1,000 rps for 5 minutes (two replicas carry it), then 5,000 for 6: beyond the 3 replicas'
    # ~2,300 at any limit.
    trace = Trace.from_points([(0.0, 1000.0), (BEYOND_AT, 5000.0)], duration_s=660.0)
    scenario = Scenario(
        trace=trace,
        service=MID,
        sla_s=0.1,
        max_replicas=REPLICAS,
        cluster=ClusterConfig(cold_start_s=30.0),
    )
    return simulate(scenario, "autopilot")


def test_beyond_the_ceiling_the_limit_whose_full_batches_carry_the_most_in_time() -> None:
    result = run()
    before = [r for r in result.intervals if 180 <= r.t < BEYOND_AT]
    assert {r.batch_size for r in before} == {24}
    settled = [r for r in result.intervals if r.t >= BEYOND_AT + 90]
    assert {r.batch_size for r in settled} == {32}
    assert {r.replicas for r in settled} == {REPLICAS}
    in_time = sum(r.in_sla_rps for r in settled) / len(settled)
    # (at 24 rows: 3 × 706 = 2,118 rps at most)
    assert in_time >= 0.95 * REPLICAS * FULL_32
    assert any("the most full batches carry in time" in r.reason for r in settled)


def test_the_requests_answered_in_time_add_up_to_the_request_attainment() -> None:
    result = run()
    spans = [
        (later.t if later is not None else 660.0) - r.t
        for r, later in zip(result.intervals, [*result.intervals[1:], None], strict=True)
    ]
    within = sum(r.in_sla_rps * span for r, span in zip(result.intervals, spans, strict=True))
    # (the run's count also holds the requests that finish after its last interval)
    assert within / result.summary.requests == pytest.approx(
        result.summary.request_attainment, abs=1e-3
    )
