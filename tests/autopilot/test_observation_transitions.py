"""The observation while the fleet changes under it, read from a real Prometheus: replicas that
come, go or run beside another workload's pods, as histories backfilled into its data directory
(`batchpilot.sandbox.backfill`). Each history is the shape a production cluster makes; the
observation must read what the replicas did, not what the series' coming and going makes of a
sum divided by a count, or of a lookback that outlives a pod.
"""

from __future__ import annotations

import time

import pytest

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.prometheus import (
    FleetObserver,
    PrometheusObserver,
    Scope,
    http_query,
)
from batchpilot.sandbox.backfill import backfill
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


def test_a_replica_gone_is_not_counted_whatever_the_lookback(observe) -> None:  # type: ignore[no-untyped-def]
    seen = observe(Scope("gone", "svc"))
    assert seen.now_qps == pytest.approx(10.0)  # not 15: the one gone two minutes ago
    assert seen.reporting_replicas == 1


@pytest.mark.parametrize(("isvc", "busy"), [("resnet50", 0.2), ("resnet50-v2", 0.9)])
def test_dcgm_reads_a_services_own_pods_only(observe, isvc: str, busy: float) -> None:  # type: ignore[no-untyped-def]
    # not the other service's, not the training Job's (resnet50-train-x7k2p)
    assert observe(Scope("shared", isvc), "dcgm").utilization == pytest.approx(busy)
