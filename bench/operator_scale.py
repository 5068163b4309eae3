"""Reconcile N InferenceServices on the local Kubernetes API: how fast, how many writes, how much
memory.

The operator runs as its own process (`batchpilot operator run`) against the local API, as it
would against a cluster. Measured:
- time from the first InferenceService created until every one of them has all its children;
- API writes per InferenceService while creating (children, status, Events);
- API writes during idle periodic reconcile passes over all N (must be 0);
- the operator's resident memory (peak and at the end).

The autopilot is kept out of the measurement (its interval is set beyond the run): it writes
status every interval by design, while reconcile must write nothing when nothing changed.

Usage: python bench/operator_scale.py [--count 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchpilot.sandbox import LocalKubernetesAPI  # noqa: E402

ISVCS = "/apis/batchpilot.io/v1alpha1/namespaces/default/inferenceservices"
CHILDREN = {
    "deployments.apps": "/apis/apps/v1/namespaces/default/deployments",
    "services": "/api/v1/namespaces/default/services",
    "configmaps": "/api/v1/namespaces/default/configmaps",
    "secrets": "/api/v1/namespaces/default/secrets",
}
RECONCILE_INTERVAL_S = 10


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


def run(count: int, workdir: Path) -> dict[str, Any]:
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        env = {
            **os.environ,
            "BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS": str(RECONCILE_INTERVAL_S),
            "BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS": "86400",
            "BATCHPILOT_OPERATOR_PROMETHEUS_URL": "http://127.0.0.1:9",
        }
        log = (workdir / "operator.log").open("wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
             "--kubeconfig", str(kubeconfig)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            time.sleep(2)  # let it start watching
            idle_memory = memory_kib(operator.pid)
            start_writes = api.writes.total
            started = time.monotonic()
            for index in range(count):
                request(api.url + ISVCS, "POST", inference_service(index))
            created_s = time.monotonic() - started
            deadline = started + 600
            while True:
                counts = {
                    name: len(request(api.url + path)["items"]) for name, path in CHILDREN.items()
                }
                if all(n >= count for n in counts.values()):
                    break
                if time.monotonic() > deadline or operator.poll() is not None:
                    raise RuntimeError(f"children incomplete: {counts}; see {log.name}")
                time.sleep(0.2)
            converged_s = time.monotonic() - started
            # Let the last status writes and Events land, then measure idle passes.
            time.sleep(3)
            create_writes = api.writes.total - start_writes
            by_resource = api.writes.by_resource()
            idle_mark = api.writes.total
            time.sleep(2 * RECONCILE_INTERVAL_S + 1)
            idle_writes = api.writes.total - idle_mark
            memory = memory_kib(operator.pid)
        finally:
            operator.terminate()
            operator.wait(timeout=30)
            log.close()
    return {
        "inference_services": count,
        "create_requests_s": round(created_s, 2),
        "all_children_exist_s": round(converged_s, 2),
        "writes_on_create": create_writes,
        "writes_per_object_on_create": round(create_writes / count, 2),
        "writes_by_resource": by_resource,
        "idle_passes_watched": 2,
        "writes_on_idle_passes": idle_writes,
        "operator_rss_mib": round(memory.get("VmRSS", 0) / 1024, 1),
        "operator_peak_rss_mib": round(memory.get("VmHWM", 0) / 1024, 1),
        "operator_rss_before_mib": round(idle_memory.get("VmRSS", 0) / 1024, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.count, Path(tmp))
    for key, value in result.items():
        print(f"{key:32} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["writes_on_idle_passes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
