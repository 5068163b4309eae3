"""t(b), the time one batch of b rows takes: timed directly on the model (no server, no HTTP),
and the straight line t(b) = α + β·b through any set of such points.

The direct timing goes through the torch engine's own call (inputs copied to the device, the
program run, outputs copied back), which is what the runtime's per-batch compute counters time
inside the server; the two are then the same quantity measured two ways.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchpilot.runtime.engine import example_inputs
from batchpilot.runtime.torch_engine import TorchEngine


@dataclass(frozen=True, slots=True)
class Line:
    """t(b) = α + β·b, in seconds."""

    alpha_s: float
    beta_s: float

    def seconds(self, rows: float) -> float:
        return self.alpha_s + self.beta_s * rows

    def as_dict(self) -> dict[str, float]:
        return {"alpha_ms": self.alpha_s * 1e3, "beta_ms": self.beta_s * 1e3}


def least_squares(points: Sequence[tuple[float, float, float]]) -> Line | None:
    """The weighted least-squares line through (rows, seconds, weight) points; None with fewer
    than two distinct batch sizes."""
    usable = [(b, t, w) for b, t, w in points if w > 0]
    if len({b for b, _, _ in usable}) < 2:
        return None
    weight = sum(w for _, _, w in usable)
    mean_b = sum(w * b for b, _, w in usable) / weight
    mean_t = sum(w * t for _, t, w in usable) / weight
    var = sum(w * (b - mean_b) ** 2 for b, _, w in usable)
    cov = sum(w * (b - mean_b) * (t - mean_t) for b, t, w in usable)
    beta = cov / var
    return Line(alpha_s=mean_t - beta * mean_b, beta_s=beta)


async def _time_batches(
    engine: TorchEngine, batches: Sequence[int], *, seconds_per_batch: float, min_reps: int
) -> list[dict[str, Any]]:
    rows_out = []
    for rows in batches:
        inputs = example_inputs(engine.signature, rows=rows)
        for _ in range(2):  # the first batch of a new size pays for allocations
            await engine.run(inputs)
        times: list[float] = []
        began = time.perf_counter()
        while len(times) < min_reps or time.perf_counter() - began < seconds_per_batch:
            start = time.perf_counter()
            await engine.run(inputs)
            times.append(time.perf_counter() - start)
        rows_out.append(
            {
                "batch": rows,
                "median_s": statistics.median(times),
                "mean_s": statistics.fmean(times),
                "reps": len(times),
                "rows_per_s": rows / statistics.median(times),
            }
        )
    return rows_out


def time_directly(
    engine: TorchEngine, batches: Sequence[int], *, seconds_per_batch: float, min_reps: int = 5
) -> list[dict[str, Any]]:
    """The median time of a batch of each size, after two unmeasured ones."""
    return asyncio.run(
        _time_batches(engine, batches, seconds_per_batch=seconds_per_batch, min_reps=min_reps)
    )
