"""The observation adapter against a real Prometheus scraping a real runtime under real load.

What the load generator measured and what the autopilot reads back must agree: the request rate
within 10 %. The P99 read back over the whole run must be the P99 of the runtime's own histogram
(read from its /metrics, interpolated as Prometheus does) within 2 %: the same buckets through
PromQL. Against the client it is bounded, not matched: the server's time is inside the client's
send-to-answer time, which on two busy shared cores can add a hundred milliseconds of the client's
own lag, and an interpolated quantile may overstate by up to one bucket (15 %); and no request
takes less than one simulated batch (20 + 2 ms).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from batchpilot.api.request_rows import RowMix
from batchpilot.operator.autopilot.learn import unevenness
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.prometheus import (
    PrometheusObserver,
    PrometheusUnavailable,
    Scope,
    http_query,
)
from batchpilot.operator.autopilot.service_model import fit
from batchpilot.operator.autopilot.stragglers import MIN_BATCHES, slow_pods
from batchpilot.runtime.loadgen import LoadConfig, RateSchedule, Retries, Target, run_load
from batchpilot.sandbox.prometheus import PrometheusProcess, prometheus_process
from tests.runtime_process import RuntimeProcess, Scrape, free_port, runtime_process
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

SCOPE = Scope(namespace="vision", isvc="resnet50")
LOAD_S = 8.0
MIX = RowMix.parse("1:3,2:1")


@contextmanager
def scraped_runtime(
    image_model: Path, tmp_path: Path, latency: str, max_batch: int
) -> Iterator[tuple[RuntimeProcess, PrometheusProcess, float]]:
    """A simulated runtime of the service `SCOPE`, Prometheus scraping it, and when its target
    was set; from its first scrape on."""
    with (
        runtime_process(
            image_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            latency,
            "--max-batch-size",
            str(max_batch),
            "--max-queue-delay-ms",
            "2",
            log_dir=tmp_path,
            env={"BATCHPILOT_ISVC_NAME": SCOPE.isvc, "BATCHPILOT_ISVC_NAMESPACE": SCOPE.namespace},
        ) as runtime,
        prometheus_process(tmp_path) as prometheus,
    ):
        targets_set = time.time()
        prometheus.set_targets([(f"127.0.0.1:{runtime.port}", {})])
        wait_until(
            lambda: prometheus.query("up") and prometheus.query("batchpilot_engine_info"),
            timeout=20,
            what="the first scrape",
        )
        yield runtime, prometheus, targets_set


def scraped_through(prometheus: PrometheusProcess, succeeded: int) -> None:
    """Wait until Prometheus has scraped every request the load generator had answered."""
    total = f'sum(batchpilot_requests_total{{{SCOPE.selector},outcome="success"}})'
    wait_until(
        lambda: (r := prometheus.query(total)) and float(r[0]["value"][1]) >= succeeded,
        timeout=10,
        what="Prometheus to scrape the last requests",
    )


def whole_run(prometheus: PrometheusProcess, targets_set: float) -> Observation | None:
    """A window over the whole run, reaching back to before the target was set: the first
    sample of every bucket in it is the first scrape's zero, so increase() extrapolates nothing
    at the start and counts every request, as the runtime's own histogram does. (A window that
    starts after the first scrape begins at a sample that already counts some requests, and
    increase() extrapolates each bucket back to zero differently.)"""
    return PrometheusObserver(
        http_query(prometheus.url),
        window_s=math.ceil(time.time() - targets_set) + 1,
        clock=time.time,
    ).observe(SCOPE, ready_replicas=1)


def test_rate_and_latency_read_back_agree_with_the_load_generator(
    image_model: Path, tmp_path: Path
) -> None:
    with scraped_runtime(image_model, tmp_path, "alpha_ms=20,beta_ms=2", 8) as (
        runtime,
        prometheus,
        targets_set,
    ):
        # Requests of varied rows, three of one row for each of two: mean 1.25, cv 0.35.
        config = LoadConfig(
            target=Target(url=runtime.url, model="image", row_mix=MIX),
            duration_s=LOAD_S,
            schedule=RateSchedule.constant(80),
        )
        report = asyncio.run(run_load(config))
        ended = time.time()
        assert report.succeeded > 0.9 * 80 * LOAD_S
        scraped_through(prometheus, report.succeeded)
        # A window that sits inside the load, ending when it ended.
        observer = PrometheusObserver(
            http_query(prometheus.url), window_s=int(LOAD_S) - 2, recent_s=3, clock=time.time
        )
        observation = observer.observe(SCOPE, ready_replicas=1, at=ended - 0.5)
        whole = whole_run(prometheus, targets_set)
        scrape = Scrape(runtime)
        buckets = scrape.buckets("batchpilot_request_duration_seconds")

    assert observation is not None
    assert observation.qps == pytest.approx(report.achieved_qps, rel=0.10)
    assert observation.rejected_qps == 0
    # the offered load, counted at arrival by the runtime: all of it was served here
    assert observation.arrival_qps == pytest.approx(observation.qps, rel=0.02)
    assert observation.offered_qps == pytest.approx(report.achieved_qps, rel=0.10)
    # the fast signal: arrivals between the last two scrapes in a 3 s range (its span taken as
    # half the range), the same load
    assert observation.recent_window_s == 1.5
    assert observation.recent_qps == pytest.approx(report.achieved_qps, rel=0.25)
    # and the runtime's gauge of its last 5 s, as the last scrape read it: the same load
    assert observation.now_qps == pytest.approx(report.achieved_qps, rel=0.25)
    # Poisson arrivals, one at a time: read back near Poisson's 1 (a client on two busy cores
    # sends in small bunches when its loop stalls, 1.4 seen), far below clumps (2m − 1)
    assert observation.arrival_dispersion is not None
    assert 0.6 <= observation.arrival_dispersion <= 2.5
    # every arrival counted by its second too: one replica all along, at an even rate
    assert observation.arrival_counted_seconds == pytest.approx(1.0, rel=0.1)
    assert observation.arrival_second_squares is not None
    assert unevenness(observation, known=0.0) == 1.0
    # the rows a request brought, and how much they varied, as the runtime counted them
    assert observation.rows_per_request == pytest.approx(MIX.mean, rel=0.15)
    assert observation.request_rows_cv == pytest.approx(MIX.cv, rel=0.2)
    # how the real model's batches varied around the server's t(b) on this machine's CPU
    assert observation.batch_time_cv is not None
    assert 0.0 < observation.batch_time_cv < 2.0
    assert observation.p99_s is not None
    assert whole is not None
    assert whole.p99_s is not None
    assert whole.p99_s == pytest.approx(histogram_quantile(0.99, buckets), rel=0.02)
    assert report.service_latency_ms is not None
    client_p99_s = report.service_latency_ms.p99_ms / 1e3
    assert 0.022 <= whole.p99_s <= 1.15 * client_p99_s + 0.005, (whole.p99_s, client_p99_s)
    assert observation.mean_batch is not None
    assert observation.mean_batch >= 1
    # the rows run per request answered over the run: the rows the requests brought
    brought = scrape.value("batchpilot_arrival_rows_total") / scrape.value(
        "batchpilot_arrivals_total"
    )
    assert whole.rows_per_request == pytest.approx(brought, rel=0.01)
    # the time outside the batcher: the runtime's request durations less their time in it
    outside = (
        scrape.value("batchpilot_request_duration_seconds_sum")
        - scrape.value("batchpilot_batcher_seconds_total")
    ) / scrape.value("batchpilot_request_duration_seconds_count")
    assert whole.outside_s is not None
    assert 0 < whole.outside_s == pytest.approx(outside, rel=0.02, abs=1e-4)
    # the batches timed at start-up: 1 row and the batch limit, the runtime's own gauges
    assert [(p.mean_batch, p.batches) for p in whole.startup] == [(1.0, 0.0), (8.0, 0.0)]
    for point in whole.startup:
        rows = str(int(point.mean_batch))
        own_time = scrape.value("batchpilot_startup_batch_seconds", rows=rows)
        assert point.mean_seconds == pytest.approx(own_time, rel=1e-6)
        assert point.mean_seconds >= 0.98 * (0.020 + 0.002 * point.mean_batch)
    assert observation.utilization is not None
    assert 0 < observation.utilization < 1
    # Compute points, read back over the whole run: each bucket's mean batch and mean time are
    # the runtime's own counters' (rows / batches, seconds / batches); and no batch computed in
    # less than the simulated accelerator's t(b) = 20 + 2·b ms (on a busy machine its timers
    # only ever fire late).
    assert whole.compute
    labels = {s.labels["batch_bucket"] for s in scrape.samples if "batch_bucket" in s.labels}
    own = {}  # the runtime's own (mean rows, mean seconds) per batch-size bucket
    for label in labels:
        batches = scrape.value("batchpilot_batches_total", batch_bucket=label)
        if batches:
            own[label] = (
                scrape.value("batchpilot_batch_rows_total", batch_bucket=label) / batches,
                scrape.value("batchpilot_batch_compute_seconds_total", batch_bucket=label)
                / batches,
            )
    read_back = sorted((p.mean_batch, p.mean_seconds) for p in whole.compute)
    expected = sorted(own.values())
    assert len(read_back) == len(expected)
    for got, want in zip(read_back, expected, strict=True):
        assert got == pytest.approx(want, rel=0.02)
    for mean_batch, mean_seconds in read_back:
        assert mean_seconds >= 0.98 * (0.020 + 0.002 * mean_batch)


def test_requests_of_several_rows_read_back_as_rows_per_request(
    image_model: Path, tmp_path: Path
) -> None:
    # 4 rows a request, a batch limit of 16 rows: batches of whole requests, 4 to 16 rows.
    with scraped_runtime(image_model, tmp_path, "alpha_ms=5,beta_ms=0.5", 16) as (
        runtime,
        prometheus,
        targets_set,
    ):
        config = LoadConfig(
            target=Target(url=runtime.url, model="image", rows=4),
            duration_s=4.0,
            schedule=RateSchedule.constant(40),
        )
        report = asyncio.run(run_load(config))
        scraped_through(prometheus, report.succeeded)
        whole = whole_run(prometheus, targets_set)
    assert report.succeeded > 0.9 * 40 * 4.0
    assert whole is not None
    assert whole.rows_per_request == pytest.approx(4.0, rel=0.02)
    assert whole.mean_batch is not None
    assert 0.98 * 4 <= whole.mean_batch <= 16.0
    assert whole.compute
    # every batch holds whole requests of 4 rows: buckets 4, 8 and 16, nothing smaller
    assert min(p.mean_batch for p in whole.compute) >= 0.98 * 4


def test_retries_the_clients_mark_are_read_as_no_part_of_the_demand(
    image_model: Path, tmp_path: Path
) -> None:
    # Batches of at most 4 rows at 20 + 2·b ms: about 140 rps served of 250 offered; what is
    # refused is sent twice more, 0.1 s apart, each try numbered as Envoy numbers them.
    with scraped_runtime(image_model, tmp_path, "alpha_ms=20,beta_ms=2", 4) as (
        runtime,
        prometheus,
        _,
    ):
        config = LoadConfig(
            target=Target(url=runtime.url, model="image"),
            duration_s=LOAD_S,
            schedule=RateSchedule.constant(250),
            retries=Retries(2, delay_s=0.1, marked=True),
        )
        report = asyncio.run(run_load(config))
        ended = time.time()
        scraped_through(
            prometheus, int(Scrape(runtime).value("batchpilot_requests_total", outcome="success"))
        )
        observer = PrometheusObserver(
            http_query(prometheus.url), window_s=int(LOAD_S) - 2, recent_s=3, clock=time.time
        )
        observation = observer.observe(SCOPE, ready_replicas=1, at=ended - 0.5)
        scrape = Scrape(runtime)
    offered = report.sent / LOAD_S
    assert report.retries > 0.3 * report.sent  # the storm is large against the demand
    # The runtime counted every marked retry apart from the requests' first tries.
    assert scrape.value("batchpilot_arrivals_total", attempt="retry") == report.retries
    assert scrape.value("batchpilot_arrivals_total", attempt="first") == report.sent
    assert observation is not None
    # What the autopilot reads as demand is the clients' own rate, every signal of it, not
    # the rate of sends (the requests and their retries) that reached the runtime.
    assert observation.arrival_qps == pytest.approx(offered, rel=0.10)
    assert observation.offered_qps == pytest.approx(offered, rel=0.10)
    assert observation.recent_qps == pytest.approx(offered, rel=0.25)
    assert observation.now_qps == pytest.approx(offered, rel=0.25)
    # The retries are read beside it, for the status to show.
    assert observation.retried_qps is not None
    assert observation.retried_qps > 0.3 * offered
    # Still refusing: the share not served is the demand's.
    assert observation.unserved_share > 0.2


def test_sends_a_hedging_client_cancelled_are_read_as_withdrawn_not_unserved(
    image_model: Path, tmp_path: Path
) -> None:
    # Batches of 1 row at 30 ms, two clients at a time that send again after 40 ms and cancel
    # the slower send (tests/autopilot/test_withdrawn.py reads the same from the pod itself).
    with scraped_runtime(image_model, tmp_path, "alpha_ms=30,beta_ms=0", 1) as (
        runtime,
        prometheus,
        targets_set,
    ):
        config = LoadConfig(
            target=Target(url=runtime.url, model="image"),
            duration_s=LOAD_S,
            concurrency=2,
            max_requests=60,
            hedge_s=0.04,
        )
        report = asyncio.run(run_load(config))
        withdrawn = f"sum(batchpilot_withdrawn_total{{{SCOPE.selector}}})"
        wait_until(
            lambda: (
                Scrape(runtime).value("batchpilot_inflight_requests") == 0
                and (r := prometheus.query(withdrawn))
                and float(r[0]["value"][1]) == Scrape(runtime).value("batchpilot_withdrawn_total")
            ),
            timeout=10,
            what="Prometheus to scrape the last cancellations",
        )
        observation = whole_run(prometheus, targets_set)
    assert report.succeeded == 60
    assert report.hedges >= 20
    assert observation is not None
    assert observation.withdrawn_qps is not None
    assert observation.withdrawn_qps > 0
    assert observation.unserved_share < 0.01
    assert replace(observation, withdrawn_qps=None).unserved_share > 0.1


def test_a_dead_prometheus_is_no_observation_not_a_hang(tmp_path: Path) -> None:
    query = http_query(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    with pytest.raises(PrometheusUnavailable):
        query("up")
    observer = PrometheusObserver(query, window_s=30, clock=time.time)
    started = time.monotonic()
    assert observer.observe(SCOPE, ready_replicas=1) is None
    assert time.monotonic() - started < 5


def test_a_service_without_metrics_is_missing_not_zero(tmp_path: Path) -> None:
    with prometheus_process(tmp_path) as prometheus:
        observer = PrometheusObserver(http_query(prometheus.url), window_s=30, clock=time.time)
        observation = observer.observe(SCOPE, ready_replicas=1)
    assert observation is not None
    assert observation.qps is None
    assert observation.arrival_qps is None
    assert observation.p99_s is None
    assert observation.missing() == ["request rate", "P99 latency"]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) buckets: the rank's
    bucket, linearly interpolated from the bucket below (0 below the first)."""
    buckets = sorted(buckets)
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    raise AssertionError("the +Inf bucket holds every observation")


def test_a_replica_slower_than_its_peers_reads_back_as_slow(
    image_model: Path, tmp_path: Path
) -> None:
    # Three replicas of the service, each scraped with its pod's name (as a ServiceMonitor
    # labels them): two at t(b) = 5 + 0.5·b ms, one whose batches take twice as long.
    latencies = {
        "resnet50-6c4f9-a1": "alpha_ms=5,beta_ms=0.5",
        "resnet50-6c4f9-b2": "alpha_ms=5,beta_ms=0.5",
        "resnet50-6c4f9-c3": "alpha_ms=10,beta_ms=1",
    }
    env = {"BATCHPILOT_ISVC_NAME": SCOPE.isvc, "BATCHPILOT_ISVC_NAMESPACE": SCOPE.namespace}
    with ExitStack() as stack:
        runtimes = {
            pod: stack.enter_context(
                runtime_process(
                    image_model,
                    "--engine",
                    "simulated",
                    "--simulated-latency",
                    latency,
                    "--max-batch-size",
                    "8",
                    "--max-queue-delay-ms",
                    "2",
                    log_dir=tmp_path,
                    env=env,
                )
            )
            for pod, latency in latencies.items()
        }
        prometheus = stack.enter_context(prometheus_process(tmp_path))
        targets_set = time.time()
        prometheus.set_targets(
            [(f"127.0.0.1:{runtime.port}", {"pod": pod}) for pod, runtime in runtimes.items()]
        )
        wait_until(
            lambda: len(prometheus.query("batchpilot_engine_info")) == len(runtimes),
            timeout=20,
            what="the first scrape of every replica",
        )

        async def load_all() -> list[int]:
            reports = await asyncio.gather(
                *(
                    run_load(
                        LoadConfig(
                            target=Target(url=runtime.url, model="image"),
                            duration_s=4.0,
                            schedule=RateSchedule.constant(40),
                        )
                    )
                    for runtime in runtimes.values()
                )
            )
            return [report.succeeded for report in reports]

        succeeded = asyncio.run(load_all())
        scraped_through(prometheus, sum(succeeded))
        whole = whole_run(prometheus, targets_set)
    assert whole is not None
    assert {p.pod for p in whole.pods} == set(latencies)
    assert all(p.batches >= MIN_BATCHES for p in whole.pods)
    model = fit(whole.compute, None)
    assert model is not None
    slow = slow_pods(whole.pods, model)
    assert set(slow) == {"resnet50-6c4f9-c3"}
    assert 1.6 <= slow["resnet50-6c4f9-c3"] <= 2.4


def test_a_replica_scraped_by_two_jobs_counts_once_and_says_so(
    image_model: Path, tmp_path: Path
) -> None:
    """Two scrape jobs on one pod (a PodMonitor beside an annotation-driven job) double every
    rate, and counted by series they made two replicas of one — hiding one not scraped at all.
    Counted by address: one replica, scraped twice."""
    with scraped_runtime(image_model, tmp_path, "alpha_ms=5,beta_ms=1", 8) as (
        runtime,
        prometheus,
        _,
    ):
        address = f"127.0.0.1:{runtime.port}"
        prometheus.set_targets(
            [(address, {"via": "podmonitor"}), (address, {"via": "annotations"})]
        )
        wait_until(
            lambda: len(prometheus.query("batchpilot_engine_info")) == 2,
            timeout=20,
            what="both jobs' scrapes",
        )
        observer = PrometheusObserver(http_query(prometheus.url), window_s=5, clock=time.time)
        observation = observer.observe(SCOPE, ready_replicas=1)
    assert observation is not None
    assert observation.reporting_replicas == 1
    assert observation.scrapes_per_replica == 2
