"""Run the real Prometheus server (Debian's package) on a loopback port, for tests."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runtime_process import free_port


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus is not installed: `make install` installs it (apt)")
    return path


@dataclass
class PrometheusProcess:
    process: subprocess.Popen[bytes]
    port: int
    targets_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_targets(self, targets: Sequence[str], labels: dict[str, str] | None = None) -> None:
        """Replace the scrape targets (file-based service discovery, re-read on change)."""
        doc = [{"targets": list(targets), "labels": labels or {}}]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.targets_file)

    def query(self, text: str) -> list[dict[str, object]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": text})
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())["data"]["result"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def prometheus_process(
    workdir: Path, *, scrape_interval_s: float = 1.0
) -> Iterator[PrometheusProcess]:
    port = free_port()
    targets = workdir / "targets.json"
    targets.write_text("[]")
    config = workdir / "prometheus.yml"
    config.write_text(
        f"""
global:
  scrape_interval: {round(scrape_interval_s * 1000)}ms
  evaluation_interval: {round(scrape_interval_s * 1000)}ms
scrape_configs:
  - job_name: batchpilot-runtime
    file_sd_configs:
      - files: [{targets}]
        refresh_interval: 1s
"""
    )
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    running = PrometheusProcess(process, port, targets)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError((workdir / "prometheus.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{running.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("prometheus not ready within 30 s")
            time.sleep(0.05)
        yield running
    finally:
        running.stop()
        log.close()
