"""Reads one window of a service's metrics from Prometheus (the autopilot's eyes).

Every query is scoped to the InferenceService by the `namespace` and `isvc` labels the runtime
puts on its series. Results that are empty, NaN or infinite are *missing* (None), never zero:
an idle service has request rate 0.0 (the counter exists and did not move) but no latency,
while a service whose metrics are gone has neither. Queries have a timeout and no retries, so a
dead Prometheus costs one timeout and an observation of None — the autopilot then holds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from batchpilot.operator.autopilot.observation import ComputePoint, Observation, PastPeriod

log = logging.getLogger(__name__)

UtilizationSource = Literal["busy", "nvml", "dcgm"]


class QueryFn(Protocol):
    def __call__(self, text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        """Evaluate an instant query at `at` (Unix seconds; None: now)."""
        ...


class PrometheusUnavailable(Exception):
    """Prometheus did not answer, or answered with an error."""


@dataclass(frozen=True, slots=True)
class Scope:
    namespace: str
    isvc: str

    @property
    def selector(self) -> str:
        return f'namespace="{self.namespace}",isvc="{self.isvc}"'


@dataclass(frozen=True, slots=True)
class Seasonality:
    """Where to look for a recurring pattern: `periods` whole periods back (a day each by
    default), `lookahead_s` after that time, scaled by the mean rate over `level_s` before it."""

    period_s: int = 86_400
    periods: int = 2
    lookahead_s: int = 300
    level_s: int = 3600
    step_s: int = 30
    """The resolution of the look-ahead's peak (a subquery step)."""


def queries(
    scope: Scope,
    *,
    window_s: int,
    utilization: UtilizationSource,
    recent_s: int | None = None,
    seasonality: Seasonality | None = None,
) -> dict[str, str]:
    """The PromQL for each signal, by name. `recent_s` adds the fast signal: the arrival rate
    between the last two scrapes within that range (empty unless two scrapes fit in it).
    `seasonality` adds today's level and, per past period, its level and its look-ahead peak."""
    sel, w = scope.selector, f"{window_s}s"

    def quantile(q: float, metric: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{sel}}}[{w}])))"

    def rate(metric: str, extra: str = "", by: str = "") -> str:
        grouping = f" by ({by})" if by else ""
        return f"sum{grouping}(rate({metric}{{{sel}{extra}}}[{w}]))"

    util = {
        "busy": (
            f"{rate('batchpilot_device_busy_seconds_total')} / "
            f"count(batchpilot_device_busy_seconds_total{{{sel}}})"
        ),
        "nvml": f"avg(avg_over_time(batchpilot_gpu_utilization_ratio{{{sel}}}[{w}]))",
        "dcgm": (
            f'avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{{namespace="{scope.namespace}",'
            f'pod=~"{scope.isvc}-.*"}}[{w}])) / 100'
        ),
    }[utilization]
    # irate: the rate between the last two scrapes in the range, the freshest Prometheus has.
    recent = (
        {}
        if recent_s is None
        else {"recent": f"sum(irate(batchpilot_arrivals_total{{{sel}}}[{recent_s}s]))"}
    )
    seasonal: dict[str, str] = {}
    if seasonality is not None:
        arrivals = f"batchpilot_arrivals_total{{{sel}}}"
        level, ahead = f"{seasonality.level_s}s", f"{seasonality.lookahead_s}s"
        seasonal["level"] = f"sum(rate({arrivals}[{level}]))"
        for n in range(1, seasonality.periods + 1):
            back = n * seasonality.period_s
            seasonal[f"level_{n}"] = f"sum(rate({arrivals}[{level}] offset {back}s))"
            # The subquery's range ends `lookahead` after this time, then: offset back − ahead.
            seasonal[f"ahead_{n}"] = (
                f"max_over_time(sum(rate({arrivals}[{w}]))[{ahead}:{seasonality.step_s}s] "
                f"offset {back - seasonality.lookahead_s}s)"
            )
    return (
        recent
        | seasonal
        | {
            "p99": quantile(0.99, "batchpilot_request_duration_seconds"),
            "p95": quantile(0.95, "batchpilot_request_duration_seconds"),
            "queue_p99": quantile(0.99, "batchpilot_queue_wait_seconds"),
            "qps": rate("batchpilot_requests_total", ',outcome="success"'),
            "rejected": rate("batchpilot_requests_total", ',outcome="rejected"'),
            "arrivals": rate("batchpilot_arrivals_total"),
            "utilization": util,
            "mean_batch": (
                f"{rate('batchpilot_batch_size_sum')} / {rate('batchpilot_batch_size_count')}"
            ),
            "compute_seconds": rate("batchpilot_batch_compute_seconds_total", by="batch_bucket"),
            "compute_rows": rate("batchpilot_batch_rows_total", by="batch_bucket"),
            "compute_batches": rate("batchpilot_batches_total", by="batch_bucket"),
            "reporting": f"count(batchpilot_engine_info{{{sel}}})",
        }
    )


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


class PrometheusObserver:
    """Turns PromQL answers into an `Observation`."""

    def __init__(
        self,
        query: QueryFn,
        *,
        window_s: int = 60,
        utilization: UtilizationSource = "busy",
        recent_s: int | None = None,
        seasonality: Seasonality | None = None,
        clock: Callable[[], float],
    ) -> None:
        self._query = query
        self._window_s = window_s
        self._recent_s = recent_s
        self._seasonality = seasonality
        self._utilization: UtilizationSource = utilization
        self._clock = clock

    def observe(
        self, scope: Scope, *, ready_replicas: int | None, at: float | None = None
    ) -> Observation | None:
        """The window ending now (or at `at`), or None if Prometheus cannot be read."""
        texts = queries(
            scope,
            window_s=self._window_s,
            utilization=self._utilization,
            recent_s=self._recent_s,
            seasonality=self._seasonality,
        )
        try:
            raw = {name: self._query(text, at=at) for name, text in texts.items()}
        except PrometheusUnavailable as exc:
            log.warning("Prometheus unavailable for %s/%s: %s", scope.namespace, scope.isvc, exc)
            return None
        if _number(raw["reporting"]) is None:
            qps = rejected = arrivals = recent = None  # no replica of this service reports
        else:
            qps = _number(raw["qps"])
            rejected = _number(raw["rejected"])
            arrivals = _number(raw["arrivals"])
            recent = _number(raw["recent"]) if "recent" in raw else None
        seconds = _by_label(raw["compute_seconds"], "batch_bucket")
        rows = _by_label(raw["compute_rows"], "batch_bucket")
        batches = _by_label(raw["compute_batches"], "batch_bucket")
        points = tuple(
            ComputePoint(
                mean_batch=rows[bucket] / rate,
                mean_seconds=seconds[bucket] / rate,
                batches=rate * self._window_s,
            )
            for bucket, rate in sorted(batches.items(), key=lambda kv: int(kv[0]))
            if rate > 0 and bucket in rows and bucket in seconds
        )
        return Observation(
            at=self._clock(),
            window_s=self._window_s,
            p99_s=_number(raw["p99"]),
            p95_s=_number(raw["p95"]),
            qps=qps,
            rejected_qps=rejected,
            queue_p99_s=_number(raw["queue_p99"]),
            utilization=_number(raw["utilization"]),
            mean_batch=_number(raw["mean_batch"]),
            compute=points,
            ready_replicas=ready_replicas,
            arrival_qps=arrivals,
            recent_qps=recent,
            # two scrapes fit the range: their distance is about half of it
            recent_window_s=None
            if recent is None or self._recent_s is None
            else self._recent_s / 2,
            level_qps=_number(raw["level"]) if "level" in raw else None,
            past=_past(raw, self._seasonality),
        )


def _past(
    raw: dict[str, list[dict[str, Any]]], seasonality: Seasonality | None
) -> tuple[PastPeriod, ...]:
    """Every past period's level and look-ahead peak, or none: a period Prometheus has no
    history for yet (retention, a new service) makes the pattern unknown, not smaller."""
    if seasonality is None:
        return ()
    past = []
    for n in range(1, seasonality.periods + 1):
        level, ahead = _number(raw[f"level_{n}"]), _number(raw[f"ahead_{n}"])
        if level is None or ahead is None:
            return ()
        past.append(PastPeriod(ahead_qps=ahead, level_qps=level))
    return tuple(past)


def http_query(url: str, *, timeout_s: float = 5.0) -> QueryFn:
    """A `QueryFn` over prometheus-api-client: one attempt per query, bounded by `timeout_s`."""
    from prometheus_api_client import PrometheusConnect
    from prometheus_api_client.exceptions import PrometheusApiClientException
    from requests import RequestException
    from urllib3.util.retry import Retry

    client = PrometheusConnect(url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout_s)

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        params = {} if at is None else {"time": f"{at:.3f}"}
        try:
            result: list[dict[str, Any]] = client.custom_query(text, params=params)
        except (PrometheusApiClientException, RequestException, ValueError) as exc:
            raise PrometheusUnavailable(f"{url}: {type(exc).__name__}") from exc
        return result

    return query
