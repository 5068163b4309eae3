"""The fleet's round against a real Prometheus: one set of grouped queries answers every service.

Twenty services' metrics history is backfilled into Prometheus' data directory (the same series
the runtime exports, see `batchpilot.sandbox.backfill`). One round must ask as many queries as
one service's tick, whatever the number of services, and give each service exactly the
observation its own queries give; a service without series is missing (its decision holds),
and a Prometheus that does not answer costs the round one attempt.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batchpilot.operator.autopilot import recorded
from batchpilot.operator.autopilot.prometheus import (
    FleetObserver,
    PrometheusObserver,
    Scope,
    Seasonality,
    http_query,
    queries,
)
from batchpilot.sandbox.backfill import FakeService, backfill, fleet, openmetrics
from batchpilot.sandbox.prometheus import free_port, prometheus_process

pytestmark = pytest.mark.slow

SERVICES = list(fleet(20, namespaces=3))


def comparable(observation: object) -> dict[str, object]:
    """Every field but the time, numbers to 12 significant digits: the recorded and the raw
    series are the same sums taken in another order, which may differ in the last bit."""
    assert observation is not None
    fields = dataclasses.asdict(observation)  # type: ignore[call-overload]
    del fields["at"]
    return {name: _rounded(value) for name, value in fields.items()}


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


DIFFERENCES = {"outside_s"}
"""Fields that are a difference of two rates (the request durations' less the time in the
batcher): where the two are close, their last digits — the backfilled counters are written to
three decimals, and the recorded and raw sums add in another order — show in the difference's
fifth significant digit. Compared to 1e-4."""


def alike(recorded: object, raw: object) -> bool:
    """`comparable` equality, the differences of rates to a relative 1e-4."""
    mine, theirs = comparable(recorded), comparable(raw)
    for name in DIFFERENCES:
        a, b = mine.pop(name), theirs.pop(name)
        if (a is None) != (b is None):
            return False
        if isinstance(a, float) and isinstance(b, float) and not math.isclose(a, b, rel_tol=1e-4):
            return False
    return mine == theirs


def test_one_round_answers_every_service_as_its_own_queries_do(tmp_path: Path) -> None:
    now = int(time.time()) // 15 * 15
    data = tmp_path / "prometheus" / "data"
    backfill(openmetrics(SERVICES, start=now - 900, end=now), data, workdir=tmp_path)
    with prometheus_process(tmp_path / "prometheus", retention="1d") as prometheus:
        query = http_query(prometheus.url)
        season = Seasonality(period_s=300, lookahead_s=60)
        settings = {"window_s": 60, "recent_s": 30, "seasonality": season}
        fleet_observer = FleetObserver(query, clock=time.time, **settings)  # type: ignore[arg-type]
        each = PrometheusObserver(query, clock=time.time, **settings)  # type: ignore[arg-type]

        first = fleet_observer.round(at=now - 30)
        assert fleet_observer.asked == len(
            queries(None, window_s=60, utilization="busy", recent_s=30, seasonality=season)
        )
        for service in SERVICES:
            scope = Scope(service.namespace, service.isvc)
            mine = each.observe(scope, ready_replicas=1, at=now - 30)
            # The fleet widens the seasonal look-ahead by its refresh: compare the rest exactly.
            ours = first.observe(scope, ready_replicas=1)
            assert comparable(ours) | {"past": None} == comparable(mine) | {"past": None}
            assert ours is not None
            assert ours.qps == pytest.approx(service.qps * (1 - service.rejected_share), rel=0.02)
            assert len(ours.past) == 2
            assert ours.p99_s is not None
            assert ours.utilization == pytest.approx(service.busy, rel=0.02)
            assert ours.outside_s == pytest.approx(service.p50_s / 2, rel=0.02)
            assert [(p.mean_batch, p.mean_seconds) for p in ours.startup] == [
                (1, pytest.approx(service.p50_s * (1 / 4 + 1 / 256), rel=1e-3)),
                (64, pytest.approx(service.p50_s / 2, rel=1e-3)),
            ]
            assert ours.compute
            assert not ours.missing()

        # The next round within the refresh asks the fast signals only, and keeps the seasonal.
        asked = fleet_observer.asked
        second = fleet_observer.round(at=now - 15)
        fast = queries(None, window_s=60, utilization="busy", recent_s=30)
        assert fleet_observer.asked - asked == len(fast)
        kept = second.observe(Scope(SERVICES[0].namespace, SERVICES[0].isvc), ready_replicas=1)
        assert kept is not None
        assert (
            kept.past
            == first.observe(Scope(SERVICES[0].namespace, SERVICES[0].isvc), ready_replicas=1).past
        )  # type: ignore[union-attr]

        absent = second.observe(Scope("team-0", "not-deployed"), ready_replicas=1)
        assert absent is not None
        assert absent.qps is None
        assert absent.missing()


def test_a_prometheus_that_does_not_answer_costs_the_round_one_attempt() -> None:
    observer = FleetObserver(
        http_query(f"http://127.0.0.1:{free_port()}", timeout_s=1.0), clock=time.time
    )
    round_ = observer.round()
    assert round_.answers is None
    assert observer.asked == 1
    assert round_.observe(Scope("a", "b"), ready_replicas=1) is None


def test_the_recorded_round_answers_every_service_as_the_raw_queries_do(tmp_path: Path) -> None:
    """The recording rules, evaluated by the real Prometheus over the same history, give every
    service the observation the raw grouped queries give at the rules' evaluation time."""
    now = int(time.time()) // 15 * 15 + 15  # history up to the next scrape: the rules see it
    data = tmp_path / "prometheus" / "data"
    # And a service whose history Prometheus holds only from 30 s before `now` (restarted
    # without it): how much of the window it holds is recorded with the rates it corrects.
    restarted = FakeService("team-0", "restarted", qps=40.0)
    history = "\n".join(
        line
        for line in openmetrics([*SERVICES, restarted], start=now - 900, end=now).splitlines()
        if 'isvc="restarted"' not in line or int(line.rsplit(" ", 1)[1]) >= now - 30
    )
    backfill(history + "\n", data, workdir=tmp_path)
    group = recorded.rule_group(60, "busy", interval_s=1.0)
    with prometheus_process(
        tmp_path / "prometheus", retention="1d", rule_groups=[group]
    ) as prometheus:
        query = http_query(prometheus.url)
        assert wait_for(lambda: prometheus.query(recorded.series("p99", 60)))
        # The rules' last complete evaluation: the marker is written last, so every recorded
        # series has a sample at its time (a signal read on its own may already be one
        # evaluation ahead of the rules after it). The raw queries asked then answer the same.
        # (The sample's own time: an instant query answers at the time it is asked.)
        marker = wait_for(
            lambda: prometheus.query(f"timestamp({recorded.marker_query(60, 'busy')})")
        )
        evaluated = float(marker[0]["value"][1])
        observer = FleetObserver(query, recent_s=30, clock=time.time)
        raw = FleetObserver(query, recent_s=30, rules="off", clock=time.time)
        ours, theirs = observer.round(at=evaluated), raw.round(at=evaluated)
        assert ours.reading == "recorded"
        assert theirs.reading == "raw"
        assert observer.asked == len(recorded.recorded_queries(60, "busy", recent_s=30))
        for service in SERVICES:
            scope = Scope(service.namespace, service.isvc)
            mine = ours.observe(scope, ready_replicas=1)
            assert alike(mine, theirs.observe(scope, ready_replicas=1)), (
                comparable(mine),
                comparable(theirs.observe(scope, ready_replicas=1)),
            )
            assert mine is not None
            assert mine.p99_s is not None
            assert mine.outside_s == pytest.approx(service.p50_s / 2, rel=0.02)
            assert len(mine.startup) == 2
            assert mine.compute
            assert not mine.missing()
        scope = Scope(restarted.namespace, restarted.isvc)
        mine = ours.observe(scope, ready_replicas=1)
        assert alike(mine, theirs.observe(scope, ready_replicas=1))
        assert mine is not None
        assert mine.covered_s is not None
        assert mine.covered_s < 60

        # Asked a window and more after the rules' last evaluation, a recorded value is missing
        # (the rules stopped: the autopilot holds), though Prometheus would still return it.
        later = evaluated + 120
        assert query(recorded.series("p99", 60), at=later)
        stale = observer.round(at=later)
        assert stale.reading == "recorded"
        late = stale.observe(Scope(SERVICES[0].namespace, SERVICES[0].isvc), ready_replicas=1)
        assert late is not None
        assert late.p99_s is None
        assert late.missing()


def wait_for(
    probe: Callable[[], list[dict[str, Any]]], timeout_s: float = 30
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        assert time.monotonic() < deadline, "Prometheus did not evaluate the rules in time"
        time.sleep(0.1)
    return found
