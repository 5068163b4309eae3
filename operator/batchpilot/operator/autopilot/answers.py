"""Prometheus' answers read into an `Observation`: one service's share of a round, or its own
queries' answers.

Results that are empty, NaN or infinite are *missing* (None), never zero: an idle service has
request rate 0.0 (the counter exists and did not move) but no latency, while a service whose
metrics are gone has neither — and the decision holds on missing signals. A past period
Prometheus has no history for makes the daily pattern unknown, not smaller.

A Prometheus that holds only the window's last seconds (restarted without its history, or down
for part of the window) makes every rate read low: `rate()` divides what it sees by the whole
range. The rates are read over the part it holds instead (`covered_span`), and the observation
says how much that is, so that the decision does not scale down on it.

Pure: instant-vector results in, an `Observation` out.
"""

from __future__ import annotations

import math
from typing import Any

from batchpilot.operator.autopilot.observation import (
    ComputePoint,
    Observation,
    PastPeriod,
    PodCompute,
)
from batchpilot.operator.autopilot.promql import Seasonality, UtilizationSource

EXTRAPOLATED = 1.1
"""`rate()` extrapolates to the range's start where its first sample is less than this many
mean sample intervals after it (Prometheus' `extrapolatedRate`)."""
RESCALE_MAX = 10.0
"""The most a window's rates are scaled up for the part of it Prometheus holds: below a tenth of
the window, they are read as over a tenth (too few seconds to plan more on; the decision does not
scale down on such a window anyway)."""


def _number(result: list[dict[str, Any]]) -> float | None:
    """The single value of an instant vector, or None if empty, NaN or infinite."""
    if not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    values = {}
    for series in result:
        key = series.get("metric", {}).get(label)
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if key is not None and math.isfinite(value):
            values[key] = value
    return values


def covered_span(window_s: float, back_s: float | None, interval_s: float | None) -> float | None:
    """The part of the window at its end that the window's rates describe, from how far back
    its first sample is (`back_s`) and the mean distance between samples (`interval_s`), as
    Prometheus' `rate()` extrapolates: the whole window where the first sample is less than
    `EXTRAPOLATED` intervals after its start; else from half an interval before that sample
    (for a counter far from zero, as a restarted Prometheus finds them). None where either is
    not measured."""
    if back_s is None or interval_s is None or interval_s <= 0:
        return None
    if window_s - back_s < EXTRAPOLATED * interval_s:
        return window_s
    return min(window_s, back_s + interval_s / 2)


Raw = dict[str, list[dict[str, Any]]]
"""Each signal's answer, by name: Prometheus' instant-vector result."""


def observation_from(
    raw: Raw,
    *,
    window_s: float,
    recent_s: int | None,
    seasonality: Seasonality | None,
    ready_replicas: int | None,
    at: float,
    utilization: UtilizationSource = "busy",
) -> Observation:
    """One service's `Observation` from the answers to its queries (`queries`); a signal
    without an answer (no series for this service) is missing, as an empty answer is. The
    window's rates are read over the part of it Prometheus holds (`covered_span`): its
    `utilization` too where it is a rate (`busy`; NVML's and DCGM's are averages of gauges,
    whole over any part)."""

    def number(name: str) -> float | None:
        return _number(raw.get(name, []))

    covered = covered_span(window_s, number("covered"), number("scrape_interval"))
    scale = 1.0 if covered is None else window_s / max(covered, window_s / RESCALE_MAX)

    def rate(name: str) -> float | None:
        value = number(name)
        return None if value is None else value * scale

    reporting = number("reporting")
    if reporting is None:
        qps = rejected = arrivals = retried = withdrawn = recent = now = None  # none reports
    else:
        qps, rejected, arrivals = rate("qps"), rate("rejected"), rate("arrivals")
        retried, withdrawn = rate("retried"), rate("withdrawn")
        recent, now = number("recent"), number("now")
    seconds = _by_label(raw.get("compute_seconds", []), "batch_bucket")
    rows = _by_label(raw.get("compute_rows", []), "batch_bucket")
    batches = _by_label(raw.get("compute_batches", []), "batch_bucket")
    points = tuple(
        ComputePoint(
            mean_batch=rows[bucket] / rate,
            mean_seconds=seconds[bucket] / rate,
            batches=rate * window_s,
        )
        for bucket, rate in sorted(batches.items(), key=lambda kv: int(kv[0]))
        if rate > 0 and bucket in rows and bucket in seconds
    )
    # two scrapes fit the recent range: their distance is about half of it
    recent_span = None if recent_s is None else recent_s / 2
    timed = _by_label(raw.get("startup", []), "rows")
    startup = tuple(
        ComputePoint(mean_batch=float(rows), mean_seconds=timed[rows], batches=0.0)
        for rows in sorted((r for r in timed if r.isdigit() and int(r) > 0), key=int)
        if timed[rows] > 0
    )
    return Observation(
        at=at,
        window_s=window_s,
        p99_s=number("p99"),
        p95_s=number("p95"),
        qps=qps,
        rejected_qps=rejected,
        queue_p99_s=number("queue_p99"),
        late_share=number("late_share"),
        counted_sla_min_s=number("counted_sla_min"),
        counted_sla_max_s=number("counted_sla_max"),
        utilization=rate("utilization") if utilization == "busy" else number("utilization"),
        mean_batch=number("mean_batch"),
        arrival_dispersion=number("dispersion"),
        arrival_second_squares=rate("second_squares"),
        arrival_counted_seconds=rate("counted_seconds"),
        batch_time_cv=number("batch_cv"),
        request_rows_cv=number("rows_cv"),
        rows_per_request=number("rows_per_request"),
        outside_s=number("outside"),
        before_s=number("before"),
        startup=startup,
        compute=points,
        ready_replicas=ready_replicas,
        covered_s=covered,
        reporting_replicas=None if reporting is None else round(reporting),
        scrapes_per_replica=None if (scrapes := number("scrapes")) is None else round(scrapes),
        memory_rows=None if (memory := number("memory_rows")) is None else max(1, int(memory)),
        arrival_qps=arrivals,
        retried_qps=retried,
        withdrawn_qps=withdrawn,
        recent_qps=recent,
        # two scrapes fit the range: their distance is about half of it
        recent_window_s=None if recent is None else recent_span,
        now_qps=now,
        level_qps=number("level"),
        past=_past(raw, seasonality),
        pods=_pods(raw, "pod_", window_s),
        recent_pods=() if recent_span is None else _pods(raw, "recent_pod_", recent_span),
    )


def _pods(raw: Raw, prefix: str, span_s: float) -> tuple[PodCompute, ...]:
    """Each replica's batches, rows and compute seconds a second (the signals `prefix` +
    batches, rows, seconds) as its batches over `span_s`, by pod."""
    batches = _by_label(raw.get(f"{prefix}batches", []), "pod")
    rows = _by_label(raw.get(f"{prefix}rows", []), "pod")
    seconds = _by_label(raw.get(f"{prefix}seconds", []), "pod")
    return tuple(
        PodCompute(
            pod=pod,
            mean_batch=rows[pod] / rate,
            mean_seconds=seconds[pod] / rate,
            batches=rate * span_s,
        )
        for pod, rate in sorted(batches.items())
        if pod and rate > 0 and pod in rows and pod in seconds
    )


def _past(raw: Raw, seasonality: Seasonality | None) -> tuple[PastPeriod, ...]:
    """Every past period's level and look-ahead peak, or none: a period Prometheus has no
    history for yet (retention, a new service) makes the pattern unknown, not smaller."""
    if seasonality is None:
        return ()
    past = []
    for n in range(1, seasonality.periods + 1):
        level, ahead = _number(raw.get(f"level_{n}", [])), _number(raw.get(f"ahead_{n}", []))
        then = _number(raw.get(f"then_{n}", []))
        if level is None or ahead is None or then is None:
            return ()
        past.append(PastPeriod(ahead_qps=ahead, level_qps=level, then_qps=then))
    return tuple(past)
