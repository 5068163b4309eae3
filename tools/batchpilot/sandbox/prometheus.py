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
    command: Sequence[str] = ()
    """What started it: `restart` starts it again on the same port and data."""
    log_path: Path | None = None

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

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def restart(self, *, ready_timeout_s: float = 30) -> None:
        """Start it again after `stop`, on the same port, configuration and data (what it
        scraped before is there; the time it was down is a gap)."""
        if self.running:
            return
        self.process = _start(self.command, self.log_path)
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                log = self.log_path.read_text()[-2000:] if self.log_path is not None else ""
                raise RuntimeError(log)
            with (
                contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response,
            ):
                if response.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready within {timeout_s} s")
            time.sleep(0.05)


def _start(command: Sequence[str], log_path: Path | None) -> subprocess.Popen[bytes]:
    with (log_path or Path("/dev/null")).open("ab") as log:
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)


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
    command = [
        prometheus_binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--storage.tsdb.retention.time={retention}",
    ]
    log_path = workdir / "prometheus.log"
    log_path.write_bytes(b"")
    running = PrometheusProcess(_start(command, log_path), port, targets, command, log_path)
    try:
        running.wait_ready(ready_timeout_s)
        yield running
    finally:
        running.stop()
