"""The PodDisruptionBudget: voluntary evictions take one replica at a time.

Only with more than one replica: a budget over a single pod would block every node drain.
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
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": owner.selector}},
    }
