"""The sandbox's ReplicaSet and Deployment controllers, as one decision per pass: which pods to
create and which to delete to bring a Deployment's pods to its replicas and its template.

The operator rolls with a surge of one most of the time, but turns a rollout in place
(`maxSurge: 0, maxUnavailable: 1`) when the surge pod finds no GPU, and a sandbox that ignored
the strategy would never show that. So the pod runner (podrunner.py) follows the Deployment's
`spec.strategy.rollingUpdate` here, as Kubernetes' Deployment controller does:

- at most `replicas + maxSurge` pods in all: new ones are created while that allows;
- at least `replicas - maxUnavailable` ready: old pods are deleted while that allows, not-ready
  ones first (they serve nothing), and never while new pods that are not ready yet would
  make up for them (they may never become ready);
- a pass that creates deletes nothing, as the controller scales up, then syncs again.

Values are integers or percentages of `replicas`, maxSurge rounded up and maxUnavailable down;
when both come to 0, maxUnavailable is 1 (Kubernetes' own fencepost); absent, 25 % each (the
API server's default). `Recreate` is every old pod first, then the new ones. Scaling without a
new template is a ReplicaSet's: pods not yet bound to the node go first, then not-ready ones,
then the youngest. Pure: pods in, names out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PERCENT = "25%"


@dataclass(frozen=True, slots=True)
class PodView:
    """What the controllers look at in a pod."""

    name: str
    ready: bool
    bound: bool = True
    """Bound to the node (scheduled); an unbound pod holds nothing and serves nothing."""
    started_at: float = 0.0
    """When its container started or is to start (later for a younger pod)."""


@dataclass(frozen=True, slots=True)
class RollingLimits:
    max_surge: int
    max_unavailable: int


@dataclass(frozen=True, slots=True)
class Step:
    """What one pass does: `create` pods of the current template, delete `delete` (names)."""

    create: int = 0
    delete: tuple[str, ...] = ()


def _resolve(value: object, replicas: int, *, round_up: bool, what: str) -> int:
    """An IntOrString of the strategy as a pod count for `replicas`."""
    wrong = ValueError(f"{what} must be an integer or a percentage, not {value!r}")
    if isinstance(value, bool):
        raise wrong
    text = str(value).strip()
    percent = text.endswith("%")
    try:
        number = value if isinstance(value, int) else int(text.removesuffix("%"))
    except ValueError:
        raise wrong from None
    if number < 0:
        raise ValueError(f"{what} must not be negative: {value!r}")
    if not percent:
        return number
    scaled = number * replicas / 100
    return math.ceil(scaled) if round_up else math.floor(scaled)


def rolling_limits(deployment: Mapping[str, Any], replicas: int) -> RollingLimits:
    """The Deployment's maxSurge and maxUnavailable as pod counts for `replicas`; ValueError
    for a value Kubernetes would refuse (negative, or neither an integer nor a percentage)."""
    strategy = deployment.get("spec", {}).get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return RollingLimits(max_surge=0, max_unavailable=max(1, replicas))
    rolling = strategy.get("rollingUpdate") or {}
    surge = _resolve(
        rolling.get("maxSurge", DEFAULT_PERCENT), replicas, round_up=True, what="maxSurge"
    )
    unavailable = _resolve(
        rolling.get("maxUnavailable", DEFAULT_PERCENT),
        replicas,
        round_up=False,
        what="maxUnavailable",
    )
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return RollingLimits(max_surge=surge, max_unavailable=unavailable)


def _scale_down_order(pod: PodView) -> tuple[bool, bool, float]:
    """A ReplicaSet's: unbound first, then not ready, then the youngest."""
    return (pod.bound, pod.ready, -pod.started_at)


def _old_pod_order(pod: PodView) -> tuple[bool, bool, float]:
    """Old pods in a rollout: unbound first, then not ready, then the oldest."""
    return (pod.bound, pod.ready, pod.started_at)


def step(
    *,
    replicas: int,
    limits: RollingLimits,
    current: Sequence[PodView],
    old: Sequence[PodView],
) -> Step:
    """One pass of the controllers for a Deployment of `replicas`, with `current` pods of its
    template and `old` pods of earlier ones."""
    if len(current) > replicas:
        # Fewer wanted than the current template has: its extra pods go, and every old one.
        extra = sorted(current, key=_scale_down_order)[: len(current) - replicas]
        return Step(delete=tuple(p.name for p in extra) + tuple(p.name for p in old))
    if not old:
        return Step(create=replicas - len(current))
    total = len(current) + len(old)
    create = min(replicas - len(current), replicas + limits.max_surge - total)
    if create > 0:
        return Step(create=create)
    min_available = replicas - limits.max_unavailable
    current_unavailable = sum(not p.ready for p in current)
    budget = total - min_available - current_unavailable
    if budget <= 0:
        return Step()
    unready = sorted((p for p in old if not p.ready), key=_old_pod_order)[:budget]
    ready = sorted((p for p in old if p.ready), key=_old_pod_order)
    available = sum(p.ready for p in current) + len(ready)
    more = max(0, min(budget - len(unready), available - min_available))
    return Step(delete=tuple(p.name for p in unready + ready[:more]))
