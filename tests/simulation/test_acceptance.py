"""The autopilot's aims on the shipped traces, against the oracle and every baseline.

The service is the textbook case (ResNet-50 on an A10, P99 < 100 ms); the spec is the
InferenceService defaults (1-8 replicas, batch 1 to start, batch ceiling 64, 5 ms queue delay,
300 s scale-down delay); cold start 30 s; the simulator scrapes every replica every 15 s and
replicas refuse what they predict late (the runtime's admission).

Aims:
- smooth, ramp and step traffic (textbook, step, diurnal, ramp; objective 99 %): at least 99 % of
  15 s intervals inside the SLA, at most 1.2x the GPU-seconds of an oracle that knows the load;
- heavily bursty traffic (onoff, flash, bursty; objective 97 %): the declared objective met, for
  fewer GPU-seconds than static provisioning for the peak;
- never dominated on the (attainment, GPU-seconds) plane: no baseline reaches more intervals
  inside the SLA for fewer GPU-seconds. Static and the HPA never do. The `reactive` bound —
  which knows the present rate exactly and what a replica truly carries — does on the step and
  flash traces (step: 99.58 % against 99.72 %, 1.07x against 1.03x; flash: 97.78 % against
  98.06 %, 1.31x against 1.18x), by one interval over the SLA per sudden rise, and no observer
  can close that gap: the step trace's steps fall exactly on decision instants, where the bound
  sees the new rate at once (shifted 7 s off them, the bound keeps 99.58 % too), and a flash
  shows in metrics scraped every 15 s up to a scrape after the bound reacts (scraped every 5 s,
  the autopilot keeps the bound's 98.06 %). Kept as strict xfails.

`bench/slo_matrix.py` runs the same comparison on traces generated with other seeds.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from batchpilot.simulation import TEXTBOOK, Scenario, SimulationResult, Trace, simulate
from batchpilot.simulation.scenario import oracle_gpu_seconds

TRACES = Path(__file__).parents[2] / "examples" / "traces"
SMOOTH = ["textbook", "step", "diurnal", "ramp"]
BURSTY = ["onoff", "flash", "bursty"]
DOMINATED_BY_THE_BOUND = pytest.mark.xfail(
    strict=True,
    reason="the bound sees a rise at the instant it happens (steps on decision instants), the "
    "autopilot a scrape later: one more interval over the SLA per sudden rise",
)


@cache
def scenario(name: str) -> Scenario:
    objective = 0.97 if name in BURSTY else 0.99
    return Scenario(
        trace=Trace.from_csv(TRACES / f"{name}.csv"),
        service=TEXTBOOK,
        sla_s=0.1,
        objective=objective,
    )


@cache
def run(name: str, policy: str) -> SimulationResult:
    return simulate(scenario(name), policy)  # type: ignore[arg-type]


def plane(name: str, policy: str) -> tuple[float, float]:
    summary = run(name, policy).summary
    return summary.interval_attainment, summary.gpu_seconds


@pytest.mark.parametrize("name", SMOOTH)
def test_smooth_ramp_and_step_traffic_inside_the_sla_for_at_most_1_2x_the_oracle(
    name: str,
) -> None:
    summary = run(name, "autopilot").summary
    assert summary.interval_attainment >= 0.99
    assert summary.gpu_seconds / oracle_gpu_seconds(scenario(name)) <= 1.2


@pytest.mark.parametrize("name", BURSTY)
def test_bursty_traffic_meets_its_97_percent_objective_for_less_than_static(name: str) -> None:
    autopilot, static = run(name, "autopilot").summary, run(name, "static").summary
    assert autopilot.interval_attainment >= scenario(name).objective
    assert autopilot.gpu_seconds < static.gpu_seconds


@pytest.mark.parametrize("baseline", ["static", "hpa"])
@pytest.mark.parametrize("name", SMOOTH + BURSTY)
def test_no_baseline_reaches_more_intervals_for_fewer_gpu_seconds(name: str, baseline: str) -> None:
    mine, theirs = plane(name, "autopilot"), plane(name, baseline)
    assert not (theirs[0] > mine[0] and theirs[1] < mine[1])


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=DOMINATED_BY_THE_BOUND) if n in ("step", "flash") else n
        for n in SMOOTH + BURSTY
    ],
)
def test_not_even_the_reactive_bound(name: str) -> None:
    mine, theirs = plane(name, "autopilot"), plane(name, "reactive")
    assert not (theirs[0] > mine[0] and theirs[1] < mine[1])


@pytest.mark.parametrize("name", SMOOTH + BURSTY)
def test_cheaper_than_the_hpa(name: str) -> None:
    assert run(name, "autopilot").summary.gpu_seconds < run(name, "hpa").summary.gpu_seconds


def test_hours_of_traffic_in_seconds() -> None:
    result = run("diurnal", "autopilot")  # 4 hours, 9.3 million requests
    assert result.summary.requests > 9_000_000
    assert result.wall_s < 60  # about 10 s on one core
