"""(a) The limit of this machine: `session.run` in a loop, no HTTP, no queue, no copies.

For each batch size the same input array is fed again and again, so what is timed is the model
and onnxruntime's own call overhead, nothing else. The session is opened with the project's
`SessionConfig`, exactly as the server opens it. Each batch size runs for a bounded time and a
bounded number of calls; the per-call times give the batch-1 latency that the server's added
latency is measured against. Each batch size is metered, and repeated (bounded) when other
processes took the CPU meanwhile.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.runtime.onnx_engine import SessionConfig, open_session
from cpu_meter import CpuMeter, QuietPolicy


@dataclass(frozen=True, slots=True)
class RawPoint:
    batch: int
    calls: int
    rows_per_s: float
    p50_ms: float
    """Median time of one call (one batch)."""
    mean_ms: float
    others_cores: float | None = None
    """CPU used by other processes meanwhile."""
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "calls": self.calls,
            "rows_per_s": round(self.rows_per_s, 1),
            "p50_ms": round(self.p50_ms, 4),
            "mean_ms": round(self.mean_ms, 4),
            "others_cores": None if self.others_cores is None else round(self.others_cores, 2),
            "attempts": self.attempts,
        }


def raw_throughput(
    model: Path,
    *,
    config: SessionConfig,
    batches: tuple[int, ...],
    seconds_per_batch: float,
    quiet: QuietPolicy,
    max_calls: int = 200_000,
) -> list[RawPoint]:
    session = open_session(model, providers=["CPUExecutionProvider"], config=config)
    spec = session.get_inputs()[0]
    row_shape = tuple(int(d) for d in spec.shape[1:])
    output_names = [out.name for out in session.get_outputs()]
    rng = np.random.default_rng(0)
    points = []
    for batch in batches:
        feeds = {spec.name: rng.standard_normal((batch, *row_shape)).astype(np.float32)}
        for _ in range(3):
            session.run(output_names, feeds)
        attempt = 0
        while True:
            attempt += 1
            quiet.wait(say=f"raw batch {batch}")
            meter = CpuMeter()
            point = _time_calls(session, output_names, feeds, batch, seconds_per_batch, max_calls)
            use = meter.stop()
            if use is not None:
                point = dataclasses.replace(point, others_cores=use.others_cores, attempts=attempt)
            if quiet.is_quiet(use):
                break
            if attempt > quiet.retries or quiet.waited_s >= quiet.wait_budget_s:
                quiet.disturbed += 1
                break
            quiet.repeated += 1
        points.append(point)
    return points


def _time_calls(
    session: Any,
    output_names: list[str],
    feeds: dict[str, np.ndarray[Any, Any]],
    batch: int,
    seconds: float,
    max_calls: int,
) -> RawPoint:
    times: list[float] = []
    clock = time.perf_counter
    started = clock()
    deadline = started + seconds
    while len(times) < max_calls:
        t = clock()
        session.run(output_names, feeds)
        end = clock()
        times.append(end - t)
        if end > deadline:
            break
    elapsed = clock() - started
    values = np.sort(np.asarray(times))
    return RawPoint(
        batch=batch,
        calls=len(times),
        rows_per_s=len(times) * batch / elapsed,
        p50_ms=float(values[(len(values) - 1) // 2]) * 1e3,
        mean_ms=float(values.mean()) * 1e3,
    )
