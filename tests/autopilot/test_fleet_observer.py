"""The fleet's round without a Prometheus: what is asked, in which order, and what a failure costs.

The round first asks, alone, how many pods report, with the recording rules' marker in the same
answer; then it reads the recorded series or asks the raw grouped queries, one after another or
(`concurrency` > 1) a few at a time: the answers must be split per service the same either way,
and a Prometheus that fails costs the round one bounded attempt.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from batchpilot.operator.autopilot import recorded
from batchpilot.operator.autopilot.prometheus import (
    FleetObserver,
    PrometheusUnavailable,
    Scope,
    Seasonality,
    queries,
)

FAST = queries(None, window_s=60, utilization="busy", recent_s=30)
RECORDED = recorded.recorded_queries(60, "busy", recent_s=30)
MARKER = recorded.marker_query(60, "busy")
PROBE = f"({FAST['reporting']}) or {MARKER}"
"""The round's first query: the count of reporting pods, and the recording rules' marker."""
NAMES = (
    {text: name for name, text in FAST.items()}
    | {text: name for name, text in RECORDED.items()}
    | {PROBE: "reporting"}
)
MARKER_SERIES = {
    "metric": {"__name__": recorded.marker(60), "utilization": "busy"},
    "value": [0, "1"],
}


def series(namespace: str, isvc: str, value: float, **labels: str) -> dict[str, Any]:
    return {
        "metric": {"namespace": namespace, "isvc": isvc, **labels},
        "value": [0, str(value)],
    }


def answer(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
    """Two services' answers to every signal: each signal's own number for each (no recording
    rules: the marker has no series)."""
    number = sorted(FAST).index(NAMES[text]) + 1.0
    if NAMES[text].startswith("compute_"):
        return [series("a", "one", number, batch_bucket="8"), series("b", "two", 2 * number)]
    return [series("a", "one", number), series("b", "two", 2 * number)]


def test_the_answers_are_split_as_one_query_after_another_splits_them() -> None:
    asked_alone = FleetObserver(answer, recent_s=30, concurrency=1, clock=lambda: 100.0)
    asked_together = FleetObserver(answer, recent_s=30, concurrency=4, clock=lambda: 100.0)
    alone, together = asked_alone.round(at=100.0), asked_together.round(at=100.0)
    assert together.answers == alone.answers
    assert together.answers is not None
    assert list(together.answers[("a", "one")]) == list(FAST)  # in the order of the signals
    assert asked_together.asked == asked_alone.asked == len(FAST)
    assert together.reading == "raw"
    assert together.observe(Scope("b", "two"), ready_replicas=1) == alone.observe(
        Scope("b", "two"), ready_replicas=1
    )


def test_the_queries_after_the_first_are_asked_together() -> None:
    first = PROBE
    together = threading.Barrier(4, timeout=10)
    lock, waiting, met = threading.Lock(), [0], []

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        with lock:
            waits = text != first and waiting[0] < 4
            waiting[0] += waits
        if waits:  # the barrier breaks (and fails the round) unless 4 are asked at once
            met.append(together.wait())
        return answer(text, at=at)

    observer = FleetObserver(query, recent_s=30, concurrency=4, clock=lambda: 100.0)
    assert observer.round(at=100.0).answers is not None
    assert sorted(met) == [0, 1, 2, 3]


def test_without_the_rules_the_round_asks_the_same_and_no_marker() -> None:
    order: list[str] = []
    lock = threading.Lock()

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        with lock:
            order.append(text)
        return answer(text, at=at)

    observer = FleetObserver(query, recent_s=30, rules="off", clock=lambda: 100.0)
    round_ = observer.round(at=100.0)
    auto = FleetObserver(answer, recent_s=30, clock=lambda: 100.0).round(at=100.0)
    assert round_.answers == auto.answers
    assert order[0] == FAST["reporting"]  # alone, first
    assert sorted(order) == sorted(FAST.values())
    assert observer.reading == "raw"


def with_rules(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
    """Prometheus with the recording rules: the marker has its series."""
    if text == PROBE:
        return [*answer(text, at=at), MARKER_SERIES]
    return answer(text, at=at)


def test_with_the_rules_loaded_the_round_reads_the_recorded_series() -> None:
    asked: list[str] = []

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        asked.append(text)
        return with_rules(text, at=at)

    raw = FleetObserver(answer, recent_s=30, clock=lambda: 100.0).round(at=100.0)
    observer = FleetObserver(query, recent_s=30, clock=lambda: 100.0)
    round_ = observer.round(at=100.0)
    assert round_.reading == observer.reading == "recorded"
    assert asked[0] == PROBE
    assert sorted(asked[1:]) == sorted(t for n, t in RECORDED.items() if n != "reporting")
    assert observer.asked == len(RECORDED) == len(FAST)
    for signal in recorded.RECORDED:
        assert recorded.series(signal, 60) in RECORDED[signal]
        assert RECORDED[signal] not in FAST.values()
    # The recorded series answer what the raw queries answer: the same observations, and the
    # marker is nobody's answer.
    assert round_.answers == raw.answers
    assert round_.observe(Scope("a", "one"), ready_replicas=1) == raw.observe(
        Scope("a", "one"), ready_replicas=1
    )


def test_the_round_follows_the_rules_coming_and_going_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prometheus = [answer]

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        return prometheus[0](text, at=at)

    observer = FleetObserver(query, recent_s=30, clock=lambda: 100.0)
    readings = []
    with caplog.at_level(logging.INFO, logger="batchpilot.operator.autopilot.prometheus"):
        for rules in (False, False, True, True, False):
            prometheus[0] = with_rules if rules else answer
            readings.append(observer.round(at=100.0).reading)
    assert readings == ["raw", "raw", "recorded", "recorded", "raw"]
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO", "WARNING"]
    assert "no batchpilot recording rules for a 60 s window" in said[0][1]
    assert "reads Prometheus' recording rules" in said[1][1]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_prometheus_that_does_not_answer_is_asked_once(concurrency: int) -> None:
    calls = []

    def dead(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        calls.append(text)
        raise PrometheusUnavailable("connection refused")

    observer = FleetObserver(dead, recent_s=30, concurrency=concurrency, clock=lambda: 100.0)
    round_ = observer.round()
    assert round_.answers is None
    assert round_.reading is None
    assert observer.asked == len(calls) == 1
    assert round_.observe(Scope("a", "one"), ready_replicas=1) is None


@pytest.mark.parametrize("rules", [False, True])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_query_that_fails_later_holds_the_whole_round(concurrency: int, rules: bool) -> None:
    failing = (RECORDED if rules else FAST)["p99"]

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        if text == failing:
            raise PrometheusUnavailable("timeout")
        return (with_rules if rules else answer)(text, at=at)

    observer = FleetObserver(query, recent_s=30, concurrency=concurrency, clock=lambda: 100.0)
    assert observer.round().answers is None
    # The next round asks afresh.
    assert FleetObserver(answer, recent_s=30, clock=lambda: 100.0).round().answers is not None


def test_seasonal_signals_that_fail_cost_the_forecast_its_refresh_not_the_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    season = Seasonality(period_s=3600, lookahead_s=60)
    failing = [True]
    asked: list[str] = []

    def slow(texts: list[str]) -> int:
        return sum(1 for text in texts if text not in NAMES)  # not a fast signal's

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        asked.append(text)
        if slow([text]):
            if failing[0]:
                raise PrometheusUnavailable("timeout")
            return [series("a", "one", 5.0)]
        return answer(text, at=at)

    clock = [100.0]
    observer = FleetObserver(query, recent_s=30, seasonality=season, clock=lambda: clock[0])
    first = observer.round(at=100.0)
    assert first.answers is not None  # the fast signals answered: the round goes on
    assert first.observe(Scope("a", "one"), ready_replicas=1) is not None
    assert "seasonal signals" in caplog.text
    # Asked again the next round, not a refresh interval later.
    failing[0] = False
    clock[0] = 115.0
    asked.clear()
    second = observer.round(at=115.0)
    assert slow(asked) == 7  # today's level; per past period its level, rate then and peak
    observed = second.observe(Scope("a", "one"), ready_replicas=1)
    assert observed is not None
    assert observed.level_qps == 5.0
    # Kept until the next refresh.
    clock[0] = 130.0
    asked.clear()
    third = observer.round(at=130.0)
    assert slow(asked) == 0
    kept = third.observe(Scope("a", "one"), ready_replicas=1)
    assert kept is not None
    assert kept.level_qps == 5.0
