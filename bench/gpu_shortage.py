"""A cluster short of GPUs: replicas the autopilot asks for that cannot be scheduled.

    .venv/bin/python bench/gpu_shortage.py --seed 2412 [--physics textbook,mid,fixed,big]
        [--gpus 3] [--more-at-s inf] [--procs 2] [--json out.json]

Per physics, a step generated for the purpose: an hour and a quarter of Poisson traffic (seeded)
at 1.5 replicas' worth of capacity (each replica's at the SLA, as the oracle measures it), 5× that
from 10 to 40 minutes, then back to 1.5×. The cluster has `--gpus` GPUs for the service: pods
beyond them are Pending (not schedulable) until `--more-at-s` (a node autoscaler adding nodes;
inf: never), and cost nothing while Pending. Two autopilots: one that sees the Pending pods as
blocked (the operator reads the pods it watches: `rollout.blocked`), and one that sees only the
Deployment's counts, every pod not ready "starting" — as the operator did before.

Per row: intervals inside the SLA over the run and in the 20 minutes after the load fell,
GPU-seconds (Pending pods hold none), the replicas asked at the end and the most asked after
the load fell (Pending pods ask a node autoscaler for GPUs), and the cold start learned.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from multiprocessing import Pool
from pathlib import Path

from batchpilot.simulation import Gpus, Scenario, Trace, simulate
from batchpilot.simulation.cluster import ClusterConfig
from batchpilot.simulation.service import ServiceTruth
from physics_matrix import PHYSICS

DURATION_S = 4500.0
RISE_S, FALL_S = 600.0, 2400.0
BASE, PEAK = 1.5, 5.0
"""The load before and after the step, and at its top, in replicas' worth."""
AFTER_S = 1200.0
"""How long after the fall the "after" columns look."""


def scenario(name: str, seed: int, gpus: int, more_at_s: float, seen: bool) -> Scenario:
    physics = PHYSICS[name]
    sized = Scenario(
        trace=Trace.from_points([(0.0, 100.0), (10.0, 100.0)], duration_s=None),
        service=ServiceTruth.parse(physics.service),
        sla_s=physics.sla_s,
        max_replicas=min(physics.max_replicas, 12),
    )
    one = sized.best_capacity().rate
    points = [
        (0.0, BASE * one),
        (RISE_S, PEAK * one),
        (FALL_S, BASE * one),
        (DURATION_S, BASE * one),
    ]
    cluster = ClusterConfig(
        cold_start_s=physics.cold_start_s,
        seed=seed,
        gpus=Gpus(gpus, more_at_s),
        blocked_seen=seen,
    )
    return replace(
        sized,
        trace=Trace.from_points(points, name=f"step-{seed}", duration_s=None),
        cluster=cluster,
        start_replicas=2,
    )


@dataclass(frozen=True)
class Row:
    physics: str
    blocked_seen: bool
    attainment: float
    attainment_after: float
    gpu_seconds: float
    replicas_at_end: int
    most_asked_after: int
    cold_start_s: float | None


def run(job: tuple[str, int, int, float, bool]) -> Row:
    name, seed, gpus, more_at_s, seen = job
    chosen = scenario(name, seed, gpus, more_at_s, seen)
    controller = chosen.controller("autopilot")
    result = simulate(chosen, controller)
    after = [r for r in result.intervals if FALL_S <= r.t < FALL_S + AFTER_S]
    inside = sum(1 for r in after if math.isnan(r.p99_s) or r.p99_s <= result.sla_s)
    state = getattr(controller, "state", None)
    return Row(
        physics=name,
        blocked_seen=seen,
        attainment=result.summary.interval_attainment,
        attainment_after=inside / len(after),
        gpu_seconds=result.summary.gpu_seconds,
        replicas_at_end=result.intervals[-1].replicas,
        most_asked_after=max(r.replicas for r in after[4:]),
        cold_start_s=None if state is None else state.cold_start_s,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=2412)
    parser.add_argument("--physics", default="textbook,mid,fixed,big")
    parser.add_argument("--gpus", type=int, default=3)
    parser.add_argument("--more-at-s", type=float, default=math.inf)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = args.physics.split(",")
    jobs = [
        (n, args.seed, args.gpus, args.more_at_s, seen) for n in names for seen in (False, True)
    ]
    with Pool(args.procs) as pool:
        rows = pool.map(run, jobs)
    print(
        f"{'physics':10} {'blocked':>8} {'inside':>7} {'after':>7} {'GPU-s':>8} "
        f"{'at end':>6} {'asked':>6} {'cold start':>10}"
    )
    for row in rows:
        cold = "-" if row.cold_start_s is None else f"{row.cold_start_s:.0f} s"
        print(
            f"{row.physics:10} {'seen' if row.blocked_seen else 'unseen':>8} "
            f"{row.attainment:7.1%} {row.attainment_after:7.1%} {row.gpu_seconds:8.0f} "
            f"{row.replicas_at_end:6d} {row.most_asked_after:6d} {cold:>10}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
