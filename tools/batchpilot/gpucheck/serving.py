"""The runtime and the load generator as the GPU check drives them: real processes, the
`batchpilot runtime serve --engine torch` server and `batchpilot loadgen`, read through what they
publish (the server's /metrics, the load generator's JSON report).

Both are started as `python -m batchpilot.runtime.cli …`, the code the `batchpilot` command runs,
so the check works from a source tree on a machine where the project is not installed.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

CLI = [sys.executable, "-m", "batchpilot.runtime.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Scrape:
    """One reading of the server's /metrics."""

    def __init__(self, samples: Sequence[Sample], at: float) -> None:
        self.samples = list(samples)
        self.at = at

    def total(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.samples:
            if s.name == name and label in s.labels:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)


def histogram_quantile(q: float, before: Scrape, after: Scrape, name: str) -> float | None:
    """Prometheus's histogram_quantile over the increase between two scrapes (linear inside the
    bucket); None without observations."""
    start, end = before.by_label(f"{name}_bucket", "le"), after.by_label(f"{name}_bucket", "le")
    buckets = sorted((float(le), end[le] - start.get(le, 0.0)) for le in end)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_edge, lower_count = 0.0, 0.0
    for edge, count in buckets:
        if count >= rank:
            if math.isinf(edge):
                return lower_edge
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_edge + (edge - lower_edge) * share
        lower_edge, lower_count = edge, count
    return lower_edge


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def scrape(self) -> Scrape:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return Scrape(
            [
                Sample(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text)
                for s in family.samples
            ],
            at=time.monotonic(),
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def serve(
    model: Path, *args: str, name: str, log_path: Path, ready_timeout_s: float
) -> Iterator[Server]:
    """`batchpilot runtime serve --engine torch` for `model`, ready; SIGTERM on exit."""
    port = free_port()
    command = [
        *CLI, "runtime", "serve", "--engine", "torch", "--model", str(model), "--name", name,
        "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(free_port()), *args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the runtime exited with {process.returncode}:\n{server.log()}")
            try:
                with urllib.request.urlopen(f"{server.url}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the runtime was not ready in {ready_timeout_s:g} s")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def loadgen(url: str, model: str, *args: str, out: Path, timeout_s: float) -> dict[str, Any]:
    """`batchpilot loadgen --url URL --model MODEL ARGS --json OUT`, its report as a dict. Exit
    status 3 (an invalid run or probe) still leaves a report: the check records it as such."""
    command = [*CLI, "loadgen", "--url", url, "--model", model, *args, "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode not in (0, 3) or not out.exists():
        raise RuntimeError(f"loadgen failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    report: dict[str, Any] = json.loads(out.read_text())
    report["exit_status"] = done.returncode
    return report


class GaugeSampler:
    """Reads the server's NVML utilization gauge every `interval_s` on a thread of its own, for
    the mean over a run (NVML's own figure is a short moving window). Only readings taken while
    requests arrive count: the load generator's own start is not part of the run."""

    def __init__(self, server: Server, *, interval_s: float = 0.5) -> None:
        self._server = server
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.values: list[float] = []
        self._arrivals: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(OSError, ValueError):
                scrape = self._server.scrape()
                arrivals = scrape.total("batchpilot_arrivals_total")
                loaded = self._arrivals is not None and arrivals > self._arrivals
                self._arrivals = arrivals
                if loaded and scrape.has("batchpilot_gpu_utilization_ratio"):
                    self.values.append(scrape.total("batchpilot_gpu_utilization_ratio"))

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None
