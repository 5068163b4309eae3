"""Replicas whose requests bring varied rows: `Replica`'s rules in rows, and the autopilot on
them through the whole simulator.

A mix of one size must be served exactly as `Replica` serves requests of that size (admission,
deadlines, bursts included); a varied mix as `simulation.sizes` serves it (the batcher rule for
rule, without admission). On a step trace of one request in ten of 16 rows, the autopilot that
reads the rows' spread stays inside the SLA where the one planning by the mean rows does not.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from batchpilot.api.request_rows import RowMix
from batchpilot.simulation import Scenario, Trace, simulate
from batchpilot.simulation.cluster import ClusterConfig
from batchpilot.simulation.generate import generate
from batchpilot.simulation.replica import Replica, Served
from batchpilot.simulation.service import ServiceTruth
from batchpilot.simulation.sized import SizedReplica
from batchpilot.simulation.sizes import latencies

SEED = 4242
"""Generated for this test: no shipped trace uses it."""


def run(replica: Replica | SizedReplica, arrivals: list[float]) -> list[Served]:
    """Feed the arrivals a 15 s control interval at a time, then drain."""
    served, start = [], 0.0
    while start < arrivals[-1] + 15:
        mine = [t for t in arrivals if start <= t < start + 15]
        served.append(replica.serve(mine, since=start, until=start + 15))
        start += 15
    served.append(replica.serve([], since=start, until=math.inf))
    return served


def latency(served: list[Served]) -> np.ndarray:
    return np.concatenate(
        [np.repeat(s.dispatched_at + s.seconds, s.sizes) - s.arrivals for s in served]
    )


@pytest.mark.parametrize(
    ("alpha_s", "beta_s", "rate", "deadline_s", "burst"),
    [
        (0.004, 0.001, 180, None, None),
        (0.004, 0.001, 180, 0.06, None),
        (0.030, 0.0005, 160, 0.1, None),
        (0.030, 0.0005, 160, 0.1, 64),  # the backlog runs in batches of up to 64 rows
    ],
)
def test_one_size_is_served_as_the_replica_in_requests_serves_it(
    alpha_s: float, beta_s: float, rate: float, deadline_s: float | None, burst: int | None
) -> None:
    # Requests of 4 rows, a limit of 16 rows: the replica in requests holds 4 of β·4 each.
    arrivals = np.cumsum(np.random.default_rng(5).exponential(1 / rate, 8_000)).tolist()
    in_requests = Replica(
        alpha_s=alpha_s, beta_s=4 * beta_s, max_batch=4, delay_s=0.003, deadline_s=deadline_s,
        burst=None if burst is None else burst // 4,
    )  # fmt: skip
    in_rows = SizedReplica(
        alpha_s=alpha_s, beta_s=beta_s, mix=RowMix.parse("4"), max_batch=16, delay_s=0.003,
        deadline_s=deadline_s, burst=burst,
    )  # fmt: skip
    a, b = run(in_requests, arrivals), run(in_rows, arrivals)
    assert sum(s.refused for s in a) == sum(s.refused for s in b)
    assert np.allclose(np.sort(latency(a)), np.sort(latency(b)))
    assert all(s.rows is not None and (s.rows == 4 * s.sizes).all() for s in b)
    if burst is not None:
        assert max(int(s.sizes.max()) for s in b if s.batches) > 4  # a burst ran


def test_a_varied_mix_is_served_as_the_batcher_serves_it() -> None:
    # Without admission, P99 as `simulation.sizes` finds it (the same rules; other draws).
    mix = RowMix.parse("1:9,16:1")
    arrivals = np.cumsum(np.random.default_rng(6).exponential(1 / 60, 30_000)).tolist()
    replica = SizedReplica(
        alpha_s=0.005, beta_s=0.002, mix=mix, max_batch=32, delay_s=0.005, capacity=30_000
    )
    mine = float(np.percentile(latency(run(replica, arrivals))[500:], 99))
    reference = latencies(
        60, mix, alpha_s=0.005, beta_s=0.002, max_batch=32, delay_s=0.005, requests=30_000, seed=6
    )
    assert mine == pytest.approx(float(np.percentile(reference[500:], 99)), rel=0.1)


def test_the_service_counts_and_describes_its_rows() -> None:
    truth = replace(ServiceTruth.parse("alpha_ms=5,beta_ms=2"), row_mix=RowMix.parse("1:9,16:1"))
    assert truth.mean_rows == 2.5
    assert truth.replica_limit(32) == 32  # rows
    assert ServiceTruth.parse("textbook,rows=4").replica_limit(32) == 8  # requests
    assert truth.capacity(32) == pytest.approx(32 / 2.5 / 0.069)
    assert "rows a request: 1 (90%), 16 (10%)" in truth.describe()
    with pytest.raises(ValueError, match="not both"):
        replace(truth, rows_per_request=4)


@cache
def step(spread: bool) -> Scenario:
    mix = RowMix.parse("1:9,16:1")
    # The step trace's rates over the mean rows: its rows a second, in requests of 2.5 rows.
    points = [(t, rate / mix.mean) for t, rate in generate("step", SEED, duration_s=3600)]
    return Scenario(
        trace=Trace.from_points(points, name=f"step-{SEED}", duration_s=None),
        service=replace(ServiceTruth.parse("alpha_ms=5,beta_ms=2"), row_mix=mix),
        sla_s=0.1,
        objective=0.99,
        max_replicas=200,
        cluster=ClusterConfig(rows_spread=spread),
    )


def test_the_autopilot_that_reads_the_spread_holds_the_sla() -> None:
    planned = simulate(step(True), "autopilot")
    blind = simulate(step(False), "autopilot")
    assert planned.summary.interval_attainment >= 0.99
    assert blind.summary.interval_attainment < 0.98
    assert any("2.5 rows a request ± 180%" in r.reason for r in planned.intervals)
    assert not any("±" in r.reason for r in blind.intervals)
