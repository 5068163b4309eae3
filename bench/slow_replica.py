"""The autopilot when replicas slow down: one GPU that throttles, two, or the whole fleet.

    .venv/bin/python bench/slow_replica.py --seed 4242 [--physics textbook,fixed,mid,big]
        [--kinds realistic,step] [--factor 2] [--cv 0.5] [--clump 4] [--procs 2] [--json out.json]

A replica whose batches take `--factor` times as long as its peers' (from a third of the trace
on, to its end: a GPU stays slow until someone acts) gets its share of a Service's requests all
the same; its queue is the fleet's P99. Per physics and trace (generated from `--seed`), the share
of 15 s intervals inside the SLA and the GPU-seconds over a run without any slowdown, for:

- `none`: no replica slows (the reference);
- `one` and `two`: one or two of the replicas then ready slow down, with the autopilot that
  replaces replicas slower than their peers (`autopilot.stragglers`), and `one-kept` / `two-kept`
  with `scaling.replaceSlowReplicas: false` (it can only add replicas);
- `fleet`: every replica, new ones too, slows by the same factor (a heavier input mix, a
  fleet-wide thermal limit): none is slower than its peers, nothing to replace; the fit learns
  the slower t(b) and the plan follows.

`--cv V`: every batch's time varies around t(b) by V (`ServiceTruth.cv`), `--clump M`: requests
arrive in clumps of mean size M — noise that must not read as a slow replica (`none` replaces
nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from batchpilot.simulation import Scenario, Trace, simulate
from batchpilot.simulation.cluster import ClusterConfig, Slowdown
from batchpilot.simulation.generate import generate
from batchpilot.simulation.service import ServiceTruth
from physics_matrix import PHYSICS, chosen
from slo_matrix import OBJECTIVE

CASES = ("none", "one", "one-kept", "two", "two-kept", "fleet")


def run(
    job: tuple[str, str, int, str, float, float, float],
) -> tuple[str, str, str, float, float, int]:
    """(physics, kind, case, attainment, GPU-seconds, replacements) of one simulation."""
    name, kind, seed, case, factor, cv, clump = job
    physics = PHYSICS[name]
    trace = Trace.from_points(generate(kind, seed), name=f"{kind}-{seed}", duration_s=None)
    at = round(trace.duration_s / 3)
    slowdowns = {
        "none": (),
        "one": (Slowdown(at, factor, count=1),),
        "two": (Slowdown(at, factor, count=2),),
        "fleet": (Slowdown(at, factor),),
    }[case.removesuffix("-kept")]
    scenario = Scenario(
        trace=trace,
        service=ServiceTruth.parse(physics.service + (f",cv={cv}" if cv else "")),
        sla_s=physics.sla_s,
        objective=OBJECTIVE[kind],
        max_replicas=physics.max_replicas,
        replace_slow=not case.endswith("-kept"),
        cluster=ClusterConfig(cold_start_s=physics.cold_start_s, slowdowns=slowdowns, clump=clump),
    )
    result = simulate(scenario, "autopilot")
    replaced = sum(1 for r in result.intervals if "replacing pod" in r.reason)
    summary = result.summary
    return name, kind, case, summary.interval_attainment, summary.gpu_seconds, replaced


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=4242)
    parser.add_argument("--physics", default="textbook,fixed,mid,big")
    parser.add_argument("--kinds", default="realistic,step")
    parser.add_argument("--factor", type=float, default=2.0, help="how many times as long")
    parser.add_argument("--cv", type=float, default=0.0, help="batch times' spread (0: exact)")
    parser.add_argument("--clump", type=float, default=1.0, help="mean clump size (1: Poisson)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names, kinds = chosen(parser, args.physics, args.kinds)
    began = time.perf_counter()
    jobs = [
        (n, k, args.seed, c, args.factor, args.cv, args.clump)
        for n in names
        for k in kinds
        for c in CASES
    ]
    with Pool(args.procs) as pool:
        results = pool.map(run, jobs)
    table = {(n, k, c): (a, g, r) for n, k, c, a, g, r in results}
    noise = (f", batch times ±{args.cv:.0%}" if args.cv else "") + (
        f", clumps of {args.clump:g}" if args.clump != 1 else ""
    )
    print(f"slowdown ×{args.factor:g} from a third of each trace on{noise}")
    print("intervals inside the SLA")
    print("(GPU-seconds over `none`) [decisions that replaced pods]\n")
    header = "  ".join(f"{c:>23}" for c in CASES)
    print(f"{'physics':<10} {'trace':<16} {'objective':>9}  {header}")
    rows = []
    for name in names:
        for kind in kinds:
            base = table[name, kind, "none"][1]
            row: dict[str, object] = {"physics": name, "trace": f"{kind}-{args.seed}"}
            cells = []
            for case in CASES:
                attainment, gpu_seconds, replaced = table[name, kind, case]
                row[case] = {
                    "attainment": attainment,
                    "gpuSeconds": gpu_seconds,
                    "vsNone": gpu_seconds / base,
                    "replacements": replaced,
                }
                cells.append(f"{attainment:>8.2%} ({gpu_seconds / base:.2f}x) [{replaced}]")
            rows.append(row)
            print(
                f"{name:<10} {kind + '-' + str(args.seed):<16} {OBJECTIVE[kind]:>9.0%}  "
                + "  ".join(f"{c:>23}" for c in cells)
            )
    print(f"({len(jobs)} simulations in {time.perf_counter() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
