"""A node that dies under the service's replicas: the SLA through the episode, and the bill.

    .venv/bin/python bench/node_loss.py --seed 5353 [--physics textbook,textbook-cold,fixed,big]
        [--kind realistic] [--load 3.2] [--eviction-s 300] [--procs 2] [--json out.json]

Kubernetes is slow to notice a dead node, and slower to replace its pods: for 40 s (the node
controller's grace period) they stay ready and in the Service's endpoints, and what they are
sent fails; then they are NotReady, billed and not replaced, until the taints evict them (300 s
later unless the pods tolerate less) and the ReplicaSet starts replacements, which pay the cold
start. A controller that reads the ready count can replace them minutes sooner. This measures
how the autopilot and the reactive bound (`physics_matrix.py`'s) go through it, on several of
`physics_matrix.py`'s physics.

Per physics, a generated trace (`--kind`, `--seed`; one hour; the realistic kind with a gentler
day, twice its trough at its peak) is scaled so that a third of the way in, where the node dies,
it needs `--load` replicas' worth of capacity (each replica's capacity at the SLA, as the oracle
measures it): at least three replicas, and the ones left short. Rows: no loss (the reference),
the node under one replica lost, under two. Per row and controller: the share of 15 s intervals
inside the SLA over the whole trace and within the episode (from the loss until a replacement
started at eviction would be ready), and GPU-seconds over the oracle's (which knows the traffic,
not the loss; a loss costs it nothing: its dead pods are billed until evicted, and replaced at
once). Also the replicas the autopilot had in force at the loss. `--eviction-s 30` is the
toleration the operator renders (`runtime.nodeLossTolerationSeconds`); the autopilot is told
the time either way, as it reads it from the pod template.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from multiprocessing import Pool
from pathlib import Path

from batchpilot.simulation import NodeLoss, Scenario, SimulationResult, Trace, simulate
from batchpilot.simulation.cluster import ClusterConfig
from batchpilot.simulation.generate import KINDS, generate
from batchpilot.simulation.scenario import PolicyName, oracle_gpu_seconds
from batchpilot.simulation.service import ServiceTruth
from physics_matrix import PHYSICS
from slo_matrix import OBJECTIVE

POLICIES: tuple[PolicyName, ...] = ("autopilot", "reactive")
LOST = (0, 1, 2)
"""Replicas on the dead node; 0: no loss, the reference."""
DURATION_S = 3600.0
GENTLE = {"amplitude": 2.0}
"""For the kinds that take it: the peak at twice the trough, so the loss meets steady-ish
traffic rather than the day's ramps."""


def loss_at(lost: int, eviction_s: float) -> NodeLoss:
    """The node under `lost` replicas (1 for the reference window) dies a third of the way in,
    as a control interval starts; noticed after Kubernetes' default 40 s."""
    interval = ClusterConfig().interval_s
    at = round(DURATION_S / 3 / interval) * interval
    return NodeLoss(at, max(1, lost), eviction_s=eviction_s)


def scenario(
    name: str, kind: str, seed: int, load: float, lost: int, eviction_s: float
) -> Scenario:
    """`name`'s physics on the trace sized for it, and the loss of a node under `lost`."""
    physics = PHYSICS[name]
    parameters = {k: v for k, v in GENTLE.items() if k in KINDS[kind].parameters}
    rows = generate(kind, seed, duration_s=DURATION_S, **parameters)
    loss = loss_at(lost, eviction_s)
    sized = Scenario(
        trace=Trace.from_points(rows, name=f"{kind}-{seed}", duration_s=None),
        service=ServiceTruth.parse(physics.service),
        sla_s=physics.sla_s,
        objective=OBJECTIVE.get(kind, 0.99),
        max_replicas=physics.max_replicas,
        cluster=ClusterConfig(
            cold_start_s=physics.cold_start_s, node_losses=(loss,) if lost else ()
        ),
    )
    scale = load * sized.best_capacity().rate / sized.trace.rate_at(loss.at_s)
    scaled = [(t, round(rate * scale, 1)) for t, rate in rows]
    return replace(sized, trace=Trace.from_points(scaled, name=sized.trace.name, duration_s=None))


def inside(result: SimulationResult, start: float, end: float) -> float:
    """The share of intervals starting in [start, end) inside the SLA (`summarize`'s rule: no
    traffic counts as inside)."""
    picked = [r for r in result.intervals if start <= r.t < end]
    ok = sum(1 for r in picked if r.p99_s <= result.sla_s or math.isnan(r.p99_s))
    return ok / len(picked) if picked else 1.0


@dataclass(frozen=True)
class Cell:
    physics: str
    lost: int
    policy: str
    attainment: float
    episode: float
    """Intervals inside the SLA from the loss until a replacement started at eviction is
    ready (the same window without a loss)."""
    episode_s: float
    vs_oracle: float
    replicas_at_loss: int


def run(job: tuple[str, str, int, float, int, float, PolicyName]) -> Cell:
    name, kind, seed, load, lost, eviction_s, policy = job
    chosen = scenario(name, kind, seed, load, lost, eviction_s)
    result = simulate(chosen, policy)
    loss = loss_at(lost, eviction_s)
    end = loss.evicted_s + chosen.cluster.cold_start_s
    return Cell(
        physics=name,
        lost=lost,
        policy=policy,
        attainment=result.summary.interval_attainment,
        episode=inside(result, loss.at_s, end),
        episode_s=end - loss.at_s,
        vs_oracle=result.summary.gpu_seconds / oracle_gpu_seconds(chosen),
        replicas_at_loss=next(r.replicas for r in result.intervals if r.t == loss.at_s),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=5353)
    parser.add_argument("--physics", default="textbook,textbook-cold,fixed,big")
    parser.add_argument("--kind", default="realistic", choices=sorted(KINDS))
    parser.add_argument(
        "--load",
        type=float,
        default=3.2,
        help="replicas' worth of capacity the traffic needs where the node dies (3.2)",
    )
    parser.add_argument(
        "--eviction-s",
        type=float,
        default=300.0,
        help="the pods' toleration of a lost node, which the autopilot reads too (300, "
        "Kubernetes' default; the operator renders 30)",
    )
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = args.physics.split(",")
    unknown = [n for n in names if n not in PHYSICS]
    if unknown:
        parser.error(f"unknown physics: {', '.join(unknown)}")
    began = time.perf_counter()
    jobs = [
        (n, args.kind, args.seed, args.load, k, args.eviction_s, p)
        for n in names
        for k in LOST
        for p in POLICIES
    ]
    with Pool(args.procs) as pool:
        results = pool.map(run, jobs)
    cells = {(c.physics, c.lost, c.policy): c for c in results}
    loss = loss_at(1, args.eviction_s)
    print(
        f"{args.kind}-{args.seed}, {DURATION_S:g} s, sized to {args.load:g} replicas where the "
        f"node dies at {loss.at_s:g} s ({loss.notice_s:g} s unnoticed, evicted "
        f"{loss.eviction_s:g} s later); intervals inside the SLA, GPU-seconds over the oracle's"
    )
    print(
        f"{'physics':<14} {'lost':>4} {'episode':>8} {'replicas':>8}  "
        + "  ".join(f"{p + ': all, episode, vs oracle':>35}" for p in POLICIES)
    )
    for name in names:
        for lost in LOST:
            mine = cells[name, lost, POLICIES[0]]
            line = f"{name:<14} {lost:>4} {mine.episode_s:>7.0f}s {mine.replicas_at_loss:>8}  "
            parts = [
                f"{c.attainment:>15.2%} {c.episode:>9.2%} {c.vs_oracle:>8.2f}x"
                for c in (cells[name, lost, policy] for policy in POLICIES)
            ]
            print(line + "  ".join(parts))
    print(f"({len(jobs)} simulations in {time.perf_counter() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(c) for c in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
