"""The whole sandbox holding a fleet: N InferenceServices running, scraped and piloted.

The local Kubernetes API, the pod runner with a pod host (one process serving every simulated
pod: a process per pod would not fit 2,000 on one machine), the real Prometheus scraping every
pod (every 15 s by default), and the operator with its autopilot on — all on this machine. Measured:
- time from the first InferenceService created until every one has a Ready pod, and until
  Prometheus has scraped every pod (`count(up == 1)`);
- then a steady window (default 60 s), without traffic: CPU seconds
  and resident memory of each part (the API and pod runner share this process), the autopilot's
  rounds (from the operator's log line per round: services ticked, failures, how long each took
  against the interval), its status writes per service per interval (none are due without
  traffic), the queries Prometheus answered per interval (the fleet round asks a constant
  number), and whether every part is still up.

`--failover` runs two operators with leader election (as the chart does) and, after the steady
window, kills the leader (SIGKILL: a node lost, an OOM kill) and measures the take-over: when the
standby holds the Lease, when its first autopilot round starts and ends and how many services it
ticked, when every service has been ticked again (from the standby's log), and the API writes the
new leader makes while it takes over, by resource.

Prometheus evaluates the autopilot's recording rules (`recorded.rule_group`, as the chart's
PrometheusRule installs them) and the round reads them; `--no-rules` leaves them out, so the
round asks the raw grouped queries.

    .venv/bin/python bench/sandbox_fleet.py [--count 2000] [--window-s 60] [--scrape-s 15]
        [--autopilot-s 15] [--runner-poll-s 2] [--no-rules] [--failover] [--json OUT]
        [--workdir DIR]

The aim (the control plane at fleet scale): 2,000 InferenceServices held on one 2-core machine,
every pod Ready and scraped, and the autopilot deciding for every service every interval.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from batchpilot.operator.autopilot import recorded  # noqa: E402
from batchpilot.sandbox import LocalKubernetesAPI  # noqa: E402
from batchpilot.sandbox.hosting import pod_host_process  # noqa: E402
from batchpilot.sandbox.operators import NAMES, lease_holder  # noqa: E402
from batchpilot.sandbox.podrunner import Endpoints, PodRunner  # noqa: E402
from batchpilot.sandbox.prometheus import prometheus_process  # noqa: E402
from fleet_autopilot import cpu_seconds  # noqa: E402
from operator_scale import memory_kib, request, wait_for  # noqa: E402

ISVCS = "/apis/batchpilot.io/v1alpha1/namespaces/default/inferenceservices"
MODEL = ROOT / "examples" / "models" / "resnet50-signature.onnx"
ROUND_LINE = re.compile(
    r"autopilot round: (\d+) services, (\d+) ticked, (\d+) failed, Prometheus "
    r"(?:answered from (its recording rules|raw queries) in ([\d.]+) s|unreachable[^,]*), "
    r"([\d.]+) s of a"
)
WINDOW_S = 60
"""The operator's metrics window (its default): the recording rules are written for it."""
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
QUERY_COUNTER = re.compile(
    rb'^prometheus_http_requests_total\{[^}]*handler="/api/v1/query(_range)?"[^}]*\} (\S+)$', re.M
)


def inference_service(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": f"svc-{index:04d}", "namespace": "default"},
        "spec": {
            "model": {"uri": f"file:///models/{MODEL.name}"},
            "runtime": {
                "device": "cpu",
                "engine": "simulated",
                "simulatedLatency": {"alphaMs": 1.52, "betaMs": 2.25},
            },
            "sla": {"latencyP99Ms": 100},
            "scaling": {"minReplicas": 1, "maxReplicas": 4},
        },
    }


def rss_mib(pid: int) -> float:
    return memory_kib(pid).get("VmRSS", 0) / 1024


def queries_answered(prometheus_url: str) -> float:
    with urllib.request.urlopen(f"{prometheus_url}/metrics", timeout=10) as response:
        return sum(float(m.group(2)) for m in QUERY_COUNTER.finditer(response.read()))


def run(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    count: int = args.count
    window_s: float = args.window_s
    models = workdir / "models"
    models.mkdir(parents=True)
    (models / MODEL.name).write_bytes(MODEL.read_bytes())
    api_cm = LocalKubernetesAPI(crds=[ROOT / "crds"], request_limit=20_000).threaded()
    with (
        api_cm as api,
        prometheus_process(
            workdir / "prometheus",
            scrape_interval_s=args.scrape_s,
            rule_groups=(
                [recorded.rule_group(WINDOW_S, "busy", interval_s=args.autopilot_s)]
                if args.rules
                else []
            ),
        ) as prom,
        pod_host_process(workdir / "podhost") as host,
    ):
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")

        def publish(endpoints: Endpoints) -> None:
            prom.set_targets(endpoints.scrape)

        runner = PodRunner(
            api.url, workdir=workdir, models_dir=models, start_delay_s=0.5,
            poll_s=args.runner_poll_s, on_endpoints=publish, pod_host=host.client,
        )  # fmt: skip
        env = {
            **os.environ,
            "BATCHPILOT_OPERATOR_PROMETHEUS_URL": prom.url,
            "BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS": str(args.autopilot_s),
            "BATCHPILOT_OPERATOR_METRICS_WINDOW_SECONDS": str(WINDOW_S),
            "BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS": "120",
        }
        names = NAMES if args.failover else ("operator",)
        operators: dict[str, subprocess.Popen[bytes]] = {}
        for name in names:
            with (workdir / f"{name}.log").open("wb") as operator_log:
                operators[name] = subprocess.Popen(
                    [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
                     "--kubeconfig", str(kubeconfig),
                     "--leader-elect" if args.failover else "--no-leader-elect"],
                    env={**env, "POD_NAME": name}, stdout=operator_log, stderr=subprocess.STDOUT,
                )  # fmt: skip
        runner.run_in_thread()
        try:
            started = time.monotonic()
            for index in range(count):
                request(api.url + ISVCS, "POST", inference_service(index))
            created_s = time.monotonic() - started
            log(f"{count} InferenceServices created in {created_s:.1f} s")

            def all_ready() -> bool:
                if any(p.poll() is not None for p in operators.values()) or (
                    host.process.poll() is not None
                ):
                    raise RuntimeError(f"a part exited; see {workdir}")
                ready = sum(r.ready for r in list(runner.replicas.values()))
                return ready >= count

            wait_for(all_ready, timeout_s=1800, what="a Ready pod per service", every=1.0)
            ready_s = time.monotonic() - started
            log(f"every service has a Ready pod after {ready_s:.1f} s")

            def all_scraped() -> bool:
                found = prom.query("count(up == 1)")
                return bool(found) and float(found[0]["value"][1]) >= count

            wait_for(all_scraped, timeout_s=300, what="every pod scraped", every=5.0)
            scraped_s = time.monotonic() - started
            log(f"Prometheus scrapes every pod after {scraped_s:.1f} s")

            leader = holder(api.url) if args.failover else names[0]
            operator = operators[leader]
            operator_log_path = workdir / f"{leader}.log"
            parts = {
                "operator": operator.pid,
                "pod host": host.process.pid,
                "prometheus": prom.process.pid,
                "API + pod runner": os.getpid(),
            }
            cpu_before = {name: cpu_seconds(pid) for name, pid in parts.items()}
            queries_before = queries_answered(prom.url)
            status_mark = api.writes.total
            log_mark = operator_log_path.stat().st_size
            window_start = time.monotonic()
            time.sleep(window_s)
            elapsed = time.monotonic() - window_start
            cpu = {n: (cpu_seconds(pid) - cpu_before[n]) / elapsed for n, pid in parts.items()}
            queries = queries_answered(prom.url) - queries_before
            status_writes = sum(
                1
                for record in api.writes.since(status_mark)
                if record.resource == "inferenceservices" and record.subresource == "status"
            )
            with operator_log_path.open("rb") as text:
                text.seek(log_mark)
                lines = text.read().decode(errors="replace").splitlines()
            round_lines = [line for line in lines if "autopilot round" in line]
            rounds = [m.groups() for line in round_lines if (m := ROUND_LINE.search(line))]
            round_s = sorted(float(r[5]) for r in rounds)
            answered = [r for r in rounds if r[3]]
            observe_s = sorted(float(r[4]) for r in answered)
            ready_now = sum(r.ready for r in list(runner.replicas.values()))
            up = prom.query("count(up == 1)")
            intervals = elapsed / args.autopilot_s
            result = {
                "inference_services": count,
                "scrape_interval_s": args.scrape_s,
                "autopilot_interval_s": args.autopilot_s,
                "runner_pass_s": args.runner_poll_s,
                "recording_rules": args.rules,
                "create_requests_s": round(created_s, 1),
                "all_ready_s": round(ready_s, 1),
                "all_scraped_s": round(scraped_s, 1),
                "window_s": round(elapsed, 1),
                "cpu_cores": {n: round(v, 3) for n, v in cpu.items()},
                "cpu_cores_total": round(sum(cpu.values()), 3),
                "rss_mib": {n: round(rss_mib(pid), 1) for n, pid in parts.items()},
                "rss_mib_per_hosted_pod": round(rss_mib(host.process.pid) / count, 3),
                "autopilot_status_writes_per_service_per_interval": round(
                    status_writes / count / intervals, 2
                ),
                "prometheus_queries_per_interval": round(queries / intervals, 1),
                "autopilot_rounds": len(rounds),
                "autopilot_round_s_median": round_s[len(round_s) // 2] if round_s else None,
                "autopilot_round_s_max": round_s[-1] if round_s else None,
                "autopilot_rounds_answered": {
                    how: sum(1 for r in answered if r[3] == how)
                    for how in ("its recording rules", "raw queries")
                },
                "autopilot_observe_s_median": (
                    observe_s[len(observe_s) // 2] if observe_s else None
                ),
                "autopilot_observe_s_max": observe_s[-1] if observe_s else None,
                "autopilot_services_ticked_per_round": sorted({int(r[1]) for r in rounds}),
                "autopilot_ticks_failed": sum(int(r[2]) for r in rounds),
                "autopilot_round_lines": [line[:200] for line in round_lines[-5:]],
                "ready_pods_at_end": ready_now,
                "scraped_pods_at_end": int(float(up[0]["value"][1])) if up else 0,
                "runner_errors": runner.errors[-5:],
            }
            if args.failover:
                result["failover"] = take_over(
                    api, operators, leader, workdir, count=count, log=log
                )
            return result
        finally:
            runner.stop()
            for process in operators.values():
                process.terminate()
            for process in operators.values():
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def holder(api_url: str) -> str:
    """Who holds the operators' Lease ("" when nobody does, or there is none yet)."""
    return lease_holder(lambda path: request(api_url + path))()


def logged_at(line: str) -> float | None:
    """The wall-clock time (epoch seconds) a log line of the operator's carries."""
    found = LOG_TIME.match(line)
    if found is None:
        return None
    stamp = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def take_over(
    api: LocalKubernetesAPI,
    operators: dict[str, subprocess.Popen[bytes]],
    leader: str,
    workdir: Path,
    *,
    count: int,
    log: Callable[[str], None],
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Kill the leader; measure until the standby has ticked every service (or `timeout_s`)."""
    standby = next(name for name in operators if name != leader)
    standby_log = workdir / f"{standby}.log"
    mark = standby_log.stat().st_size
    write_mark = api.writes.total
    killed = time.time()
    operators[leader].send_signal(signal.SIGKILL)
    operators[leader].wait()
    log(f"killed the leader {leader}")
    wait_for(lambda: holder(api.url) == standby, timeout_s=120, what="a new leader", every=0.1)
    leading_s = time.time() - killed
    log(f"{standby} holds the Lease {leading_s:.1f} s after")
    rounds: list[tuple[float, tuple[str, ...]]] = []

    def every_service_ticked() -> bool:
        if operators[standby].poll() is not None:
            raise RuntimeError(f"{standby} exited; see {standby_log}")
        with standby_log.open("rb") as text:
            text.seek(mark)
            lines = text.read().decode(errors="replace").splitlines()
        rounds[:] = [
            (at, found.groups())
            for line in lines
            if "autopilot round" in line
            and (found := ROUND_LINE.search(line))
            and (at := logged_at(line)) is not None
        ]
        return any(int(groups[1]) >= count for _, groups in rounds)

    wait_for(every_service_ticked, timeout_s=timeout_s, what="every service ticked", every=0.5)
    full = next(i for i, (_, g) in enumerate(rounds) if int(g[1]) >= count)
    until = rounds[: full + 1]  # the rounds until every service was ticked
    ticked_at = rounds[full][0]
    first_at, first = rounds[0]
    writes = collections.Counter(
        record.resource + (f"/{record.subresource}" if record.subresource else "")
        for record in api.writes.since(write_mark)
        if record.resource != "leases.coordination.k8s.io"
    )
    result = {
        "lease_taken_s": round(leading_s, 2),
        "first_round_ended_s": round(first_at - killed, 2),
        "first_round_took_s": float(first[5]),
        "first_round_services": int(first[0]),
        "first_round_ticked": int(first[1]),
        "every_service_ticked_s": round(ticked_at - killed, 2),
        "rounds_until_then": len(until),
        "ticks_failed_until_then": sum(int(g[2]) for _, g in until),
        "writes_until_then": dict(writes.most_common()),
    }
    log(f"take-over: {json.dumps(result)}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--scrape-s", type=float, default=15.0, help="Prometheus scrape interval")
    parser.add_argument("--autopilot-s", type=int, default=15, help="the autopilot's interval")
    parser.add_argument("--runner-poll-s", type=float, default=2.0, help="the pod runner's pass")
    parser.add_argument(
        "--no-rules",
        dest="rules",
        action="store_false",
        help="no recording rules in Prometheus: the round asks the raw grouped queries",
    )
    parser.add_argument(
        "--failover",
        action="store_true",
        help="two operators with leader election; after the window, kill the leader and "
        "measure the take-over",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep every part's files and logs here"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batchpilot-fleet-") as tmp:
        workdir = args.workdir or Path(tmp)
        result = run(args, workdir, lambda m: print(m, flush=True))
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
