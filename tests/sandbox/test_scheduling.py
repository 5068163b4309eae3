"""The sandbox's node with GPUs: what a pod asks for, which waiting pods the node takes, and how
the scheduler words a pod it has no room for."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.rollout import NO_ROOM, pod_trouble
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox.scheduling import (
    GpuRequest,
    Waiting,
    bind_in_order,
    fits,
    gpu_request,
    held,
    insufficient,
    scheduled_condition,
    unschedulable_condition,
    unscheduled_status,
)

GPU = GpuRequest("nvidia.com/gpu", 1)
SINCE = "2025-01-01T00:00:00Z"


def rendered_container(device: str, settings: OperatorSettings) -> dict[str, Any]:
    """The runtime container the operator renders for a service on `device`."""
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"uri": "file:///models/mlp.onnx"},
            "runtime": {"device": device, "engine": "simulated"},
            "sla": {"latencyP99Ms": 100},
        }
    )
    owner = Owner(name="m", namespace="default", uid="u", spec=spec)
    deployment = build_deployment(owner, settings, replicas=2)
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


class TestWhatAPodAsksFor:
    def test_the_operators_gpu_limit(self) -> None:
        container = rendered_container("gpu", OperatorSettings())
        assert gpu_request(container) == GPU

    def test_whatever_gpu_resource_the_operator_renders(self) -> None:
        settings = OperatorSettings(gpu_resource="nvidia.com/mig-1g.10gb")
        container = rendered_container("gpu", settings)
        assert gpu_request(container) == GpuRequest("nvidia.com/mig-1g.10gb", 1)

    def test_a_cpu_service_asks_for_none(self) -> None:
        assert gpu_request(rendered_container("cpu", OperatorSettings())) is None

    @pytest.mark.parametrize(
        ("resources", "expected"),
        [
            ({}, None),
            ({"limits": {"cpu": "2", "memory": "1Gi"}}, None),
            ({"limits": {"hugepages-2Mi": "1Gi", "kubernetes.io/something": "1"}}, None),
            ({"requests": {"amd.com/gpu": 2}}, GpuRequest("amd.com/gpu", 2)),
            ({"limits": {"nvidia.com/gpu": "0"}}, None),
            ({"limits": {"nvidia.com/gpu": "half"}}, None),
        ],
    )
    def test_only_whole_extended_resources_count(
        self, resources: dict[str, Any], expected: GpuRequest | None
    ) -> None:
        assert gpu_request({"resources": resources}) == expected


class TestWhichWaitingPodsTheNodeTakes:
    def test_a_node_without_a_limit_takes_every_pod(self) -> None:
        waiting = [Waiting(f"p{i}", i, GPU) for i in range(5)]
        assert bind_in_order(waiting, {"nvidia.com/gpu": 8}, gpus=None) == [
            "p0",
            "p1",
            "p2",
            "p3",
            "p4",
        ]

    def test_the_oldest_first_up_to_the_gpus_left(self) -> None:
        waiting = [Waiting("young", 3.0, GPU), Waiting("old", 1.0, GPU), Waiting("mid", 2.0, GPU)]
        # 2 GPUs, 1 held: room for one, and the oldest gets it.
        assert bind_in_order(waiting, {"nvidia.com/gpu": 1}, gpus=2) == ["old"]

    def test_none_while_every_gpu_is_held(self) -> None:
        assert bind_in_order([Waiting("p", 0.0, GPU)], {"nvidia.com/gpu": 2}, gpus=2) == []

    def test_a_pod_too_big_keeps_no_smaller_one_behind_it_waiting(self) -> None:
        waiting = [Waiting("two", 1.0, GpuRequest("nvidia.com/gpu", 2)), Waiting("one", 2.0, GPU)]
        assert bind_in_order(waiting, {"nvidia.com/gpu": 1}, gpus=2) == ["one"]

    def test_a_pod_without_a_gpu_always_fits(self) -> None:
        assert bind_in_order([Waiting("cpu", 0.0, None)], {"nvidia.com/gpu": 2}, gpus=0) == ["cpu"]

    def test_each_resource_counts_on_its_own(self) -> None:
        holding = held([GPU, GPU, GpuRequest("amd.com/gpu", 1), None])
        assert holding == {"nvidia.com/gpu": 2, "amd.com/gpu": 1}
        assert not fits(GPU, holding, gpus=2)
        assert fits(GpuRequest("amd.com/gpu", 1), holding, gpus=2)


class TestWhatTheSchedulerSays:
    def test_in_the_schedulers_words(self) -> None:
        assert insufficient(GPU) == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."

    def test_a_waiting_pod_is_pending_and_unschedulable_for_want_of_room(self) -> None:
        status = unscheduled_status(unschedulable_condition(GPU, since=SINCE))
        assert status == {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                    "lastTransitionTime": SINCE,
                }
            ],
        }
        # What the operator reads as a pod lacking room (rollout.rolls_in_place, pod_trouble).
        assert NO_ROOM in status["conditions"][0]["message"]
        assert pod_trouble({"status": status}) == ("Unschedulable", insufficient(GPU))

    def test_a_pod_just_made_has_no_word_from_the_scheduler_yet(self) -> None:
        assert unscheduled_status(None) == {"phase": "Pending", "conditions": []}

    def test_a_bound_pod_is_scheduled(self) -> None:
        assert scheduled_condition(since=SINCE) == {
            "type": "PodScheduled",
            "status": "True",
            "lastTransitionTime": SINCE,
        }
