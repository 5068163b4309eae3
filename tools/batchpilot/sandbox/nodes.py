"""A node that dies, as Kubernetes lets it play out: what `sandbox up --lose-node` asks of the
pod runner.

When a node stops answering (its kernel hangs, its network or power goes), its pods do not
exit: their processes keep the connections they hold and answer nothing, and nothing in the
cluster knows yet. The node controller notices only once the node has missed its heartbeats for
the node-monitor grace period (40 s by default): it marks the node NotReady and each of its
pods' Ready condition False, so they leave the Service's endpoints and the Deployment's
readyReplicas. It deletes nothing: the ReplicaSet still counts the pods and does not replace
them, and no kubelet is there to restart them. The node is tainted `unreachable` (NoExecute)
at the same time, and each pod is evicted (deleted) once the taint outlasts its toleration: the
`tolerationSeconds` its spec gives that taint, else 300 s (what the DefaultTolerationSeconds
admission plugin gives a pod that names none; the API server's
--default-unreachable-toleration-seconds). Then the ReplicaSet creates replacements, which start
from cold. So by default a lost replica serves nothing for about six minutes before its
replacement is even asked for, unless something else stands in for it.

The sandbox has one node; losing one means that some pods of a service (the oldest ready ones)
are on a node that goes dark: their processes are frozen (SIGSTOP; a hosted pod is cut off by
the pod host), so requests already sent hang and new ones hang until the client gives up.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NODE_MONITOR_GRACE_S = 40.0
"""kube-controller-manager's --node-monitor-grace-period: from the node's silence to NotReady."""
UNREACHABLE_TOLERATION_S = 300.0
"""The `node.kubernetes.io/unreachable:NoExecute` toleration every pod gets by default: from
NotReady to eviction."""
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_REASON = "NodeNotReady"
NOT_READY_MESSAGE = "Node is not ready"


@dataclass(frozen=True, slots=True)
class NodeLoss:
    """A node lost `at_s` seconds into the load, with `count` ready pods of the service on it."""

    at_s: float
    count: int = 1
    notice_s: float = NODE_MONITOR_GRACE_S
    """From the node's silence to its pods' Ready condition False."""
    eviction_s: float = UNREACHABLE_TOLERATION_S
    """From NotReady to the deletion, and replacement, of a pod whose spec names no toleration
    of the unreachable taint (one that does is evicted after its own)."""

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.count < 1 or self.notice_s < 0 or self.eviction_s < 0:
            raise ValueError(f"a node loss needs times >= 0 and a count >= 1: {self}")


def parse_node_loss(
    text: str,
    *,
    notice_s: float = NODE_MONITOR_GRACE_S,
    eviction_s: float = UNREACHABLE_TOLERATION_S,
) -> NodeLoss:
    """`AT_S[:COUNT]`, e.g. `30` or `30:2`; raises ValueError."""
    at, _, count = text.partition(":")
    try:
        return NodeLoss(
            float(at), int(count) if count else 1, notice_s=notice_s, eviction_s=eviction_s
        )
    except ValueError:
        raise ValueError(f"expected AT_S[:COUNT] (e.g. 30 or 30:2), not {text!r}") from None


def unreachable_toleration_s(pod_spec: Mapping[str, Any]) -> float | None:
    """How long a pod with this spec stays bound to an unreachable node once it is tainted:
    the `tolerationSeconds` of its toleration of the NoExecute `unreachable` taint (infinity for
    one without a time), None when it has none (the default applies)."""
    for toleration in pod_spec.get("tolerations") or ():
        if toleration.get("effect") not in (None, "", "NoExecute"):
            continue
        key = toleration.get("key")
        if key == UNREACHABLE_TAINT or (not key and toleration.get("operator") == "Exists"):
            seconds = toleration.get("tolerationSeconds")
            return math.inf if seconds is None else max(0.0, float(seconds))
    return None


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A pod on a node that is gone (monotonic times)."""

    since: float
    not_ready_at: float
    evict_at: float

    @classmethod
    def starting(cls, now: float, *, notice_s: float, eviction_s: float) -> Unreachable:
        return cls(now, now + notice_s, now + notice_s + eviction_s)


def marked_not_ready(status: dict[str, Any]) -> dict[str, Any]:
    """A pod's status once the node controller has marked its node NotReady: what its kubelet
    last reported (no kubelet reports any more), with the Ready condition False."""
    marked = copy.deepcopy(status)
    conditions = [c for c in marked.get("conditions", []) if c.get("type") != "Ready"]
    conditions.append(
        {
            "type": "Ready",
            "status": "False",
            "reason": NOT_READY_REASON,
            "message": NOT_READY_MESSAGE,
        }
    )
    marked["conditions"] = conditions
    return marked
