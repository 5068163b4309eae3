"""What a round of the autopilot costs while Prometheus does not answer: every service's pods
read on their admin port (`GET /admin/metrics`, `autopilot/pod_metrics.py`) instead of one
Prometheus round.

Starts the sandbox's pod host with `--pods` simulated pods (two per service, added as
`podhost_scale.py` adds them), then runs rounds as the operator's fleet does — every service's
`PodScraper` call on `--workers` threads — and measures each round's wall time against the
autopilot's interval, and what a pod's read costs. A window needs two reads: as the fleet's
first round without Prometheus does, every service is `prime`d first (measured apart: the
first round's extra cost, beside the first window it waits), so that every round, the first
included, makes observations, and each must have every pod in it.

Usage: python bench/blind_round.py [--pods 400] [--rounds 3] [--workers 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import onnx_models  # noqa: E402

from batchpilot.operator.autopilot.pod_metrics import PodScraper  # noqa: E402
from batchpilot.operator.children.common import Owner  # noqa: E402
from batchpilot.operator.spec import InferenceServiceSpec  # noqa: E402
from podhost_scale import call, cpu_s, pod_body, start_host  # noqa: E402

INTERVAL_S = 15.0
"""The autopilot's default interval: a round longer than this delays the next."""


class ServicePods:
    """Each service's ready pods' admin endpoints, as the watch cache lists them."""

    def __init__(self, endpoints: dict[str, list[str]]) -> None:
        self.endpoints = endpoints

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return self.endpoints[next(iter(selector.values()))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="blind-round-"))
    model = onnx_models.mlp(work / "mlp.onnx")
    host, url = start_host(work)
    result: dict[str, Any] = {"pods": options.pods, "workers": options.workers}
    try:
        services: dict[str, list[str]] = {}
        for n in range(options.pods):
            name = f"svc-{n // 2}"
            body, _ = pod_body(f"pod-{n}", model, work / f"pod-{n}")
            call(f"{url}/pods/pod-{n}", "PUT", body)
            admin_port = body["args"][body["args"].index("--admin-port") + 1]
            services.setdefault(name, []).append(f"127.0.0.1:{admin_port}")
        spec = InferenceServiceSpec.model_validate(
            {"model": {"uri": "pvc://models/mlp.onnx"}, "sla": {"latencyP99Ms": 100}}
        )
        owners = [Owner(name=name, namespace="bench", uid=name, spec=spec) for name in services]
        scraper = PodScraper(ServicePods(services))
        result["services"] = len(owners)
        rounds = []
        with ThreadPoolExecutor(options.workers) as pool:
            host_cpu, started = cpu_s(host.pid), time.monotonic()
            primed = sum(pool.map(lambda o: scraper.prime(o.namespace, o.name), owners))
            took = time.monotonic() - started
            result["prime"] = {
                "services": primed,
                "seconds": round(took, 2),
                "of_interval": round(took / INTERVAL_S, 3),
                "pod_host_cpu_s": round(cpu_s(host.pid) - host_cpu, 2),
            }
            print(json.dumps(result["prime"]), flush=True)
            for n in range(options.rounds):
                time.sleep(1.0)  # a window of at least a second between the reads
                host_cpu, started = cpu_s(host.pid), time.monotonic()
                seen = list(
                    pool.map(lambda o: scraper(o, ready_replicas=2, at=time.time()), owners)
                )
                took = time.monotonic() - started
                whole = sum(1 for s in seen if s is not None and s.reporting_replicas == 2)
                rounds.append(
                    {
                        "round": n + 1,
                        "seconds": round(took, 2),
                        "ms_per_pod": round(took * 1e3 / options.pods, 2),
                        "of_interval": round(took / INTERVAL_S, 3),
                        "observations_with_every_pod": whole,
                        "pod_host_cpu_s": round(cpu_s(host.pid) - host_cpu, 2),
                    }
                )
                print(json.dumps(rounds[-1]), flush=True)
        result["rounds"] = rounds
    finally:
        host.terminate()
        host.wait(timeout=60)
    print(json.dumps(result, indent=2))
    if options.json is not None:
        options.json.write_text(json.dumps(result, indent=2))
    whole = all(r["observations_with_every_pod"] == result["services"] for r in result["rounds"])
    return 0 if whole and result["prime"]["services"] == result["services"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
