"""Replicas lost while they served (a node that died, a container that crashed): counted, and
stood in for once they have been away longer than a restart takes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.learn import DEFAULT_COLD_START_S
from batchpilot.operator.autopilot.lost import MIN_GRACE_S, Loss, grace_s, stand_ins, track
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.pilot import Autopilot
from batchpilot.operator.autopilot.policy import Decision, InForce
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.children.node_loss import eviction_s
from tests.autopilot.test_decide import MODEL, POLICY, TICK, seen
from tests.autopilot.test_pilot import NOW, T, World

WIDE = replace(POLICY, max_replicas=8)
RATE = 900.0
"""Three replicas' load at batch 16 (the model: 395 rps each inside the SLA)."""
GRACE = grace_s(DEFAULT_COLD_START_S)


def tick(
    current: InForce, state: State, now: float, *, ready: int, p99_ms: float = 40.0
) -> tuple[Decision, InForce, State]:
    obs = seen(at=now, qps=RATE, p99_ms=p99_ms, ready=ready, batch=8)
    decision, state = decide(obs, WIDE, current, state, now)
    return (
        decision,
        InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s),
        state,
    )


def steady(ticks: int = 4) -> tuple[InForce, State, float]:
    """Three replicas, all ready, carrying their load, for a few ticks."""
    current, state, now = InForce(3, 16, 0.005), State(fit=MODEL), 0.0
    for _ in range(ticks):
        decision, current, state = tick(current, state, now, ready=3)
        assert decision.replicas == 3
        now += TICK
    return current, state, now


class TestTrack:
    def test_a_ready_replica_gone_without_a_scale_down_is_lost(self) -> None:
        loss = track(Loss(), ready=2, replicas=3, was_ready=3, had_replicas=3, now=100)
        assert loss == Loss(1, 100)

    def test_the_replica_a_rollout_in_place_has_down_is_no_loss(self) -> None:
        # one old pod goes first, for its GPU: by design, not a loss
        assert (
            track(Loss(), ready=2, replicas=3, was_ready=3, had_replicas=3, now=1, replaced=1)
            == Loss()
        )
        # a second one gone meanwhile is
        loss = track(Loss(), ready=1, replicas=3, was_ready=3, had_replicas=3, now=1, replaced=1)
        assert loss == Loss(1, 1)

    def test_a_scale_down_that_removed_a_ready_replica_is_no_loss(self) -> None:
        assert track(Loss(), ready=2, replicas=2, was_ready=3, had_replicas=3, now=1) == Loss()
        # ... nor while another still starts.
        assert track(Loss(), ready=2, replicas=3, was_ready=3, had_replicas=4, now=1) == Loss()

    def test_replicas_of_a_scale_up_that_do_not_start_are_no_loss(self) -> None:
        loss = track(Loss(), ready=3, replicas=5, was_ready=3, had_replicas=3, now=1)
        assert loss == Loss()

    def test_a_loss_during_a_scale_up_is_counted(self) -> None:
        loss = track(Loss(), ready=2, replicas=5, was_ready=3, had_replicas=3, now=7)
        assert loss == Loss(1, 7)

    def test_a_loss_is_over_once_every_replica_is_ready(self) -> None:
        assert track(Loss(1, 5), ready=4, replicas=4, was_ready=3, had_replicas=4, now=9) == Loss()

    def test_a_loss_is_never_more_than_the_replicas_not_ready(self) -> None:
        # Two lost; one came back, one still away.
        loss = track(Loss(2, 5), ready=2, replicas=3, was_ready=1, had_replicas=3, now=9)
        assert loss == Loss(1, 5)

    def test_no_previous_decision_counts_no_loss(self) -> None:
        loss = track(Loss(), ready=1, replicas=3, was_ready=None, had_replicas=None, now=1)
        assert loss == Loss()


class TestStandIns:
    def test_none_within_the_grace(self) -> None:
        loss = Loss(1, 100)
        assert stand_ins(loss, plan=3, cold_start_s=30, now=100 + MIN_GRACE_S - 1) == 0
        assert stand_ins(loss, plan=3, cold_start_s=30, now=100 + MIN_GRACE_S) == 1

    def test_the_grace_is_two_cold_starts_learned(self) -> None:
        assert grace_s(10) == MIN_GRACE_S
        assert grace_s(90) == 180
        loss = Loss(2, 0)
        assert stand_ins(loss, plan=3, cold_start_s=90, now=179) == 0
        assert stand_ins(loss, plan=3, cold_start_s=90, now=180) == 2

    def test_never_more_than_the_plan(self) -> None:
        assert stand_ins(Loss(6, 0), plan=3, cold_start_s=30, now=1000) == 3


class TestDecide:
    def test_a_node_lost_gets_a_stand_in_after_the_grace_and_gives_it_back_after(self) -> None:
        current, state, now = steady()
        lost_at = now
        # The node controller marks the pod NotReady; nothing deletes it.
        while now - lost_at < GRACE:
            decision, current, state = tick(current, state, now, ready=2)
            assert decision.replicas == 3, now - lost_at
            now += TICK
        decision, current, state = tick(current, state, now, ready=2)
        assert decision.replicas == 4
        assert "1 more in place of 1 replica ready before and not for" in decision.reason
        now += TICK
        # The stand-in starts, then serves; the lost one is still away: the count holds.
        for ready in (2, 2, 3, 3, 3):
            decision, current, state = tick(current, state, now, ready=ready)
            assert decision.replicas == 4
            now += TICK
        assert state.cold_start_s is not None  # the stand-in's start was measured
        # Evicted and replaced: all four ready, the loss is over; the surplus goes after the
        # stabilization window, as any surplus does.
        replicas = []
        for _ in range(8):
            decision, current, state = tick(current, state, now, ready=current.replicas)
            replicas.append(decision.replicas)
            now += TICK
        assert state.lost == Loss()
        assert replicas[0] == 4
        assert replicas[-1] == 3

    def test_the_guard_weighs_the_replicas_that_serve_while_one_is_lost(self) -> None:
        # The stand-in serves, the lost one is still away, and the windows are over the SLA
        # although the model says three carry the load: observed latency wins, as it does with
        # every replica ready.
        current, state, now = steady()
        lost_at = now
        while current.replicas == 3:
            assert now - lost_at <= GRACE
            _, current, state = tick(current, state, now, ready=2)
            now += TICK
        reasons = []
        for _ in range(8):
            decision, current, state = tick(current, state, now, ready=3, p99_ms=150)
            reasons.append(decision.reason)
            now += TICK
        assert current.replicas == 5
        added = [r for r in reasons if "feedback: adding 1 replicas" in r]
        assert added
        assert "1 more in place of 1 replica" in added[0]

    def test_over_the_sla_a_lost_replica_gets_its_stand_in_at_once(self) -> None:
        # The two left do not carry the load: no grace, whatever brings the third back.
        current, state, now = steady()
        decision, current, state = tick(current, state, now, ready=2, p99_ms=150)
        assert decision.replicas == 4
        assert "1 more in place of 1 replica ready before and not for 0 s" in decision.reason
        # Inside the SLA again, it stays while the lost one is away.
        for _ in range(4):
            decision, current, state = tick(current, state, now, ready=3)
            assert decision.replicas == 4
            now += TICK

    def test_a_restart_back_within_the_grace_adds_nothing(self) -> None:
        current, state, now = steady()
        for ready in (2, 2, 2, 3, 3):
            decision, current, state = tick(current, state, now, ready=ready)
            assert decision.replicas == 3
            now += TICK
        assert state.lost == Loss()

    def test_a_scale_up_that_cannot_start_gets_no_stand_in(self) -> None:
        # A quota: the fourth replica never comes up.
        current, state, now = InForce(4, 16, 0.005), State(fit=MODEL, ready=3, replicas=3), 0.0
        for _ in range(int(3 * GRACE / TICK)):
            decision, current, state = tick(current, state, now, ready=3, p99_ms=90)
            assert decision.replicas == 4
            now += TICK

    def test_spare_replicas_in_force_cover_a_loss(self) -> None:
        # Four in force where the plan needs three: one lost is covered, nothing is added.
        current, state, now = InForce(4, 16, 0.005), State(fit=MODEL, ready=4, replicas=4), 0.0
        for _ in range(int(2 * GRACE / TICK)):
            decision, current, state = tick(current, state, now, ready=3)
            assert decision.replicas == 4
            now += TICK

    @pytest.mark.parametrize("cycles", [1, 3, 6])
    def test_replicas_that_crash_whenever_they_serve_take_at_most_twice_the_plan(
        self, cycles: int
    ) -> None:
        current, state, now = steady()
        for _ in range(cycles):
            # All of them die, stay away past the grace, then come back and die again.
            for _ in range(int(GRACE / TICK) + 2):
                _, current, state = tick(current, state, now, ready=0)
                now += TICK
            _, current, state = tick(current, state, now, ready=current.replicas)
            now += TICK
        assert current.replicas <= 6

    def test_the_loss_survives_a_restart_of_the_operator(self) -> None:
        current, state, now = steady()
        decision, current, state = tick(current, state, now, ready=2)
        restored = State.from_dict(state.to_dict())
        assert restored.lost == state.lost == Loss(1, now)
        assert restored.replicas == 3
        now += GRACE
        decision, current, state = tick(current, restored, now, ready=2)
        assert decision.replicas == 4


class TestEviction:
    """Where the pods tolerate a lost node briefly, Kubernetes replaces them on its own."""

    def test_the_grace_waits_for_an_eviction_sooner_than_a_restart(self) -> None:
        # A restart's grace is 120 s here (two default cold starts): an eviction at 300 s
        # comes later, one at 30 s sooner — then the stand-in waits as long again after it.
        assert grace_s(DEFAULT_COLD_START_S, evicted_after_s=300) == 120
        assert grace_s(DEFAULT_COLD_START_S, evicted_after_s=30) == 150
        assert grace_s(DEFAULT_COLD_START_S, evicted_after_s=math.inf) == 120

    def test_a_replica_replaced_after_its_eviction_gets_no_stand_in(self) -> None:
        policy = replace(WIDE, evicted_after_s=30)
        current, state, now = steady()
        # Evicted 30 s after the loss was noticed, the replacement ready 105 s later: past a
        # restart's grace (120 s), inside the eviction's (150 s).
        for ready in [2] * 9 + [3] * 4:
            obs = seen(at=now, qps=RATE, p99_ms=40, ready=ready, batch=8)
            decision, state = decide(obs, policy, current, state, now)
            assert decision.replicas == 3, now
            now += TICK
        assert state.lost == Loss()

    def test_a_replica_never_evicted_nor_back_gets_one_after_the_eviction_and_the_grace(
        self,
    ) -> None:
        # A pod crash-looping on a broken GPU: its node answers, nothing evicts it.
        policy = replace(WIDE, evicted_after_s=30)
        current, state, now = steady()
        lost_at, replicas = now, 3
        while replicas == 3:
            obs = seen(at=now, qps=RATE, p99_ms=40, ready=2, batch=8)
            decision, state = decide(obs, policy, current, state, now)
            replicas = decision.replicas
            now += TICK
        assert now - TICK - lost_at == 150
        assert replicas == 4


class TestThePilot:
    def test_it_plans_with_the_tolerations_the_pods_were_given(self) -> None:
        """The operator renders a 30 s toleration: a replica away for 135 s gets its stand-in
        after 150 s, not after a restart's 120 s."""
        clock = [T]

        def steady_load(scope: Scope, *, ready_replicas: int | None) -> Observation:
            return replace(
                seen(at=clock[0], qps=RATE, p99_ms=40, ready=ready_replicas or 0, batch=8),
                window_s=60,
            )

        world = World(observe=steady_load)
        world.autopilot = Autopilot(
            world.kube,
            observe=steady_load,
            pods=world,
            push=world.push,
            clock=lambda: NOW,
            seconds=lambda: clock[0],
        )
        deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
        template = deployment["spec"]["template"]["spec"]
        assert eviction_s(template["tolerations"]) == 30

        def run(ready: int) -> int:
            deployment["status"] = {"readyReplicas": ready, "replicas": 3}
            decision = world.tick().decision
            clock[0] += TICK
            assert decision is not None
            deployment["spec"]["replicas"] = decision.replicas
            return decision.replicas

        deployment["spec"]["replicas"] = 3
        assert [run(3) for _ in range(4)] == [3] * 4
        away = [run(2) for _ in range(12)]
        assert away == [3] * 10 + [4] * 2  # the 11th tick, 150 s after the loss
