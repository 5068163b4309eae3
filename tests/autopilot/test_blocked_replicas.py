"""Replicas that cannot come: pods Kubernetes cannot start (not schedulable for want of a GPU, a
ResourceQuota, a container crash-looping) are told apart from pods starting (`rollout.blocked`),
and the autopilot does not wait for them — no scale-down held, no cold start learned from their
wait, no stand-in for a lost replica whose replacement is as blocked, no runaway of replicas
asked on P99 alone."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

import batchpilot.operator.autopilot.pilot as pilot_module
from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.feedback import feedback_only
from batchpilot.operator.autopilot.learn import learn
from batchpilot.operator.autopilot.lost import Loss, track
from batchpilot.operator.autopilot.pilot import Autopilot
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.rollout import blocked
from tests.autopilot.test_decide import MODEL, POLICY, TICK, seen, step
from tests.autopilot.test_pilot import NOW, T, World, overloaded


def pod(
    *, ready: bool = False, scheduled: bool = True, waiting: str | None = None
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if not scheduled:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        )
    status: dict[str, Any] = {"conditions": conditions}
    if waiting is not None:
        status["containerStatuses"] = [
            {"name": "runtime", "state": {"waiting": {"reason": waiting}}}
        ]
    return {"metadata": {"name": "p"}, "status": status}


def deployment(replicas: int, created: int, *, quota: bool = False) -> dict[str, Any]:
    conditions = []
    if quota:
        conditions.append(
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": 'pods "x" is forbidden: exceeded quota: gpus',
            }
        )
    return {
        "spec": {"replicas": replicas},
        "status": {"replicas": created, "conditions": conditions},
    }


class TestWhatIsBlocked:
    def test_pods_kubernetes_cannot_start_are_blocked_and_pods_starting_are_not(self) -> None:
        pods = [
            pod(ready=True),
            pod(scheduled=False),  # no node with a free GPU
            pod(waiting="CrashLoopBackOff"),
            pod(waiting="ImagePullBackOff"),
            pod(waiting="ContainerCreating"),  # on its way
            pod(),  # scheduled, loading its model
        ]
        assert blocked(deployment(6, 6), pods) == 3

    def test_pods_a_quota_keeps_from_being_created_are_blocked(self) -> None:
        assert blocked(deployment(5, 3, quota=True), [pod(ready=True)] * 3) == 2
        assert blocked(deployment(5, 3), [pod(ready=True)] * 3) == 0  # being created


class TestAScaleDown:
    def test_is_not_held_by_replicas_that_cannot_come(self) -> None:
        # Six asked for at a peak, three of them Pending for good (no GPU); the load falls to
        # what one carries. Waited for as "starting", they held six for as long as they waited.
        policy = replace(POLICY, max_replicas=8, scale_down_delay_s=120)

        def run(stuck: int) -> list[int]:
            current, state = InForce(6, 8, 0.005), State(fit=MODEL)
            counts = []
            for tick in range(1, 30):
                obs = replace(
                    seen(at=tick * TICK, qps=50, p99_ms=15, ready=3), blocked_replicas=stuck
                )
                decision, current, state = step(obs, current, state, tick * TICK, policy)
                counts.append(decision.replicas)
            return counts

        waited = run(0)
        assert set(waited) == {6}  # three starting, as far as it knows
        given_back = run(3)
        assert given_back[-1] < 3, given_back
        # after the window of low load, as any scale-down
        assert given_back.index(min(given_back)) * TICK >= 120


class TestTheColdStart:
    def test_is_not_learned_from_a_wait_kubernetes_said_was_blocked(self) -> None:
        current = InForce(6, 8, 0.005)
        state = State(fit=MODEL, pending_since=1000.0, ready=3, cold_start_s=40.0)
        stuck = replace(seen(at=1300, qps=50, p99_ms=15, ready=3), blocked_replicas=3)
        learned = learn(stuck, POLICY, current, state, 1300.0).state
        assert learned.pending_since is None
        # the node came eight minutes later: the replicas' readiness measures nothing
        up = seen(at=1480, qps=50, p99_ms=15, ready=6)
        after = learn(up, POLICY, current, replace(learned, rate=None), 1480.0).state
        assert after.cold_start_s == 40.0

    def test_a_wait_longer_than_a_start_can_take_is_not_learned(self) -> None:
        current = InForce(4, 8, 0.005)
        state = State(fit=MODEL, pending_since=0.0, ready=2, cold_start_s=40.0)
        up = seen(at=2400, qps=50, p99_ms=15, ready=4)
        assert learn(up, POLICY, current, state, 2400.0).state.cold_start_s == 40.0


class TestALoss:
    def test_ends_when_every_replica_that_can_come_is_ready(self) -> None:
        # one replica's node died; its replacement is Pending for want of a GPU
        lost = track(Loss(), ready=2, replicas=3, was_ready=3, had_replicas=3, now=100.0)
        assert lost.count == 1
        assert (
            track(lost, ready=2, replicas=3, was_ready=2, had_replicas=3, now=115.0, blocked=1)
            == Loss()
        )


class TestP99Alone:
    def test_adds_no_replicas_while_those_asked_for_are_not_ready(self) -> None:
        # no model, no busy share; P99 over the SLA and the batch at its maximum
        current = InForce(5, POLICY.max_batch_size, 0.005)
        obs = replace(seen(at=0, qps=300, p99_ms=160, ready=3), compute=(), utilization=None)
        replicas, _, why = feedback_only(obs, replace(POLICY, max_replicas=32), current)
        assert replicas == 5
        assert "not ready yet" in why
        ready = replace(obs, ready_replicas=5)
        assert feedback_only(ready, replace(POLICY, max_replicas=32), current)[0] > 5

    def test_decide_does_not_run_away(self) -> None:
        policy = replace(POLICY, max_replicas=32)
        current, state = InForce(3, policy.max_batch_size, 0.005), State()
        for tick in range(1, 6):
            obs = replace(
                seen(at=tick * TICK, qps=300, p99_ms=160, ready=3), compute=(), utilization=None
            )
            _, current, state = step(obs, current, state, tick * TICK, policy)
        assert current.replicas <= 6


class TestThePilot:
    def test_counts_the_pods_that_cannot_come_from_what_kubernetes_says(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen_by_decide = []

        def observe(scope: Scope, *, ready_replicas: int | None) -> Any:
            return overloaded(scope, ready_replicas=ready_replicas)

        world = World(observe=observe)
        found = world.kube.objects[("Deployment", "vision", "resnet50")]
        found["spec"]["replicas"] = 3
        found["status"] = {"readyReplicas": 1, "replicas": 3}
        pods = [pod(ready=True), pod(scheduled=False), pod(scheduled=False)]
        asked: list[tuple[str, dict[str, str]]] = []

        def read_pods(namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
            asked.append((namespace, selector))
            return pods

        autopilot = Autopilot(
            world.kube,
            observe=observe,
            pods=world,
            push=world.push,
            clock=lambda: NOW,
            seconds=lambda: T,
            read_pods=read_pods,
        )

        def spy(observation: Any, *args: Any, **kwargs: Any) -> Any:
            seen_by_decide.append(observation.blocked_replicas)
            return decide(observation, *args, **kwargs)

        monkeypatch.setattr(pilot_module, "decide", spy)
        autopilot.prepare(copy.deepcopy(world.body))
        assert seen_by_decide == [2]
        ((namespace, selector),) = asked
        assert namespace == "vision"
        assert selector  # the service's own pods
        # all ready: the pods are not read
        found["status"] = {"readyReplicas": 3, "replicas": 3}
        asked.clear()
        autopilot.prepare(copy.deepcopy(world.body))
        assert not asked


def test_decide_reads_the_blocked_count_from_the_observation() -> None:
    obs = replace(seen(at=120, qps=50, p99_ms=15, ready=2), blocked_replicas=1)
    state = State(fit=MODEL, recommendations=((0.0, 1),))
    decision, _ = decide(obs, POLICY, InForce(3, 8, 0.005), state, now=120)
    assert "still starting" not in decision.reason
