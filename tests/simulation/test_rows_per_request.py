"""The autopilot on clients that send several rows a request, against the oracle.

A client that batches on its side (8 images a request, a page of sentences) sends requests of
several rows. The runtime's rates count requests; its batches, their limit and the fit
t(b) ≈ α + β·b count rows. Planned in requests with a fit in rows, such a service gets a k-th of
the replicas it needs and misses most windows (4 rows a request on the textbook's service: 9 %
of the intervals of a step trace inside the SLA). The autopilot reads the rows a request brings
from the window (rows run over requests answered) and plans in whole requests of that many rows.
`bench/physics_matrix.py` runs both physics below on every kind of generated traffic.
"""

from __future__ import annotations

from functools import cache

import pytest

from batchpilot.simulation import Scenario, Trace, simulate
from batchpilot.simulation.generate import generate
from batchpilot.simulation.scenario import oracle_gpu_seconds
from batchpilot.simulation.service import ServiceTruth

SEED = 4242
"""Generated for this test: no shipped trace uses it."""
PHYSICS = {
    "textbook, 4 rows": (ServiceTruth.parse("textbook,rows=4"), 32),
    "fixed cost, 8 rows": (ServiceTruth.parse("alpha_ms=30,beta_ms=0.5,rows=8"), 200),
}


@cache
def scenario(name: str) -> Scenario:
    service, max_replicas = PHYSICS[name]
    return Scenario(
        trace=Trace.from_points(generate("step", SEED), name=f"step-{SEED}", duration_s=None),
        service=service,
        sla_s=0.1,
        objective=0.99,
        max_replicas=max_replicas,
    )


@pytest.mark.parametrize("name", PHYSICS)
def test_inside_the_sla_as_with_one_row_a_request(name: str) -> None:
    result = simulate(scenario(name), "autopilot")
    assert result.summary.interval_attainment >= 0.96
    assert result.summary.gpu_seconds / oracle_gpu_seconds(scenario(name)) <= 1.5
    rows = scenario(name).service.rows_per_request
    assert any(f"{rows} rows a request" in record.reason for record in result.intervals)
