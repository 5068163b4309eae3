"""Whether the way in works, as the Gateway says: the `Exposed` condition from the routes' own
status, and each route's word for `status.exposure.routes`.

Applying an HTTPRoute proves nothing: the Gateway may refuse it (a listener that does not admit
routes from this namespace, no listener for its hostnames, a backend it cannot resolve), and the
model is then unreachable from outside while the API server shows the route. Gateway API v1
routes say it in `status.parents[]`, one entry per parent and controller: a `parentRef`, the
`controllerName` and the conditions `Accepted` and `ResolvedRefs`. Only the entry for the parent
this InferenceService names counts (a route may be shared with another Gateway's controller), and
only conditions of the route's current generation (an older one speaks of the spec before the
last change).

An Ingress has no acceptance status: applied is all that can be said, with the load balancer's
address once the controller has written one.

Pure: the routes are arguments (the reconciler hands the watch-fed cache's copies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.exposure import exposure_status
from batchpilot.operator.exposure_spec import GatewayExposure

Obj = dict[str, Any]
Status = Literal["True", "False", "Unknown"]
GATEWAY_GROUP = "gateway.networking.k8s.io"
ACCEPTED = "Accepted"
RESOLVED_REFS = "ResolvedRefs"
PENDING = "Pending"
"""The condition's reason while the Gateway has not said yet (also the Gateway API's own reason
for an `Accepted` condition that is Unknown)."""
APPLIED = "Applied"


@dataclass(frozen=True, slots=True)
class RouteWord:
    """What the Gateway said of one route, for the parent this InferenceService names."""

    kind: str
    name: str
    state: Literal["accepted", "refused", "pending"]
    condition: str = ""
    """The condition that refused it: `Accepted`, or `ResolvedRefs` (accepted, but a backend
    is unusable)."""
    reason: str = ""
    message: str = ""

    def summary(self) -> str:
        """One line of `status.exposure.routes` (`kubectl describe`)."""
        where = f"{self.kind} {self.name}"
        if self.state == "accepted":
            return f"{where}: accepted"
        if self.state == "pending":
            return f"{where}: pending{f' ({self.message})' if self.message else ''}"
        if self.condition == RESOLVED_REFS:
            return f"{where}: accepted, backends unusable ({self.reason})"
        return f"{where}: refused ({self.reason})"


@dataclass(frozen=True, slots=True)
class Exposure:
    """The `Exposed` condition, and the routes as `status.exposure.routes` shows them."""

    status: Status
    reason: str
    message: str
    routes: list[str] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return self.status == "False"


def gateway_name(owner: Owner, gateway: GatewayExposure) -> str:
    return f"{gateway.namespace or owner.namespace}/{gateway.name}"


def _is_our_parent(ref: Mapping[str, Any], owner: Owner, gateway: GatewayExposure) -> bool:
    """Whether a status entry's `parentRef` is the one the routes were given (the API's
    defaults filled in: the Gateway API's group, kind Gateway, the route's namespace)."""
    return (
        ref.get("group", GATEWAY_GROUP) == GATEWAY_GROUP
        and ref.get("kind", "Gateway") == "Gateway"
        and ref.get("name") == gateway.name
        and (ref.get("namespace") or owner.namespace) == (gateway.namespace or owner.namespace)
        and ref.get("sectionName") == gateway.section_name
        and ref.get("port") is None
    )


def _current(condition: Mapping[str, Any], generation: Any) -> bool:
    """Whether a condition speaks of the route's current spec (where both say a generation)."""
    observed = condition.get("observedGeneration")
    if not isinstance(observed, int) or not isinstance(generation, int):
        return True
    return observed >= generation


def route_word(kind: str, route: Obj | None, owner: Owner, gateway: GatewayExposure) -> RouteWord:
    """What the Gateway said of `route` (None: not there yet)."""
    name = owner.name if route is None else str(route["metadata"]["name"])
    if route is None:
        return RouteWord(kind, name, "pending", message="not created yet")
    generation = route.get("metadata", {}).get("generation")
    entries = [
        entry
        for entry in (route.get("status") or {}).get("parents") or []
        if isinstance(entry, Mapping)
        and _is_our_parent(entry.get("parentRef") or {}, owner, gateway)
    ]
    if not entries:
        return RouteWord(kind, name, "pending")
    stale = False
    said: dict[str, Mapping[str, Any]] = {}
    for entry in entries:  # one per controller; any controller's refusal counts
        for condition in entry.get("conditions") or []:
            if not isinstance(condition, Mapping):
                continue
            if not _current(condition, generation):
                stale = True
                continue
            type_ = condition.get("type")
            if type_ in (ACCEPTED, RESOLVED_REFS) and (
                type_ not in said or condition.get("status") == "False"
            ):
                said[type_] = condition
    for type_ in (ACCEPTED, RESOLVED_REFS):
        condition = said.get(type_)
        if (
            condition is not None
            and condition.get("status") == "False"
            and condition.get("reason") != PENDING
        ):
            return RouteWord(
                kind,
                name,
                "refused",
                condition=type_,
                reason=str(condition.get("reason") or type_),
                message=str(condition.get("message") or ""),
            )
    if all((said.get(t) or {}).get("status") == "True" for t in (ACCEPTED, RESOLVED_REFS)):
        return RouteWord(kind, name, "accepted")
    return RouteWord(kind, name, "pending", message="a change not seen yet" if stale else "")


def _refusal(word: RouteWord, gateway: str) -> str:
    what = (
        "accepted it but cannot use its backends"
        if word.condition == RESOLVED_REFS
        else "did not accept it"
    )
    return f"{word.kind} {word.name}: the Gateway {gateway} {what}: {word.reason}" + (
        f": {word.message}" if word.message else ""
    )


def gateway_exposure(owner: Owner, routes: Mapping[str, Obj | None]) -> Exposure | None:
    """`Exposed` for a Gateway exposure, from its routes by kind (HTTPRoute, and GRPCRoute when
    asked for): True only when the Gateway accepted every one and resolved its backends, False
    with the Gateway's reason when it refused one, Unknown while it has not said. None: not
    exposed through a Gateway."""
    exposure = owner.spec.exposure
    gateway = exposure.gateway if exposure is not None else None
    if gateway is None:
        return None
    kinds = ["HTTPRoute"] + (["GRPCRoute"] if gateway.grpc else [])
    words = [route_word(kind, routes.get(kind), owner, gateway) for kind in kinds]
    where = gateway_name(owner, gateway)
    summaries = [word.summary() for word in words]
    refused = [word for word in words if word.state == "refused"]
    if refused:
        return Exposure(
            "False",
            refused[0].reason,
            "; ".join(_refusal(word, where) for word in refused),
            summaries,
        )
    waiting = [f"{word.kind} {word.name}" for word in words if word.state == "pending"]
    if waiting:
        return Exposure(
            "Unknown",
            PENDING,
            f"applied; waiting for the Gateway {where} to accept the routes ({', '.join(waiting)})",
            summaries,
        )
    text = (exposure_status(owner) or {}).get("text", "")
    return Exposure("True", ACCEPTED, f"{text}: accepted by the Gateway {where}", summaries)


def ingress_exposure(owner: Owner, ingress: Obj | None) -> Exposure | None:
    """`Exposed` for an Ingress: True once applied (an Ingress has no acceptance status), with
    the load balancer's address when its controller has written one. None: no Ingress asked."""
    exposure = owner.spec.exposure
    if exposure is None or exposure.ingress is None:
        return None
    text = (exposure_status(owner) or {}).get("text", "")
    balancers = (((ingress or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress")
    addresses = [
        str(entry.get("ip") or entry.get("hostname"))
        for entry in balancers or []
        if isinstance(entry, Mapping) and (entry.get("ip") or entry.get("hostname"))
    ]
    said = f"applied, address {', '.join(addresses)}" if addresses else "applied"
    return Exposure("True", APPLIED, f"{text}: {said}", [f"Ingress {owner.name}: {said}"])


def exposure_now(owner: Owner, children: Mapping[str, Obj | None]) -> Exposure | None:
    """`Exposed` from the exposure's children by kind, as they are after this pass's writes.
    None without spec.exposure."""
    return gateway_exposure(owner, children) or ingress_exposure(owner, children.get("Ingress"))
