"""Metrics history for a fleet of services, written straight into a Prometheus data directory.

A thousand runtimes cannot run on one machine, but the autopilot's fleet round only reads what
they export: the same series, with the same names and labels, at a scrape interval. So this
module writes that history as OpenMetrics text — every signal the autopilot queries, for any
number of services, each with its own constant rate, batch size and latency — and `backfill`
turns it into TSDB blocks with `promtool tsdb create-blocks-from openmetrics` (how an operator
imports history), for a real Prometheus started on that directory to answer. Tests compare the
fleet's grouped queries with each service's own; the fleet benchmark times a round over 1,000.

The latency model is coarse on purpose — every request of a service falls in the bucket of its
`p50_s` but one in fifty, which falls in the bucket of its `p99_s` — since what is checked is
that two ways of asking give the same answer, not the shape of a distribution.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from batchpilot.runtime.metrics import LATENCY_BUCKETS


@dataclass(frozen=True, slots=True)
class FakeService:
    namespace: str
    isvc: str
    qps: float
    batch: int = 8
    p50_s: float = 0.02
    p99_s: float = 0.06
    rejected_share: float = 0.0
    busy: float = 0.5
    """Device busy fraction."""


def _bucket_counts(total: float, p50_s: float, p99_s: float) -> list[tuple[str, float]]:
    """Cumulative (le, count) for `total` requests: 98 % at p50, 2 % at p99."""
    out = []
    for bound in LATENCY_BUCKETS:
        below = (0.98 * total if p50_s <= bound else 0.0) + (0.02 * total if p99_s <= bound else 0)
        out.append((f"{bound:g}", below))
    out.append(("+Inf", total))
    return out


def openmetrics(services: list[FakeService], *, start: int, end: int, step_s: int = 15) -> str:
    """OpenMetrics text: every service's series, one sample per `step_s` in [start, end)."""
    families: dict[str, list[str]] = {}
    kinds = {
        "batchpilot_request_duration_seconds": "histogram",
        "batchpilot_queue_wait_seconds": "histogram",
        "batchpilot_batch_size": "histogram",
        "batchpilot_requests": "counter",
        "batchpilot_arrivals": "counter",
        "batchpilot_batcher_seconds": "counter",
        "batchpilot_startup_batch_seconds": "gauge",
        "batchpilot_device_busy_seconds": "counter",
        "batchpilot_batch_compute_seconds": "counter",
        "batchpilot_batch_rows": "counter",
        "batchpilot_batches": "counter",
        "batchpilot_engine": "info",
    }
    for family in kinds:
        families[family] = []
    for service in services:
        pod = f'namespace="{service.namespace}",isvc="{service.isvc}",pod="{service.isvc}-0-0"'
        bucket = 1 << (service.batch.bit_length() - 1)
        for t in range(start, end, step_s):
            elapsed = t - start + step_s
            arrived = service.qps * elapsed
            served = arrived * (1 - service.rejected_share)
            rows = families["batchpilot_request_duration_seconds"]
            for le, count in _bucket_counts(served, service.p50_s, service.p99_s):
                rows.append(
                    f'batchpilot_request_duration_seconds_bucket{{{pod},le="{le}"}} {count:.3f} {t}'
                )
            rows.append(f"batchpilot_request_duration_seconds_count{{{pod}}} {served:.3f} {t}")
            rows.append(
                f"batchpilot_request_duration_seconds_sum{{{pod}}} {served * service.p50_s:.3f} {t}"
            )
            waits = families["batchpilot_queue_wait_seconds"]
            for le, count in _bucket_counts(served, service.p50_s / 4, service.p99_s / 4):
                waits.append(
                    f'batchpilot_queue_wait_seconds_bucket{{{pod},le="{le}"}} {count:.3f} {t}'
                )
            waits.append(f"batchpilot_queue_wait_seconds_count{{{pod}}} {served:.3f} {t}")
            waits.append(
                f"batchpilot_queue_wait_seconds_sum{{{pod}}} {served * service.p50_s / 4:.3f} {t}"
            )
            batches = served / service.batch
            sizes = families["batchpilot_batch_size"]
            sizes.append(f'batchpilot_batch_size_bucket{{{pod},le="+Inf"}} {batches:.3f} {t}')
            sizes.append(f"batchpilot_batch_size_count{{{pod}}} {batches:.3f} {t}")
            sizes.append(f"batchpilot_batch_size_sum{{{pod}}} {served:.3f} {t}")
            outcomes = families["batchpilot_requests"]
            outcomes.append(
                f'batchpilot_requests_total{{{pod},outcome="success"}} {served:.3f} {t}'
            )
            outcomes.append(
                f'batchpilot_requests_total{{{pod},outcome="rejected"}} {arrived - served:.3f} {t}'
            )
            families["batchpilot_arrivals"].append(
                f"batchpilot_arrivals_total{{{pod}}} {arrived:.3f} {t}"
            )
            # timed at start-up: t(b) = p50 / 4 + p50 / 256 · b
            for size in (1, 64):
                families["batchpilot_startup_batch_seconds"].append(
                    f'batchpilot_startup_batch_seconds{{{pod},rows="{size}"}} '
                    f"{service.p50_s / 4 + service.p50_s / 256 * size:.6f} {t}"
                )
            # half of a request's time in the batcher, the other half outside it
            families["batchpilot_batcher_seconds"].append(
                f"batchpilot_batcher_seconds_total{{{pod}}} {served * service.p50_s / 2:.3f} {t}"
            )
            busy_s = service.busy * elapsed
            families["batchpilot_device_busy_seconds"].append(
                f"batchpilot_device_busy_seconds_total{{{pod}}} {busy_s:.3f} {t}"
            )
            by_bucket = f'{pod},batch_bucket="{bucket}"'
            families["batchpilot_batch_compute_seconds"].append(
                f"batchpilot_batch_compute_seconds_total{{{by_bucket}}} {busy_s:.3f} {t}"
            )
            families["batchpilot_batch_rows"].append(
                f"batchpilot_batch_rows_total{{{by_bucket}}} {served:.3f} {t}"
            )
            families["batchpilot_batches"].append(
                f"batchpilot_batches_total{{{by_bucket}}} {batches:.3f} {t}"
            )
            families["batchpilot_engine"].append(
                f'batchpilot_engine_info{{{pod},engine="simulated"}} 1 {t}'
            )
    lines: list[str] = []
    for family, rows in families.items():
        lines.append(f"# TYPE {family} {kinds[family]}")
        lines.extend(rows)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill(text: str, data_dir: Path, *, workdir: Path) -> None:
    """Write `text` (OpenMetrics) into `data_dir` as TSDB blocks, with promtool."""
    source = workdir / "history.om"
    source.write_text(text)
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
        check=True,
        capture_output=True,
        timeout=600,
    )


def fleet(count: int, *, namespaces: int = 10) -> Iterator[FakeService]:
    """`count` services spread over `namespaces`, each its own rate, batch and latency."""
    for i in range(count):
        yield FakeService(
            namespace=f"team-{i % namespaces}",
            isvc=f"model-{i}",
            qps=10.0 + (i * 37) % 500,
            batch=1 << (i % 6),
            p50_s=0.005 * (1 + i % 5),
            p99_s=0.02 * (1 + i % 4),
            rejected_share=0.01 * (i % 3),
            busy=0.2 + 0.1 * (i % 7),
        )
