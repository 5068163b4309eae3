"""The pods' own metrics where Prometheus does not answer: two reads as Prometheus' answers
(`scraped`), and the autopilot adding replicas on them, never removing any."""

from __future__ import annotations

import asyncio
import copy
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchpilot.api.samples import Sample, read_samples, samples_doc
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.autopilot.pod_metrics import (
    FIRST_WINDOW_S,
    MAX_BASELINE_S,
    PodScraper,
    first_window_s,
)
from batchpilot.operator.autopilot.prometheus import FleetRound
from batchpilot.operator.autopilot.scraped import Read, answers, histogram_quantile
from batchpilot.operator.children.common import Owner
from batchpilot.operator.fleet import FleetPilot
from batchpilot.operator.kinds import DEPLOYMENT, INFERENCESERVICE
from batchpilot.operator.passes import Passes
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.loadgen import LoadConfig, RateSchedule, Target, run_load
from tests.autopilot.test_pilot import T, World
from tests.operator.test_handlers import Blind
from tests.operator.test_reconciler import isvc
from tests.runtime_process import runtime_process

BOUNDS = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "+Inf")


def counters(
    *,
    served: float,
    rejected: float = 0.0,
    busy_s: float = 0.0,
    rows: float = 0.0,
    batches: float = 0.0,
    buckets: tuple[float, ...] = (0,) * len(BOUNDS),
    batcher_s: float = 0.0,
    duration_s: float = 0.0,
) -> list[Sample]:
    """A pod's samples as its /admin/metrics has them (cumulative buckets)."""
    own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}
    found: list[Sample] = [
        ("batchpilot_requests_total", {**own, "outcome": "success"}, served),
        ("batchpilot_requests_total", {**own, "outcome": "rejected"}, rejected),
        ("batchpilot_arrivals_total", own, served + rejected),
        ("batchpilot_device_busy_seconds_total", own, busy_s),
        ("batchpilot_batch_size_sum", own, rows),
        ("batchpilot_batch_size_count", own, batches),
        ("batchpilot_batcher_seconds_total", own, batcher_s),
        ("batchpilot_request_duration_seconds_sum", own, duration_s),
        ("batchpilot_request_duration_seconds_count", own, buckets[-1]),
        ("batchpilot_batch_compute_seconds_total", {**own, "batch_bucket": "1"}, busy_s),
        ("batchpilot_batch_rows_total", {**own, "batch_bucket": "1"}, rows),
        ("batchpilot_batches_total", {**own, "batch_bucket": "1"}, batches),
    ]
    found += [
        ("batchpilot_request_duration_seconds_bucket", {**own, "le": le}, count)
        for le, count in zip(BOUNDS, buckets, strict=True)
    ]
    return found


class TestHistogramQuantile:
    def test_linear_within_the_bucket_the_rank_falls_in(self) -> None:
        buckets = {"0.1": 50.0, "0.2": 90.0, "0.5": 100.0, "+Inf": 100.0}
        assert histogram_quantile(0.99, buckets) == pytest.approx(0.2 + 0.3 * 9 / 10)
        assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)

    def test_in_the_inf_bucket_the_largest_finite_bound(self) -> None:
        assert histogram_quantile(0.99, {"0.1": 50.0, "+Inf": 100.0}) == 0.1

    def test_nothing_observed_is_missing(self) -> None:
        assert histogram_quantile(0.99, {"0.1": 0.0, "+Inf": 0.0}) is None
        assert histogram_quantile(0.99, {}) is None


class TestTwoReads:
    def test_rates_are_increases_over_the_seconds_between_reads_summed_over_pods(self) -> None:
        before = {
            "a": Read(100.0, tuple(counters(served=1000, busy_s=10, rows=2000, batches=500))),
            # restarted since: its counters start from zero again
            "b": Read(100.0, tuple(counters(served=9000, busy_s=90, rows=20_000, batches=5000))),
        }
        after = {
            "a": Read(110.0, tuple(counters(served=1300, busy_s=15, rows=2600, batches=650))),
            "b": Read(110.0, tuple(counters(served=200, busy_s=2, rows=400, batches=100))),
        }
        found = answers(before, after)
        assert found is not None
        raw, window_s = found
        assert window_s == 10.0
        assert float(raw["qps"][0]["value"][1]) == pytest.approx(30 + 20)
        assert float(raw["utilization"][0]["value"][1]) == pytest.approx((0.5 + 0.2) / 2)
        assert float(raw["mean_batch"][0]["value"][1]) == pytest.approx(1000 / 250)
        assert float(raw["reporting"][0]["value"][1]) == 2

    def test_a_latency_quantile_is_over_the_buckets_increases(self) -> None:
        quiet = tuple(counters(served=0))
        # 100 requests: 90 under 50 ms, 10 between 250 and 500 ms
        busy = tuple(counters(served=100, buckets=(0, 0, 0, 90, 90, 90, 100, 100, 100)))
        raw, _ = answers({"a": Read(0.0, quiet)}, {"a": Read(10.0, busy)}) or ({}, 0)
        assert float(raw["p99"][0]["value"][1]) == pytest.approx(0.25 + 0.25 * 9 / 10)
        assert float(raw["p95"][0]["value"][1]) == pytest.approx(0.25 + 0.25 * 5 / 10)

    def test_retries_a_pod_counted_apart_are_no_part_of_the_arrivals(self) -> None:
        own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}

        def read(at: float, first: float, retried: float) -> Read:
            return Read(
                at,
                (
                    *counters(served=0),
                    ("batchpilot_arrivals_total", {**own, "attempt": "first"}, first),
                    ("batchpilot_arrivals_total", {**own, "attempt": "retry"}, retried),
                    ("batchpilot_recent_arrivals_per_second", {**own, "attempt": "first"}, 40.0),
                    ("batchpilot_recent_arrivals_per_second", {**own, "attempt": "retry"}, 90.0),
                ),
            )

        # `counters` adds a series without the label (a runtime that does not count by
        # attempt): it is demand, as Prometheus' `attempt!="retry"` reads it.
        raw, _ = answers({"a": read(0.0, 100, 50)}, {"a": read(10.0, 500, 950)}) or ({}, 0)
        assert float(raw["arrivals"][0]["value"][1]) == pytest.approx(40.0)
        assert float(raw["now"][0]["value"][1]) == pytest.approx(40.0)
        assert float(raw["retried"][0]["value"][1]) == pytest.approx(90.0)

    def test_how_the_arrivals_clump_is_the_pods_mean_gauge(self) -> None:
        own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}

        def read(at: float, dispersion: float) -> Read:
            gauge = ("batchpilot_arrival_dispersion", own, dispersion)
            return Read(at, (*counters(served=0), gauge))

        before = {"a": read(0.0, 1.0), "b": read(0.0, 1.0)}
        raw, _ = answers(before, {"a": read(10.0, 3.0), "b": read(10.0, 5.0)}) or ({}, 0)
        assert float(raw["dispersion"][0]["value"][1]) == pytest.approx(4.0)

    def test_the_seconds_squares_and_the_seconds_counted_are_summed_rates(self) -> None:
        own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}

        def read(at: float, squares: float, seconds: float) -> Read:
            sums = (
                ("batchpilot_arrival_second_squares_total", own, squares),
                ("batchpilot_arrival_counted_seconds_total", own, seconds),
            )
            return Read(at, (*counters(served=0), *sums))

        before = {"a": read(0.0, 0, 100), "b": read(0.0, 500, 40)}
        raw, _ = answers(before, {"a": read(10.0, 1_000, 110), "b": read(10.0, 3_500, 50)}) or (
            {},
            0,
        )
        assert float(raw["second_squares"][0]["value"][1]) == pytest.approx(400.0)
        assert float(raw["counted_seconds"][0]["value"][1]) == pytest.approx(2.0)

    def test_the_share_over_the_sla_is_of_the_pods_that_count_it(self) -> None:
        own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}
        bounds = (0,) * (len(BOUNDS) - 1)

        def read(at: float, timed: float, over: float | None) -> Read:
            late = () if over is None else (("batchpilot_requests_over_sla_total", own, over),)
            sla = () if over is None else (("batchpilot_sla_seconds", own, 0.1),)
            return Read(at, (*counters(served=timed, buckets=(*bounds, timed)), *late, *sla))

        # a: 100 timed, 3 over the SLA; b: not yet given the SLA, 100 timed, in neither sum
        before = {"a": read(0.0, 0, 0), "b": read(0.0, 0, None)}
        after = {"a": read(10.0, 100, 3), "b": read(10.0, 100, None)}
        raw, _ = answers(before, after) or ({}, 0)
        assert float(raw["late_share"][0]["value"][1]) == pytest.approx(0.03)
        # and the SLA it was counted against, as the pods give it
        assert float(raw["counted_sla_min"][0]["value"][1]) == 0.1
        assert float(raw["counted_sla_max"][0]["value"][1]) == 0.1
        none = {"b": read(10.0, 100, None)}
        raw, _ = answers({"b": read(0.0, 0, None)}, none) or ({}, 0)
        assert raw["late_share"] == []

    def test_how_batch_times_vary_is_the_pods_mean_gauge(self) -> None:
        own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}

        def read(at: float, cv: float | None) -> Read:
            gauge = () if cv is None else (("batchpilot_batch_time_cv", own, cv),)
            return Read(at, (*counters(served=0), *gauge))

        before = {"a": read(0.0, 0.1), "b": read(0.0, None), "c": read(0.0, 0.1)}
        after = {"a": read(10.0, 0.2), "b": read(10.0, None), "c": read(10.0, 0.4)}
        raw, _ = answers(before, after) or ({}, 0)
        # b has not yet predicted ten batches: no gauge, no part of the mean
        assert float(raw["batch_cv"][0]["value"][1]) == pytest.approx(0.3)

    def test_how_the_rows_a_request_vary_is_their_cv_over_the_pods(self) -> None:
        own = {"model": "resnet50", "isvc": "resnet50", "namespace": "vision"}

        def read(at: float, arrivals: float, rows: float, squares: float) -> Read:
            sums = (
                ("batchpilot_arrival_rows_total", own, rows),
                ("batchpilot_arrival_rows_squared_total", own, squares),
            )
            return Read(at, (*counters(served=arrivals), *sums))

        # a: 90 of one row and 10 of 16 in 10 s; b: 100 of 4. Over both: 200 requests, 650
        # rows, 2,650 + 1,600 squared: cv² = 4,250 · 200 / 650² - 1
        before = {"a": read(0.0, 0, 0, 0), "b": read(0.0, 0, 0, 0)}
        after = {"a": read(10.0, 100, 250, 2_650), "b": read(10.0, 100, 400, 1_600)}
        raw, _ = answers(before, after) or ({}, 0)
        expected = math.sqrt(4_250 * 200 / 650**2 - 1)
        assert float(raw["rows_cv"][0]["value"][1]) == pytest.approx(expected)
        # one size: 0; a runtime without the sums: no answer
        same = {"a": read(10.0, 100, 400, 1_600)}
        raw, _ = answers({"a": read(0.0, 0, 0, 0)}, same) or ({}, 0)
        assert float(raw["rows_cv"][0]["value"][1]) == 0.0
        plain = Read(10.0, tuple(counters(served=100)))
        raw, _ = answers({"a": Read(0.0, tuple(counters(served=0)))}, {"a": plain}) or ({}, 0)
        assert raw["rows_cv"] == []

    def test_a_pod_read_once_is_not_in_the_window(self) -> None:
        read = Read(0.0, tuple(counters(served=0)))
        assert answers({}, {"a": read}) is None
        assert answers({"a": read}, {"b": read}) is None
        assert answers({"a": read}, {"a": read}) is None  # no time between

    def test_idle_pods_are_measured_idle_not_missing(self) -> None:
        read = tuple(counters(served=5))
        raw, _ = answers({"a": Read(0.0, read)}, {"a": Read(15.0, read)}) or ({}, 0)
        assert float(raw["qps"][0]["value"][1]) == 0.0
        assert raw["p99"] == []


class Pods:
    def __init__(self, *endpoints: str) -> None:
        self.endpoints = list(endpoints)

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return list(self.endpoints)


class Fleet:
    """Pods whose counters move as a load of `rps` (of which `shed_rps` refused) would move
    them, read through the JSON document as the operator reads it."""

    def __init__(self, *endpoints: str) -> None:
        self.pods = Pods(*endpoints)
        self.clock = 1000.0
        self.rps = 0.0
        self.shed_rps = 0.0
        self.busy = 0.0
        self.slow = False
        self.silent: set[str] = set()
        self._totals: dict[str, dict[str, float]] = {}

    def advance(self, seconds: float) -> None:
        self.clock += seconds
        for endpoint in self.pods.endpoints:
            t = self._totals.setdefault(endpoint, dict.fromkeys(("served", "shed", "busy"), 0.0))
            t["served"] += (self.rps - self.shed_rps) * seconds
            t["shed"] += self.shed_rps * seconds
            t["busy"] += self.busy * seconds

    def fetch(self, endpoint: str) -> list[Sample]:
        if endpoint in self.silent:
            raise ConnectionRefusedError("connection refused")
        t = self._totals.setdefault(endpoint, dict.fromkeys(("served", "shed", "busy"), 0.0))
        n = t["served"]
        # slow: every request over 500 ms; else all under 50 ms
        buckets = (0, 0, 0, 0, 0, 0, 0, n, n) if self.slow else (0, 0, 0, n, n, n, n, n, n)
        samples = counters(
            served=n,
            rejected=t["shed"],
            busy_s=t["busy"],
            rows=n,
            batches=n,
            buckets=buckets,
            batcher_s=n * (0.6 if self.slow else 0.03),
            duration_s=n * (0.6 if self.slow else 0.03),
        )
        return read_samples(samples_doc(samples))  # through the wire's shape


def owner() -> Owner:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"uri": "pvc://models/resnet50.onnx"}, "sla": {"latencyP99Ms": 100}}
    )
    return Owner(name="resnet50", namespace="vision", uid="u", spec=spec)


class TestPodScraper:
    def test_the_first_read_only_keeps_then_each_read_has_a_window(self) -> None:
        fleet = Fleet("10.0.0.1:8082", "10.0.0.2:8082")
        scraper = PodScraper(fleet.pods, fetch=fleet.fetch, clock=lambda: fleet.clock)
        assert scraper(owner(), ready_replicas=2, at=T) is None
        fleet.rps, fleet.busy = 40.0, 0.5
        fleet.advance(15)
        seen = scraper(owner(), ready_replicas=2, at=T + 15)
        assert isinstance(seen, Observation)
        assert (seen.window_s, seen.ready_replicas, seen.reporting_replicas) == (15, 2, 2)
        assert seen.qps == pytest.approx(80.0)
        assert seen.utilization == pytest.approx(0.5)
        assert seen.p99_s is not None
        assert seen.p99_s < 0.05
        assert seen.missing() == []

    def test_a_pod_that_does_not_answer_is_left_out_and_counted(self) -> None:
        fleet = Fleet("10.0.0.1:8082", "10.0.0.2:8082")
        scraper = PodScraper(fleet.pods, fetch=fleet.fetch, clock=lambda: fleet.clock)
        scraper(owner(), ready_replicas=2, at=T)
        fleet.rps = 10.0
        fleet.advance(15)
        fleet.silent = {"10.0.0.2:8082"}
        seen = scraper(owner(), ready_replicas=2, at=T + 15)
        assert seen is not None
        assert seen.reporting_replicas == 1
        assert seen.qps == pytest.approx(10.0)

    def test_a_services_pods_are_read_at_once(self) -> None:
        """Each read waits for all three to be under way: read one after another, they would
        each give up, and no pod would be in the window."""
        fleet = Fleet("10.0.0.1:8082", "10.0.0.2:8082", "10.0.0.3:8082")
        together = threading.Barrier(3, timeout=10)

        def fetch(endpoint: str) -> list[Sample]:
            together.wait()
            return fleet.fetch(endpoint)

        scraper = PodScraper(fleet.pods, fetch=fetch, clock=lambda: fleet.clock)
        scraper(owner(), ready_replicas=3, at=T)
        fleet.advance(15)
        seen = scraper(owner(), ready_replicas=3, at=T + 15)
        assert seen is not None
        assert seen.reporting_replicas == 3

    def test_reads_older_than_a_minute_start_no_window(self) -> None:
        fleet = Fleet("10.0.0.1:8082")
        scraper = PodScraper(fleet.pods, fetch=fleet.fetch, clock=lambda: fleet.clock)
        scraper(owner(), ready_replicas=1, at=T)
        fleet.advance(MAX_BASELINE_S + 1)
        assert scraper(owner(), ready_replicas=1, at=T + 61) is None
        fleet.advance(15)
        assert scraper(owner(), ready_replicas=1, at=T + 76) is not None

    def test_a_prime_reads_a_service_with_no_read_kept_and_starts_its_window(self) -> None:
        fleet = Fleet("10.0.0.1:8082", "10.0.0.2:8082")
        scraper = PodScraper(fleet.pods, fetch=fleet.fetch, clock=lambda: fleet.clock)
        assert scraper.prime("vision", "resnet50")
        assert not scraper.prime("vision", "resnet50")  # kept: the next call's window starts
        fleet.rps = 40.0
        fleet.advance(5)
        seen = scraper(owner(), ready_replicas=2, at=T + 5)
        assert seen is not None
        assert (seen.window_s, seen.reporting_replicas) == (5, 2)
        assert seen.qps == pytest.approx(80.0)
        # A read kept by the call is a window's start too; one older than a minute is not.
        assert not scraper.prime("vision", "resnet50")
        fleet.advance(MAX_BASELINE_S + 1)
        assert scraper.prime("vision", "resnet50")

    def test_a_prime_that_reads_no_pod_says_so(self) -> None:
        fleet = Fleet("10.0.0.1:8082")
        fleet.silent = {"10.0.0.1:8082"}
        scraper = PodScraper(fleet.pods, fetch=fleet.fetch, clock=lambda: fleet.clock)
        assert not scraper.prime("vision", "resnet50")
        assert not PodScraper(Pods(), fetch=fleet.fetch).prime("vision", "resnet50")

    def test_the_first_window_is_a_third_of_a_short_interval(self) -> None:
        assert first_window_s(15) == FIRST_WINDOW_S == 5
        assert first_window_s(2) == pytest.approx(2 / 3)


def blind(scope: Any, *, ready_replicas: int | None) -> None:
    return None  # Prometheus does not answer


class TestTheAutopilotWithoutPrometheus:
    def world(self) -> tuple[World, Fleet]:
        fleet = Fleet("10.0.0.7:8082")
        self.seconds = [T]
        scrape = PodScraper(fleet.pods, fetch=fleet.fetch, clock=lambda: fleet.clock)
        world = World(observe=blind, seconds=lambda: self.seconds[0], scrape=scrape)
        world.body["spec"]["scaling"]["maxBatchSize"] = 1  # replicas, not batches, carry more
        return world, fleet

    def next_tick(self, world: World, fleet: Fleet) -> Any:
        fleet.advance(15)
        self.seconds[0] += 15
        return world.tick()

    def replicas(self, world: World) -> int:
        return int(world.kube.objects[("Deployment", "vision", "resnet50")]["spec"]["replicas"])

    def test_an_overloaded_service_gets_replicas_from_its_pods_metrics(self) -> None:
        world, fleet = self.world()
        fleet.rps, fleet.shed_rps, fleet.busy, fleet.slow = 300.0, 100.0, 1.0, True
        first = world.tick()  # the first read: nothing to decide on yet
        assert first.decision is not None
        assert first.decision.action == "hold"
        assert self.replicas(world) == 1
        second = self.next_tick(world, fleet)
        decision = second.decision
        assert decision is not None
        assert decision.replicas > 1
        assert self.replicas(world) == decision.replicas
        assert decision.reason.startswith(
            "Prometheus did not answer; from the pods' own metrics over the last 15 s "
            "(only more replicas on them): P99 "
        )
        # Prometheus is still what the condition says is missing.
        assert world.condition("MetricsAvailable")["status"] == "False"
        assert world.condition("SLAMet")["status"] == "False"

    def test_a_quiet_service_is_never_scaled_down_on_them(self) -> None:
        world, fleet = self.world()
        deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
        deployment["spec"]["replicas"] = 4
        deployment["status"] = {"readyReplicas": 4, "replicas": 4}
        fleet.rps, fleet.busy = 1.0, 0.01
        for _ in range(30):  # far past any scale-down delay
            result = self.next_tick(world, fleet)
            assert result.decision is not None
            assert result.decision.replicas == 4
        assert self.replicas(world) == 4
        assert world.kube.of(DEPLOYMENT, "vision", "resnet50")["spec"]["replicas"] == 4

    def test_an_outage_after_prometheus_came_back_starts_with_a_fresh_read(self) -> None:
        world, fleet = self.world()
        answering = [False]
        quiet = Observation(
            at=T, window_s=60, p99_s=0.01, p95_s=0.01, qps=1.0, rejected_qps=0.0,
            queue_p99_s=0.001, utilization=0.01, mean_batch=1.0, ready_replicas=1,
        )  # fmt: skip

        def prometheus(scope: Any, *, ready_replicas: int | None) -> Observation | None:
            return replace(quiet, at=self.seconds[0]) if answering[0] else None

        world.autopilot._observe = prometheus
        fleet.rps, fleet.shed_rps, fleet.busy, fleet.slow = 300.0, 100.0, 1.0, True
        world.tick()  # blind: the pods read
        answering[0] = True
        assert self.next_tick(world, fleet).decision.metrics_available
        answering[0] = False
        held = self.next_tick(world, fleet).decision  # blind again: read afresh, no window yet
        assert held.action == "hold"
        assert "pods' own" not in held.reason
        assert self.next_tick(world, fleet).decision.replicas > 1


class TestAnOutagesFirstRound:
    """The fleet's round that finds Prometheus away reads the pods before the ticks, and waits
    the first window: its ticks decide on the pods' metrics, not only keep a read for the next
    round, an interval later."""

    def setup(self, first_s: float, mode: str = "auto") -> tuple[World, Fleet, FleetPilot]:
        fleet = Fleet("10.0.0.7:8082")
        scrape = PodScraper(
            fleet.pods, fetch=lambda pod: fleet.fetch(pod), clock=lambda: fleet.clock
        )
        world = World(mode, observe=blind, seconds=lambda: T + fleet.clock, scrape=scrape)
        world.body["spec"]["scaling"]["maxBatchSize"] = 1
        world.kube.put_object(copy.deepcopy(world.body))
        self.slept: list[float] = []

        def sleep(seconds: float) -> None:
            self.slept.append(seconds)
            fleet.advance(seconds)

        pilot = FleetPilot(
            Passes(world.kube),
            world.autopilot,
            Blind(),
            post=lambda body, events: None,
            workers=2,
            first_window_s=first_s,
            clock=lambda: fleet.clock,
            sleep=sleep,
        )
        fleet.rps, fleet.shed_rps, fleet.busy, fleet.slow = 300.0, 100.0, 1.0, True
        return world, fleet, pilot

    def replicas(self, world: World) -> int:
        return int(world.kube.of(DEPLOYMENT, "vision", "resnet50")["spec"]["replicas"])

    def reason(self, world: World) -> str:
        status = world.kube.of(INFERENCESERVICE, "vision", "resnet50")["status"]
        return str(status["lastDecision"]["reason"])

    def test_the_first_round_adds_replicas_on_a_window_it_waited_for(self) -> None:
        world, fleet, pilot = self.setup(FIRST_WINDOW_S)
        report = pilot.run_round([("vision", "resnet50")])
        assert (report.reading, report.primed, report.ticked) == (None, 1, 1)
        assert self.slept == [FIRST_WINDOW_S]
        assert self.replicas(world) > 1
        assert "from the pods' own metrics over the last 5 s" in self.reason(world)
        # The next round's window starts at this round's read: nothing to read ahead, no wait.
        fleet.advance(15)
        report = pilot.run_round([("vision", "resnet50")])
        assert (report.primed, self.slept) == (0, [FIRST_WINDOW_S])

    def test_without_a_first_window_the_first_round_only_reads(self) -> None:
        world, fleet, pilot = self.setup(0.0)
        assert pilot.run_round([("vision", "resnet50")]).primed == 0
        assert (self.slept, self.replicas(world)) == ([], 1)
        fleet.advance(15)
        pilot.run_round([("vision", "resnet50")])
        assert self.replicas(world) > 1

    def test_a_service_in_recommend_mode_is_not_read_ahead(self) -> None:
        _, _, pilot = self.setup(FIRST_WINDOW_S, mode="recommend")
        assert pilot.run_round([("vision", "resnet50")]).primed == 0
        assert self.slept == []


class TestARoundWithoutOneServicesSeries(TestAnOutagesFirstRound):
    """Prometheus answers, but not for this service (its pods no longer scraped): its pods are
    read first and it ticks after the first window; the services Prometheus answered for tick
    at once, before the wait."""

    def setup(self, first_s: float, mode: str = "auto") -> tuple[World, Fleet, FleetPilot]:
        world, fleet, pilot = super().setup(first_s, mode)
        other = isvc(scaling={"mode": mode})
        other["metadata"] |= {"name": "bert", "uid": "uid-bert"}
        Reconciler(world.kube, OperatorSettings(), learned_outside_s=learned_outside_s).reconcile(
            copy.deepcopy(other)
        )
        world.kube.put_object(other)
        world.kube.of(DEPLOYMENT, "vision", "bert")["status"] = {"readyReplicas": 1}
        self.order: list[str] = []
        self.fleet = fleet
        pilot._observer = self.answering({("vision", "bert")})
        self.reads = 0
        fetch = fleet.fetch

        def counted(endpoint: str) -> list[Sample]:
            self.reads += 1
            return fetch(endpoint)

        fleet.fetch = counted  # type: ignore[method-assign]
        ticks = pilot._tick

        answered = threading.Event()

        def tick(
            namespace: str, name: str, answers: FleetRound, hold_events: bool, deadline: float
        ) -> bool | None:
            self.order.append(name)
            done = ticks(namespace, name, answers, hold_events, deadline)
            if name == "bert":
                answered.set()
            return done

        pilot._tick = tick  # type: ignore[method-assign]
        sleep = pilot._sleep

        def sleeping(seconds: float) -> None:
            # The service Prometheus answered for ticks while the round waits (or never would).
            self.order.append("sleep" if answered.wait(timeout=10) else "sleep, bert waiting")
            sleep(seconds)

        pilot._sleep = sleeping
        return world, fleet, pilot

    def test_the_first_round_adds_replicas_on_a_window_it_waited_for(self) -> None:
        world, _, pilot = self.setup(FIRST_WINDOW_S)
        report = pilot.run_round([("vision", "bert"), ("vision", "resnet50")])
        assert (report.reading, report.primed, report.ticked) == ("recorded", 1, 2)
        assert self.slept == [FIRST_WINDOW_S]
        assert self.order == ["bert", "sleep", "resnet50"]
        assert self.replicas(world) > 1
        said = "no request rate, P99 latency in Prometheus; never scaling on missing metrics; "
        assert said + "from the pods' own metrics over the last 5 s" in self.reason(world)

    def test_a_round_with_every_services_series_reads_no_pod(self) -> None:
        _, _, pilot = self.setup(FIRST_WINDOW_S)
        pilot._observer = self.answering({("vision", "bert"), ("vision", "resnet50")})
        report = pilot.run_round([("vision", "bert"), ("vision", "resnet50")])
        assert (report.primed, self.slept, self.reads) == (0, [], 0)

    def answering(self, answered: set[tuple[str, str]]) -> Answering:
        return Answering(answered, at=lambda: T + self.fleet.clock)

    def test_without_a_first_window_the_first_round_only_reads(self) -> None:
        super().test_without_a_first_window_the_first_round_only_reads()
        assert "sleep" not in self.order


class Answering:
    """A Prometheus that answers for the `answered` services alone: one request a second at
    5 ms P99 each, the others' series missing."""

    def __init__(self, answered: set[tuple[str, str]], *, at: Callable[[], float]) -> None:
        self.answered = answered
        self.at = at

    def round(self, at: float | None = None) -> FleetRound:
        now = self.at()

        def one(value: float) -> list[dict[str, Any]]:
            return [{"metric": {}, "value": [now, str(value)]}]

        raw = {"reporting": one(1), "qps": one(1.0), "p99": one(0.005), "arrivals": one(1.0)}
        answers = {key: dict(raw) for key in self.answered}
        return FleetRound(now, answers, 60, None, None, reading="recorded")


@pytest.mark.slow
def test_a_runtime_overloaded_while_prometheus_is_away_gets_a_replica(
    mlp_model: Path, tmp_path: Path
) -> None:
    """Real parts but Kubernetes: a runtime process at batch 1 (t(1) = 20 ms: 50 rps) offered
    120 rps by the load generator, no Prometheus, and the autopilot's ticks reading the pod over
    HTTP: the second tick adds replicas, and says from what."""
    with runtime_process(
        mlp_model,
        "--engine", "simulated", "--simulated-latency", "alpha_ms=20,beta_ms=0",
        "--max-batch-size", "1", "--max-queue-delay-ms", "1",
        log_dir=tmp_path,
    ) as runtime:  # fmt: skip
        scrape = PodScraper(Pods(f"127.0.0.1:{runtime.admin_port}"))
        world = World(observe=blind, seconds=time.time, scrape=scrape)
        world.body["spec"]["scaling"]["maxBatchSize"] = 1
        world.body["spec"]["sla"]["latencyP99Ms"] = 200
        load = LoadConfig(
            target=Target(url=runtime.url, model="mlp", timeout_s=5),
            duration_s=6,
            schedule=RateSchedule.constant(120),
        )
        loader = threading.Thread(target=lambda: asyncio.run(run_load(load)), daemon=True)
        loader.start()
        time.sleep(1.0)
        first = world.tick()
        assert first.decision is not None
        assert first.decision.action == "hold"
        time.sleep(3.0)
        second = world.tick().decision
        loader.join(timeout=30)
    assert second is not None
    assert second.replicas > 1, second.reason
    said = r"from the pods' own metrics over the last \d+ s \(only more replicas on them\): "
    assert re.search(said, second.reason)
    deployment = world.kube.of(DEPLOYMENT, "vision", "resnet50")
    assert deployment["spec"]["replicas"] == second.replicas
