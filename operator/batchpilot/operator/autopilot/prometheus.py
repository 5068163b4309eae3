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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
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


FLEET_LABELS = ("namespace", "isvc")
"""What the fleet's round groups every signal by: one series per InferenceService."""


def queries(
    scope: Scope | None,
    *,
    window_s: int,
    utilization: UtilizationSource,
    recent_s: int | None = None,
    seasonality: Seasonality | None = None,
) -> dict[str, str]:
    """The PromQL for each signal, by name: for one service (`scope`), or for every service at
    once (None: each aggregation grouped by `FLEET_LABELS`, the same text otherwise — so the
    fleet's round asks as many questions as one service's tick, whatever the fleet's size).
    `recent_s` adds the fast signal: the arrival rate between the last two scrapes within that
    range (empty unless two scrapes fit in it). `seasonality` adds today's level and, per past
    period, its level and its look-ahead peak."""
    sel = scope.selector if scope is not None else 'isvc!=""'
    group = () if scope is not None else FLEET_LABELS
    w = f"{window_s}s"

    def agg(op: str, expr: str, *labels: str) -> str:
        by = ", ".join((*group, *labels))
        return f"{op} by ({by}) ({expr})" if by else f"{op}({expr})"

    def quantile(q: float, metric: str) -> str:
        return (
            f"histogram_quantile({q}, {agg('sum', f'rate({metric}_bucket{{{sel}}}[{w}])', 'le')})"
        )

    def rate(metric: str, extra: str = "", *labels: str) -> str:
        return agg("sum", f"rate({metric}{{{sel}{extra}}}[{w}])", *labels)

    busy = "batchpilot_device_busy_seconds_total"
    if scope is not None:
        dcgm = (
            f'avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{{namespace="{scope.namespace}",'
            f'pod=~"{scope.isvc}-.*"}}[{w}])) / 100'
        )
    else:
        # dcgm-exporter labels pods, not services: a Deployment's pod is <isvc>-<hash>-<hash>.
        dcgm = (
            agg(
                "avg",
                f'label_replace(avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{w}]), '
                f'"isvc", "$1", "pod", "(.+)-[^-]+-[^-]+")',
            )
            + " / 100"
        )
    util = {
        "busy": f"{rate(busy)} / {agg('count', f'{busy}{{{sel}}}')}",
        "nvml": agg("avg", f"avg_over_time(batchpilot_gpu_utilization_ratio{{{sel}}}[{w}])"),
        "dcgm": dcgm,
    }[utilization]
    arrivals = f"batchpilot_arrivals_total{{{sel}}}"
    # irate: the rate between the last two scrapes in the range, the freshest Prometheus has.
    recent = {} if recent_s is None else {"recent": agg("sum", f"irate({arrivals}[{recent_s}s])")}
    seasonal: dict[str, str] = {}
    if seasonality is not None:
        level, ahead = f"{seasonality.level_s}s", f"{seasonality.lookahead_s}s"
        # The level is the median one-minute rate over the hour: what the traffic runs at,
        # which a burst within the hour (today's or a past day's) does not move.
        steps = f"[{level}:{seasonality.step_s}s]"
        median = f"quantile_over_time(0.5, {agg('sum', f'rate({arrivals}[{w}])')}{steps}"
        seasonal["level"] = f"{median})"
        for n in range(1, seasonality.periods + 1):
            back = n * seasonality.period_s
            seasonal[f"level_{n}"] = f"{median} offset {back}s)"
            seasonal[f"then_{n}"] = agg("sum", f"rate({arrivals}[{w}] offset {back}s)")
            # The subquery's range ends `lookahead` after this time, then: offset back − ahead.
            seasonal[f"ahead_{n}"] = (
                f"max_over_time({agg('sum', f'rate({arrivals}[{w}])')}"
                f"[{ahead}:{seasonality.step_s}s] offset {back - seasonality.lookahead_s}s)"
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
            "compute_seconds": rate("batchpilot_batch_compute_seconds_total", "", "batch_bucket"),
            "compute_rows": rate("batchpilot_batch_rows_total", "", "batch_bucket"),
            "compute_batches": rate("batchpilot_batches_total", "", "batch_bucket"),
            "reporting": agg("count", f"batchpilot_engine_info{{{sel}}}"),
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


Raw = dict[str, list[dict[str, Any]]]
"""Each signal's answer, by name: Prometheus' instant-vector result."""


def observation_from(
    raw: Raw,
    *,
    window_s: int,
    recent_s: int | None,
    seasonality: Seasonality | None,
    ready_replicas: int | None,
    at: float,
) -> Observation:
    """One service's `Observation` from the answers to its queries (`queries`); a signal
    without an answer (no series for this service) is missing, as an empty answer is."""

    def number(name: str) -> float | None:
        return _number(raw.get(name, []))

    if number("reporting") is None:
        qps = rejected = arrivals = recent = None  # no replica of this service reports
    else:
        qps, rejected, arrivals = number("qps"), number("rejected"), number("arrivals")
        recent = number("recent")
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
    return Observation(
        at=at,
        window_s=window_s,
        p99_s=number("p99"),
        p95_s=number("p95"),
        qps=qps,
        rejected_qps=rejected,
        queue_p99_s=number("queue_p99"),
        utilization=number("utilization"),
        mean_batch=number("mean_batch"),
        compute=points,
        ready_replicas=ready_replicas,
        arrival_qps=arrivals,
        recent_qps=recent,
        # two scrapes fit the range: their distance is about half of it
        recent_window_s=None if recent is None or recent_s is None else recent_s / 2,
        level_qps=number("level"),
        past=_past(raw, seasonality),
    )


class PrometheusObserver:
    """One service's observation, its own queries asked there and then (`batchpilot profile`,
    tests). The operator's autopilot asks for the whole fleet at once: `FleetObserver`."""

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
        return observation_from(
            raw,
            window_s=self._window_s,
            recent_s=self._recent_s,
            seasonality=self._seasonality,
            ready_replicas=ready_replicas,
            at=self._clock(),
        )


@dataclass(frozen=True, slots=True)
class FleetRound:
    """One round of answers for every service at once: what each service's tick reads."""

    at: float
    answers: dict[tuple[str, str], Raw] | None
    """Each service's answers by (namespace, isvc); None: Prometheus did not answer the round."""
    window_s: int
    recent_s: int | None
    seasonality: Seasonality | None

    def observe(self, scope: Scope, *, ready_replicas: int | None) -> Observation | None:
        """The service's observation from this round; None when the round had no answers. A
        service absent from every answer has every signal missing: its decision holds."""
        if self.answers is None:
            return None
        return observation_from(
            self.answers.get((scope.namespace, scope.isvc), {}),
            window_s=self.window_s,
            recent_s=self.recent_s,
            seasonality=self.seasonality,
            ready_replicas=ready_replicas,
            at=self.at,
        )


class FleetObserver:
    """Every service's signals in one round of grouped queries — as many queries as one
    service's tick asks, whatever the number of services, each answered once per interval and
    split by (namespace, isvc). A failing or slow Prometheus costs the round one bounded attempt:
    the first query is asked alone, and only once it has answered are the others asked,
    `concurrency` at a time (Prometheus evaluates queries in parallel; asked one after another,
    the three histogram quantiles over every service's buckets alone took 2.5 s of a 2.7 s
    round for 1,000 services). The first query that fails ends the round.

    The seasonal signals move slowly: asked once per `seasonal_refresh_s` with the look-ahead
    widened by that much (so the forecast in force covers every tick until the next refresh),
    kept in between. `asked` counts the queries sent (for the fleet benchmark)."""

    def __init__(
        self,
        query: QueryFn,
        *,
        window_s: int = 60,
        utilization: UtilizationSource = "busy",
        recent_s: int | None = None,
        seasonality: Seasonality | None = None,
        seasonal_refresh_s: float = 60.0,
        concurrency: int = 4,
        clock: Callable[[], float],
    ) -> None:
        self._query = query
        self._window_s = window_s
        self._recent_s = recent_s
        self._seasonality = seasonality
        self._refresh_s = seasonal_refresh_s
        self._concurrency = concurrency
        self._clock = clock
        self._fast = queries(None, window_s=window_s, utilization=utilization, recent_s=recent_s)
        self._seasonal: dict[str, str] = {}
        if seasonality is not None:
            widened = replace(
                seasonality, lookahead_s=seasonality.lookahead_s + math.ceil(seasonal_refresh_s)
            )
            every = queries(None, window_s=window_s, utilization=utilization, seasonality=widened)
            self._seasonal = {k: v for k, v in every.items() if k not in self._fast}
        self._kept: dict[tuple[str, str], Raw] = {}
        self._kept_at: float | None = None
        self.asked = 0

    def round(self, at: float | None = None) -> FleetRound:
        """Ask every signal once (at `at`, Unix seconds; None: now) and split the answers."""
        now = self._clock()
        texts = dict(self._fast)
        refresh = bool(self._seasonal) and (
            self._kept_at is None or now - self._kept_at >= self._refresh_s
        )
        if refresh:
            texts |= self._seasonal
        try:
            results = self._ask(texts, at=at)
        except PrometheusUnavailable as exc:
            log.warning("Prometheus unavailable: the autopilot holds this round (%s)", exc)
            return FleetRound(now, None, self._window_s, self._recent_s, self._seasonality)
        answers = split(results)
        if refresh:
            self._kept = {
                key: {name: raw[name] for name in self._seasonal if name in raw}
                for key, raw in answers.items()
            }
            self._kept_at = now
        else:
            for key, kept in self._kept.items():
                answers.setdefault(key, {}).update(kept)
        return FleetRound(now, answers, self._window_s, self._recent_s, self._seasonality)

    def _ask(self, texts: dict[str, str], *, at: float | None) -> Raw:
        """Every text's answer, by name, in the order of `texts`: the first alone, the rest
        `concurrency` at a time; raises the first failure (`PrometheusUnavailable`)."""
        names = list(texts)
        self.asked += 1
        results = {names[0]: self._query(texts[names[0]], at=at)}
        rest = names[1:]
        if not rest:
            return results
        pool = ThreadPoolExecutor(
            max_workers=max(1, min(self._concurrency, len(rest))),
            thread_name_prefix="prometheus",
        )
        try:
            futures = {name: pool.submit(self._query, texts[name], at=at) for name in rest}
            self.asked += len(futures)
            for name in rest:
                results[name] = futures[name].result()
        finally:
            # After a failure the queries not started are dropped; those in flight end at
            # their own timeout, unwaited for.
            pool.shutdown(wait=False, cancel_futures=True)
        return results


def split(results: Raw) -> dict[tuple[str, str], Raw]:
    """Grouped answers (each signal's series for every service) split into each service's
    answers, by (namespace, isvc)."""
    answers: dict[tuple[str, str], Raw] = {}
    for name, series_list in results.items():
        for series in series_list:
            labels = series.get("metric", {})
            key = (labels.get("namespace", ""), labels.get("isvc", ""))
            answers.setdefault(key, {}).setdefault(name, []).append(series)
    return answers


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
