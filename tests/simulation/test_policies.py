"""The baselines' rules, tick by tick. Each tick is one control interval of 15 s."""

from __future__ import annotations

from typing import ClassVar

import pytest

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.operator.autopilot.state import State
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, simulate
from batchpilot.simulation.capacity import Capacity
from batchpilot.simulation.policies import (
    AutopilotController,
    HpaController,
    ReactiveController,
    oracle_plan,
)
from batchpilot.simulation.trace import Trace

TICK = 15.0


def busy(utilization: float | None, *, ready: int, at: float = 0.0) -> Observation:
    return Observation(
        at=at,
        window_s=60,
        p99_s=0.05,
        p95_s=None,
        qps=100,
        rejected_qps=0,
        queue_p99_s=None,
        utilization=utilization,
        mean_batch=1.0,
        ready_replicas=ready,
    )


def hpa() -> HpaController:
    return HpaController(
        target=0.70,
        tolerance=0.10,
        stabilization_s=300,
        min_replicas=1,
        max_replicas=10,
        batch_size=1,
        max_queue_delay_s=0.005,
        start_replicas=2,
    )


class TestHpa:
    def test_desired_is_the_ceiling_of_replicas_times_utilization_over_target(self) -> None:
        # 2 replicas at 98 %: ceil(2 · 0.98 / 0.70) = ceil(2.8) = 3.
        command = hpa().decide(busy(0.98, ready=2), InForce(2, 1, 0.005), now=0, interval=1)
        assert command.replicas == 3

    def test_within_the_tolerance_nothing_moves(self) -> None:
        # 0.76 / 0.70 = 1.086: within 10 % of the target.
        command = hpa().decide(busy(0.76, ready=2), InForce(2, 1, 0.005), now=0, interval=1)
        assert command.replicas == 2

    def test_scale_up_is_at_most_double_or_four_more_per_period(self) -> None:
        # 2 replicas at 100 % with a 10 % target → 20 wanted, max(2 · 2, 2 + 4) = 6 allowed.
        controller = hpa()
        controller.target = 0.10
        command = controller.decide(busy(1.0, ready=2), InForce(2, 1, 0.005), now=0, interval=1)
        assert command.replicas == 6

    def test_starting_pods_count_as_idle_when_scaling_up(self) -> None:
        # 2 of 3 ready at 84 %: 0.84 · 2 / (3 · 0.70) = 0.8 → no scale-up (it would scale down,
        # but the stabilization window remembers 3).
        controller = hpa()
        controller.recommendations = [(0.0, 3)]
        command = controller.decide(busy(0.84, ready=2), InForce(3, 1, 0.005), now=15, interval=1)
        assert command.replicas == 3

    def test_scale_down_waits_for_the_stabilization_window(self) -> None:
        controller, current = hpa(), InForce(4, 1, 0.005)
        controller.recommendations = [(0.0, 4)]
        replicas = []
        for tick in range(1, 24):
            # 4 replicas at 35 %: ceil(4 · 0.35 / 0.70) = 2 wanted from tick 1 on.
            command = controller.decide(
                busy(0.35, ready=current.replicas), current, now=tick * TICK, interval=tick
            )
            current = InForce(command.replicas, 1, 0.005)
            replicas.append(command.replicas)
        # The t=0 recommendation of 4 leaves the 300 s window at t=300 (tick 20).
        assert replicas == [4] * 19 + [2] * 4

    def test_missing_utilization_holds(self) -> None:
        command = hpa().decide(busy(None, ready=2), InForce(3, 1, 0.005), now=0, interval=1)
        assert command.replicas == 3


class TestOracle:
    TABLE: ClassVar[list[Capacity]] = [Capacity(4, 300.0), Capacity(8, 330.0)]

    @pytest.mark.parametrize(
        ("peak", "replicas", "batch"),
        [
            (0.0, 1, 8),  # nothing to carry: the minimum
            (300.0, 1, 8),  # 300 / 330 = 0.91 → 1; batch 4 would also do (1.0), 8 has room
            (331.0, 2, 8),  # 331 / 330 → 2 (batch 4 needs 2 as well, with less room)
            (900.0, 3, 8),  # 900 / 330 = 2.73 → 3
        ],
    )
    def test_the_fewest_replicas_whose_true_capacity_covers_the_peak(
        self, peak: float, replicas: int, batch: int
    ) -> None:
        assert oracle_plan(peak, self.TABLE, min_replicas=1, max_replicas=8) == (replicas, batch)

    def test_capped_at_max_replicas(self) -> None:
        assert oracle_plan(5000.0, self.TABLE, min_replicas=1, max_replicas=8) == (8, 8)


class TestReactiveBound:
    TABLE: ClassVar[list[Capacity]] = [Capacity(8, 330.0)]

    def bound(self, *, margin: float = 1.0, hold_s: float = 60.0) -> ReactiveController:
        # 300 rps, a spike to 700 rps for 20 s at t=30, then 300 rps again.
        trace = Trace.from_points([(0.0, 300.0), (30.0, 700.0), (50.0, 300.0)], duration_s=600.0)
        return ReactiveController(
            trace=trace,
            table=self.TABLE,
            margin=margin,
            hold_s=hold_s,
            min_replicas=1,
            max_replicas=8,
            max_queue_delay_s=0.005,
        )

    def test_it_provisions_the_present_rate_and_holds_it_for_the_scale_down_delay(self) -> None:
        controller, current = self.bound(), InForce(1, 8, 0.005)
        replicas = [controller.initial().replicas]
        for tick in range(1, 8):
            command = controller.decide(None, current, now=tick * TICK, interval=tick)
            replicas.append(command.replicas)
        # It sees the spike at t=30 and t=45 (700 / 330 → 3), and holds 3 until the t=45
        # recommendation leaves the 60 s window (t=105).
        assert replicas == [1, 1, 3, 3, 3, 3, 3, 1]

    def test_the_margin_multiplies_the_present_rate(self) -> None:
        # 300 rps: exactly one replica (330); with a 20 % margin, 360 rps → 2.
        assert self.bound().initial().replicas == 1
        assert self.bound(margin=1.2).initial().replicas == 2


class TestAutopilotController:
    """The autopilot's memory goes through `status.autopilot` between decisions, as in the
    operator: a merge patch of its document, read back."""

    def test_the_cold_start_learned_through_the_status_is_the_cold_start(self) -> None:
        # Steps up make scale-ups; each is timed once. Were a key the memory dropped kept in
        # the status (a merge patch keeps what it leaves out), the scale-up would be timed
        # again at every decision, and the cold start learned would grow to its cap.
        trace = Trace.from_points([(0.0, 200.0), (300.0, 900.0), (900.0, 1800.0)], duration_s=1500)
        scenario = Scenario(
            trace=trace,
            service=TEXTBOOK,
            sla_s=0.1,
            max_replicas=16,
            cluster=ClusterConfig(cold_start_s=90.0),
        )
        controller = scenario.controller("autopilot")
        assert isinstance(controller, AutopilotController)
        simulate(scenario, controller)
        learned = controller.state.cold_start_s
        assert learned is not None
        assert 60.0 <= learned <= 120.0
        assert "pendingSince" not in controller.status
        assert State.from_dict(controller.status) == controller.state
