"""Reconcile N InferenceServices on the local Kubernetes API, for several N: how fast, how many
writes and reads, how much memory — and whether the cost per service stays flat.

The operator runs as its own process (`batchpilot operator run`) against a fresh local API for
each N, as it would against a cluster. Measured per N:
- time from the first InferenceService created until every one of them has all its children;
- API writes per InferenceService while creating (children, status, Events);
- during two idle periodic passes over all N: the writes (must be 0), the reads by kind (GETs of
  one object, lists; the watch-fed cache makes them 0), and the passes that ran (kopf's log
  line for each timer run), so that "nothing happened" is not mistaken for "nothing ran";
- the operator's resident memory (peak and at the end).
Then, across the counts: the time of the largest N over the smallest's, against the count ratio
(aim: 2,000 take at most 10x the time of 200), 0 idle writes, RSS < 300 MiB at the largest N.

The autopilot is kept out of the measurement (its interval is set beyond the run): it writes
status every interval by design, while reconcile must write nothing when nothing changed.

Usage: python bench/operator_scale.py [--counts 200,1000,2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchpilot.sandbox import LocalKubernetesAPI  # noqa: E402

ISVCS = "/apis/batchpilot.io/v1alpha1/namespaces/default/inferenceservices"
CHILDREN = ("deployments.apps", "services", "configmaps", "secrets")
RECONCILE_INTERVAL_S = 10
IDLE_PASSES = 2
TIMER_RAN = b"Timer 'reconcile_periodically' succeeded"
REQUEST_LIMIT = 100_000
"""The emulator keeps the newest requests only: enough for the idle window's reads."""
AIMS = {"time_ratio_max": 10.0, "rss_mib_max": 300.0}


def request(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as response:
        return json.loads(response.read())


def inference_service(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": f"svc-{index:04d}", "namespace": "default"},
        "spec": {
            "model": {"uri": f"pvc://models/svc-{index}/model.onnx"},
            "runtime": {"device": "gpu" if index % 2 else "cpu"},
            "sla": {"latencyP99Ms": 100},
            "scaling": {"minReplicas": 1, "maxReplicas": 4},
        },
    }


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def wait_for(condition: Callable[[], bool], *, timeout_s: float, what: str, every: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every)


class Created:
    """Children created so far, by resource, read incrementally from the API's write log (a
    list over HTTP of 2,000 Deployments every poll would cost the API more than the operator)."""

    def __init__(self, api: LocalKubernetesAPI, mark: int) -> None:
        self._api = api
        self._mark = mark
        self.counts: collections.Counter[str] = collections.Counter()

    def update(self) -> collections.Counter[str]:
        total = self._api.writes.total
        for record in self._api.writes.since(self._mark):
            if record.method == "POST" and record.code < 300 and not record.subresource:
                self.counts[record.resource] += 1
        self._mark = total
        return self.counts


def next_request_id(api: LocalKubernetesAPI) -> int:
    return api.call(lambda: max((r.id for r in api.emulator), default=-1) + 1)


def reads_since(api: LocalKubernetesAPI, first_id: int) -> dict[str, int]:
    """GETs of one object (`get …`) and lists (`list …`) by resource since a request id; watches
    are not reads of this kind."""

    def collect() -> dict[str, int]:
        counts: collections.Counter[str] = collections.Counter()
        for r in api.emulator:
            if r.id < first_id or r.method != kmock.method.GET or r.resource is None:
                continue
            verb = {kmock.action.FETCH: "get", kmock.action.LIST: "list"}.get(r.action)
            if verb is not None:
                counts[f"{verb} {r.resource.plural}"] += 1
        return dict(sorted(counts.items()))

    return api.call(collect)


def quiet(api: LocalKubernetesAPI, *, for_s: float, timeout_s: float) -> None:
    """Until no write has reached the API for `for_s` (the last status writes and Events)."""
    deadline = time.monotonic() + timeout_s
    last, since = api.writes.total, time.monotonic()
    while time.monotonic() - since < for_s:
        if time.monotonic() > deadline:
            raise RuntimeError("the API never went quiet")
        time.sleep(0.25)
        if api.writes.total != last:
            last, since = api.writes.total, time.monotonic()


def run(count: int, workdir: Path) -> dict[str, Any]:
    with LocalKubernetesAPI(crds=[ROOT / "crds"], request_limit=REQUEST_LIMIT).threaded() as api:
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        env = {
            **os.environ,
            "BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS": str(RECONCILE_INTERVAL_S),
            "BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS": "86400",
            "BATCHPILOT_OPERATOR_PROMETHEUS_URL": "http://127.0.0.1:9",
        }
        log_path = workdir / f"operator-{count}.log"
        log = log_path.open("wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
             "--kubeconfig", str(kubeconfig)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(
                lambda: any(
                    r.action == kmock.action.WATCH
                    and r.resource is not None
                    and r.resource.plural == "inferenceservices"
                    for r in api.call(lambda: list(api.emulator))
                ),
                timeout_s=60,
                what="the operator's watch",
                every=0.2,
            )
            idle_memory = memory_kib(operator.pid)
            start_writes = api.writes.total
            created = Created(api, start_writes)
            started = time.monotonic()
            for index in range(count):
                request(api.url + ISVCS, "POST", inference_service(index))
            created_s = time.monotonic() - started

            def complete() -> bool:
                if operator.poll() is not None:
                    raise RuntimeError(f"the operator exited; see {log_path}")
                counts = created.update()
                return all(counts[resource] >= count for resource in CHILDREN)

            wait_for(complete, timeout_s=900, what="every child", every=0.25)
            converged_s = time.monotonic() - started
            quiet(api, for_s=2, timeout_s=300)
            create_writes = api.writes.total - start_writes
            by_resource = api.writes.by_resource()

            idle_writes_mark = api.writes.total
            idle_reads_mark = next_request_id(api)
            log.flush()
            log_mark = log_path.stat().st_size
            time.sleep(IDLE_PASSES * RECONCILE_INTERVAL_S + 1)
            idle_writes = api.writes.since(idle_writes_mark)
            idle_reads = reads_since(api, idle_reads_mark)
            with log_path.open("rb") as text:
                text.seek(log_mark)
                passes = text.read().count(TIMER_RAN)
            memory = memory_kib(operator.pid)
        finally:
            operator.terminate()
            try:
                operator.wait(timeout=5)
            except subprocess.TimeoutExpired:  # kopf winding down 2,000 timers: not measured
                operator.kill()
                operator.wait(timeout=30)
            log.close()
    return {
        "inference_services": count,
        "create_requests_s": round(created_s, 2),
        "all_children_exist_s": round(converged_s, 2),
        "ms_per_service": round(1000 * converged_s / count, 1),
        "writes_on_create": create_writes,
        "writes_per_object_on_create": round(create_writes / count, 2),
        "writes_by_resource": by_resource,
        "idle_window_s": IDLE_PASSES * RECONCILE_INTERVAL_S + 1,
        "idle_passes_ran": passes,
        "idle_passes_expected": IDLE_PASSES * count,
        "writes_on_idle_passes": len(idle_writes),
        "idle_writes_seen": [str(w) for w in idle_writes[:10]],
        "reads_on_idle_passes": sum(idle_reads.values()),
        "reads_on_idle_passes_by_kind": idle_reads,
        "operator_rss_mib": round(memory.get("VmRSS", 0) / 1024, 1),
        "operator_peak_rss_mib": round(memory.get("VmHWM", 0) / 1024, 1),
        "operator_rss_before_mib": round(idle_memory.get("VmRSS", 0) / 1024, 1),
    }


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest N against the smallest: is the cost per service flat?"""
    small, large = results[0], results[-1]
    time_ratio = large["all_children_exist_s"] / small["all_children_exist_s"]
    count_ratio = large["inference_services"] / small["inference_services"]
    rss = large["operator_rss_mib"]
    idle_writes = sum(r["writes_on_idle_passes"] for r in results)
    return {
        "counts": [r["inference_services"] for r in results],
        "time_ratio": round(time_ratio, 2),
        "count_ratio": round(count_ratio, 2),
        "cost_per_service_ratio": round(time_ratio / count_ratio, 2),
        "idle_writes": idle_writes,
        "idle_reads": sum(r["reads_on_idle_passes"] for r in results),
        "largest_rss_mib": rss,
        "aims": AIMS,
        "time_aim_met": time_ratio <= AIMS["time_ratio_max"],
        "idle_writes_aim_met": idle_writes == 0,
        "rss_aim_met": rss < AIMS["rss_mib_max"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--counts",
        default="200,1000,2000",
        help="InferenceServices per run, comma-separated, smallest first (default 200,1000,2000)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep-logs", type=Path, help="copy the operator's logs into this folder")
    args = parser.parse_args()
    counts = sorted(int(c) for c in args.counts.split(","))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            result = run(count, Path(tmp))
            results.append(result)
            print(f"--- {count} InferenceServices", flush=True)
            for key, value in result.items():
                print(f"  {key:32} {value}", flush=True)
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                (args.keep_logs / f"operator-{count}.log").write_bytes(
                    (Path(tmp) / f"operator-{count}.log").read_bytes()
                )
    report = {"runs": results, "summary": summary(results)}
    print("--- summary")
    for key, value in report["summary"].items():
        print(f"  {key:32} {value}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    met = report["summary"]
    return 0 if met["idle_writes_aim_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
