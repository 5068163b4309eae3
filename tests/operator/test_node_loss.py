"""The tolerations of a lost node: rendered into every runtime pod unless the spec has its own,
and read back as the time Kubernetes replaces a pod whose node died."""

from __future__ import annotations

import math
from typing import Any

import pytest

from batchpilot.operator.children.node_loss import (
    DEFAULT_EVICTION_S,
    NODE_LOSS_TAINTS,
    eviction_s,
    with_node_loss,
)
from batchpilot.operator.settings import OperatorSettings
from tests.operator.test_children import EXAMPLES, owner_of, pod_of, with_spec

UNREACHABLE, NOT_READY = NODE_LOSS_TAINTS
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def toleration(key: str, seconds: int | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"key": key, "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        found["tolerationSeconds"] = seconds
    return found


def pod_tolerations(runtime: dict[str, Any], settings: OperatorSettings) -> list[dict[str, Any]]:
    """The tolerations of the pods of the first example, its runtime changed by `runtime`."""
    owner = owner_of(EXAMPLES[0])
    changed = with_spec(
        owner,
        runtime={
            **owner.spec.runtime.model_dump(by_alias=True, exclude_none=True, mode="json"),
            **runtime,
        },
    )
    tolerations: list[dict[str, Any]] = pod_of(changed, settings)["spec"]["tolerations"]
    return tolerations


class TestRendered:
    def test_every_pod_tolerates_a_lost_node_for_the_setting(self) -> None:
        settings = OperatorSettings(node_loss_toleration_seconds=45)
        for device in ("cpu", "gpu"):
            tolerations = pod_tolerations({"device": device}, settings)
            assert toleration(UNREACHABLE, 45) in tolerations
            assert toleration(NOT_READY, 45) in tolerations
            assert eviction_s(tolerations) == 45
        assert GPU_TAINT in pod_tolerations({"device": "gpu"}, settings)

    def test_the_default_is_30_s(self) -> None:
        assert eviction_s(pod_tolerations({"device": "gpu"}, OperatorSettings())) == 30

    def test_a_spec_that_tolerates_a_taint_itself_keeps_its_own(self) -> None:
        own = [GPU_TAINT, toleration(UNREACHABLE, 600)]
        tolerations = pod_tolerations({"device": "gpu", "tolerations": own}, OperatorSettings())
        assert tolerations == [*own, toleration(NOT_READY, 30)]
        assert eviction_s(tolerations) == 600

    def test_a_spec_that_tolerates_every_taint_gets_nothing_added(self) -> None:
        everything = [{"operator": "Exists"}]
        tolerations = pod_tolerations({"tolerations": everything}, OperatorSettings())
        assert tolerations == everything
        assert eviction_s(tolerations) == math.inf


class TestEviction:
    def test_kubernetes_default_where_the_pod_names_none(self) -> None:
        assert eviction_s(None) == DEFAULT_EVICTION_S
        assert eviction_s([GPU_TAINT]) == DEFAULT_EVICTION_S

    @pytest.mark.parametrize(
        ("tolerations", "seconds"),
        [
            ([toleration(UNREACHABLE, 10), toleration(NOT_READY, 20)], 20),
            ([toleration(UNREACHABLE, 10)], DEFAULT_EVICTION_S),
            ([toleration(UNREACHABLE), toleration(NOT_READY, 5)], math.inf),
            # A NoSchedule toleration of the key does not stop an eviction.
            ([{**toleration(UNREACHABLE, 10), "effect": "NoSchedule"}], DEFAULT_EVICTION_S),
            # No effect named: every effect.
            ([{"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 7}], 300),
        ],
    )
    def test_the_later_of_the_two_taints(
        self, tolerations: list[dict[str, Any]], seconds: float
    ) -> None:
        assert eviction_s(tolerations) == seconds

    def test_with_node_loss_adds_only_what_is_missing(self) -> None:
        assert with_node_loss([], 30) == [toleration(UNREACHABLE, 30), toleration(NOT_READY, 30)]
        mine = [toleration(NOT_READY, 5)]
        assert with_node_loss(mine, 30) == [*mine, toleration(UNREACHABLE, 30)]
