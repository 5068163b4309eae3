"""Does the seasonal forecast earn its complexity? The autopilot with and without it, side by side.

    .venv/bin/python bench/season_matrix.py --seeds 101,202,303 [--json out.json]

Traces of the `daily` kind, generated here with seeds no shipped trace uses: four compressed days
of two hours (a scheduled job — a 6x step for 10 minutes — at about the same time each day,
unscheduled flash crowds on some days), and the same traffic with the job at a random time each
day (`scheduled=0`: no pattern to find). The textbook service, SLA P99 < 100 ms, objective 99 %
over an hour, 30 s cold start, every other setting the InferenceService's default. For each
trace: the autopilot with the forecast (`period 7200 s`, the trace's day) and without, and the
baselines; intervals inside the SLA, GPU-seconds over the oracle's, the worst run of intervals
over the SLA, and who dominates whom.

Keep the forecast only if it pays: fewer intervals outside the SLA where days repeat, and nearly
nothing spent where they do not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from batchpilot.operator.autopilot.prometheus import Seasonality
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, simulate
from batchpilot.simulation.generate import daily

PERIOD_S = 7200
BASELINES = ("oracle", "reactive", "hpa", "static")


def run(seed: int, scheduled: int) -> list[dict[str, object]]:
    name = f"daily-{seed}" + ("" if scheduled else "-unscheduled")
    trace = Trace.from_points(daily(seed, scheduled=scheduled), name=name, duration_s=None)
    scenario = Scenario(trace=trace, service=TEXTBOOK, sla_s=0.1, objective=0.99)
    blind = replace(scenario, cluster=ClusterConfig(seasonality=None))
    seeing = replace(scenario, cluster=ClusterConfig(seasonality=Seasonality(period_s=PERIOD_S)))
    results = {
        "autopilot+season": simulate(seeing, "autopilot"),
        "autopilot": simulate(blind, "autopilot"),
        **{b: simulate(blind, b) for b in BASELINES},
    }
    oracle = results["oracle"].summary.gpu_seconds
    plane = {k: (r.summary.interval_attainment, r.summary.gpu_seconds) for k, r in results.items()}
    rows = []
    for policy, result in results.items():
        s = result.summary
        rows.append(
            {
                "trace": name,
                "policy": policy,
                "attainment": s.interval_attainment,
                "vs_oracle": s.gpu_seconds / oracle,
                "worst_streak_s": s.worst_streak_s,
                "dominated_by": [
                    other
                    for other, point in plane.items()
                    if other not in (policy, "oracle")
                    and point[0] > plane[policy][0]
                    and point[1] < plane[policy][1]
                ],
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="101,202,303")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    began = time.perf_counter()
    rows: list[dict[str, object]] = []
    print(
        f"{'trace':<24} {'policy':<17} {'intervals':>9} {'vs oracle':>9} {'worst':>6}  dominated by"
    )
    for scheduled in (1, 0):
        for seed in (int(s) for s in args.seeds.split(",")):
            for row in run(seed, scheduled):
                rows.append(row)
                print(
                    f"{row['trace']:<24} {row['policy']:<17} {row['attainment']:>9.2%} "
                    f"{row['vs_oracle']:>8.2f}x {row['worst_streak_s']:>5.0f}s  "
                    f"{', '.join(row['dominated_by']) or '-'}",  # type: ignore[arg-type]
                    flush=True,
                )
    print(f"({time.perf_counter() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
