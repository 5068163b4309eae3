"""The ScalingLimited condition and its Event, per tick: at maxReplicas, or while replicas the
autopilot asked for cannot come up, as the reconciler's Ready condition says."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from batchpilot.operator import conditions, rollout
from batchpilot.operator.autopilot.policy import Decision, InForce
from batchpilot.operator.autopilot.reporting import report_tick
from batchpilot.operator.autopilot.slo import SloReport
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.events import Event
from batchpilot.operator.kinds import DEPLOYMENT
from batchpilot.operator.rollout import Trouble
from batchpilot.operator.spec import InferenceServiceSpec
from tests.autopilot.test_pilot import World
from tests.operator.test_reconciler import isvc

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = InferenceServiceSpec.model_validate(isvc(scaling={"maxReplicas": 8})["spec"])
NO_VERDICT = SloReport(attainment=None, budget_remaining=None, burn_rates={}, at_risk=None)
QUOTA = 'pods "resnet50-x" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1'
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
AT_MAX = "at maxReplicas 6 with P99 900 ms over the 100 ms SLA; raise maxReplicas or maxBatchSize"

# What `rollout.why_not_ready` says for each way replicas cannot come up.
TROUBLES = [
    Trouble("FailedCreate", f"pods cannot be created: {QUOTA}"),
    Trouble("Unschedulable", f"4 of 4 pods cannot be scheduled: {NO_GPU}"),
    Trouble("CrashLoopBackOff", "4 of 4 pods CrashLoopBackOff: runtime: exit code 137: OOMKilled"),
    Trouble(
        "ImagePullBackOff",
        '4 of 4 pods ImagePullBackOff: runtime: Back-off pulling image "ghcr.io/x/runtime:9"',
    ),
    Trouble(
        "ProgressDeadlineExceeded",
        'the rollout is stuck: ReplicaSet "resnet50-7d9c5b" has timed out progressing.',
    ),
]


def ready_status(*, ready: int, desired: int, trouble: Trouble | None) -> dict[str, Any]:
    """An InferenceService's status holding the Ready condition the reconciler writes."""
    state, reason, message = rollout.ready_condition(ready=ready, desired=desired, trouble=trouble)
    return {
        "conditions": conditions.set_condition(
            None,
            type_=conditions.READY,
            status=state,
            reason=reason,
            message=message,
            generation=1,
            now=NOW - timedelta(minutes=1),
        )
    }


def decision(replicas: int, *, limited: str | None = None) -> Decision:
    return Decision(
        replicas=replicas,
        batch_size=8,
        max_queue_delay_s=0.005,
        action="steady",
        reason="P99 90 ms vs SLA 100 ms at 300 rps; no change",
        metrics_available=True,
        sla_met=limited is None,
        scaling_limited=limited,
    )


def tick(
    status: dict[str, Any],
    chosen: Decision,
    *,
    in_force: int,
    ready: int,
    acting: bool = True,
) -> tuple[dict[str, Any], list[Event]]:
    """report_tick, and `status` as the write leaves it."""
    doc, events = report_tick(
        status,
        SPEC,
        observation=None,
        decision=chosen,
        current=InForce(replicas=in_force, batch_size=8, max_queue_delay_s=0.005),
        ready_replicas=ready,
        state=State(),
        report=NO_VERDICT,
        acting=acting,
        generation=1,
        now=NOW,
    )
    status.update(doc)
    return conditions.find(doc["conditions"], conditions.SCALING_LIMITED) or {}, events


def limited_events(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.type, e.message) for e in events if e.reason == "ScalingLimited"]


class TestReplicasUnavailable:
    @pytest.mark.parametrize("trouble", TROUBLES, ids=[t.reason for t in TROUBLES])
    def test_some_ready_the_rest_in_trouble_limits_with_the_ready_conditions_words(
        self, trouble: Trouble
    ) -> None:
        # Ready is True (Available: 2 of 6) and says what keeps the other four away.
        status = ready_status(ready=2, desired=6, trouble=trouble)
        condition, events = tick(status, decision(6), in_force=6, ready=2)
        message = f"the autopilot asks for 6 replicas, 2 are ready: {trouble.message}"
        assert (condition["status"], condition["reason"]) == ("True", "ReplicasUnavailable")
        assert condition["message"] == message
        assert limited_events(events) == [("Warning", message)]

    @pytest.mark.parametrize("trouble", TROUBLES, ids=[t.reason for t in TROUBLES])
    def test_none_ready_limits_with_the_ready_conditions_words(self, trouble: Trouble) -> None:
        # Ready is False with the trouble's own reason.
        status = ready_status(ready=0, desired=4, trouble=trouble)
        condition, _ = tick(status, decision(4), in_force=4, ready=0)
        assert (condition["status"], condition["reason"]) == ("True", "ReplicasUnavailable")
        assert condition["message"] == (
            f"the autopilot asks for 4 replicas, 0 are ready: {trouble.message}"
        )

    def test_the_event_is_posted_once_and_the_condition_clears_with_the_trouble(self) -> None:
        status = ready_status(ready=2, desired=6, trouble=TROUBLES[0])
        first, said_first = tick(status, decision(6), in_force=6, ready=2)
        since = first["lastTransitionTime"]
        # Three replicas now, still the quota: the message follows, no second Event.
        status["conditions"] = ready_status(ready=3, desired=6, trouble=TROUBLES[0])[
            "conditions"
        ] + [c for c in status["conditions"] if c["type"] != conditions.READY]
        second, said_second = tick(status, decision(6), in_force=6, ready=3)
        assert len(limited_events(said_first)) == 1
        assert limited_events(said_second) == []
        assert second["message"].startswith("the autopilot asks for 6 replicas, 3 are ready: ")
        assert second["lastTransitionTime"] == since
        # The quota raised: all six ready, Ready names nothing, ScalingLimited clears.
        status["conditions"] = ready_status(ready=6, desired=6, trouble=None)["conditions"] + [
            c for c in status["conditions"] if c["type"] != conditions.READY
        ]
        cleared, said_cleared = tick(status, decision(6), in_force=6, ready=6)
        assert (cleared["status"], cleared["reason"], cleared["message"]) == (
            "False",
            "WithinLimits",
            "the autopilot can reach what the SLA needs",
        )
        assert limited_events(said_cleared) == []

    def test_a_recommendation_says_it_recommends(self) -> None:
        status = ready_status(ready=1, desired=3, trouble=TROUBLES[1])
        condition, _ = tick(status, decision(5), in_force=3, ready=1, acting=False)
        assert condition["message"] == (
            f"the autopilot recommends 5 replicas, 1 is ready: {TROUBLES[1].message}"
        )


class TestNotALimit:
    def test_pods_starting_are_progress(self) -> None:
        status = ready_status(ready=0, desired=4, trouble=None)  # Progressing
        condition, events = tick(status, decision(4), in_force=4, ready=0)
        assert (condition["status"], condition["reason"]) == ("False", "WithinLimits")
        assert limited_events(events) == []

    def test_a_decision_that_wants_no_more_than_run_is_not_held_back(self) -> None:
        # Four asked for, two ready behind the quota; the autopilot now wants two.
        status = ready_status(ready=2, desired=4, trouble=TROUBLES[0])
        condition, _ = tick(status, decision(2), in_force=4, ready=2)
        assert condition["reason"] == "WithinLimits"

    def test_trouble_from_before_a_scale_up_is_not_blamed_on_replicas_not_asked_for_yet(
        self,
    ) -> None:
        # Ready still says the quota from an earlier pass, but all in force (2) are ready now:
        # the scale-up to 6 is this tick's, nothing is known yet of what stops it.
        status = ready_status(ready=1, desired=2, trouble=TROUBLES[0])
        condition, _ = tick(status, decision(6), in_force=2, ready=2)
        assert condition["reason"] == "WithinLimits"

    def test_a_refused_spec_is_not_about_replicas(self) -> None:
        status = {
            "conditions": conditions.set_condition(
                None,
                type_=conditions.READY,
                status="False",
                reason="ChildConflict",
                message="Deployment resnet50 already exists and is not controlled by this "
                "InferenceService; it was left alone. Delete or rename it.",
                generation=1,
                now=NOW,
            )
        }
        condition, _ = tick(status, decision(4), in_force=4, ready=0)
        assert condition["reason"] == "WithinLimits"


class TestAnSlaBelowTheLatencyFloor:
    FLOOR = (
        "the SLA is below what a request takes alone: 44 ms, 40 ms of it outside the batcher; "
        "planning for P99 within 50% of that — raise the SLA or cut the time outside the batcher"
    )

    def test_it_is_a_limit_with_what_to_change(self) -> None:
        status = ready_status(ready=2, desired=2, trouble=None)
        below = replace(decision(2), sla_met=False, below_floor=self.FLOOR)
        condition, events = tick(status, below, in_force=2, ready=2)
        assert (condition["status"], condition["reason"]) == ("True", "SLABelowLatencyFloor")
        assert condition["message"] == self.FLOOR
        assert limited_events(events) == [("Warning", self.FLOOR)]

    def test_replicas_that_cannot_come_up_are_said_after_it(self) -> None:
        status = ready_status(ready=1, desired=3, trouble=TROUBLES[1])
        below = replace(decision(3), sla_met=False, below_floor=self.FLOOR)
        condition, _ = tick(status, below, in_force=3, ready=1)
        assert condition["reason"] == "SLABelowLatencyFloor"
        assert condition["message"] == f"{self.FLOOR}; 1 of 3 replicas ready: " + (
            TROUBLES[1].message
        )


class TestAtMaxReplicas:
    def test_at_max_keeps_its_reason_and_says_the_missing_replicas_after(self) -> None:
        status = ready_status(ready=2, desired=6, trouble=TROUBLES[1])
        condition, events = tick(status, decision(6, limited=AT_MAX), in_force=6, ready=2)
        message = f"{AT_MAX}; 2 of 6 replicas ready: {TROUBLES[1].message}"
        assert (condition["status"], condition["reason"]) == ("True", "AtMaxReplicas")
        assert condition["message"] == message
        assert limited_events(events) == [("Warning", message)]

    def test_at_max_with_every_replica_ready_says_only_the_maximum(self) -> None:
        status = ready_status(ready=6, desired=6, trouble=None)
        condition, _ = tick(status, decision(6, limited=AT_MAX), in_force=6, ready=6)
        assert (condition["reason"], condition["message"]) == ("AtMaxReplicas", AT_MAX)

    def test_from_unavailable_to_at_max_is_one_limit_and_one_event(self) -> None:
        status = ready_status(ready=2, desired=6, trouble=TROUBLES[0])
        _, said_first = tick(status, decision(6), in_force=6, ready=2)
        condition, said_second = tick(status, decision(6, limited=AT_MAX), in_force=6, ready=2)
        assert condition["reason"] == "AtMaxReplicas"
        assert len(limited_events(said_first)) == 1
        assert limited_events(said_second) == []

    def test_a_long_message_is_cut_to_one_condition_line(self) -> None:
        long = Trouble(
            "Unschedulable", rollout.short("4 of 4 pods cannot be scheduled: " + "x" * 500)
        )
        status = ready_status(ready=2, desired=6, trouble=long)
        condition, _ = tick(status, decision(6, limited=AT_MAX), in_force=6, ready=2)
        assert len(condition["message"]) == rollout.MESSAGE_MAX
        assert condition["message"].startswith(f"{AT_MAX}; 2 of 6 replicas ready: 4 of 4 pods")
        assert condition["message"].endswith("…")


def test_the_tick_reads_ready_replicas_from_the_deployment() -> None:
    # One replica asked for, none ready, the scheduler finds no GPU: the Ready condition the
    # reconciler wrote says so, and the tick (which reads readyReplicas off the Deployment)
    # reports the limit.
    world = World(mode="recommend")
    world.kube.objects[("Deployment", "vision", "resnet50")]["status"] = {"readyReplicas": 0}
    world.body["status"]["conditions"] = ready_status(ready=0, desired=1, trouble=TROUBLES[1])[
        "conditions"
    ]
    before = copy.deepcopy(world.kube.of(DEPLOYMENT, "vision", "resnet50"))
    result = world.tick()
    condition = world.condition("ScalingLimited")
    assert world.kube.of(DEPLOYMENT, "vision", "resnet50") == before
    recommended = world.body["status"]["recommendation"]["replicas"]
    assert (condition["status"], condition["reason"]) == ("True", "ReplicasUnavailable")
    assert condition["message"] == (
        f"the autopilot recommends {recommended} replicas, 0 are ready: {TROUBLES[1].message}"
    )
    assert [e.reason for e in result.events].count("ScalingLimited") == 1
