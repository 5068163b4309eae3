"""Run the real Prometheus server (Debian's package) on a loopback port, for the sandbox.

The sandbox's pod runner knows where the runtime processes listen; it writes them into a
file-based service discovery file, which Prometheus re-reads within a second. That is the
same contract a PodMonitor gives on a real cluster, with the file standing in for the
Kubernetes service discovery.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchpilot.sandbox.processes import stop_processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket stays bound until all are chosen (one at a time,
    the kernel may hand out the port it just took back — two listeners of one process on one
    port)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


class PrometheusMissing(RuntimeError):
    """The prometheus binary is not installed."""


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    if path is None:
        raise PrometheusMissing("prometheus is not installed: `make install` installs it (apt)")
    return path


@dataclass
class PrometheusProcess:
    process: subprocess.Popen[bytes]
    port: int
    targets_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_targets(self, groups: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Replace the scrape targets: one (host:port, labels) per target, written atomically."""
        doc = [{"targets": [target], "labels": dict(labels)} for target, labels in groups]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.targets_file)

    def query(self, text: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": text})
        with urllib.request.urlopen(url, timeout=2) as response:
            return list(json.loads(response.read())["data"]["result"])

    def stop(self) -> None:
        stop_processes([self.process], grace_s=10)


@contextlib.contextmanager
def prometheus_process(
    workdir: Path,
    *,
    scrape_interval_s: float = 1.0,
    ready_timeout_s: float = 30,
    retention: str = "1h",
    rule_groups: Sequence[Mapping[str, Any]] = (),
) -> Iterator[PrometheusProcess]:
    """A Prometheus with file-based discovery under `workdir`; stopped on exit. Its data is
    `workdir/data`, which may hold backfilled blocks (kept for `retention`). `rule_groups`:
    recording rule groups to evaluate (a rule file's `groups`, e.g. the autopilot's
    `recorded.rule_group`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    targets = workdir / "targets.json"
    targets.write_text("[]")
    config = workdir / "prometheus.yml"
    rules = workdir / "rules.yml"
    rules.write_text(json.dumps({"groups": list(rule_groups)}))  # JSON is YAML
    interval = f"{round(scrape_interval_s * 1000)}ms"
    config.write_text(
        f"""
global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
rule_files: [{rules}]
scrape_configs:
  - job_name: batchpilot-runtime
    file_sd_configs:
      - files: [{targets}]
        refresh_interval: 1s
"""
    )
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.retention.time={retention}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    running = PrometheusProcess(process, port, targets)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError((workdir / "prometheus.log").read_text()[-2000:])
            with (
                contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                urllib.request.urlopen(f"{running.url}/-/ready", timeout=1) as response,
            ):
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready within {ready_timeout_s} s")
            time.sleep(0.05)
        yield running
    finally:
        running.stop()
