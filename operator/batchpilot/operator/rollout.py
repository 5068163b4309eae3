"""Why an InferenceService's replicas are not ready, in one line for `kubectl describe`.

"Waiting for a replica to become ready" is all a Deployment says on its own while its pods
cannot be created (a ResourceQuota on GPUs, a PriorityClass or ServiceAccount that does not
exist), cannot be scheduled (no node with a free GPU), cannot pull their image, or crash — the
model fetch or the runtime itself. Kubernetes knows which, in the Deployment's conditions and
the pods' statuses; this module reads them (as the operator's cache keeps them: `cache.slim_pod`)
and names the first that holds, with Kubernetes' own message, so the person who reads the
InferenceService knows what to fix without hunting for the pods. The Ready condition is worded
here too (`ready_condition`), beside the reading of it back (`trouble_in`): the autopilot's
ScalingLimited says from it when replicas it asked for cannot come up. So is how a rollout
replaces pods where no GPU is free for a surge (`rolls_in_place`), and how many rollouts may do
so at once, fleet-wide (`in_place_turn`). Pure: dicts in, words out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

STUCK_WAITING = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)
"""A container's waiting reasons that do not go away by waiting (ContainerCreating does)."""

CREATE_FAILED = ("FailedCreate", "FailedDelete")
"""The reasons of a Deployment's ReplicaFailure condition (its ReplicaSet controller's); any other
is named ReplicaFailure, so that a Trouble's reason is always one of TROUBLE_REASONS."""

TROUBLE_REASONS = (
    *CREATE_FAILED,
    "ReplicaFailure",
    "Unschedulable",
    *STUCK_WAITING,
    "ProgressDeadlineExceeded",
)
"""Every reason a Trouble can have: how a Ready condition that is False says replicas cannot come
up, as opposed to coming up (Progressing) or a spec the operator refused."""

AVAILABLE = "Available"
PROGRESSING = "Progressing"

MESSAGE_MAX = 400
"""Kubernetes' messages can be long (a scheduler's per-node account): one condition line."""


@dataclass(frozen=True, slots=True)
class Trouble:
    reason: str
    """CamelCase, for the Ready condition: Kubernetes' own (FailedCreate, Unschedulable,
    CrashLoopBackOff, ImagePullBackOff, …, ProgressDeadlineExceeded)."""
    message: str


def short(text: str) -> str:
    """`text` on one line, cut to MESSAGE_MAX."""
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 1] + "…"


def _last_line(text: str) -> str:
    """A log tail's last line with something on it: where a process says why it stopped."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == type_:
            return dict(condition)
    return None


def _stuck_container(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the pod's first container stuck waiting, init containers first
    (the model fetch runs before the runtime)."""
    status = pod.get("status", {})
    for key, kind in (("initContainerStatuses", "init container"), ("containerStatuses", "")):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in STUCK_WAITING:
                continue
            name = f"{kind} {container.get('name')}".strip()
            detail = waiting.get("message") or ""
            last = (container.get("lastState") or {}).get("terminated") or {}
            if reason == "CrashLoopBackOff" and "exitCode" in last:
                # What it said as it died (its log's tail: FallbackToLogsOnError), not the back-off.
                exited = f"exit code {last['exitCode']}"
                said = _last_line(last.get("message") or "") or last.get("reason")
                detail = f"{exited}: {said}" if said else exited
            return reason, f"{name}: {detail}" if detail else name
    return None


def pod_trouble(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the pod is stuck — a container waiting on what does not pass by
    waiting, or not schedulable — else None (starting, running, or on its way out)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    found = _stuck_container(pod)
    if found is not None:
        return found
    scheduled = _condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return "Unschedulable", scheduled.get("message") or scheduled.get("reason") or ""
    return None


def _pods_saying(pods: Sequence[dict[str, Any]], total: int) -> Trouble | None:
    troubles = [found for pod in pods if (found := pod_trouble(pod)) is not None]
    # A stuck container first: the pod got a node and still does not serve.
    stuck = [t for t in troubles if t[0] != "Unschedulable"]
    if stuck:
        reason, message = stuck[0]
        return Trouble(reason, short(f"{len(stuck)} of {total} pods {reason}: {message}"))
    if troubles:
        since = _unschedulable_since(pods)
        when = f" since {since}" if since else ""
        return Trouble(
            "Unschedulable",
            short(f"{len(troubles)} of {total} pods cannot be scheduled{when}: {troubles[0][1]}"),
        )
    return None


def _unschedulable_since(pods: Sequence[dict[str, Any]]) -> str | None:
    """When the pod unschedulable longest became so (its PodScheduled condition's
    lastTransitionTime, as Kubernetes writes it): how long a full cluster has kept replicas
    away, in words that stay the same pass after pass (no status write for a clock's tick)."""
    times = []
    for pod in pods:
        scheduled = _condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False":
            at = scheduled.get("lastTransitionTime")
            if isinstance(at, str) and _parse_time(at) is not None:
                times.append(at)
    return min(times) if times else None  # RFC 3339 in UTC ("…Z") sorts as it reads


def why_not_ready(
    deployment: dict[str, Any] | None, pods: Sequence[dict[str, Any]]
) -> Trouble | None:
    """What keeps replicas of `deployment` from becoming ready, if Kubernetes says: pods that
    cannot be created, then pods stuck (a container waiting on something that does not pass,
    or not schedulable), then a rollout past its progress deadline. None while nothing is wrong
    (pods starting, pulling, loading the model)."""
    if deployment is None:
        return None
    failure = _condition(deployment, "ReplicaFailure")
    if failure and failure.get("status") == "True":
        reason = failure.get("reason")
        return Trouble(
            reason if reason in CREATE_FAILED else "ReplicaFailure",
            short(f"pods cannot be created: {failure.get('message') or failure.get('reason')}"),
        )
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    said = _pods_saying(live, len(live))
    if said is not None:
        return said
    progressing = _condition(deployment, "Progressing")
    if (
        progressing
        and progressing.get("status") == "False"
        and progressing.get("reason") == "ProgressDeadlineExceeded"
    ):
        return Trouble(
            "ProgressDeadlineExceeded",
            short(f"the rollout is stuck: {progressing.get('message') or 'no progress'}"),
        )
    return None


def blocked(deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> int:
    """How many of `deployment`'s replicas cannot come up, as Kubernetes says, rather than
    coming up: its pods not ready and stuck (`pod_trouble`: not schedulable, a container
    waiting on what does not pass by waiting), and, while its ReplicaSet cannot create pods (a
    ResourceQuota), the pods it asks for that do not exist. A pod starting, pulling or loading
    its model is not blocked: it is on its way."""
    if deployment is None:
        return 0
    count = 0
    for pod in pods:
        ready = _condition(pod, "Ready")
        if ready is not None and ready.get("status") == "True":
            continue
        if pod_trouble(pod) is not None:
            count += 1
    failure = _condition(deployment, "ReplicaFailure")
    if failure and failure.get("status") == "True":
        asked = int(deployment.get("spec", {}).get("replicas") or 0)
        created = int(deployment.get("status", {}).get("replicas") or 0)
        count += max(0, asked - created)
    return count


def ready_condition(
    *, ready: int, desired: int, trouble: Trouble | None
) -> tuple[Literal["True", "False"], str, str]:
    """(status, reason, message) of the Ready condition for `ready` of `desired` replicas and
    what keeps the others from becoming ready: True (Available) from one ready replica on, with
    the trouble after a "; " while there is one; False with the trouble's reason, or Progressing
    while nothing is wrong. `trouble_in` reads it back."""
    if ready >= 1:
        text = f"{ready} of {desired} replicas ready"
        return "True", AVAILABLE, text if trouble is None else f"{text}; {trouble.message}"
    if trouble is not None:
        return "False", trouble.reason, trouble.message
    return "False", PROGRESSING, "waiting for a replica to become ready"


def trouble_in(condition: Mapping[str, Any] | None) -> str | None:
    """What a Ready condition written from `ready_condition` says keeps replicas from becoming
    ready, or None when it names nothing (all ready, progressing, or not about replicas)."""
    if condition is None:
        return None
    message = str(condition.get("message") or "")
    if condition.get("status") == "True" and condition.get("reason") == AVAILABLE:
        return message.partition("; ")[2] or None
    if condition.get("status") == "False" and condition.get("reason") in TROUBLE_REASONS:
        return message or None
    return None


SURGE = {"maxSurge": 1, "maxUnavailable": 0}
"""How a rollout replaces pods: a new one first, an old one once it is ready, so the service never
serves with fewer replicas. It needs room for one pod more (a GPU free)."""
IN_PLACE = {"maxSurge": 0, "maxUnavailable": 1}
"""How a rollout replaces pods where there is no room for one more: an old one goes first and
frees its GPU for the new one, one fewer serving until that is ready (`rolls_in_place`)."""


def rolling_in_place(deployment: Mapping[str, Any] | None) -> int:
    """Replicas a rollout in place has down at once while it is under way (its maxUnavailable),
    0 where the Deployment rolls with a surge or no rollout is under way: for the autopilot,
    whose count of replicas lost must not take them for a loss."""
    if deployment is None:
        return 0
    strategy = deployment.get("spec", {}).get("strategy", {}).get("rollingUpdate") or {}
    if strategy.get("maxSurge") != 0 or not rollout_under_way(deployment):
        return 0
    down = strategy.get("maxUnavailable", 0)
    return down if isinstance(down, int) else 0


def rollout_under_way(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment is replacing pods of an older template: some remain, as its
    controller last reported (its pods, not terminating, beyond those of the newest template).
    A scale-up whose pods are yet to be created is no rollout, nor is a Deployment whose
    controller has reported nothing yet."""
    status = deployment.get("status", {})
    return (status.get("replicas") or 0) > (status.get("updatedReplicas") or 0)


NO_ROOM = "Insufficient"
"""In the scheduler's message, what says a pod lacks room: "0/3 nodes are available: 3
Insufficient nvidia.com/gpu." — room an old pod of the Deployment would free."""


def rolls_in_place(
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    *,
    now: datetime,
    wait_s: float,
) -> bool:
    """Whether the Deployment's rollout should replace pods in place (`IN_PLACE`: an old one
    goes first) rather than with a surge (a new one first, which needs room for one pod more).

    On a cluster with no GPU free, a rollout's surge pod waits unschedulable for ever: the
    rollout never ends, and the spec's change (a new model, a new image) never serves. So once a
    pod has been unschedulable for want of room (the scheduler says `Insufficient` of a
    resource) for `wait_s` (time for a cluster autoscaler to add a node) while a rollout is under
    way, the rollout goes in place until it is over: one fewer serving at a time, each old pod's
    GPU freed for its replacement. A pod no node would take for another reason (a node selector,
    a taint) would not be helped by it. Never for a single replica (the service
    would stop serving: it waits for room), nor with `wait_s` 0 (the operator's choice to wait)."""
    if deployment is None or wait_s <= 0:
        return False
    if (deployment.get("spec", {}).get("replicas") or 0) < 2:
        return False
    if not rollout_under_way(deployment):
        return False
    if rolling_in_place(deployment):
        return True  # until the rollout is over: with a surge again, the next step would wait
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        scheduled = _condition(pod, "PodScheduled")
        if not scheduled or scheduled.get("status") != "False":
            continue
        if scheduled.get("reason") != "Unschedulable":
            continue
        if NO_ROOM not in (scheduled.get("message") or ""):
            continue  # no node would take it anyway (a selector, a taint): going in place won't
        since = _parse_time(scheduled.get("lastTransitionTime"))
        if since is not None and (now - since).total_seconds() >= wait_s:
            return True
    return False


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


WAITS_ITS_TURN = "this one waits its turn"
"""What the Ready condition says while a rollout that would go in place waits for a turn
(`in_place_turn`), and how its Event is said once: the next pass finds it there."""


@dataclass(frozen=True, slots=True)
class Held:
    """A rollout that would go in place, held with its surge: its old pods serve meanwhile."""

    condition: str
    """For the Ready condition: the same words on every pass while nothing changes."""
    event: str
    """For the Event posted when the wait starts: with the services that hold the turns."""


def in_place_turn(others: Sequence[str] | None, *, wait_s: float, max_services: int) -> Held | None:
    """Whether a rollout that `rolls_in_place` says should go in place, and is not in place yet,
    may go now: None when it may, else why it is held.

    `others`: the other services whose rollouts go in place now ("namespace/name", fleet-wide:
    `rolling_in_place` of their Deployments), None where they are not known. Each has a replica
    down; a change of the operator or of its runtime-wide settings rolls every service at once,
    and on a full cluster every one of them would go in place together: one replica fewer in
    each. So no more than `max_services` go in place at a time (0: no limit); the others wait
    with their surge pods pending, their old pods all serving, until a turn frees. Not known is
    held too: a surge loses nothing by waiting a pass longer."""
    if max_services <= 0:
        return None
    if others is not None and len(others) < max_services:
        return None
    found = f"the rollout's new pod has found no room for {wait_s:g} s"
    limit = f"rolloutInPlaceMaxServices {max_services}"
    if others is None:
        said = f"{found}; the services rolling in place are not known yet ({limit})"
        return Held(f"{said}, {WAITS_ITS_TURN}", f"{said}, {WAITS_ITS_TURN}")
    many = "service is" if len(others) == 1 else "services are"
    said = f"{found}; {len(others)} other {many} rolling in place ({limit})"
    return Held(
        f"{said}, {WAITS_ITS_TURN}",
        short(
            f"{said}: {', '.join(others)}; {WAITS_ITS_TURN}, with a surge: its old pods serve "
            "until one of those rollouts is over"
        ),
    )


def waits_its_turn(ready: Mapping[str, Any] | None) -> bool:
    """Whether a Ready condition says its service's rollout waits for a turn to go in place
    (`in_place_turn`): whom to reconcile when a turn frees."""
    return ready is not None and WAITS_ITS_TURN in str(ready.get("message") or "")


def stuck(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment's rollout is past its progress deadline (its controller's
    `Progressing` False, `ProgressDeadlineExceeded`: the new pods crash, or never become ready)."""
    progressing = _condition(deployment, PROGRESSING)
    return (
        progressing is not None
        and progressing.get("status") == "False"
        and progressing.get("reason") == "ProgressDeadlineExceeded"
    )


def holds_a_turn(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment holds one of the fleet's turns to roll in place
    (`in_place_turn`): it rolls in place, and its rollout is not stuck — one whose new pods crash
    (a model too large for the GPU, a broken image) never ends, and held its turn for good: two of
    them held every other service's rollout with its surge pending."""
    return rolling_in_place(deployment) > 0 and not stuck(deployment)


def frees_a_turn(deployment: Mapping[str, Any], *, deleted: bool = False) -> bool:
    """Whether a Deployment that rolls in place has freed its turn (`in_place_turn`): its
    rollout is over (its next pass turns it back to a surge) or stuck (`holds_a_turn`), or it
    was deleted mid-rollout."""
    strategy = deployment.get("spec", {}).get("strategy", {}).get("rollingUpdate") or {}
    if strategy.get("maxSurge") != 0:
        return False
    return deleted or not rollout_under_way(deployment) or stuck(deployment)
