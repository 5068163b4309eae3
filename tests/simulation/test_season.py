"""The seasonal forecast in the simulated cluster: a job that comes at the same time every day.

Compressed days of 90 minutes, three of them — longer than the hour of history the headroom
learns recurring bursts from, so only a forecast can see yesterday's job: the autopilot has no
past day on the first, one on the second (two must agree), and on the third it provisions for
the job before it starts. Without the forecast it meets the job a reaction horizon late.
"""

from __future__ import annotations

import pytest

from batchpilot.operator.autopilot.prometheus import Seasonality
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, simulate
from batchpilot.simulation.generate import DAILY_JOB_PHASE, daily

pytestmark = pytest.mark.slow

PERIOD_S = 5400.0


def late_intervals(seasonality: Seasonality | None) -> tuple[list[float], float]:
    """The starts of the intervals over the SLA within 3 minutes of the job's scheduled start on
    the third day; and the run's GPU-seconds."""
    rows = daily(11, duration_s=3 * PERIOD_S, period_s=PERIOD_S)
    trace = Trace.from_points(rows, name="daily-11", duration_s=None)
    scenario = Scenario(
        trace=trace,
        service=TEXTBOOK,
        sla_s=0.1,
        cluster=ClusterConfig(seasonality=seasonality),
    )
    result = simulate(scenario, "autopilot")
    jobs = [day * PERIOD_S + DAILY_JOB_PHASE * PERIOD_S for day in (2,)]
    late = [
        r.t
        for r in result.intervals
        if (r.p99_s is None or r.p99_s > 0.1) and any(-150 <= r.t - job <= 180 for job in jobs)
    ]
    return late, result.summary.gpu_seconds


def test_from_the_third_day_the_job_is_met_in_advance() -> None:
    season = Seasonality(period_s=int(PERIOD_S))
    blind, blind_cost = late_intervals(None)
    seeing, seeing_cost = late_intervals(season)
    assert len(blind) >= 2  # without a forecast: a reaction horizon late
    assert seeing == []
    assert seeing_cost < 1.1 * blind_cost
