"""The numbers of a report, as pure functions of the raw per-request outcomes.

Averages hide what an SLA is about, so these are exact nearest-rank percentiles over every
recorded sample, errors by kind (shed load apart from failures), and per-window time series for
plotting. Nothing here does I/O, so the tests check the arithmetic directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from batchpilot.runtime.loadgen.errors import DROPPED_CLIENT, SHED_KINDS


def nearest_rank(sorted_values: np.ndarray[Any, Any], percent: float) -> float:
    """The textbook percentile: the smallest sample with at least `percent` % of the samples at
    or below it. "P99 <= SLA" then means what it says: 99 % of requests were within the SLA."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no samples")
    # The tiny slack keeps e.g. 99 % of 100 at rank 99 despite 0.99 * 100 == 99.00000000000001.
    rank = max(1, math.ceil(n * percent / 100.0 - 1e-9))
    return float(sorted_values[min(rank, n) - 1])


@dataclass(frozen=True, slots=True)
class LatencyStats:
    count: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


def latency_stats(samples_s: np.ndarray[Any, Any] | Sequence[float]) -> LatencyStats | None:
    """Exact percentiles (nearest rank) of latency samples given in seconds; None if empty."""
    values = np.sort(np.asarray(samples_s, dtype=np.float64)) * 1000.0
    if len(values) == 0:
        return None
    return LatencyStats(
        count=len(values),
        mean_ms=float(values.mean()),
        p50_ms=nearest_rank(values, 50),
        p95_ms=nearest_rank(values, 95),
        p99_ms=nearest_rank(values, 99),
        max_ms=float(values[-1]),
    )


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One time window of the measured period, in seconds from its start. `offered_rps` counts
    arrivals (sends in a closed loop) by scheduled time; `served_rps`, `errors` and `p99_ms`
    count completions by the time they completed — what an observer of the server (Prometheus,
    a live view) would see. The last window also holds what completed after the period."""

    start_s: float
    end_s: float
    offered_rps: float
    served_rps: float
    errors: int
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Every request of a run, one entry each, times in seconds from the start of the run.
    `kind` is "" for success, else the error kind; `sent` is NaN where nothing was sent."""

    scheduled: np.ndarray[Any, Any]
    sent: np.ndarray[Any, Any]
    done: np.ndarray[Any, Any]
    kind: np.ndarray[Any, Any]


class Summary(TypedDict):
    """The measured numbers of a run; the fields of LoadReport that come from its outcomes."""

    scheduled: int
    sent: int
    succeeded: int
    achieved_qps: float
    offered_rps: float | None
    errors: dict[str, int]
    shed: int
    failed: int
    elapsed_s: float
    latency_ms: LatencyStats | None
    service_latency_ms: LatencyStats | None
    windows: tuple[WindowStats, ...]


def summarize(
    outcomes: Outcomes,
    *,
    measure_start_s: float,
    duration_s: float,
    window_s: float,
    open_loop: bool,
    stopped_early: bool = False,
) -> Summary:
    """The numbers of a report, from the raw outcomes: only requests scheduled at or after
    `measure_start_s` count (the rest are warm-up)."""
    measured = outcomes.scheduled >= measure_start_s
    scheduled = outcomes.scheduled[measured] - measure_start_s
    sent = outcomes.sent[measured] - measure_start_s
    done = outcomes.done[measured] - measure_start_s
    kind = outcomes.kind[measured]
    ok = kind == ""
    kinds, counts = np.unique(kind[~ok], return_counts=True)
    errors = {str(k): int(c) for k, c in zip(kinds, counts, strict=True)}
    shed = sum(count for k, count in errors.items() if k in SHED_KINDS)
    last_done = float(done.max()) if len(done) else 0.0
    elapsed = max(last_done, duration_s) if open_loop and not stopped_early else last_done
    succeeded = int(ok.sum())
    # A run stopped early offered its arrivals over the time it ran, not the duration.
    offered_over = elapsed if stopped_early else duration_s
    return {
        "scheduled": len(kind),
        "sent": int(np.sum(kind != DROPPED_CLIENT)),
        "succeeded": succeeded,
        "achieved_qps": succeeded / elapsed if elapsed > 0 else 0.0,
        "offered_rps": len(kind) / offered_over if open_loop and offered_over > 0 else None,
        "errors": errors,
        "shed": shed,
        "failed": sum(errors.values()) - shed,
        "elapsed_s": elapsed,
        "latency_ms": latency_stats(done[ok] - scheduled[ok]),
        "service_latency_ms": latency_stats(done[ok] - sent[ok]),
        "windows": _windows(
            scheduled, done, ok, span_s=min(elapsed, duration_s), window_s=window_s
        ),
    }


def _windows(
    scheduled: np.ndarray[Any, Any],
    done: np.ndarray[Any, Any],
    ok: np.ndarray[Any, Any],
    *,
    span_s: float,
    window_s: float,
) -> tuple[WindowStats, ...]:
    if span_s <= 0:
        return ()
    count = max(1, math.ceil(span_s / window_s - 1e-9))

    def bucket(times: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.clip((times // window_s).astype(np.int64), 0, count - 1)

    offered = np.bincount(bucket(scheduled), minlength=count)
    served = np.bincount(bucket(done[ok]), minlength=count)
    errors = np.bincount(bucket(done[~ok]), minlength=count)
    # Sort successes by (window, latency) once, so each window's p99 is one index away.
    ok_window = bucket(done[ok])
    latency = done[ok] - scheduled[ok]
    order = np.lexsort((latency, ok_window))
    ok_window, latency = ok_window[order], latency[order]
    bounds = np.searchsorted(ok_window, np.arange(count + 1))
    result = []
    for i in range(count):
        chunk = latency[bounds[i] : bounds[i + 1]]
        start, end = i * window_s, min((i + 1) * window_s, span_s)
        result.append(
            WindowStats(
                start_s=start,
                end_s=end,
                offered_rps=float(offered[i]) / (end - start),
                served_rps=float(served[i]) / (end - start),
                errors=int(errors[i]),
                p99_ms=nearest_rank(chunk, 99) * 1000.0 if len(chunk) else None,
            )
        )
    return tuple(result)
