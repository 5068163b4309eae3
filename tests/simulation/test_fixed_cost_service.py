"""The autopilot on a service whose batches take mostly a fixed time, against the oracle.

A large model on a fast accelerator: t(b) = 30 + 0.5·b ms, nothing outside the device, P99 <
100 ms. Its P99 sits near twice a batch's time at any load up to the knee, so the headroom the
autopilot keeps decides which batch limits it can use: 20 % of the latency would halve the batch
the SLA allows (32 → 16) and what a replica carries; 25 % of the load costs 25 %
(`capacity.replica_capacity` keeps the cheaper). And the latency it learns outside the batcher
must be the floor under the windows' P99, not their average: a window whose P99 came from its
busiest part would otherwise teach 10 ms that rule out the batch that carries the load.

Aim, on the shipped step and ramp traces: at least 99 % of intervals inside the SLA for at most
1.4× the oracle's GPU-seconds (with the latency headroom alone and an averaged floor: 1.65× and
2.36×). `bench/physics_matrix.py` runs this physics and five others on generated traffic.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from batchpilot.simulation import Scenario, Trace, simulate
from batchpilot.simulation.scenario import oracle_gpu_seconds
from batchpilot.simulation.service import ServiceTruth

TRACES = Path(__file__).parents[2] / "examples" / "traces"
FIXED_COST = ServiceTruth(alpha_s=0.030, beta_s=0.0005)


@cache
def scenario(name: str) -> Scenario:
    return Scenario(
        trace=Trace.from_csv(TRACES / f"{name}.csv"),
        service=FIXED_COST,
        sla_s=0.1,
        objective=0.99,
        max_replicas=200,
    )


@pytest.mark.parametrize("name", ["step", "ramp"])
def test_inside_the_sla_for_at_most_1_4x_the_oracle(name: str) -> None:
    result = simulate(scenario(name), "autopilot")
    assert result.summary.interval_attainment >= 0.99
    assert result.summary.gpu_seconds / oracle_gpu_seconds(scenario(name)) <= 1.4
    # The headroom is kept in load, at the batch limit the SLA allows, and the reason says so.
    reasons = [record.reason for record in result.intervals]
    assert any("with 25% to spare inside 95 ms" in reason for reason in reasons)
