"""Why replicas are not ready, read from what Kubernetes reports: the Deployment's conditions
and its pods' statuses, in the shapes the API server and the kubelet write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from batchpilot.operator.cache import slim_pod
from batchpilot.operator.rollout import (
    IN_PLACE,
    MESSAGE_MAX,
    STUCK_WAITING,
    SURGE,
    TROUBLE_REASONS,
    Trouble,
    frees_a_turn,
    holds_a_turn,
    in_place_turn,
    pod_trouble,
    ready_condition,
    rolling_in_place,
    rollout_under_way,
    rolls_in_place,
    trouble_in,
    waits_its_turn,
    why_not_ready,
)

QUOTA = (
    'pods "resnet50-7d9c5b-x2m4q" is forbidden: exceeded quota: gpus, requested: '
    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4"
)
NO_GPU = (
    "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-"
    "plane: }, 2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 "
    "Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
)
TRACEBACK = (
    "2026-12-02 10:00:01 INFO batchpilot.runtime.device: CUDA device 0: NVIDIA H100\n"
    "2026-12-02 10:00:02 ERROR batchpilot.runtime: model /models/model.onnx cannot be served: "
    "model file /models/model.onnx does not exist\n"
)


def deployment(*conditions: dict[str, Any], ready: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": "resnet50"},
        "spec": {"replicas": 2},
        "status": {"readyReplicas": ready, "conditions": list(conditions)},
    }


def pod(
    name: str = "resnet50-7d9c5b-a",
    *,
    scheduled: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Pending",
        "conditions": [scheduled or {"type": "PodScheduled", "status": "True"}],
    }
    if containers is not None:
        status["containerStatuses"] = containers
    if init is not None:
        status["initContainerStatuses"] = init
    meta: dict[str, Any] = {"name": name, "labels": {"batchpilot.io/inferenceservice": "resnet50"}}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    return {"metadata": meta, "status": status}


def waiting(reason: str, note: str = "", last: dict[str, Any] | None = None) -> dict[str, Any]:
    """A container waiting for `reason` (the kubelet's `note`), `last` how it last exited."""
    container: dict[str, Any] = {
        "name": "runtime",
        "ready": False,
        "restartCount": 3,
        "state": {"waiting": {"reason": reason, "message": note}},
    }
    if last is not None:
        container["lastState"] = {"terminated": {"reason": "Error", **last}}
    return container


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": NO_GPU,
}
REPLICA_FAILURE = {
    "type": "ReplicaFailure",
    "status": "True",
    "reason": "FailedCreate",
    "message": QUOTA,
}
DEADLINE = {
    "type": "Progressing",
    "status": "False",
    "reason": "ProgressDeadlineExceeded",
    "message": 'ReplicaSet "resnet50-7d9c5b" has timed out progressing.',
}


class TestWhyNotReady:
    def test_pods_that_cannot_be_created_say_the_api_servers_reason(self) -> None:
        assert why_not_ready(deployment(REPLICA_FAILURE), []) == Trouble(
            "FailedCreate", f"pods cannot be created: {QUOTA}"
        )

    def test_a_replica_failure_without_a_known_reason_is_named_replica_failure(self) -> None:
        odd = {**REPLICA_FAILURE, "reason": "SomethingNew"}
        assert why_not_ready(deployment(odd), []) == Trouble(
            "ReplicaFailure", f"pods cannot be created: {QUOTA}"
        )

    def test_pods_with_no_node_say_the_schedulers_reason(self) -> None:
        pods = [pod(scheduled=UNSCHEDULABLE), pod("b", scheduled=UNSCHEDULABLE), pod("c")]
        assert why_not_ready(deployment(), pods) == Trouble(
            "Unschedulable", f"2 of 3 pods cannot be scheduled: {NO_GPU}"
        )

    def test_pods_with_no_node_say_since_when_the_longest_has_waited(self) -> None:
        # A timestamp, not a duration: the same words on every pass, no write for the clock.
        early = {**UNSCHEDULABLE, "lastTransitionTime": "2026-12-08T00:47:45Z"}
        late = {**UNSCHEDULABLE, "lastTransitionTime": "2026-12-08T01:02:00Z"}
        pods = [pod(scheduled=late), pod("b", scheduled=early), pod("c")]
        assert why_not_ready(deployment(), pods) == Trouble(
            "Unschedulable",
            f"2 of 3 pods cannot be scheduled since 2026-12-08T00:47:45Z: {NO_GPU}",
        )

    def test_a_crash_loop_says_the_last_line_the_container_logged(self) -> None:
        pods = [
            pod(
                containers=[
                    waiting(
                        "CrashLoopBackOff", "back-off 40s", {"exitCode": 1, "message": TRACEBACK}
                    )
                ]
            )
        ]
        trouble = why_not_ready(deployment(), pods)
        assert trouble == Trouble(
            "CrashLoopBackOff",
            "1 of 1 pods CrashLoopBackOff: runtime: exit code 1: 2026-12-02 10:00:02 ERROR "
            "batchpilot.runtime: model /models/model.onnx cannot be served: model file "
            "/models/model.onnx does not exist",
        )

    def test_a_crash_without_a_message_says_the_exit(self) -> None:
        pods = [
            pod(
                containers=[
                    waiting(
                        "CrashLoopBackOff", "back-off 10s", {"exitCode": 137, "reason": "OOMKilled"}
                    )
                ]
            )
        ]
        trouble = why_not_ready(deployment(), pods)
        assert trouble is not None
        assert trouble.message == "1 of 1 pods CrashLoopBackOff: runtime: exit code 137: OOMKilled"

    def test_an_image_that_cannot_be_pulled_says_which(self) -> None:
        message = 'Back-off pulling image "ghcr.io/batchpilot/runtime-gpu:0.1.0"'
        pods = [
            pod(containers=[waiting("ImagePullBackOff", message)]),
            pod("b", scheduled=UNSCHEDULABLE),
        ]
        # A pod that got a node and still cannot run comes first.
        assert why_not_ready(deployment(), pods) == Trouble(
            "ImagePullBackOff", f"1 of 2 pods ImagePullBackOff: runtime: {message}"
        )

    def test_the_model_fetch_failing_is_named(self) -> None:
        fetch = waiting(
            "CrashLoopBackOff",
            "",
            {
                "exitCode": 1,
                "message": "fetch: 404 Not Found for https://models.example.com/r50.onnx",
            },
        )
        fetch["name"] = "fetch-model"
        pods = [pod(init=[fetch], containers=[waiting("PodInitializing")])]
        trouble = why_not_ready(deployment(), pods)
        assert trouble is not None
        assert trouble.message == (
            "1 of 1 pods CrashLoopBackOff: init container fetch-model: exit code 1: fetch: 404 Not "
            "Found for https://models.example.com/r50.onnx"
        )

    def test_a_stuck_rollout_is_said_when_the_pods_say_nothing(self) -> None:
        assert why_not_ready(deployment(DEADLINE), [pod()]) == Trouble(
            "ProgressDeadlineExceeded",
            'the rollout is stuck: ReplicaSet "resnet50-7d9c5b" has timed out progressing.',
        )

    @pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing"])
    def test_pods_on_their_way_up_are_no_trouble(self, reason: str) -> None:
        assert why_not_ready(deployment(), [pod(containers=[waiting(reason)])]) is None
        assert why_not_ready(deployment(), []) is None
        assert why_not_ready(None, []) is None

    def test_terminating_pods_are_not_counted(self) -> None:
        leaving = pod(containers=[waiting("CrashLoopBackOff", "x")], terminating=True)
        assert pod_trouble(leaving) is None
        assert why_not_ready(deployment(), [leaving, pod("b")]) is None

    def test_a_long_message_is_cut_to_one_line(self) -> None:
        long = "0/500 nodes are available: " + "x" * 2000 + "\n and more"
        trouble = why_not_ready(deployment(), [pod(scheduled={**UNSCHEDULABLE, "message": long})])
        assert trouble is not None
        assert len(trouble.message) == MESSAGE_MAX
        assert "\n" not in trouble.message
        assert trouble.message.endswith("…")


class TestReadyCondition:
    """The Ready condition worded from a trouble, and the trouble read back from it (what the
    autopilot's ScalingLimited says)."""

    TROUBLES = (
        Trouble("FailedCreate", f"pods cannot be created: {QUOTA}"),
        Trouble("Unschedulable", f"1 of 1 pods cannot be scheduled: {NO_GPU}"),
        Trouble("CrashLoopBackOff", "1 of 1 pods CrashLoopBackOff: runtime: exit code 1; again"),
        Trouble("ProgressDeadlineExceeded", "the rollout is stuck: timed out progressing."),
    )

    @pytest.mark.parametrize("trouble", TROUBLES, ids=[t.reason for t in TROUBLES])
    def test_some_ready_stay_available_and_the_trouble_reads_back(self, trouble: Trouble) -> None:
        status, reason, message = ready_condition(ready=1, desired=2, trouble=trouble)
        assert (status, reason, message) == (
            "True",
            "Available",
            f"1 of 2 replicas ready; {trouble.message}",
        )
        said = {"status": status, "reason": reason, "message": message}
        assert trouble_in(said) == trouble.message

    @pytest.mark.parametrize("trouble", TROUBLES, ids=[t.reason for t in TROUBLES])
    def test_none_ready_take_the_troubles_reason_and_it_reads_back(self, trouble: Trouble) -> None:
        status, reason, message = ready_condition(ready=0, desired=2, trouble=trouble)
        assert (status, reason, message) == ("False", trouble.reason, trouble.message)
        said = {"status": status, "reason": reason, "message": message}
        assert trouble_in(said) == trouble.message

    @pytest.mark.parametrize(
        ("ready", "reason", "message"),
        [
            (2, "Available", "2 of 2 replicas ready"),
            (0, "Progressing", "waiting for a replica to become ready"),
        ],
    )
    def test_without_trouble_nothing_reads_back(
        self, ready: int, reason: str, message: str
    ) -> None:
        status, said_reason, said = ready_condition(ready=ready, desired=2, trouble=None)
        assert (said_reason, said) == (reason, message)
        assert trouble_in({"status": status, "reason": said_reason, "message": said}) is None

    def test_a_ready_condition_not_about_replicas_names_no_trouble(self) -> None:
        for reason in ("ChildConflict", "InvalidSpec", "UnsupportedModel"):
            refused = {"status": "False", "reason": reason, "message": "spec.x: no"}
            assert trouble_in(refused) is None
        assert trouble_in(None) is None

    def test_every_trouble_found_has_a_trouble_reason(self) -> None:
        found = [
            why_not_ready(deployment(REPLICA_FAILURE), []),
            why_not_ready(deployment({**REPLICA_FAILURE, "reason": None}), []),
            why_not_ready(deployment(), [pod(scheduled=UNSCHEDULABLE)]),
            why_not_ready(deployment(DEADLINE), []),
            *(
                why_not_ready(deployment(), [pod(containers=[waiting(reason, "x")])])
                for reason in STUCK_WAITING
            ),
        ]
        assert all(t is not None and t.reason in TROUBLE_REASONS for t in found), found


def test_the_cache_keeps_what_it_takes() -> None:
    """The operator reads pods from its cache, which slims them: the answer is the same."""
    full = [
        pod(
            containers=[
                {
                    **waiting("CrashLoopBackOff", "b", {"exitCode": 1, "message": TRACEBACK}),
                    "image": "x",
                    "imageID": "y",
                    "containerID": "z",
                }
            ]
        ),
        pod("b", scheduled=UNSCHEDULABLE),
        pod(
            "c",
            containers=[
                {"name": "runtime", "ready": True, "state": {"running": {"startedAt": "t"}}}
            ],
        ),
    ]
    assert why_not_ready(deployment(), [slim_pod(p) for p in full]) == why_not_ready(
        deployment(), full
    )
    assert "containerStatuses" not in slim_pod(full[2])["status"]  # healthy: nothing kept


class TestRollingInPlace:
    """A rollout whose surge pod finds no room (no GPU free) goes in place after a wait."""

    NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)

    @staticmethod
    def rolling(
        *, replicas: int = 3, updated: int = 1, total: int = 4, in_place: bool = False
    ) -> dict[str, Any]:
        """Mid-rollout as its controller reports it: `updated` pods of the new template,
        `total` pods in all (the surge pod among them)."""
        return {
            "metadata": {"name": "resnet50"},
            "spec": {
                "replicas": replicas,
                "strategy": {"rollingUpdate": dict(IN_PLACE if in_place else SURGE)},
            },
            "status": {"replicas": total, "updatedReplicas": updated, "readyReplicas": 3},
        }

    def unschedulable_for(self, seconds: float) -> dict[str, Any]:
        since = (self.NOW - timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
        return slim_pod(
            pod(
                scheduled={
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": NO_GPU,
                    "lastTransitionTime": since,
                }
            )
        )

    def in_place(
        self, deployment: dict[str, Any], *pods: dict[str, Any], wait_s: float = 120
    ) -> bool:
        return rolls_in_place(deployment, list(pods), now=self.NOW, wait_s=wait_s)

    def test_a_surge_pod_with_no_room_for_the_wait_turns_the_rollout_in_place(self) -> None:
        assert not self.in_place(self.rolling(), self.unschedulable_for(119))
        assert self.in_place(self.rolling(), self.unschedulable_for(120))

    def test_once_in_place_it_stays_so_until_the_rollout_is_over(self) -> None:
        # the old pod went, the new one found its GPU: nothing is unschedulable now
        assert self.in_place(self.rolling(updated=2, total=3, in_place=True))
        done = self.rolling(updated=3, total=3, in_place=True)
        assert not rollout_under_way(done)
        assert not self.in_place(done)  # back to a surge for the next rollout

    def test_no_rollout_no_change(self) -> None:
        # a scale-up that finds no room is not a rollout: going in place would not help it
        scaling_up = self.rolling(updated=4, total=4, replicas=4)
        assert not self.in_place(scaling_up, self.unschedulable_for(600))

    def test_a_single_replica_waits_for_room(self) -> None:
        one = self.rolling(replicas=1, updated=0, total=2)
        assert not self.in_place(one, self.unschedulable_for(600))

    def test_a_wait_of_zero_means_never(self) -> None:
        assert not self.in_place(self.rolling(), self.unschedulable_for(600), wait_s=0)

    def test_terminating_and_scheduled_pods_are_no_reason(self) -> None:
        gone = {**self.unschedulable_for(600)}
        gone["metadata"] = {**gone["metadata"], "deletionTimestamp": "2026-12-05T11:59:00Z"}
        assert not self.in_place(self.rolling(), gone, slim_pod(pod()))

    def test_the_autopilot_counts_the_replica_a_rollout_in_place_has_down(self) -> None:
        assert rolling_in_place(self.rolling(in_place=True)) == 1
        assert rolling_in_place(self.rolling()) == 0  # a surge has none down
        assert rolling_in_place(self.rolling(updated=3, total=3, in_place=True)) == 0
        assert rolling_in_place(None) == 0

    def test_a_pod_no_node_would_take_for_another_reason_changes_nothing(self) -> None:
        pod = self.unschedulable_for(600)
        (condition,) = pod["status"]["conditions"]
        condition["message"] = (
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity."
        )
        assert not self.in_place(self.rolling(), pod)


class TestTurnsInPlace:
    """Of the rollouts that would go in place, no more than `max_services` at a time, fleet-wide:
    an upgrade of the operator rolls every service at once."""

    def turn(self, *others: str, max_services: int = 2) -> Any:
        return in_place_turn(list(others), wait_s=120, max_services=max_services)

    def test_a_turn_while_fewer_than_the_limit_go_in_place(self) -> None:
        assert self.turn() is None
        assert self.turn("vision/a") is None  # 1 < 2

    def test_at_the_limit_it_waits_and_says_who_holds_the_turns(self) -> None:
        held = self.turn("vision/a", "text/b")
        assert held is not None
        assert held.condition == (
            "the rollout's new pod has found no room for 120 s; 2 other services are rolling "
            "in place (rolloutInPlaceMaxServices 2), this one waits its turn"
        )
        assert held.event == (
            "the rollout's new pod has found no room for 120 s; 2 other services are rolling "
            "in place (rolloutInPlaceMaxServices 2): vision/a, text/b; this one waits its turn, "
            "with a surge: its old pods serve until one of those rollouts is over"
        )

    def test_past_the_limit_too(self) -> None:
        # the limit lowered while more went in place: they go on, no new one goes
        assert self.turn("a/a", "b/b", "c/c", max_services=1) is not None
        assert self.turn("a/a", max_services=1) is not None

    def test_zero_means_no_limit(self) -> None:
        assert self.turn(*(f"ns/s{i}" for i in range(500)), max_services=0) is None

    def test_not_known_is_held(self) -> None:
        held = in_place_turn(None, wait_s=120, max_services=2)
        assert held is not None
        assert "not known yet" in held.condition

    def test_the_ready_condition_that_says_it_is_read_back(self) -> None:
        held = self.turn("vision/a", max_services=1)
        assert held is not None
        message = f"3 of 3 replicas ready; {held.condition}"
        assert waits_its_turn({"type": "Ready", "status": "True", "message": message})
        assert not waits_its_turn({"type": "Ready", "status": "True", "message": "3 of 3"})
        assert not waits_its_turn(None)

    def test_a_rollout_in_place_that_is_over_or_gone_frees_its_turn(self) -> None:
        rolling = TestRollingInPlace.rolling
        assert not frees_a_turn(rolling(in_place=True))  # under way: it holds it
        assert frees_a_turn(rolling(updated=3, total=3, in_place=True))
        assert frees_a_turn(rolling(in_place=True), deleted=True)
        assert not frees_a_turn(rolling(updated=3, total=3))  # a surge held none
        assert not frees_a_turn(rolling(), deleted=True)

    def test_a_rollout_in_place_past_its_progress_deadline_frees_its_turn(self) -> None:
        # Its new pod crash-loops (a model too large for the GPU): the rollout never ends, and
        # held its turn for good.
        rolling = TestRollingInPlace.rolling(in_place=True)
        assert holds_a_turn(rolling)
        rolling["status"]["conditions"] = [
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "resnet50-5d8f" has timed out progressing.',
            }
        ]
        assert frees_a_turn(rolling)
        assert not holds_a_turn(rolling)
        assert rolling_in_place(rolling) == 1  # still one down, for the autopilot's count
