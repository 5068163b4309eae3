"""The servers under test, each its own process on 127.0.0.1, and what they say about batching.

The batching runtime is started with the project's own helper (`tests/runtime_process.py`, the
real `batchpilot runtime serve`); the plain FastAPI baseline is `bench/plain_server.py`. Both are
stopped with SIGTERM (then killed if they hang) and waited for, so none outlives the benchmark.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.runtime_process import free_port, runtime_process, wait_ready

from batchpilot.runtime.onnx_engine import SessionConfig

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Running:
    url: str
    pid: int


def session_args(config: SessionConfig) -> list[str]:
    """`batchpilot runtime serve` flags that reproduce `config`."""
    return [
        "--intra-op-threads",
        str(config.intra_op_threads),
        "--inter-op-threads",
        str(config.inter_op_threads),
        "--graph-optimization",
        config.graph_optimization,
    ]


@contextlib.contextmanager
def batching_server(model: Path, *args: str, log_dir: Path) -> Iterator[Running]:
    """`batchpilot runtime serve --model MODEL ARGS...`, logging at warning level."""
    with runtime_process(
        model, *args, "--log-level", "warning", log_dir=log_dir, ready_timeout_s=60
    ) as server:
        yield Running(server.url, server.process.pid)


@contextlib.contextmanager
def plain_server(model: Path, config: SessionConfig, *, log_dir: Path) -> Iterator[Running]:
    """bench/plain_server.py with the same session options."""
    port = free_port()
    log_path = log_dir / f"plain-{port}.log"
    command = [
        sys.executable,
        str(HERE / "plain_server.py"),
        "--model",
        str(model),
        "--port",
        str(port),
        "--intra-op-threads",
        str(config.intra_op_threads),
        "--inter-op-threads",
        str(config.inter_op_threads),
        "--graph-optimization",
        config.graph_optimization,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout_s=60)
        yield Running(url, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def batch_stats(url: str) -> dict[str, float] | None:
    """Batches run and mean rows per batch over the server's life (its Prometheus histogram)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("batchpilot_batch_size_sum", "batchpilot_batch_size_count"):
            if line.startswith((name + "{", name + " ")):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    count = values.get("batchpilot_batch_size_count", 0.0)
    if not count:
        return None
    return {"batches": count, "mean_rows_per_batch": values["batchpilot_batch_size_sum"] / count}


SHED_REASONS = ("predicted_late", "queue_full", "draining", "expired")
"""The `reason` labels of `batchpilot_shed_total` (batchpilot.runtime.metrics.SHED_REASONS)."""


_HISTOGRAMS = {
    "batchpilot_request_duration_seconds_bucket": "latency",
    "batchpilot_refusal_duration_seconds_bucket": "refusal",
}
"""Histograms whose cumulative buckets `admission_counts` keeps, to read a quantile's bound."""


def quantile_bound_ms(counts: dict[str, float] | None, name: str, q: float) -> float | None:
    """The upper bound of the histogram bucket holding the `q` quantile, in ms, from the
    `<name>_le_<bound>` counts of `admission_counts` (or of two, subtracted): the server's own
    measure, exact to its bucket edges. None without observations."""
    if not counts:
        return None
    prefix = f"{name}_le_"
    buckets = sorted(
        (float(key[len(prefix) :]), value)
        for key, value in counts.items()
        if key.startswith(prefix)
    )
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]  # +Inf
    for bound, cumulative in buckets:
        if cumulative >= q * total:
            return bound * 1e3
    return None


def admission_counts(url: str) -> dict[str, float] | None:
    """The server's own account of its load since it started: arrivals, admitted, shed by
    reason, requests by outcome, rows computed and seconds the device was busy, from one scrape
    of /metrics (None if it cannot be read). Two scrapes around a run, subtracted, are what the
    server saw of it."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    counts: dict[str, float] = {
        "arrivals": 0.0,
        "admitted": 0.0,
        "batch_rows": 0.0,
        "device_busy_s": 0.0,
    }
    counts.update({f"shed_{reason}": 0.0 for reason in SHED_REASONS})
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = {
                "batchpilot_arrivals_total": "arrivals",
                "batchpilot_admitted_total": "admitted",
                "batchpilot_batch_rows_total": "batch_rows",
                "batchpilot_device_busy_seconds_total": "device_busy_s",
            }.get(sample.name)
            if sample.name == "batchpilot_shed_total":
                key = f"shed_{sample.labels.get('reason', '')}"
            elif sample.name in _HISTOGRAMS:
                key = f"{_HISTOGRAMS[sample.name]}_le_{sample.labels.get('le', '')}"
            elif sample.name == "batchpilot_requests_total":
                key = f"outcome_{sample.labels.get('outcome', '')}"
            if key is not None:
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def counts_between(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    """What happened between two `admission_counts` scrapes (counts whole, seconds to 1 ms)."""
    if before is None or after is None:
        return None
    return {
        key: round(value - before.get(key, 0.0), 3 if key.endswith("_s") else None)
        for key, value in after.items()
    }
