"""The tolerations of a lost node: how long a runtime pod stays bound to a node that stopped
answering before Kubernetes evicts it — and its ReplicaSet replaces it.

The node controller taints a node that stopped answering (`unreachable`) or reports itself not
ready (`not-ready`) with NoExecute, about 40 s after its last heartbeat. A pod that does not
tolerate the taint is evicted at once; one that tolerates it for N seconds, N seconds later; one
whose spec names no toleration for it gets 300 s from Kubernetes itself (the
DefaultTolerationSeconds admission plugin). Until then the pod serves nothing and is not
replaced. The Deployment renders a shorter toleration (`with_node_loss`); the autopilot reads the
one in force (`eviction_s`) to know when Kubernetes will replace a lost replica on its own.

Pure: lists of tolerations in and out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
"""The NoExecute taints the node controller puts on a node that stopped answering (unreachable)
or reports itself not ready; a pod that does not tolerate them is evicted."""
DEFAULT_EVICTION_S = 300.0
"""The tolerationSeconds Kubernetes gives a pod that names none for those taints (the
DefaultTolerationSeconds admission plugin)."""


def with_node_loss(tolerations: list[dict[str, Any]], seconds: int) -> list[dict[str, Any]]:
    """`tolerations`, and for each taint of a lost node that none of them tolerates already, a
    toleration of `seconds`."""
    own = [
        {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for taint in NODE_LOSS_TAINTS
        if not any(tolerates(t, taint) for t in tolerations)
    ]
    return tolerations + own


def eviction_s(tolerations: Sequence[Mapping[str, Any]] | None) -> float:
    """How long after its node is lost a pod with these tolerations is evicted — and its
    ReplicaSet replaces it: the later of the two taints' (a node that died is unreachable, one
    whose kubelet is unwell not-ready); `DEFAULT_EVICTION_S` for a taint it names no toleration
    for, and never (infinity) for one it tolerates without a time."""
    latest = 0.0
    for taint in NODE_LOSS_TAINTS:
        seconds = DEFAULT_EVICTION_S
        for toleration in tolerations or ():
            if not tolerates(toleration, taint):
                continue
            value = toleration.get("tolerationSeconds")
            seconds = math.inf if value is None else max(0.0, float(value))
            break
        latest = max(latest, seconds)
    return latest


def tolerates(toleration: Mapping[str, Any], taint: str) -> bool:
    """Whether `toleration` matches the NoExecute `taint` (keys compare; no key with Exists
    tolerates every taint; no effect, every effect)."""
    if toleration.get("effect") not in (None, "", "NoExecute"):
        return False
    key = toleration.get("key")
    if not key:
        return toleration.get("operator") == "Exists"
    return bool(key == taint)
