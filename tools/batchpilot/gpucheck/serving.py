"""The runtime and the load generator as the GPU check drives them: the server a real process,
`batchpilot runtime serve --engine torch`, and `batchpilot loadgen` run in this process, each read
through what it publishes (the server's /metrics, the load generator's JSON report).

The server is started as `python -m batchpilot.runtime.cli …`, the code the `batchpilot` command
runs, so the check works from a source tree on a machine where the project is not installed. The
load generator is the same command's code called in-process (`run_cli`, arguments, exit status
and JSON report as on the command line): its own process would add an interpreter's start, a
second or more, to each of the check's four runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
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

from batchpilot.runtime.loadgen.cli import run_cli

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

    def configure(self, *, max_batch: int, delay_ms: float, timeout_s: float = 30) -> None:
        """New batch settings, as the operator gives a running pod a new ConfigMap: the batching
        document written over the file the server watches, then awaited on its gauges."""
        path = self.batching_path
        document = {"maxBatchSize": max_batch, "maxQueueDelayMs": delay_ms}
        staged = path.with_suffix(".new")
        staged.write_text(json.dumps(document))
        staged.replace(path)  # a new inode: the watcher sees the change whatever the clock says
        deadline = time.monotonic() + timeout_s
        while True:
            scrape = self.scrape()
            batch = scrape.total("batchpilot_batching_max_batch_size")
            delay_s = scrape.total("batchpilot_batching_max_queue_delay_seconds")
            if batch == max_batch and math.isclose(delay_s, delay_ms / 1e3, abs_tol=1e-9):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the runtime did not apply {document} in {timeout_s:g} s")
            time.sleep(0.05)

    @property
    def batching_path(self) -> Path:
        return self.log_path.with_suffix(".batching.json")


@contextlib.contextmanager
def serve(
    model: Path, *args: str, name: str, log_path: Path, ready_timeout_s: float
) -> Iterator[Server]:
    """`batchpilot runtime serve --engine torch` for `model`, ready; SIGTERM on exit. Its batch
    settings can change while it serves (`Server.configure`): it watches a batching document
    beside its log, as a pod watches its ConfigMap, at a tenth of a pod's poll interval."""
    port = free_port()
    batching = log_path.with_suffix(".batching.json")
    batching.unlink(missing_ok=True)
    command = [
        *CLI, "runtime", "serve", "--engine", "torch", "--model", str(model), "--name", name,
        "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(free_port()),
        "--batching-config", str(batching),
        # Nothing routes to this server: on SIGTERM it may close its port at once.
        "--drain-linger-s", "0", *args,
    ]  # fmt: skip
    env = {**os.environ, "BATCHPILOT_CONFIG_POLL_S": "0.1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
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


def loadgen(url: str, model: str, *args: str, out: Path) -> dict[str, Any]:
    """`batchpilot loadgen --url URL --model MODEL ARGS --json OUT`, its report as a dict; what it
    prints goes to OUT's .txt beside it. Exit status 3 (an invalid run or probe) still leaves a
    report: the check records it as such."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        status = run_cli(["--url", url, "--model", model, *args, "--json", str(out)])
    out.with_suffix(".txt").write_text(printed.getvalue())
    if status not in (0, 3) or not out.exists():
        raise RuntimeError(f"loadgen failed ({status}):\n{printed.getvalue()}")
    report: dict[str, Any] = json.loads(out.read_text())
    report["exit_status"] = status
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
        # The first reading, at once, is the baseline the next one's arrivals are compared with:
        # a short run still gets its readings.
        while True:
            with contextlib.suppress(OSError, ValueError):
                scrape = self._server.scrape()
                arrivals = scrape.total("batchpilot_arrivals_total")
                loaded = self._arrivals is not None and arrivals > self._arrivals
                self._arrivals = arrivals
                if loaded and scrape.has("batchpilot_gpu_utilization_ratio"):
                    self.values.append(scrape.total("batchpilot_gpu_utilization_ratio"))
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None
