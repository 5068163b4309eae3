"""What a simulated pod costs in the sandbox's pod host: memory per pod, idle CPU, loop stalls.

The sandbox must hold 2,000 InferenceServices on one small machine; the pod host serves their
simulated pods from one process (tools/batchpilot/sandbox/podhost.py). This starts a host, adds
N pods through its control API as the pod runner does (each with its batching file, admin token
and a metrics port, on the tiny MLP model), and measures:
- the host's resident memory before and after, and per pod; the time to add them;
- the host's CPU while idle, in cores, twice over `--idle-s`: with no traffic at all, then with
  every pod's /metrics scraped every `--scrape-interval-s` (spread evenly and over keep-alive
  connections, as Prometheus scrapes), the scrapes' own cost included, and per scrape;
- the longest answer of the control port's /healthz, probed every 100 ms through both windows:
  how long the loop stalls (a collector pass, a burst of timers) for every pod at once;
- the time SIGTERM takes to drain every pod, and the exit status.
Aims (issue 14): 2,000 pods well under 2 GiB, so under ~0.9 MiB per pod; idle with scrapes a
small fraction of a core.

Usage: python bench/podhost_scale.py [--pods 500] [--idle-s 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import onnx_models  # noqa: E402

from batchpilot.sandbox.prometheus import free_ports  # noqa: E402

_HZ = os.sysconf("SC_CLK_TCK")
AIMS = {"rss_mib_per_pod_max": 0.9, "idle_scraped_cores_max": 0.1}


def call(url: str, method: str = "GET", body: Any = None, *, timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ  # utime, stime


def pod_body(name: str, model: Path, directory: Path) -> tuple[dict[str, Any], int]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "admin-token").write_text(f"token-{name}\n")
    (directory / "batching.json").write_text('{"maxBatchSize": 8, "maxQueueDelayMs": 5}')
    port, admin_port, metrics_port = free_ports(3)
    args = [
        "--name", "mlp", "--engine", "simulated", "--simulated-latency", "alpha_ms=5,beta_ms=1",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--batching-config", str(directory / "batching.json"),
        "--admin-token-file", str(directory / "admin-token"),
        "--admin-port", str(admin_port), "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    env = {"BATCHPILOT_ISVC_NAME": name, "BATCHPILOT_ISVC_NAMESPACE": "bench"}
    return {"args": args, "env": env}, metrics_port


class Prober(threading.Thread):
    """/healthz every 100 ms; the longest answer seen (a loop stall shows here)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.worst_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            started = time.perf_counter()
            with contextlib.suppress(OSError):
                call(self.url + "/healthz", timeout=10)
            self.worst_s = max(self.worst_s, time.perf_counter() - started)


class Scraper:
    """GET /metrics over one keep-alive connection per target, as Prometheus scrapes."""

    def __init__(self) -> None:
        self.connections: dict[int, http.client.HTTPConnection] = {}

    def scrape(self, port: int) -> None:
        for _ in range(2):  # a connection the server closed meanwhile: once more, on a new one
            connection = self.connections.get(port)
            if connection is None:
                connection = self.connections[port] = http.client.HTTPConnection(
                    "127.0.0.1", port, timeout=10
                )
            try:
                connection.request("GET", "/metrics")
                response = connection.getresponse()
                response.read()
                return
            except (OSError, http.client.HTTPException):
                connection.close()
                del self.connections[port]

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()


def idle_cores(pid: int, seconds: float, *, scrape: list[int], interval_s: float) -> float:
    """The host's CPU over `seconds`, in cores; each port in `scrape` scraped every
    `interval_s`, spread evenly."""
    scraper = Scraper()
    start_cpu, start = cpu_s(pid), time.monotonic()
    step = interval_s / len(scrape) if scrape else seconds
    i = 0
    while (now := time.monotonic()) < start + seconds:
        if scrape:
            scraper.scrape(scrape[i % len(scrape)])
            i += 1
        time.sleep(max(0.0, start + i * step - time.monotonic()) if scrape else 0.5)
    used = cpu_s(pid) - start_cpu
    scraper.close()
    return used / (now - start)


def start_host(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The sandbox's pod host, once its control port answers: the process and the port's URL
    (its log in `work`/podhost.log)."""
    (control,) = free_ports(1)
    url = f"http://127.0.0.1:{control}"
    with (work / "podhost.log").open("wb") as log:
        host = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.sandbox.podhost", "--control-port", str(control)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError):
            call(url + "/healthz", timeout=1)
            return host, url
        if host.poll() is not None or time.monotonic() > deadline:
            host.kill()
            host.wait()
            raise RuntimeError((work / "podhost.log").read_text()[-2000:])
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--scrape-interval-s", type=float, default=15.0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="podhost-scale-"))
    model = onnx_models.mlp(work / "mlp.onnx")
    host, url = start_host(work)
    result: dict[str, Any] = {"pods": options.pods}
    try:
        result["rss_mib_empty"] = round(rss_mib(host.pid), 1)
        metrics_ports = []
        started = time.monotonic()
        for n in range(options.pods):
            body, metrics_port = pod_body(f"pod-{n}", model, work / f"pod-{n}")
            call(f"{url}/pods/pod-{n}", "PUT", body)
            metrics_ports.append(metrics_port)
        result["add_s"] = round(time.monotonic() - started, 1)
        listing = json.loads(call(url + "/pods"))["pods"]
        result["ready"] = sum(p["ready"] for p in listing.values())
        time.sleep(2)  # the last start-ups' garbage collected
        result["rss_mib_full"] = round(rss_mib(host.pid), 1)
        per_pod = (result["rss_mib_full"] - result["rss_mib_empty"]) / options.pods
        result["rss_mib_per_pod"] = round(per_pod, 3)
        result["rss_mib_2000_pods_estimate"] = round(result["rss_mib_empty"] + 2000 * per_pod)
        prober = Prober(url)
        prober.start()
        result["idle_cores"] = round(
            idle_cores(host.pid, options.idle_s, scrape=[], interval_s=options.scrape_interval_s),
            4,
        )
        result["idle_scraped_cores"] = round(
            idle_cores(
                host.pid,
                options.idle_s,
                scrape=metrics_ports,
                interval_s=options.scrape_interval_s,
            ),
            4,
        )
        scrapes_per_s = options.pods / options.scrape_interval_s
        per_scrape_s = (result["idle_scraped_cores"] - result["idle_cores"]) / scrapes_per_s
        result["cpu_ms_per_scrape"] = round(per_scrape_s * 1e3, 2)
        # Idle grows with the pods (the file checks), scrapes with their rate.
        result["idle_scraped_cores_2000_pods_estimate"] = round(
            result["idle_cores"] * 2000 / options.pods
            + per_scrape_s * 2000 / options.scrape_interval_s,
            3,
        )
        prober.stop.set()
        prober.join()
        result["healthz_worst_ms"] = round(prober.worst_s * 1e3, 1)
        result["rss_mib_after_idle"] = round(rss_mib(host.pid), 1)
        started = time.monotonic()
        host.send_signal(signal.SIGTERM)
        result["exit_status"] = host.wait(timeout=120)
        result["sigterm_drain_s"] = round(time.monotonic() - started, 1)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    result["aims"] = AIMS
    result["meets_aims"] = (
        result.get("rss_mib_per_pod", 1e9) <= AIMS["rss_mib_per_pod_max"]
        and result.get("idle_scraped_cores", 1e9) <= AIMS["idle_scraped_cores_max"]
    )
    print(json.dumps(result, indent=2))
    if options.json is not None:
        options.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
