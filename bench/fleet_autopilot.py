"""The autopilot's observe-and-decide round over a fleet, against a real Prometheus.

    .venv/bin/python bench/fleet_autopilot.py --count 1000 [--rounds 5] [--json OUT]
                                              [--profile OUT.pstats]

`count` services' metrics history (every series the runtime exports, 15 minutes at a 15 s scrape
interval, each service its own rate, batch size and latency) is backfilled into a fresh
Prometheus (`batchpilot.sandbox.backfill`). Then, side by side in one run:

- the fleet's round (`FleetObserver`): queries sent, wall time, Prometheus CPU seconds, and the
  decisions for every service from its answers (`decide`, each pure), each service's state
  carried from a first round as a running operator carries it (and the capacity answers of the
  round before forgotten, as the fits of a running fleet differ from tick to tick); `rounds`
  rounds 15 s apart, the median reported. Each round's queries are also asked one after another
  (`FleetObserver(concurrency=1)`; the round asks four at a time after the first by default), in
  alternating order: wall time and Prometheus CPU;
- per-service observation (`PrometheusObserver`, what a tick per service would ask) over a
  sample of services, scaled to the fleet: queries, wall time and Prometheus CPU per interval.

`--profile` writes cProfile statistics of the last round's observation and decisions (read them
with `python -m pstats OUT.pstats`).

The aims (issue: the control plane at fleet scale): queries per interval a constant ≤ 15
whatever the count; one full observe-decide round over 1,000 services < 5 s.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.prometheus import (
    FleetObserver,
    PrometheusObserver,
    Scope,
    Seasonality,
    http_query,
    queries,
)
from batchpilot.operator.autopilot.service_model import _sla_capacity
from batchpilot.operator.autopilot.slo import Objective
from batchpilot.operator.autopilot.state import State
from batchpilot.sandbox.backfill import backfill, fleet, openmetrics
from batchpilot.sandbox.prometheus import prometheus_process

POLICY = Policy(
    sla_p99_s=0.1,
    min_utilization=0.7,
    min_replicas=1,
    max_replicas=8,
    max_batch_size=64,
    scale_down_delay_s=300,
    max_queue_delay_s=0.005,
    objective=Objective(0.99, 3600),
)

IN_FORCE = InForce(1, 8, 0.005)


class Clock:
    """The rounds' clock: the time each round observes at, moved on by the benchmark."""

    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def measure_sequential(
    observer: FleetObserver, at: float, pid: int, measured: dict[str, list[float]]
) -> None:
    """One round of `observer` (one query after another): its wall time and Prometheus' CPU."""
    cpu, began = cpu_seconds(pid), time.perf_counter()
    observer.round(at=at)
    measured.setdefault("fleet_observe_sequential_s", []).append(time.perf_counter() - began)
    measured.setdefault("fleet_prometheus_cpu_sequential_s", []).append(cpu_seconds(pid) - cpu)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=50, help="services asked one by one")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds, 15 s apart")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile of the last round")
    args = parser.parse_args()
    services = list(fleet(args.count))
    now = int(time.time()) // 15 * 15
    results: dict[str, float] = {"services": args.count}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        began = time.perf_counter()
        history = openmetrics(services, start=now - 900, end=now)
        backfill(history, work / "prometheus" / "data", workdir=work)
        results["backfill_s"] = time.perf_counter() - began
        with prometheus_process(work / "prometheus", retention="1d") as prometheus:
            pid = prometheus.process.pid
            query = http_query(prometheus.url, timeout_s=30)
            settings = {"window_s": 60, "recent_s": 30, "seasonality": Seasonality()}
            # The rounds' own time: each round observes at its `at` (the seasonal signals,
            # refreshed once a minute, are asked in the first round only).
            clock = Clock(now - 15.0 * args.rounds)
            observer = FleetObserver(query, clock=clock, **settings)  # type: ignore[arg-type]
            sequential = FleetObserver(
                query,
                clock=clock,
                concurrency=1,
                **settings,  # type: ignore[arg-type]
            )
            # A first round, as a running operator has had: Prometheus' caches warm, and every
            # service's decision state (its t(b) fit) carried into the measured rounds.
            warm = observer.round(at=clock.at)
            sequential.round(at=clock.at)
            states = {}
            for service in services:
                scope = Scope(service.namespace, service.isvc)
                _, states[scope] = decide(
                    warm.observe(scope, ready_replicas=1), POLICY, IN_FORCE, State(), clock.at
                )

            measured: dict[str, list[float]] = {}
            profile = cProfile.Profile() if args.profile is not None else None
            for k in range(args.rounds):
                clock.at += 15.0
                last = k == args.rounds - 1
                if k % 2 == 1:  # alternate which way asks first
                    measure_sequential(sequential, clock.at, pid, measured)
                # In a running fleet every tick's fit differs from the last (each window measures
                # afresh, and the memory's round trip through status rounds it), so the capacity
                # answers of one round are not the next one's; here the backfilled series are
                # constant and the fits would settle: forget the answers, as the fleet does.
                _sla_capacity.cache_clear()
                asked = observer.asked
                cpu, began = cpu_seconds(pid), time.perf_counter()
                if profile is not None and last:
                    profile.enable()
                round_ = observer.round(at=clock.at)
                observed = time.perf_counter() - began
                deciding = time.process_time()
                for scope, state in states.items():
                    _, states[scope] = decide(
                        round_.observe(scope, ready_replicas=1), POLICY, IN_FORCE, state, clock.at
                    )
                if profile is not None and last:
                    profile.disable()
                    profile.dump_stats(args.profile)
                ended = time.perf_counter()
                decide_cpu_s = time.process_time() - deciding
                for key, value in {
                    "fleet_queries_per_round": observer.asked - asked,
                    "fleet_observe_s": observed,
                    "fleet_round_s": ended - began,
                    "fleet_decide_ms_per_service": (ended - began - observed) / args.count * 1e3,
                    # CPU seconds of this process: what the decisions cost whoever else runs.
                    "fleet_decide_cpu_ms_per_service": decide_cpu_s / args.count * 1e3,
                    "fleet_prometheus_cpu_s": cpu_seconds(pid) - cpu,
                }.items():
                    measured.setdefault(key, []).append(value)
                if k % 2 == 0:
                    measure_sequential(sequential, clock.at, pid, measured)
            results |= {key: statistics.median(values) for key, values in measured.items()}
            results["fleet_observe_concurrent_vs_sequential"] = (
                results["fleet_observe_s"] / results["fleet_observe_sequential_s"]
            )
            # A seasonal refresh round (once a minute): the slow queries too.
            refresh = FleetObserver(query, clock=time.time, **settings)  # type: ignore[arg-type]
            cpu, began = cpu_seconds(pid), time.perf_counter()
            refresh.round(at=now)
            results |= {
                "refresh_queries": refresh.asked,
                "refresh_round_s": time.perf_counter() - began,
                "refresh_prometheus_cpu_s": cpu_seconds(pid) - cpu,
            }

            each = PrometheusObserver(query, clock=time.time, **settings)  # type: ignore[arg-type]
            sample = services[: args.sample]
            cpu, began = cpu_seconds(pid), time.perf_counter()
            for service in sample:
                each.observe(Scope(service.namespace, service.isvc), ready_replicas=1, at=now)
            scale = args.count / len(sample)
            per_service = len(
                queries(
                    Scope("a", "b"),
                    window_s=60,
                    utilization="busy",
                    recent_s=30,
                    seasonality=Seasonality(),
                )
            )
            results |= {
                "per_service_queries_per_interval": per_service * args.count,
                "per_service_round_s_scaled": (time.perf_counter() - began) * scale,
                "per_service_prometheus_cpu_s_scaled": (cpu_seconds(pid) - cpu) * scale,
            }
    results["fleet_vs_per_service_cpu"] = (
        results["fleet_prometheus_cpu_s"] / results["per_service_prometheus_cpu_s_scaled"]
        if results["per_service_prometheus_cpu_s_scaled"]
        else float("nan")
    )
    for key, value in results.items():
        print(f"{key:<40} {value:.3f}" if isinstance(value, float) else f"{key:<40} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
