"""The autopilot on the basic signals alone (`ClusterConfig.basic_signals`): P99, the rates, the
busy share, the mean batch and the ready replicas, as a runtime without batchpilot's own series
reports them. It learns the fit from the busy share across windows (`learn.busy_compute`,
`learn.anchored`) and plans with it, rather than only following P99."""

from __future__ import annotations

from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, simulate
from batchpilot.simulation.cluster import basic, simulate_cluster
from batchpilot.simulation.service import ServiceTruth
from tests.simulation.test_simulate import Watcher


def test_the_policies_are_shown_the_basic_signals_only() -> None:
    watching = Watcher(1, 8, 0.005)
    simulate_cluster(
        Trace.constant(100, 120), TEXTBOOK, watching, sla_s=0.1,
        config=ClusterConfig(basic_signals=True),
    )  # fmt: skip
    later = watching.seen[2:]
    assert later
    for seen in later:
        assert seen == basic(seen)
        assert (seen.compute, seen.startup) == ((), ())
        assert (seen.arrival_qps, seen.recent_qps) == (None, None)
        assert seen.utilization is not None
        assert seen.mean_batch is not None
        assert seen.ready_replicas == 1


def test_the_autopilot_plans_with_a_fit_it_learned_from_the_busy_share() -> None:
    """A load that steps from 100 to 600 requests/s and back: the step runs batches of another
    size, the fit turns confident, and the decisions after it are the model's."""
    points = [(0.0, 100.0), (600.0, 600.0), (1200.0, 100.0)]
    trace = Trace.from_points(points, name="steps", duration_s=1800.0)
    scenario = Scenario(
        trace=trace, service=TEXTBOOK, sla_s=0.1,
        cluster=ClusterConfig(basic_signals=True),
    )  # fmt: skip
    result = simulate(scenario, "autopilot")
    reasons = [interval.reason for interval in result.intervals]
    late = reasons[len(reasons) // 2 :]
    assert any("model t(b)" in reason for reason in late), late[-1]
    assert not any("(rough)" in reason for reason in late), late[-1]
    assert result.summary.interval_attainment >= 0.95


def test_requests_of_several_rows_the_signals_do_not_count_buy_no_idle_fleet() -> None:
    """8 rows a request on a fixed-cost service, the rows a request not among the signals: the
    busy share over the batches the rates imply read a batch 8x too slow, and the autopilot
    ran maxReplicas at 3 % busy. Such a reading is refused (a batch cannot outlast P99), and the
    replicas are planned from the busy share instead."""
    points = [(0.0, 200.0), (300.0, 400.0)]
    trace = Trace.from_points(points, name="steps", duration_s=900.0)
    scenario = Scenario(
        trace=trace, service=ServiceTruth.parse("alpha_ms=30,beta_ms=0.5,rows=8"), sla_s=0.1,
        max_replicas=200, cluster=ClusterConfig(basic_signals=True),
    )  # fmt: skip
    result = simulate(scenario, "autopilot")
    assert max(interval.replicas for interval in result.intervals) < 50
    # the busy share steers (`busy`): the first minutes, overloaded, pay for the start
    assert result.summary.interval_attainment >= 0.9


def test_without_the_mean_batch_the_policies_see_no_batches() -> None:
    watching = Watcher(1, 8, 0.005)
    simulate_cluster(
        Trace.constant(100, 120), TEXTBOOK, watching, sla_s=0.1,
        config=ClusterConfig(busy_signals=True),
    )  # fmt: skip
    later = watching.seen[2:]
    assert later
    for seen in later:
        assert seen == basic(seen, batches=False)
        assert seen.mean_batch is None
        assert seen.utilization is not None


def test_on_the_busy_share_alone_the_replicas_follow_a_step_and_go_back() -> None:
    """P99, the rates, the busy share and the ready replicas, nothing of the batches: no fit
    can be learned, and the replicas are planned from the busy share (`busy`). A step from 100
    to 600 requests/s and back: inside the SLA apart from the step's first intervals (a cold
    start of 30 s), at no more than twice the replicas the step needs, and back down after."""
    points = [(0.0, 100.0), (600.0, 600.0), (1200.0, 100.0)]
    trace = Trace.from_points(points, name="steps", duration_s=1800.0)
    scenario = Scenario(
        trace=trace, service=TEXTBOOK, sla_s=0.1, max_replicas=40,
        cluster=ClusterConfig(busy_signals=True),
    )  # fmt: skip
    result = simulate(scenario, "autopilot")
    reasons = [interval.reason for interval in result.intervals]
    assert any("busy share" in reason for reason in reasons), reasons[-1]
    assert not any("model t(b) =" in reason for reason in reasons)
    assert result.summary.interval_attainment >= 0.95
    # 600 requests/s of about 5 ms of device time each: 3 device-seconds a second
    peak = max(interval.replicas for interval in result.intervals)
    assert 4 <= peak <= 12
    assert result.intervals[-1].replicas < peak


def test_on_the_busy_share_alone_a_mostly_fixed_batch_time_buys_no_fleet() -> None:
    """t(b) = 30 + 0.5·b ms, on P99, the rates, the busy share and the ready replicas alone: a
    replica running batches of one or two back to back reads busy most of the time at a tenth of
    what it carries in batches of sixteen. Planned by the cost a request alone, 800 requests/s
    held 22 replicas; the busy share's elasticity and the load a replica was proven to carry
    hold about half that, every interval inside the SLA — and, the load constant, no more as the
    hour goes on (each window's noise added a replica the give-back never took away)."""
    points = [(0.0, 200.0), (900.0, 800.0)]
    trace = Trace.from_points(points, name="steps", duration_s=3600.0)
    scenario = Scenario(
        trace=trace, service=ServiceTruth.parse("alpha_ms=30,beta_ms=0.5"), sla_s=0.1,
        max_replicas=200, cluster=ClusterConfig(busy_signals=True),
    )  # fmt: skip
    result = simulate(scenario, "autopilot")
    assert result.summary.interval_attainment >= 0.95
    assert max(interval.replicas for interval in result.intervals) <= 13
    settled = [interval.replicas for interval in result.intervals if interval.t >= 1800]
    assert max(settled) <= 12, settled
    assert any("stretched" in interval.reason for interval in result.intervals)
