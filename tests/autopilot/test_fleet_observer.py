"""The fleet's round without a Prometheus: what is asked, in which order, and what a failure costs.

The round asks one query after another, or (`concurrency` > 1) one alone and then the others a
few at a time: the answers must be split per service the same either way, and a Prometheus that
fails costs the round one bounded attempt.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from batchpilot.operator.autopilot.prometheus import (
    FleetObserver,
    PrometheusUnavailable,
    Scope,
    queries,
)

FAST = queries(None, window_s=60, utilization="busy", recent_s=30)
NAMES = {text: name for name, text in FAST.items()}


def series(namespace: str, isvc: str, value: float, **labels: str) -> dict[str, Any]:
    return {
        "metric": {"namespace": namespace, "isvc": isvc, **labels},
        "value": [0, str(value)],
    }


def answer(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
    """Two services' answers to every signal: each signal's own number for each."""
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
    assert together.observe(Scope("b", "two"), ready_replicas=1) == alone.observe(
        Scope("b", "two"), ready_replicas=1
    )


def test_the_queries_after_the_first_are_asked_together() -> None:
    first = next(iter(FAST.values()))
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


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_prometheus_that_does_not_answer_is_asked_once(concurrency: int) -> None:
    calls = []

    def dead(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        calls.append(text)
        raise PrometheusUnavailable("connection refused")

    observer = FleetObserver(dead, recent_s=30, concurrency=concurrency, clock=lambda: 100.0)
    round_ = observer.round()
    assert round_.answers is None
    assert observer.asked == len(calls) == 1
    assert round_.observe(Scope("a", "one"), ready_replicas=1) is None


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_query_that_fails_later_holds_the_whole_round(concurrency: int) -> None:
    failing = FAST["p99"]

    def query(text: str, /, *, at: float | None = None) -> list[dict[str, Any]]:
        if text == failing:
            raise PrometheusUnavailable("timeout")
        return answer(text, at=at)

    observer = FleetObserver(query, recent_s=30, concurrency=concurrency, clock=lambda: 100.0)
    assert observer.round().answers is None
    # The next round asks afresh.
    assert FleetObserver(answer, recent_s=30, clock=lambda: 100.0).round().answers is not None
