"""The sandbox's node and its GPUs: which pods the scheduler binds, and what it says of the rest.

The sandbox has one node and, by default, no scheduler: every pod it is asked for starts. That
hides what a full cluster does to a GPU service: a pod that asks for a GPU when every GPU of the
node is taken is not started. It exists, Pending, and the scheduler says why in its PodScheduled
condition (False, reason Unschedulable, "0/1 nodes are available: 1 Insufficient
nvidia.com/gpu."); it is bound as soon as a pod holding a GPU is deleted, the oldest waiting pod
first. A rollout with a surge stalls on exactly that (a new pod first, for which there is no
GPU), which is what the operator's rollout in place is for (`rollout.rolls_in_place`).

`sandbox up --node-gpus N` gives the node N GPUs. A GPU here is any extended resource the pod's
first container asks for (a name with a vendor's domain: `nvidia.com/gpu`, `amd.com/gpu`, a MIG
profile — whatever the operator's `gpu_resource` renders), the node having N of each. Pods that
ask for none always fit. Pure: the pod runner (podrunner.py) keeps the pods and applies this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NODE_NAME = "sandbox"
"""The one node every pod is bound to (`spec.nodeName`)."""
UNSCHEDULABLE = "Unschedulable"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a pod asks of the node's GPUs: `count` of the extended resource `resource`."""

    resource: str
    count: int


def _extended(resource: str) -> bool:
    """Whether a resource name is an extended resource (a device plugin's, like a GPU): it has a
    domain, and not Kubernetes' own (`kubernetes.io/…`, `hugepages-…`, cpu, memory have none)."""
    domain, slash, _ = resource.partition("/")
    return bool(slash) and not domain.endswith("kubernetes.io")


def gpu_request(container: Mapping[str, Any]) -> GpuRequest | None:
    """The GPUs `container` asks for: the first extended resource in its limits (or requests:
    for an extended resource either implies the other), None when it asks for none. Extended
    resources are whole numbers; anything else is taken as none, as it could not be scheduled
    anywhere."""
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        for resource, quantity in (resources.get(key) or {}).items():
            if not _extended(str(resource)):
                continue
            try:
                count = int(str(quantity))
            except ValueError:
                continue
            if count > 0:
                return GpuRequest(str(resource), count)
    return None


def held(requests: Sequence[GpuRequest | None]) -> dict[str, int]:
    """The GPUs the bound pods hold, by resource."""
    total: dict[str, int] = {}
    for request in requests:
        if request is not None:
            total[request.resource] = total.get(request.resource, 0) + request.count
    return total


def fits(request: GpuRequest | None, holding: Mapping[str, int], *, gpus: int | None) -> bool:
    """Whether a pod asking for `request` fits on the node beside pods holding `holding`:
    always without a request or with `gpus` None (a node without a limit)."""
    if request is None or gpus is None:
        return True
    return holding.get(request.resource, 0) + request.count <= gpus


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pod not yet bound to the node."""

    name: str
    created_at: float
    request: GpuRequest | None


def bind_in_order(
    waiting: Sequence[Waiting], holding: Mapping[str, int], *, gpus: int | None
) -> list[str]:
    """The waiting pods the node takes now, oldest first: each that fits beside what the bound
    pods hold and those taken before it. A pod that does not fit keeps no one behind it from a
    place that fits (the scheduler places each pod on its own)."""
    now_held = dict(holding)
    taken: list[str] = []
    for pod in sorted(waiting, key=lambda w: (w.created_at, w.name)):
        if fits(pod.request, now_held, gpus=gpus):
            taken.append(pod.name)
            if pod.request is not None:
                resource = pod.request.resource
                now_held[resource] = now_held.get(resource, 0) + pod.request.count
    return taken


def insufficient(request: GpuRequest) -> str:
    """The scheduler's message for a pod that no node has room for, as it words it on one node."""
    return f"0/1 nodes are available: 1 Insufficient {request.resource}."


def scheduled_condition(*, since: str) -> dict[str, Any]:
    """The PodScheduled condition of a pod bound to the node at `since` (RFC 3339)."""
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": since}


def unschedulable_condition(request: GpuRequest, *, since: str) -> dict[str, Any]:
    """The PodScheduled condition of a pod the node has had no room for since `since`."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": UNSCHEDULABLE,
        "message": insufficient(request),
        "lastTransitionTime": since,
    }


def unscheduled_status(condition: Mapping[str, Any] | None) -> dict[str, Any]:
    """A Pod's status before it has a node: Pending, no containers, no IPs; with the
    scheduler's PodScheduled condition once it has tried (`condition`)."""
    return {"phase": "Pending", "conditions": [] if condition is None else [dict(condition)]}
