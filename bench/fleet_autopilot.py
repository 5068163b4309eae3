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

`--recorded` measures the autopilot's recording rules instead (`recorded.rule_group`, as the
chart installs them): Prometheus evaluates them every 15 s over three minutes of backfilled history
(which ends at the next scrape, so the first evaluations see a full window), and at the time of one
evaluation the round is asked both ways, alternately — reading the recorded series, and asking
the raw grouped queries: wall time and Prometheus CPU of each, with the rule group's own
evaluation time (Prometheus' `prometheus_rule_group_last_duration_seconds`).

The aims (issue: the control plane at fleet scale): queries per interval a constant ≤ 15
whatever the count; one full observe-decide round over 1,000 services < 5 s.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from batchpilot.operator.autopilot import recorded
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
from batchpilot.sandbox.prometheus import PrometheusProcess, prometheus_process

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


def recorded_against_raw(prometheus: PrometheusProcess, rounds: int) -> dict[str, float]:
    """Rounds read from the recording rules and asked raw, alternately, at the time of one
    evaluation of the rules (medians), and the rule group's last evaluation time."""
    pid = prometheus.process.pid
    query = http_query(prometheus.url, timeout_s=30)
    deadline = time.monotonic() + 60
    # The marker is the group's last rule: once it is there, so is the rest of an evaluation.
    evaluated = f"timestamp({recorded.marker_query(60, 'busy')})"
    while not (marker := prometheus.query(evaluated)):
        assert time.monotonic() < deadline, "the rules were not evaluated within 60 s"
        time.sleep(0.2)
    at = float(marker[0]["value"][1])  # the evaluation's own time, not the query's
    ways = {
        "recorded": FleetObserver(query, recent_s=30, clock=time.time),
        "raw": FleetObserver(query, recent_s=30, rules="off", clock=time.time),
    }
    for observer in ways.values():  # warm: Prometheus' caches, as a running operator has them
        observer.round(at=at)
    measured: dict[str, list[float]] = {}
    for k in range(rounds):
        order = list(ways) if k % 2 == 0 else list(reversed(ways))
        for way in order:
            observer = ways[way]
            asked = observer.asked
            cpu, began = cpu_seconds(pid), time.perf_counter()
            round_ = observer.round(at=at)
            took = time.perf_counter() - began
            assert round_.reading == way, (way, round_.reading)
            answered = sum(1 for raw in (round_.answers or {}).values() if "p99" in raw)
            for key, value in {
                f"{way}_observe_s": took,
                f"{way}_prometheus_cpu_s": cpu_seconds(pid) - cpu,
                f"{way}_queries_per_round": observer.asked - asked,
                f"{way}_services_with_p99": answered,
            }.items():
                measured.setdefault(key, []).append(value)
    results: dict[str, float] = {key: statistics.median(values) for key, values in measured.items()}
    # Prometheus' own metrics (it does not scrape itself here): the group's last evaluation.
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=10) as response:
        own = response.read().decode()
    group = rf'rule_group="[^"]*;{recorded.GROUP}"'
    found = re.search(rf"^prometheus_rule_group_last_duration_seconds{{{group}}} (\S+)$", own, re.M)
    results["rule_group_evaluation_s"] = float(found.group(1)) if found else float("nan")
    results["recorded_vs_raw_observe"] = results["recorded_observe_s"] / results["raw_observe_s"]
    results["recorded_vs_raw_prometheus_cpu"] = results["recorded_prometheus_cpu_s"] / max(
        results["raw_prometheus_cpu_s"], 1e-9
    )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=50, help="services asked one by one")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds, 15 s apart")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile of the last round")
    parser.add_argument(
        "--recorded", action="store_true", help="recording rules against raw queries, only"
    )
    args = parser.parse_args()
    services = list(fleet(args.count))
    now = int(time.time()) // 15 * 15
    results: dict[str, float] = {"services": args.count}
    if args.recorded:
        # Three minutes of history, ending at the next scrape: written quickly enough that the
        # rules' first evaluations still find a full window of it.
        end = now + 15
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            history = openmetrics(services, start=end - 180, end=end)
            backfill(history, work / "prometheus" / "data", workdir=work)
            with prometheus_process(
                work / "prometheus",
                retention="1d",
                rule_groups=[recorded.rule_group(60, "busy", interval_s=15.0)],
            ) as prometheus:
                results |= recorded_against_raw(prometheus, args.rounds)
        return report(results, args.json)
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
    return report(results, args.json)


def report(results: dict[str, float], json_path: Path | None) -> int:
    for key, value in results.items():
        print(f"{key:<40} {value:.3f}" if isinstance(value, float) else f"{key:<40} {value}")
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
