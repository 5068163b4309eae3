"""The autopilot where the load goes beyond what maxReplicas carry, beside the bounds.

    .venv/bin/python bench/beyond_ceiling.py --seed 4242 [--physics textbook,per-row,mid,fixed]
        [--replicas 4] [--procs 2] [--json out.json]

Past the ceiling no configuration meets the SLA, and what is left to choose is how much of the
load is answered in time: the runtime refuses what would finish late, so the rest is what the
replicas' batches carry. Each physics of `physics_matrix.py` gets `--replicas` replicas at most
and a trace drawn relative to what they carry inside the SLA at their best batch limit (the
ceiling): half of it, then 1.5×, 0.7×, 3×, 0.5×, each level held 8–14 minutes (the seed draws
the lengths and ±5 % on each level), an hour in all. Per policy: the share of requests answered
inside the SLA (refused ones count as outside), and the rate answered in time while the load is
beyond the ceiling, over the ceiling. The reactive bound and the oracle plan by the capacity at
the SLA (`oracle_plan`), as everywhere else: past the ceiling they take the limit that carries
most there, whose full batches may break the SLA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import cache
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from batchpilot.simulation import Scenario, Trace, simulate
from batchpilot.simulation.capacity import best_batch, capacity_table
from batchpilot.simulation.cluster import ClusterConfig
from batchpilot.simulation.scenario import PolicyName
from batchpilot.simulation.service import ServiceTruth
from physics_matrix import PHYSICS

LEVELS = (0.5, 1.5, 0.7, 3.0, 0.5)
"""The load over the ceiling, level after level."""
POLICIES: tuple[PolicyName, ...] = ("autopilot", "reactive", "oracle")


@cache
def ceiling(name: str, replicas: int) -> float:
    """Requests a second `replicas` replicas carry inside the SLA at their best batch limit (a
    request of several rows counted once, as the trace counts it)."""
    physics = PHYSICS[name]
    truth = ServiceTruth.parse(physics.service)
    table = capacity_table(
        truth, sla_s=physics.sla_s, batches=[1, 2, 4, 8, 16, 32, 64], delay_s=0.005
    )
    return replicas * best_batch(table).rate


def trace(name: str, seed: int, replicas: int) -> tuple[Trace, list[tuple[float, float]]]:
    """The trace, and the stretches of it beyond the ceiling."""
    rng = np.random.default_rng(seed)
    top = ceiling(name, replicas)
    points: list[tuple[float, float]] = []
    beyond: list[tuple[float, float]] = []
    t = 0.0
    for level in LEVELS:
        length = 60.0 * float(rng.integers(8, 15))
        points.append((t, round(top * level * float(rng.uniform(0.95, 1.05)), 1)))
        if level > 1:
            beyond.append((t, t + length))
        t += length
    return Trace.from_points(points, name=f"beyond-{seed}", duration_s=t), beyond


def run(job: tuple[str, int, int, PolicyName]) -> tuple[str, str, float, float, float]:
    """(physics, policy, requests inside the SLA, answered in time beyond / ceiling, GPU-s)."""
    name, seed, replicas, policy = job
    physics = PHYSICS[name]
    offered, beyond = trace(name, seed, replicas)
    scenario = Scenario(
        trace=offered,
        service=ServiceTruth.parse(physics.service),
        sla_s=physics.sla_s,
        objective=0.99,
        max_replicas=replicas,
        cluster=ClusterConfig(cold_start_s=physics.cold_start_s),
    )
    result = simulate(scenario, policy)
    spans = [x for x in result.intervals if any(a <= x.t < b for a, b in beyond)]
    in_time = sum(x.in_sla_rps for x in spans) / len(spans)
    return (
        name,
        policy,
        result.summary.request_attainment,
        in_time / ceiling(name, replicas),
        result.summary.gpu_seconds,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=4242)
    parser.add_argument("--physics", default="textbook,per-row,mid,fixed,big,textbook-rows4")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = args.physics.split(",")
    unknown = [n for n in names if n not in PHYSICS]
    if unknown:
        parser.error(f"unknown physics: {', '.join(unknown)}")
    began = time.perf_counter()
    jobs = [(n, args.seed, args.replicas, p) for n in names for p in POLICIES]
    with Pool(args.procs) as pool:
        results = pool.map(run, jobs)
    table = {(n, p): (a, b, g) for n, p, a, b, g in results}
    print(
        f"{'physics':<15}{'ceiling rps':>12}  "
        + "  ".join(f"{p + ': in SLA, beyond':>28}" for p in POLICIES)
    )
    rows = []
    for name in names:
        cells = "  ".join(
            f"{table[name, p][0]:>19.2%} {table[name, p][1]:>7.2f}x" for p in POLICIES
        )
        print(f"{name:<15}{ceiling(name, args.replicas):>12.0f}  {cells}")
        rows.append(
            {
                "physics": name,
                "trace": f"beyond-{args.seed}",
                "ceilingRps": ceiling(name, args.replicas),
                **{
                    p: {
                        "requestsInSla": table[name, p][0],
                        "inTimeBeyond": table[name, p][1],
                        "gpuSeconds": table[name, p][2],
                    }
                    for p in POLICIES
                },
            }
        )
    print(f"({len(jobs)} simulations in {time.perf_counter() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
