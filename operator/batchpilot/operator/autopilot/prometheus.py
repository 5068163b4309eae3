"""Asks Prometheus (the autopilot's eyes): one service's queries (`PrometheusObserver`), or every
service's at once, once per interval (`FleetObserver`: from the recording rules of `recorded`
where Prometheus has them), over one HTTP client (`http_query`).

Queries have a timeout and no retries, so a dead Prometheus costs one timeout and an observation
of None — the autopilot then holds. What is asked is `promql`'s; how an answer becomes an
`Observation` is `answers`'. The names the rest of the operator and the tools use with the
observers (`Scope`, `Seasonality`, `queries`) are importable from here too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from batchpilot.operator.autopilot import recorded
from batchpilot.operator.autopilot.answers import Raw, observation_from
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.promql import (
    FLEET_LABELS,
    Scope,
    Seasonality,
    UtilizationSource,
    queries,
)

__all__ = [
    "FLEET_LABELS",
    "FleetObserver",
    "FleetRound",
    "PrometheusObserver",
    "PrometheusUnavailable",
    "QueryFn",
    "Reading",
    "Scope",
    "Seasonality",
    "UtilizationSource",
    "http_query",
    "queries",
    "split",
]

log = logging.getLogger(__name__)


_PROBE = "reporting"
"""The signal asked first and alone each round, with the recording rules' marker beside it."""

Reading = Literal["recorded", "raw"]
"""Where a round's signals came from: the recording rules, or the raw grouped queries."""


class QueryFn(Protocol):
    def __call__(self, text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        """Evaluate an instant query at `at` (Unix seconds; None: now)."""
        ...


class PrometheusUnavailable(Exception):
    """Prometheus did not answer, or answered with an error."""


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
            utilization=self._utilization,
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
    reading: Reading | None = None
    """Recorded or raw; None when Prometheus did not answer."""
    took_s: float = 0.0
    """How long the round's queries took, in seconds of the observer's clock."""
    utilization: UtilizationSource = "busy"
    """Where the utilization came from: a busy-time rate is read over the part of the window
    Prometheus holds, as the request rates are."""

    def observe(self, scope: Scope, *, ready_replicas: int | None) -> Observation | None:
        """The service's observation from this round; None when the round had no answers. A
        service absent from every answer has every signal missing: its decision holds."""
        if self.answers is None:
            return None
        return self._observation(self.answers, scope, ready_replicas)

    def lacks(self, scope: Scope) -> bool:
        """Whether the service's tick will miss a signal the decision needs from this round
        (every service's does where Prometheus did not answer), and so fall back on its pods."""
        if self.answers is None:
            return True
        # The tick counts the ready replicas from the Deployment: not a signal this round lacks.
        return bool(self._observation(self.answers, scope, 0).missing())

    def _observation(
        self, answers: dict[tuple[str, str], Raw], scope: Scope, ready_replicas: int | None
    ) -> Observation:
        return observation_from(
            answers.get((scope.namespace, scope.isvc), {}),
            window_s=self.window_s,
            recent_s=self.recent_s,
            seasonality=self.seasonality,
            ready_replicas=ready_replicas,
            at=self.at,
            utilization=self.utilization,
        )


class FleetObserver:
    """Every service's signals in one round of grouped queries — as many queries as one
    service's tick asks, whatever the number of services, each answered once per interval and
    split by (namespace, isvc). A failing or slow Prometheus costs the round one bounded attempt:
    the first query that fails ends the round.

    The three histogram quantiles over every service's buckets are most of a round (2.5 s of
    2.7 s for 1,000 services, one query after another), and Prometheus evaluates queries side by
    side: the first query is asked alone and, once it has answered, the others `concurrency` at a
    time (1: one after another). On the 2-core bench machine with its cores idle the round took
    two thirds of the time for 4 % more Prometheus CPU; with the machine saturated by other work
    it was no faster and cost up to a quarter more (bench/README.md).

    The seasonal signals move slowly: asked once per `seasonal_refresh_s` with the look-ahead
    widened by that much (so the forecast in force covers every tick until the next refresh),
    after the others, kept in between; when they fail, the round goes on with the last ones.
    `asked` counts the queries sent (for the fleet benchmark).

    With `rules="auto"` the first query (the count of reporting pods, always asked raw) carries
    the recording rules' marker for this window and utilization source (`recorded.marker`, one
    series `or`-ed in): while Prometheus has it, the rest of the round reads the recorded series,
    one per service and signal, whatever the pods' buckets; otherwise the raw grouped queries.
    Either way the round asks one query per signal. `rules="off"` always asks raw."""

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
        rules: Literal["auto", "off"] = "auto",
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
        self._marker = None if rules == "off" else recorded.marker_query(window_s, utilization)
        self._recorded = recorded.recorded_queries(window_s, utilization, recent_s=recent_s)
        self._utilization = utilization
        self.reading: Reading | None = None
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
        refresh = bool(self._seasonal) and (
            self._kept_at is None or now - self._kept_at >= self._refresh_s
        )
        try:
            reading, first = self._probe(at)
            texts = self._recorded if reading == "recorded" else self._fast
            rest = self._ask({n: t for n, t in texts.items() if n != _PROBE}, at=at)
            results = {name: first if name == _PROBE else rest[name] for name in texts}
        except PrometheusUnavailable as exc:
            log.warning("Prometheus unavailable: the autopilot holds this round (%s)", exc)
            return FleetRound(
                now,
                None,
                self._window_s,
                self._recent_s,
                self._seasonality,
                took_s=self._clock() - now,
            )
        if refresh:
            # Slow signals over days of history: a failure here costs the forecast its refresh
            # (the last answers stay, asked again next round), not the round.
            try:
                results |= self._ask(self._seasonal, at=at)
            except PrometheusUnavailable as exc:
                log.warning(
                    "Prometheus did not answer the seasonal signals (%s): the forecast keeps "
                    "its last answers and asks again next round",
                    exc,
                )
                refresh = False
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
        return FleetRound(
            now,
            answers,
            self._window_s,
            self._recent_s,
            self._seasonality,
            reading=reading,
            took_s=self._clock() - now,
            utilization=self._utilization,
        )

    def _probe(self, at: float | None) -> tuple[Reading, list[dict[str, Any]]]:
        """The round's first query, asked alone (a dead Prometheus fails here, once): the count
        of reporting pods, with the rules' marker `or`-ed into the same answer
        (`rules="auto"`), which says whether the rest of the round reads recorded series."""
        self.asked += 1
        if self._marker is None:
            reading: Reading = "raw"
            answer = self._query(self._fast[_PROBE], at=at)
        else:
            both = self._query(f"({self._fast[_PROBE]}) or {self._marker}", at=at)
            answer = [s for s in both if "isvc" in s.get("metric", {})]
            reading = "recorded" if len(answer) < len(both) else "raw"
            if reading != self.reading:
                self._say(reading)
        self.reading = reading
        return reading, answer

    def _say(self, reading: Reading) -> None:
        if reading == "recorded":
            log.info(
                "the autopilot reads Prometheus' recording rules (group %s, %d s window)",
                recorded.GROUP,
                self._window_s,
            )
        else:
            log.warning(
                "Prometheus has no batchpilot recording rules for a %d s window and "
                "utilization %r (%s): the autopilot asks the raw grouped queries, which "
                "read every pod's histogram buckets each round",
                self._window_s,
                self._utilization,
                recorded.marker(self._window_s),
            )

    def _ask(self, texts: dict[str, str], *, at: float | None) -> Raw:
        """Every text's answer, by name: one after another, or `concurrency` at a time; raises
        the first failure (`PrometheusUnavailable`)."""
        names = list(texts)
        results: Raw = {}
        if self._concurrency <= 1:
            for name in names:
                self.asked += 1
                results[name] = self._query(texts[name], at=at)
            return results
        if not names:
            return results
        pool = ThreadPoolExecutor(
            max_workers=max(1, min(self._concurrency, len(names))),
            thread_name_prefix="prometheus",
        )
        try:
            futures = {name: pool.submit(self._query, texts[name], at=at) for name in names}
            self.asked += len(futures)
            for name in names:
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
