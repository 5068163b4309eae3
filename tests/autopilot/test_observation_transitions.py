"""The observation while the fleet changes under it, read from a real Prometheus: replicas that
come, go or run beside another workload's pods, and a Prometheus that holds only the window's
last seconds, as histories backfilled into its data directory (`batchpilot.sandbox.backfill`).
Each history is the shape a production cluster makes; the observation must read what the
replicas did, not what the series' coming and going makes of a sum divided by a count, of a
lookback that outlives a pod, or of a `rate()` that divides a restarted Prometheus' few seconds
by the whole window.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.prometheus import (
    FleetObserver,
    PrometheusObserver,
    Scope,
    http_query,
    queries,
)
from batchpilot.operator.autopilot.state import State
from batchpilot.sandbox.backfill import FakeService, backfill, openmetrics
from batchpilot.sandbox.prometheus import prometheus_process

pytestmark = pytest.mark.slow

STEP_S = 15
NOW = int(time.time()) // STEP_S * STEP_S - 30
START = NOW - 900


def series(
    lines: list[str], name: str, labels: str, value: float, *, start: int, end: int, rate: bool
) -> None:
    """One series, a sample every `STEP_S` in [start, end]: a counter growing at `value` a
    second, or a gauge holding it."""
    for t in range(start, end + 1, STEP_S):
        lines.append(f"{name}{{{labels}}} {value * (t - start + STEP_S) if rate else value} {t}")


def pod(namespace: str, isvc: str, name: str) -> str:
    return f'namespace="{namespace}",isvc="{isvc}",pod="{name}"'


def history() -> str:
    busy: list[str] = []
    counted: list[str] = []
    info: list[str] = []
    gauge: list[str] = []
    dcgm: list[str] = []
    # Two replicas busy half the time; one stopped being scraped 90 s ago, before the window,
    # with no staleness marker (Prometheus was down when it went): a lookback still sees it.
    for name, until in (("svc-7d9f8b6c5d-x2k4p", NOW), ("svc-7d9f8b6c5d-q8w2z", NOW - 90)):
        labels = pod("left", "svc", name)
        series(busy, "batchpilot_device_busy_seconds_total", labels, 0.5, start=START, end=until,
               rate=True)  # fmt: skip
        series(info, "batchpilot_engine_info", labels, 1, start=START, end=until, rate=False)
    # A replica joined 30 s ago beside one there all along, each busy half of every second it
    # served (the seconds it counted while taking requests).
    for name, since in (("svc-7d9f8b6c5d-x2k4p", START), ("svc-7d9f8b6c5d-n4t6v", NOW - 30)):
        labels = pod("joined", "svc", name)
        series(busy, "batchpilot_device_busy_seconds_total", labels, 0.5, start=since, end=NOW,
               rate=True)  # fmt: skip
        series(counted, "batchpilot_arrival_counted_seconds_total", labels, 1.0, start=since,
               end=NOW, rate=True)  # fmt: skip
        series(info, "batchpilot_engine_info", labels, 1, start=since, end=NOW, rate=False)
    # A replica gone two minutes ago, its last samples left unmarked (Prometheus was down when
    # it went): 10 rps now on the one left, which carried 5 before.
    for name, until, recent in (("svc-7d9f8b6c5d-x2k4p", NOW, 10.0), ("svc-7d9f8b6c5d-q8w2z",
                                NOW - 120, 5.0)):  # fmt: skip
        labels = pod("gone", "svc", name)
        series(gauge, "batchpilot_recent_arrivals_per_second", labels, recent, start=START,
               end=until, rate=False)  # fmt: skip
        series(info, "batchpilot_engine_info", labels, 1, start=START, end=until, rate=False)
    # dcgm-exporter's GPUs in a namespace shared with another service and a training Job.
    for name, percent in (
        ("resnet50-7d9f8b6c5d-x2k4p", 20.0),
        ("resnet50-v2-5c8b7f9d4b-q8w2z", 90.0),
        ("resnet50-train-x7k2p", 100.0),
    ):
        series(dcgm, "DCGM_FI_DEV_GPU_UTIL", f'namespace="shared",pod="{name}",gpu="0"',
               percent, start=START, end=NOW, rate=False)  # fmt: skip
    for isvc, name in (("resnet50", "resnet50-7d9f8b6c5d-x2k4p"), ("resnet50-v2",
                       "resnet50-v2-5c8b7f9d4b-q8w2z")):  # fmt: skip
        series(info, "batchpilot_engine_info", pod("shared", isvc, name), 1, start=START,
               end=NOW, rate=False)  # fmt: skip
    return "\n".join(
        [
            "# TYPE batchpilot_device_busy_seconds counter",
            *busy,
            "# TYPE batchpilot_arrival_counted_seconds counter",
            *counted,
            "# TYPE batchpilot_engine info",
            *info,
            "# TYPE batchpilot_recent_arrivals_per_second gauge",
            *gauge,
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
            *dcgm,
            "# EOF",
            "",
        ]
    )


@pytest.fixture(scope="module")
def observe(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """`observe(scope, utilization)`: the service's observation at `NOW`, by its own queries and
    by the fleet's round, which must agree."""
    work = tmp_path_factory.mktemp("transitions")
    backfill(history(), work / "prometheus" / "data", workdir=work)
    with prometheus_process(work / "prometheus", retention="1d") as prometheus:
        query = http_query(prometheus.url)

        def observe(scope: Scope, utilization: str = "busy") -> Observation:
            settings = {"window_s": 60, "recent_s": 30, "utilization": utilization}
            own = PrometheusObserver(query, clock=lambda: NOW, **settings)  # type: ignore[arg-type]
            mine = own.observe(scope, ready_replicas=1, at=NOW)
            fleet = FleetObserver(query, clock=lambda: NOW, rules="off", **settings)  # type: ignore[arg-type]
            ours = fleet.round(at=NOW).observe(scope, ready_replicas=1)
            assert mine is not None
            assert ours is not None
            assert (mine.utilization, mine.now_qps, mine.reporting_replicas) == (
                ours.utilization,
                ours.now_qps,
                ours.reporting_replicas,
            )
            return mine

        yield observe


def test_utilization_is_the_mean_of_the_replicas_busy_rates(observe) -> None:  # type: ignore[no-untyped-def]
    # 0.5: not the one replica's rate over the two series a lookback counts (0.25). The mean of
    # the rates is right too where a replica misses a scrape (its rate is whole, the count at an
    # instant is not: 1.0 where both run at 0.5).
    seen = observe(Scope("left", "svc"))
    assert seen.utilization == pytest.approx(0.5, rel=0.02)
    assert seen.reporting_replicas == 1


def test_a_replica_that_joined_inside_the_window_counts_for_its_own_time(observe) -> None:  # type: ignore[no-untyped-def]
    # Both busy half of every second they served: 0.5, where the mean of their rates (each over
    # the whole window) read 0.41 — and 30–40 % low after every scale or rollout.
    seen = observe(Scope("joined", "svc"))
    assert seen.utilization == pytest.approx(0.5, rel=0.02)
    assert seen.reporting_replicas == 2


def test_a_replica_gone_is_not_counted_whatever_the_lookback(observe) -> None:  # type: ignore[no-untyped-def]
    seen = observe(Scope("gone", "svc"))
    assert seen.now_qps == pytest.approx(10.0)  # not 15: the one gone two minutes ago
    assert seen.reporting_replicas == 1


@pytest.mark.parametrize(("isvc", "busy"), [("resnet50", 0.2), ("resnet50-v2", 0.9)])
def test_dcgm_reads_a_services_own_pods_only(observe, isvc: str, busy: float) -> None:  # type: ignore[no-untyped-def]
    # not the other service's, not the training Job's (resnet50-train-x7k2p)
    assert observe(Scope("shared", isvc), "dcgm").utilization == pytest.approx(busy)


# A Prometheus that holds only the window's last seconds.

REPLICA = FakeService("", "svc", qps=10.0, busy=0.025)
"""Each replica of each history's service: 10 rps at batch 8 (t(8) = 20 ms: busy 1.25 batches
a second × 20 ms), P99 60 ms."""
REPLICAS = 3
LOAD = REPLICAS * REPLICA.qps


def replicas(namespace: str, count: int, *, start: int = START, since: int = START) -> list[str]:
    """The service's `count` replicas, started at `start`, as a Prometheus holds them from
    `since`: one restarted then without its history (the pods ran on: their counters keep
    their values) holds no sample before."""
    service = dataclasses.replace(REPLICA, namespace=namespace)
    text = openmetrics([service], start=start, end=NOW + 1)
    held = "\n".join(
        line
        for line in text.splitlines()
        if line.startswith("#") or int(line.rsplit(" ", 1)[1]) >= since
    )
    return [held.replace('pod="svc-0-0"', f'pod="svc-0-{n}"') for n in range(count)]


def merged(texts: list[str]) -> str:
    """OpenMetrics texts as one, each family's samples together."""
    families: dict[str, list[str]] = {}
    for text in texts:
        rows: list[str] = []
        for line in text.splitlines():
            if line.startswith("# TYPE"):
                rows = families.setdefault(line, [])
            elif line and not line.startswith("#"):
                rows.append(line)
    return "\n".join(line for kind, rows in families.items() for line in (kind, *rows)) + (
        "\n# EOF\n"
    )


def partial_history() -> str:
    return merged(
        [
            *replicas("steady", REPLICAS),
            # Prometheus restarted without its history 30 s and 45 s ago.
            *replicas("restart-30", REPLICAS, since=NOW - 30),
            *replicas("restart-45", REPLICAS, since=NOW - 45),
            # One replica there all along, one that started 45 s ago (its counters from zero).
            *replicas("joined", 1),
            *(t.replace("svc-0-0", "svc-0-1") for t in replicas("joined", 1, start=NOW - 45)),
        ]
    )


@pytest.fixture(scope="module")
def partial(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """`partial(namespace, window_s)`: the service's observation at `NOW` and the window's
    arrival rate as Prometheus answers it, by its own queries; the fleet's round must agree."""
    work = tmp_path_factory.mktemp("partial")
    backfill(partial_history(), work / "prometheus" / "data", workdir=work)
    with prometheus_process(work / "prometheus", retention="1d") as prometheus:
        query = http_query(prometheus.url)

        def observe(namespace: str, window_s: int) -> tuple[Observation, float]:
            scope = Scope(namespace, "svc")
            settings = {"window_s": window_s, "recent_s": 30}
            own = PrometheusObserver(query, clock=lambda: NOW, **settings)  # type: ignore[arg-type]
            mine = own.observe(scope, ready_replicas=REPLICAS, at=NOW)
            fleet = FleetObserver(query, clock=lambda: NOW, rules="off", **settings)  # type: ignore[arg-type]
            ours = fleet.round(at=NOW).observe(scope, ready_replicas=REPLICAS)
            assert mine is not None
            assert mine == ours
            text = queries(scope, window_s=window_s, utilization="busy")["arrivals"]
            return mine, float(query(text, at=NOW)[0]["value"][1])

        yield observe


@pytest.mark.parametrize(
    ("namespace", "window_s", "covered"),
    [
        # the first sample 30 s back, rate() extrapolating 7.5 s (half a scrape) before it
        ("restart-30", 60, 37.5),
        ("restart-45", 300, 52.5),
    ],
)
def test_a_restarted_prometheus_reads_the_load_of_the_seconds_it_holds(
    partial,  # type: ignore[no-untyped-def]
    namespace: str,
    window_s: int,
    covered: float,
) -> None:
    seen, answered = partial(namespace, window_s)
    # Prometheus' own rate: 30 rps × 37.5 / 60 = 18.75, × 52.5 / 300 = 5.25.
    assert answered == pytest.approx(LOAD * covered / window_s, rel=0.01)
    assert seen.covered_s == pytest.approx(covered)
    assert seen.arrival_qps == pytest.approx(LOAD, rel=0.01)
    assert seen.qps == pytest.approx(LOAD, rel=0.01)
    assert seen.rejected_qps == pytest.approx(0.0)
    assert seen.utilization == pytest.approx(REPLICA.busy, rel=0.01)
    assert seen.mean_batch == pytest.approx(REPLICA.batch)
    assert seen.reporting_replicas == REPLICAS


@pytest.mark.parametrize("window_s", [60, 300])
def test_a_prometheus_holding_the_whole_window_reads_as_it_answers(
    partial,  # type: ignore[no-untyped-def]
    window_s: int,
) -> None:
    seen, answered = partial("steady", window_s)
    assert seen.covered_s == window_s
    assert seen.arrival_qps == answered == pytest.approx(LOAD, rel=0.01)


def test_the_first_sample_45_s_back_of_a_60_s_window_is_whole_to_rate(partial) -> None:  # type: ignore[no-untyped-def]
    # 15 s after the window's start, scrapes 15 s apart: rate() extrapolates to the start.
    seen, answered = partial("restart-45", 60)
    assert seen.covered_s == 60
    assert seen.arrival_qps == answered == pytest.approx(LOAD, rel=0.01)


def test_a_replica_joined_inside_the_window_leaves_it_whole(partial) -> None:  # type: ignore[no-untyped-def]
    # The replica there all along covers the window: nothing rescaled. The new one's rate is
    # its part of the window: its 45 s of samples and what rate() extrapolates before them, to
    # its counter's zero 15 s before (Prometheus before 2.51) or half a scrape (since).
    seen, answered = partial("joined", 300)
    assert seen.covered_s == 300
    assert seen.arrival_qps == answered
    assert REPLICA.qps * (1 + 52.5 / 300) <= answered <= REPLICA.qps * (1 + 60 / 300)


def test_a_restarted_prometheus_never_causes_a_scale_down(partial) -> None:  # type: ignore[no-untyped-def]
    # Three replicas for 30 rps, which one carries, lower recommendations for ten minutes: with
    # the whole window Prometheus holds, two go; restarted 45 s ago, it holds too little of the
    # window for any to go, and the decision says so.
    policy = Policy(
        sla_p99_s=0.2,
        min_utilization=0.7,
        min_replicas=1,
        max_replicas=4,
        max_batch_size=32,
        scale_down_delay_s=60,
        max_queue_delay_s=0.005,
    )
    current = InForce(REPLICAS, 8, 0.005)
    state = State(recommendations=((NOW - 600.0, 1),))

    def decided(namespace: str) -> tuple[int, str]:
        seen, _ = partial(namespace, 300)
        decision, _ = decide(seen, policy, current, state, now=NOW)
        return decision.replicas, decision.reason

    assert decided("steady")[0] == 1
    kept, reason = decided("restart-45")
    assert kept == REPLICAS
    assert "Prometheus holds 52 s of the 300 s window" in reason
