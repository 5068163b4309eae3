"""A lost node's timeline as the sandbox plays it: the option's syntax, the toleration a pod's
spec gives the unreachable taint, and the pod status the node controller leaves behind."""

from __future__ import annotations

import math
from typing import Any

import pytest

from batchpilot.sandbox.nodes import (
    NodeLoss,
    Unreachable,
    marked_not_ready,
    parse_node_loss,
    unreachable_toleration_s,
)
from batchpilot.sandbox.pods import pod_status


class TestTheOption:
    def test_at_and_count(self) -> None:
        assert parse_node_loss("30:2", notice_s=5, eviction_s=100) == NodeLoss(30, 2, 5, 100)

    def test_one_pod_and_kubernetes_timings_by_default(self) -> None:
        assert parse_node_loss("12.5") == NodeLoss(12.5, 1, 40.0, 300.0)

    @pytest.mark.parametrize("text", ["", "soon", "10:0", "10:x", "-1", "10:1:2"])
    def test_nonsense_is_refused(self, text: str) -> None:
        with pytest.raises(ValueError, match="AT_S"):
            parse_node_loss(text)


class TestTheTolerationOfAnUnreachableNode:
    @pytest.mark.parametrize(
        ("tolerations", "expected"),
        [
            (None, None),
            ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], None),
            (
                [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                  "effect": "NoExecute", "tolerationSeconds": 30}],
                30.0,
            ),
            ([{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}], math.inf),
            ([{"operator": "Exists"}], math.inf),  # tolerates every taint, for ever
            (
                [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                  "effect": "NoExecute", "tolerationSeconds": 30}],
                None,
            ),
        ],
        ids=["none", "another-taint", "seconds", "for-ever", "everything", "not-ready-only"],
    )  # fmt: skip
    def test_from_the_pod_spec(self, tolerations: Any, expected: float | None) -> None:
        spec = {} if tolerations is None else {"tolerations": tolerations}
        assert unreachable_toleration_s(spec) == expected

    def test_eviction_counts_from_the_notice(self) -> None:
        assert Unreachable.starting(100.0, notice_s=40, eviction_s=300) == Unreachable(
            100.0, 140.0, 440.0
        )


def test_the_node_controller_turns_ready_false_and_leaves_the_kubelets_last_word() -> None:
    last = pod_status("Running", ready=True, started=True, restarts=2)
    marked = marked_not_ready(last)
    conditions = {c["type"]: c for c in marked["conditions"]}
    assert conditions["Ready"] == {
        "type": "Ready",
        "status": "False",
        "reason": "NodeNotReady",
        "message": "Node is not ready",
    }
    assert conditions["ContainersReady"]["status"] == "True"  # no kubelet to say otherwise
    assert marked["containerStatuses"] == last["containerStatuses"]
    assert marked["phase"] == "Running"
    assert {c["type"]: c["status"] for c in last["conditions"]}["Ready"] == "True"  # a copy
