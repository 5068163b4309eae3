"""A node that dies under replicas: what Kubernetes does, interval by interval.

Three replicas at batch 8 serve a constant 300 rps (about 100 each, a third of what one
carries), round-robin so each gets exactly a third. At 150 s the node under the oldest dies;
the node controller notices at 190 s (40 s), the taints evict the pod at 490 s (300 s more), and
its replacement is ready at 520 s (30 s cold start).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, cli
from batchpilot.simulation.cluster import NodeLoss, _Fleet, _serve, simulate_cluster
from batchpilot.simulation.observe import Telemetry
from batchpilot.simulation.policies import Command
from batchpilot.simulation.report import SimulationResult

LOSS = NodeLoss(at_s=150.0)
CLUSTER = ClusterConfig(balancing="round-robin", node_losses=(LOSS,))


@dataclass
class Fixed:
    """Three replicas, or `later` from `at` on; keeps what it was shown at each decision."""

    later: int = 3
    at: float = float("inf")
    name: str = "fixed"
    cold_start: bool = True
    seen: dict[float, tuple[int | None, int]] = field(default_factory=dict)
    """At each decision: (the ready replicas observed, the replicas in force)."""

    def initial(self) -> Command:
        return Command(3, 8, 0.005, "start")

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        assert observation is not None
        self.seen[now] = (observation.ready_replicas, current.replicas)
        return Command(self.later if now >= self.at else 3, 8, 0.005, "fixed")


def run(controller: Fixed, cluster: ClusterConfig = CLUSTER) -> SimulationResult:
    return simulate_cluster(
        Trace.constant(300, 600), TEXTBOOK, controller, sla_s=0.1, config=cluster
    )


class TestWhatTheControllerSees:
    def test_ready_drops_once_noticed_and_comes_back_with_the_replacement(self) -> None:
        controller = Fixed()
        run(controller)
        for now, (ready, replicas) in controller.seen.items():
            # The Deployment still has three replicas throughout: NotReady pods are not
            # replaced, and the replacement takes the deleted one's place at once.
            assert replicas == 3, now
            if now < 190:  # the node controller does not know yet
                assert ready == 3, now
            elif now < 520:  # NotReady, then deleted at 490 and its replacement starting
                assert ready == 2, now
            else:  # 490 + 30 s cold start
                assert ready == 3, now

    def test_the_intervals_are_cut_where_the_replacement_is_ready(self) -> None:
        intervals = run(Fixed()).intervals
        by_start = {r.t: r for r in intervals}
        # [510, 525): two replicas for 10 s, three for 5 s — served in two parts, not as if the
        # replacement had been there all along (or not at all).
        assert by_start[510.0].ready == 2
        assert by_start[525.0].ready == 3
        assert by_start[525.0].shed_rps == 0

    def test_without_a_loss_nothing_changes(self) -> None:
        controller = Fixed()
        result = run(controller, ClusterConfig(balancing="round-robin"))
        assert {seen for seen in controller.seen.values()} == {(3, 3)}
        assert result.settings["nodeLosses"] == []
        assert result.summary.shed == 0


class TestWhatFails:
    def test_what_the_service_sends_the_dark_replica_fails_until_noticed(self) -> None:
        by_start = {r.t: r for r in run(Fixed()).intervals}
        for t in (150.0, 165.0):
            # round-robin over three endpoints, one dark: a third fails, no runtime counts it
            share = by_start[t].shed_rps / (by_start[t].shed_rps + by_start[t].served_rps)
            assert share == pytest.approx(1 / 3, abs=0.01), t
            assert by_start[t].p99_s == float("inf"), t
        # [180, 195): dark for 10 s of the 15, out of the endpoints after 190
        late = by_start[180.0]
        assert late.shed_rps / (late.shed_rps + late.served_rps) == pytest.approx(2 / 9, abs=0.01)
        # Once noticed, the two left carry the load: nothing more fails.
        assert all(r.shed_rps == 0 for r in by_start.values() if r.t >= 195), "after notice"
        assert all(r.shed_rps == 0 for r in by_start.values() if r.t < 150), "before the loss"

    def test_what_it_held_queued_fails_and_prometheus_scrapes_it_no_more(self) -> None:
        # Queue admission, two replicas at batch 1 offered 600 rps (265 each at most): both
        # queues are full when the node under the older dies at 60 s.
        telemetry = Telemetry(
            intervals=8, interval_s=15.0, sla_s=0.1, overhead_s=0.04, scrape_interval_s=15.0
        )
        config = ClusterConfig(admission="queue", node_losses=(NodeLoss(at_s=60.0),))
        fleet = _Fleet(truth=TEXTBOOK, config=config, telemetry=telemetry, deadline_s=None)
        fleet.apply(Command(2, 1, 0.005), 0.0, cold_start=False, scraped_since=-90.0)
        trace, rng = Trace.constant(600, 120), np.random.default_rng(0)
        _serve(fleet, telemetry, trace, rng, 0.0, 60.0, 0)
        dark, alive = fleet.pods
        queued = dark.replica.waiting
        assert queued > 1000  # a full queue, less what the device took since the last shed
        failed_before = int(telemetry.shed[4])
        fleet.advance(60.0, cold_start=True)
        assert dark.lost == config.node_losses[0]
        assert int(telemetry.shed[4]) - failed_before == queued  # slot 4: [60, 75)
        assert telemetry.targets[dark.index].stop == 60.0
        assert alive.lost is None
        assert fleet.reporting(60.0) == 1  # its metrics are gone, though it is still "ready"
        assert len(fleet.ready(60.0)) == 2


class TestWhatItCosts:
    def test_a_dark_replica_is_billed_until_deleted_then_its_replacement(self) -> None:
        result = run(Fixed())
        # The dead pod until 490, its replacement from 490 (cold start included): 3 throughout.
        assert result.summary.gpu_seconds == pytest.approx(3 * 600)
        assert all(r.billed == pytest.approx(3) for r in result.intervals)

    def test_a_scale_down_deletes_the_not_ready_dark_replica_first(self) -> None:
        # At 300 s (noticed at 190) the controller wants 2: the dark pod goes, not a ready one.
        controller = Fixed(later=2, at=300.0)
        result = run(controller)
        by_start = {r.t: r for r in result.intervals}
        assert controller.seen[315.0] == (2, 2)  # both ready ones kept
        assert controller.seen[510.0] == (2, 2)  # nothing left to evict and replace at 490
        assert controller.seen[525.0] == (2, 2)
        assert all(r.shed_rps == 0 for r in by_start.values() if r.t >= 195)
        # Gone at once, without a drain: 3 pods for 300 s, then 2.
        assert result.summary.gpu_seconds == pytest.approx(3 * 300 + 2 * 300)

    def test_not_ready_goes_first_whatever_its_age(self) -> None:
        # The ReplicaSet's order: not ready before ready, age only after. Here the dark pod is
        # the newest of three, noticed at 10 s; at 20 s one must go.
        telemetry = Telemetry(intervals=8, interval_s=15.0, sla_s=0.1, overhead_s=0.04)
        fleet = _Fleet(truth=TEXTBOOK, config=ClusterConfig(), telemetry=telemetry, deadline_s=0.1)
        fleet.apply(Command(3, 8, 0.005), 0.0, cold_start=False)
        fleet.pods[2].lost = NodeLoss(at_s=0.0, notice_s=10.0)
        fleet.apply(Command(2, 8, 0.005), 20.0, cold_start=True)
        assert [p.removed_at for p in fleet.pods] == [None, None, 20.0]
        assert fleet.pods[2].gone_at == 20.0  # no drain: it stops costing at once


class TestTheCli:
    def test_lose_node_flags_configure_the_losses(self) -> None:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        flags = ["--lose-node", "600", "--lose-node", "1200:2", "--node-notice-s", "30"]
        args = parser.parse_args(["--trace-gen", "textbook", *flags, "--eviction-s", "120"])
        assert cli.scenario_of(args).cluster.node_losses == (
            NodeLoss(600.0, 1, notice_s=30.0, eviction_s=120.0),
            NodeLoss(1200.0, 2, notice_s=30.0, eviction_s=120.0),
        )

    @pytest.mark.parametrize("text", ["soon", "60:0", "-5", "60:two"])
    def test_a_malformed_loss_is_refused(self, text: str) -> None:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        with pytest.raises(SystemExit):
            parser.parse_args(["--trace-gen", "textbook", "--lose-node", text])

    def test_the_result_records_the_losses(self) -> None:
        assert run(Fixed()).settings["nodeLosses"] == [
            {"atS": 150.0, "count": 1, "noticeS": 40.0, "evictionS": 300.0}
        ]


class TestTheEvictionTime:
    def test_the_autopilot_knows_the_eviction_time_from_the_pod_template(self) -> None:
        losses = (NodeLoss(600.0, eviction_s=30.0), NodeLoss(900.0, eviction_s=30.0))
        cluster = ClusterConfig(node_losses=losses)
        scenario = Scenario(trace=Trace.constant(300, 600), service=TEXTBOOK, sla_s=0.1)
        assert scenario.policy.evicted_after_s == 300.0  # Kubernetes' default
        assert replace(scenario, cluster=cluster).policy.evicted_after_s == 30.0
        with pytest.raises(ValueError, match="tolerations"):
            ClusterConfig(node_losses=(NodeLoss(600.0), NodeLoss(900.0, eviction_s=30.0)))
