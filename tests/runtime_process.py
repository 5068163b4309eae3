"""Run `batchpilot runtime serve` as a real process on a loopback port, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from batchpilot.sandbox.prometheus import free_ports


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class RuntimeProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    grpc_port: int | None = None
    """The gRPC service's port when started with `grpc=True`."""
    admin_port: int = 0
    """The admin endpoint's port (`--admin-port`): PUT /admin/batching is answered only there."""
    metrics_port: int | None = None
    """`--metrics-port` when started with one; /metrics is on the inference port otherwise."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, *, timeout_s: float = 30) -> int:
        """SIGTERM, then wait for the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def wait_ready(url: str, process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """Wait until /v2/health/ready answers 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"runtime exited with status {process.returncode} before ready")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"runtime at {url} not ready within {timeout_s} s")


@contextlib.contextmanager
def runtime_process(
    model: Path,
    *args: str,
    log_dir: Path,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 30,
    grpc: bool = False,
) -> Iterator[RuntimeProcess]:
    """Start a server for `model` with extra CLI `args` (and a gRPC port when `grpc`; a free
    admin port unless `args` name one); SIGTERM it on exit."""
    port, spare_grpc, spare_admin = free_ports(3)
    grpc_port = spare_grpc if grpc else None
    admin_port = int(args[args.index("--admin-port") + 1]) if "--admin-port" in args else None
    admin_args = [] if admin_port is not None else ["--admin-port", str(admin_port := spare_admin)]
    log_path = log_dir / f"runtime-{port}.log"
    command: Sequence[str] = [
        sys.executable,
        "-m",
        "batchpilot.runtime.cli",
        "runtime",
        "serve",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(["--grpc-port", str(grpc_port)] if grpc_port is not None else []),
        *admin_args,
        *args,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    metrics_port = int(args[args.index("--metrics-port") + 1]) if "--metrics-port" in args else None
    running = RuntimeProcess(process, port, log_path, grpc_port, admin_port, metrics_port)
    try:
        wait_ready(running.url, process, timeout_s=ready_timeout_s)
        yield running
    finally:
        if process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.terminate(timeout_s=30)


def refused_start(*args: str, log_path: Path, timeout_s: float = 15) -> str:
    """Run `batchpilot runtime serve ARGS` on a free port, expecting it to refuse: exit status 1
    and the port never opened. Returns the log."""
    port, admin_port = free_ports(2)
    command = [sys.executable, "-m", "batchpilot.runtime.cli", "runtime", "serve",
               "--admin-port", str(admin_port), *args,
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        answered = False
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:
                answered |= probe.connect_ex(("127.0.0.1", port)) == 0
            time.sleep(0.02)
        exit_code = process.wait(timeout=1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log_path.read_text()
    assert exit_code == 1, text
    assert not answered, f"the port opened although the server refused to start:\n{text}"
    return text


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def send(
    server: RuntimeProcess,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    *,
    port: int | None = None,
) -> Reply:
    """One request on its own connection (a 413 may leave a reused one unusable); header bytes
    go out exactly as given. To the inference port unless `port` names another of the server's
    (its admin port, say)."""
    conn = http.client.HTTPConnection("127.0.0.1", port or server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return Reply(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


class Scrape:
    """One scrape of /metrics, parsed by prometheus_client's own parser."""

    def __init__(self, server: RuntimeProcess) -> None:
        reply = send(server, "GET", "/metrics")
        assert reply.status == 200
        self.samples = [
            sample
            for family in text_string_to_metric_families(reply.body.decode())
            for sample in family.samples
        ]

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """A histogram's cumulative buckets, (upper bound, count), summed over its other labels."""
        counts: dict[float, float] = {}
        for s in self.samples:
            if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
                upper = float(s.labels["le"])
                counts[upper] = counts.get(upper, 0.0) + s.value
        assert counts, f"no histogram {name}{labels}"
        return sorted(counts.items())

    def value(self, name: str, **labels: str) -> float:
        """The sum of every sample called `name` whose labels include `labels`."""
        values = [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert values, f"no sample {name}{labels}"
        return sum(values)


def metric(server: RuntimeProcess, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`, from one scrape."""
    return Scrape(server).value(name, **labels)


def outcomes(scrape: Scrape) -> dict[str, float]:
    return {
        o: scrape.value("batchpilot_requests_total", outcome=o)
        for o in ("success", "invalid", "rejected", "timeout", "cancelled", "error")
    }
