"""Triton's own load tool, perf_analyzer 2.45 (`make install` fetches it), against a real runtime
process over HTTP, gRPC and gRPC streaming.

perf_analyzer reads the model's metadata, configuration (Triton's model configuration extension)
and, before and after each measurement, the server's statistics (the statistics extension, whose
version it parses as a number); any of them missing or malformed stops it. What it prints of the
server's side must agree with what it measured as a client.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_process import RuntimeProcess, runtime_process

pytestmark = pytest.mark.slow

PERF_ANALYZER = Path(sys.executable).parent / "perf_analyzer"
"""The launcher `make install` writes (hack/fetch-perf-analyzer.sh)."""
CONCURRENCY = 2
"""perf_analyzer's requests in flight at once."""


@pytest.fixture(scope="module")
def server(mlp_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    with runtime_process(
        mlp_model,
        "--device",
        "cpu",
        grpc=True,
        log_dir=tmp_path_factory.mktemp("perf-analyzer"),
    ) as process:
        yield process


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="perf_analyzer ships for x86_64 Linux only",
)
@pytest.mark.parametrize(
    ("protocol", "flags", "port"),
    [
        ("http", ["-i", "http"], "port"),
        ("grpc", ["-i", "grpc"], "grpc_port"),
        ("grpc streaming", ["-i", "grpc", "--streaming"], "grpc_port"),
    ],
)
def test_perf_analyzer_measures_and_reads_the_servers_side(
    server: RuntimeProcess, protocol: str, flags: list[str], port: str
) -> None:
    assert PERF_ANALYZER.exists(), f"{PERF_ANALYZER} is missing: run `make install`"
    command = [
        str(PERF_ANALYZER),
        "-m", "mlp",
        "-u", f"127.0.0.1:{getattr(server, port)}",
        *flags,
        "--concurrency-range", str(CONCURRENCY),
        # Short windows of a fixed count, and any spread accepted: on a shared machine the
        # point is that every read and every request works, not a stable rate.
        "--measurement-mode", "count_windows",
        "--measurement-request-count", "100",
        "--stability-percentage", "1000",
        "--max-trials", "3",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{protocol}: {done.stdout}{done.stderr}"
    out = done.stdout
    client_count = int(_field(out, r"Request count: (\d+)"))
    inferences = int(_field(out, r"Inference count: (\d+)"))
    executions = int(_field(out, r"Execution count: (\d+)"))
    successes = int(_field(out, r"Successful request count: (\d+)"))
    # The server counted what the client sent in the window (one row a request), in batches.
    # A batch's rows count as it ends, its requests as each answer goes out: a window's snapshot
    # taken between the two holds up to the concurrency's rows more than answers.
    assert successes > 0
    assert 0 <= inferences - successes <= CONCURRENCY, out
    # The window's edges: at each, up to the concurrency's answers may have been counted by the
    # server's snapshot and not yet received by the client, both edges the same way.
    assert abs(successes - client_count) <= 2 * CONCURRENCY, out
    assert 0 < executions <= inferences
    parts = re.search(
        r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ "
        r"compute input (\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)",
        out,
    )
    assert parts is not None, out
    total, *split = (int(value) for value in parts.groups())
    assert total > 0
    assert int(parts.group(5)) > 0  # the model ran
    assert abs(sum(split) - total) <= 5  # perf_analyzer's rounding


def _field(text: str, pattern: str) -> str:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in:\n{text}"
    return found.group(1)
