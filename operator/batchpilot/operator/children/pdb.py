"""The PodDisruptionBudget: voluntary evictions take one replica at a time.

Only with more than one replica: a budget over a single pod would block every node drain. And
a replica that is not ready (crash-looping on a broken GPU, stuck loading its model) may always
be evicted (`unhealthyPodEvictionPolicy: AlwaysAllow`): by default a budget counts it as the one
unavailable replica it allows, and then refuses to evict it too — a node drain (a cluster
upgrade) would wait on it for ever, while evicting it costs no serving capacity.
"""

from __future__ import annotations

from typing import Any

from batchpilot.operator.children.common import Owner


def build_pdb(owner: Owner, *, replicas: int) -> dict[str, Any] | None:
    """The budget, or None when there should be none."""
    if replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.metadata(owner.name),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": owner.selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
