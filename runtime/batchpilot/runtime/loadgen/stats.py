"""The numbers of a report, as pure functions of the raw per-request outcomes.

Averages hide what an SLA is about, so these are exact nearest-rank percentiles over every
recorded sample, errors by kind (shed load apart from failures), and per-window time series for
plotting. Nothing here does I/O, so the tests check the arithmetic directly.

An open loop is only an open loop while the client keeps its schedule: a client that falls
behind (send lag) or drops arrivals (its outstanding cap) offers less load than asked, and its
numbers then describe a gentler test than the one reported. So the same outcomes also say
whether the run is valid (`invalid_reason`), and, for overload tests, how fast refused requests
were answered and how much of the load was served within the SLA (goodput).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict

import numpy as np

from batchpilot.runtime.loadgen.errors import DROPPED_CLIENT, SHED_KINDS

DEFAULT_MAX_SEND_LAG_MS: Final = 10.0
"""The send lag P99 beyond which an open-loop run is invalid. A client that cannot keep up (it
shares a small machine with the server, or its event loop is saturated) throttles the open loop
into a slower one, and that shows up here and nowhere else: the latency counts from the
scheduled time either way, so the report would look like a slow server under the asked load
when the server saw less. 10 ms is small against the SLAs this is used for (tens to hundreds of
ms), so in a valid run the server saw the asked arrivals to within an event loop's jitter; it is
a P99, not a max, so a rare GC or scheduler pause of a healthy client does not void a run, but
a client behind on more than 1 % of its sends does."""


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
    send_lag_ms: LatencyStats | None
    late_send_fraction: float | None
    max_send_lag_ms: float | None
    shed_latency_ms: LatencyStats | None
    sla_ms: float | None
    goodput_rps: float | None
    sla_misses: int | None
    valid: bool
    invalid_reason: str | None


def send_lag(outcomes: Outcomes, *, measure_start_s: float) -> np.ndarray[Any, Any]:
    """How late each measured request went out (sent - scheduled, seconds), over those that
    were sent: a dropped arrival (sent NaN) has no send to be late."""
    measured = (outcomes.scheduled >= measure_start_s) & ~np.isnan(outcomes.sent)
    lag: np.ndarray[Any, Any] = outcomes.sent[measured] - outcomes.scheduled[measured]
    return lag


def goodput(latency_s: np.ndarray[Any, Any], *, sla_ms: float, over_s: float) -> float:
    """Successful answers within the SLA per second: what the load bought. `latency_s` are the
    successes' latencies (from the scheduled time in an open loop)."""
    if over_s <= 0:
        return 0.0
    return int(np.sum(latency_s * 1000.0 <= sla_ms)) / over_s


def invalid_reason(
    *,
    open_loop: bool,
    arrivals: int,
    dropped: int,
    send_lag_ms: LatencyStats | None,
    max_send_lag_ms: float,
) -> str | None:
    """Why an open-loop run did not offer the load it was asked to, in words; None if it did.
    A closed loop has no schedule to keep, so it is always valid."""
    if not open_loop:
        return None
    reasons = []
    if dropped:
        reasons.append(
            f"the client dropped {dropped} of {arrivals} arrivals because --max-outstanding "
            "requests were already in flight (the offered load was lower than asked; raise "
            "--max-outstanding, or lower the rate if the server is this far behind)"
        )
    if send_lag_ms is not None and send_lag_ms.p99_ms > max_send_lag_ms:
        reasons.append(
            f"the client fell behind its schedule: send lag P99 {send_lag_ms.p99_ms:.1f} ms > "
            f"{max_send_lag_ms:g} ms (the offered load was lower than asked; use a faster "
            "client or a lower rate)"
        )
    return "; ".join(reasons) or None


def summarize(
    outcomes: Outcomes,
    *,
    measure_start_s: float,
    duration_s: float,
    window_s: float,
    open_loop: bool,
    stopped_early: bool = False,
    max_send_lag_ms: float = DEFAULT_MAX_SEND_LAG_MS,
    sla_ms: float | None = None,
) -> Summary:
    """The numbers of a report, from the raw outcomes: only requests scheduled at or after
    `measure_start_s` count (the rest are warm-up). The send lag and validity are an open
    loop's; goodput needs `sla_ms`. Shed requests' latency counts from their actual send: it
    says how fast the server refused, not how long the request waited to be sent."""
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
    lag = send_lag(outcomes, measure_start_s=measure_start_s) if open_loop else None
    lag_ms = latency_stats(lag) if lag is not None else None
    shed_mask = np.isin(kind, list(SHED_KINDS))
    latency = done[ok] - scheduled[ok]
    reason = invalid_reason(
        open_loop=open_loop,
        arrivals=len(kind),
        dropped=errors.get(DROPPED_CLIENT, 0),
        send_lag_ms=lag_ms,
        max_send_lag_ms=max_send_lag_ms,
    )
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
        "latency_ms": latency_stats(latency),
        "service_latency_ms": latency_stats(done[ok] - sent[ok]),
        "windows": _windows(
            scheduled, done, ok, span_s=min(elapsed, duration_s), window_s=window_s
        ),
        "send_lag_ms": lag_ms,
        "max_send_lag_ms": max_send_lag_ms if open_loop else None,
        "late_send_fraction": (
            float(np.mean(lag * 1000.0 > max_send_lag_ms)) if lag is not None and len(lag) else None
        ),
        "shed_latency_ms": latency_stats(done[shed_mask] - sent[shed_mask]),
        "sla_ms": sla_ms,
        "goodput_rps": None if sla_ms is None else goodput(latency, sla_ms=sla_ms, over_s=elapsed),
        # A refused request is one not answered within the SLA, as a late one is.
        "sla_misses": None if sla_ms is None else int(np.sum(latency * 1000.0 > sla_ms)) + shed,
        "valid": reason is None,
        "invalid_reason": reason,
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
