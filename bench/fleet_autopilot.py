"""The autopilot's observe-and-decide round over a fleet, against a real Prometheus.

    .venv/bin/python bench/fleet_autopilot.py --count 1000 [--json OUT]

`count` services' metrics history (every series the runtime exports, 15 minutes at a 15 s scrape
interval, each service its own rate, batch size and latency) is backfilled into a fresh
Prometheus (`batchpilot.sandbox.backfill`). Then, side by side in one run:

- the fleet's round (`FleetObserver`): queries sent, wall time, Prometheus CPU seconds, and the
  decisions for every service from its answers (`decide`, each pure);
- per-service observation (`PrometheusObserver`, what a tick per service would ask) over a
  sample of services, scaled to the fleet: queries, wall time and Prometheus CPU per interval.

The aims (issue: the control plane at fleet scale): queries per interval a constant ≤ 15
whatever the count; one full observe-decide round over 1,000 services < 5 s.
"""

from __future__ import annotations

import argparse
import json
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=50, help="services asked one by one")
    parser.add_argument("--json", type=Path, default=None)
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
            observer = FleetObserver(query, clock=time.time, **settings)  # type: ignore[arg-type]
            # A first round, as a running operator has had: Prometheus' caches warm, and every
            # service's decision state (its t(b) fit) carried into the measured round.
            warm = observer.round(at=now - 15)
            states = {}
            for service in services:
                scope = Scope(service.namespace, service.isvc)
                _, states[scope] = decide(
                    warm.observe(scope, ready_replicas=1), POLICY, IN_FORCE, State(), now - 15
                )

            cpu, began = cpu_seconds(pid), time.perf_counter()
            asked = observer.asked
            round_ = observer.round(at=now)
            observed = time.perf_counter() - began
            for scope, state in states.items():
                decide(round_.observe(scope, ready_replicas=1), POLICY, IN_FORCE, state, now)
            results |= {
                "fleet_queries_per_round": observer.asked - asked,
                "fleet_observe_s": observed,
                "fleet_round_s": time.perf_counter() - began,
                "fleet_decide_ms_per_service": (time.perf_counter() - began - observed)
                / args.count
                * 1e3,
                "fleet_prometheus_cpu_s": cpu_seconds(pid) - cpu,
            }
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
