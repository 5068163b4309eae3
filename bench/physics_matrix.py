"""The autopilot on service physics the shipped traces do not use, beside the bounds.

    .venv/bin/python bench/physics_matrix.py --seed 5353 [--physics textbook,fixed,mid,big]
        [--kinds ramp,step | regimes,walk,sawtooth,spikes] [--retries attempts=3,delay_s=1]
        [--clump 4] [--cv 0.2]
        [--rows 1:9,16:1 [--blind-rows]] [--basic-signals | --busy-signals] [--procs 2]
        [--json out.json]

`slo_matrix.py` runs every baseline on one physics at a time; this runs the autopilot, the
reactive bound (knows the present rate and the true capacity, pays the cold start) and the
oracle (knows the coming peak) over several at once, in parallel processes, so a change to the
autopilot is seen on all of them side by side: the textbook's ResNet-50, where a batch's time
grows with its size; a fixed cost far above the per-row one (a large model on an accelerator);
a per-row cost far above it; one in between with latency outside the device; a large model with
a 300 ms SLA and a two-minute cold start; and two whose clients send several rows a request
(4 on the textbook's service, 8 on the fixed cost), where the rates count requests and the
batches rows. Per trace: the share of 15 s intervals inside the SLA
and GPU-seconds over the oracle's; in the JSON also the replica count's flaps and the share past
the first five minutes (`attainmentAfterStart`: the bounds start provisioned, the autopilot on
one replica), and a last
line names the traces where that share is below the reactive bound's. Traces are generated
from `--seed` (pick one the shipped files do not use); the objective is declared per kind as
in `slo_matrix.py`. By default the eight kinds the autopilot was built against; `--kinds
regimes,walk,sawtooth,spikes` runs four shapes none of them has (`slo_matrix.OTHER_SHAPES`).
`--retries`: the clients send what is refused again (`batchpilot.simulation.clients`), for
every policy alike;
`--clump M`: requests arrive in clumps of mean size M, a clump's at once (`Trace.arrivals`);
`--cv V`: every physics' batch times vary around t(b) by V (`ServiceTruth.cv`); `--rows MIX`:
every request's rows drawn from the mix (`ServiceTruth.row_mix`: replicas that count in rows, a
batch filled from behind a request that does not fit), the trace's rates over the mix's mean
rows so that the rows a second are the one-row physics'; `--blind-rows`: the replicas do not
export the rows' spread (`ClusterConfig.rows_spread`), as runtimes before it, and the autopilot
plans by the mean rows alone. `--basic-signals`: every policy sees only P99, the rates, the busy
share, the mean batch and the ready replicas (`ClusterConfig.basic_signals`); `--busy-signals`:
the same without the mean batch (`ClusterConfig.busy_signals`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path

from batchpilot.api.request_rows import RowMix
from batchpilot.simulation import Scenario, Trace, simulate
from batchpilot.simulation.clients import Retries
from batchpilot.simulation.cluster import ClusterConfig
from batchpilot.simulation.generate import generate
from batchpilot.simulation.service import ServiceTruth
from slo_matrix import BURSTY, OBJECTIVE, SMOOTH


@dataclass(frozen=True)
class Physics:
    service: str
    """`ServiceTruth.parse`'s spelling."""
    cold_start_s: float
    max_replicas: int
    sla_s: float


PHYSICS = {
    "textbook": Physics("textbook", 30, 8, 0.1),
    "textbook-cold": Physics("textbook", 120, 8, 0.1),
    "fixed": Physics("alpha_ms=30,beta_ms=0.5", 30, 200, 0.1),
    "per-row": Physics("alpha_ms=5,beta_ms=8", 30, 200, 0.1),
    "mid": Physics("alpha_ms=10,beta_ms=1,overhead_ms=5", 30, 200, 0.1),
    "big": Physics("alpha_ms=60,beta_ms=2", 120, 200, 0.3),
    "textbook-rows4": Physics("textbook,rows=4", 30, 32, 0.1),
    "fixed-rows8": Physics("alpha_ms=30,beta_ms=0.5,rows=8", 30, 200, 0.1),
}
POLICIES = ("autopilot", "reactive", "oracle")
START_S = 300.0
"""The start-up left out of `attainmentAfterStart`: the autopilot starts on one replica at batch
1, the bounds provisioned for the load they know, so the first minutes of a trace that starts
loaded compare start-ups, not the reaction to the traffic."""


def run(
    job: tuple[str, str, int, str, str, float, float, str, bool, bool, bool],
) -> tuple[str, str, str, float, float, float, int]:
    """(physics, kind, policy, attainment, GPU-seconds, attainment past `START_S`, flaps) of
    one simulation."""
    name, kind, seed, policy, retries, clump, cv, rows, blind_rows, basic_signals, busy = job
    physics = PHYSICS[name]
    mix = RowMix.parse(rows) if rows else None
    per_request = 1.0 / mix.mean if mix is not None else 1.0
    points = [(t, rate * per_request) for t, rate in generate(kind, seed)]
    trace = Trace.from_points(points, name=f"{kind}-{seed}", duration_s=None)
    service = physics.service + (f",cv={cv}" if cv else "")
    truth = ServiceTruth.parse(service)
    if mix is not None:
        truth = replace(truth, rows_per_request=1, row_mix=mix)
    scenario = Scenario(
        trace=trace,
        service=truth,
        sla_s=physics.sla_s,
        objective=OBJECTIVE[kind],
        max_replicas=physics.max_replicas,
        cluster=ClusterConfig(
            cold_start_s=physics.cold_start_s,
            retries=Retries.parse(retries) if retries else None,
            clump=clump,
            rows_spread=not blind_rows,
            basic_signals=basic_signals,
            busy_signals=busy,
        ),
    )
    result = simulate(scenario, policy)
    later = [r for r in result.intervals if r.t >= START_S]
    inside = sum(1 for r in later if r.p99_s <= physics.sla_s or math.isnan(r.p99_s))
    summary = result.summary
    after = inside / len(later) if later else 1.0
    return (
        name,
        kind,
        policy,
        summary.interval_attainment,
        summary.gpu_seconds,
        after,
        summary.flaps,
    )


def chosen(
    parser: argparse.ArgumentParser, physics: str, kinds: str
) -> tuple[list[str], list[str]]:
    """The physics and trace kinds named (comma-separated); the parser's error on an unknown one."""
    names, kind_names = physics.split(","), kinds.split(",")
    unknown = [n for n in names if n not in PHYSICS] + [k for k in kind_names if k not in OBJECTIVE]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    return names, kind_names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=5353)
    parser.add_argument("--physics", default=",".join(PHYSICS), help=", ".join(PHYSICS))
    parser.add_argument("--kinds", default=",".join((*SMOOTH, *BURSTY)))
    parser.add_argument("--retries", default="", help="clients retry: attempts=3,delay_s=1,…")
    parser.add_argument("--clump", type=float, default=1.0, help="mean clump size (1: Poisson)")
    parser.add_argument("--cv", type=float, default=0.0, help="batch times' spread (0: exact)")
    parser.add_argument("--rows", default="", help="rows a request from a mix: 1:9,16:1")
    parser.add_argument("--blind-rows", action="store_true", help="the rows' spread unexported")
    parser.add_argument(
        "--basic-signals", action="store_true", help="the policies see the basic signals only"
    )
    parser.add_argument(
        "--busy-signals", action="store_true", help="the basic signals without the mean batch"
    )
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names, kinds = chosen(parser, args.physics, args.kinds)
    began = time.perf_counter()
    try:
        Retries.parse(args.retries)
        if args.rows:
            RowMix.parse(args.rows)
    except ValueError as exc:
        parser.error(str(exc))
    jobs = [
        (
            n,
            k,
            args.seed,
            p,
            args.retries,
            args.clump,
            args.cv,
            args.rows,
            args.blind_rows,
            args.basic_signals,
            args.busy_signals,
        )
        for n in names
        for k in kinds
        for p in POLICIES
    ]
    with Pool(args.procs) as pool:
        results = pool.map(run, jobs)
    table = {(n, k, p): (a, g) for n, k, p, a, g, _, _ in results}
    after = {(n, k, p): later for n, k, p, _, _, later, _ in results}
    flaps = {(n, k, p): f for n, k, p, _, _, _, f in results}
    print(
        f"{'physics':<14} {'trace':<15} {'objective':>9}  "
        + "  ".join(f"{p + ': intervals, vs oracle':>30}" for p in POLICIES[:2])
        + f"  {'oracle':>8}"
    )
    rows = []
    for name in names:
        for kind in kinds:
            oracle = table[name, kind, "oracle"]
            cells = []
            row = {"physics": name, "trace": f"{kind}-{args.seed}", "objective": OBJECTIVE[kind]}
            for policy in POLICIES:
                attainment, gpu_seconds = table[name, kind, policy]
                row[policy] = {
                    "attainment": attainment,
                    "attainmentAfterStart": after[name, kind, policy],
                    "gpuSeconds": gpu_seconds,
                    "vsOracle": gpu_seconds / oracle[1],
                    "flaps": flaps[name, kind, policy],
                }
                cells.append(f"{attainment:>20.2%} {gpu_seconds / oracle[1]:>8.2f}x")
            rows.append(row)
            print(
                f"{name:<14} {kind + '-' + str(args.seed):<15} {OBJECTIVE[kind]:>9.0%}  "
                f"{cells[0]}  {cells[1]}  {oracle[0]:>8.2%}"
            )
    behind = [
        (n, k)
        for n in names
        for k in kinds
        if after[n, k, "autopilot"] < after[n, k, "reactive"] - 1e-9
    ]
    print(
        f"past the first {START_S:.0f} s, the autopilot has fewer intervals inside the SLA than "
        f"the reactive bound on {len(behind)} of {len(names) * len(kinds)} traces"
        + (f": {', '.join(f'{n} {k}' for n, k in behind)}" if behind else "")
    )
    print(f"({len(jobs)} simulations in {time.perf_counter() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
