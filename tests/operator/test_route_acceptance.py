"""`Exposed` says what the Gateway said: the routes' `status.parents` read rule by rule — accepted,
refused with each reason the Gateway API defines, pending, stale generations, another parent's
entry, both routes — and the Ingress's applied state with its load balancer's address."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.route_acceptance import exposure_now
from batchpilot.operator.spec import InferenceServiceSpec

NS = "vision"
GATEWAY = {"name": "edge", "namespace": "infra", "sectionName": "https"}
PARENT = {"group": "gateway.networking.k8s.io", "kind": "Gateway", **GATEWAY}
CONTROLLER = "example.net/gateway-controller"


def owner(exposure: dict[str, Any]) -> Owner:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, "exposure": exposure}
    )
    return Owner(name="resnet50", namespace=NS, uid="isvc-uid", spec=spec)


OWNER = owner({"gateway": GATEWAY})


def condition(type_: str, status: str, reason: str, message: str = "", **more: Any) -> Any:
    return {"type": type_, "status": status, "reason": reason, "message": message, **more}


ACCEPTED = condition("Accepted", "True", "Accepted")
RESOLVED = condition("ResolvedRefs", "True", "ResolvedRefs")


def route(
    kind: str, *entries: dict[str, Any], generation: int = 1, name: str = "resnet50"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "generation": generation},
        "spec": {"parentRefs": [PARENT]},
    }
    if entries:
        body["status"] = {"parents": list(entries)}
    return body


def said(*conditions: dict[str, Any], parent: dict[str, Any] | None = None) -> dict[str, Any]:
    """One `status.parents` entry, as a Gateway controller writes it."""
    return {
        "parentRef": PARENT if parent is None else parent,
        "controllerName": CONTROLLER,
        "conditions": list(conditions),
    }


def both(http: dict[str, Any], grpc: dict[str, Any]) -> dict[str, Any]:
    return {"HTTPRoute": route("HTTPRoute", http), "GRPCRoute": route("GRPCRoute", grpc)}


class TestAccepted:
    def test_every_route_accepted_with_its_backends_resolved(self) -> None:
        exposed = exposure_now(OWNER, both(said(ACCEPTED, RESOLVED), said(ACCEPTED, RESOLVED)))
        assert exposed is not None
        assert (exposed.status, exposed.reason) == ("True", "Accepted")
        assert exposed.message == (
            "every host via gateway infra/edge listener https: resnet50: accepted by the Gateway "
            "infra/edge"
        )
        assert exposed.routes == ["HTTPRoute resnet50: accepted", "GRPCRoute resnet50: accepted"]

    def test_the_api_defaults_in_the_parent_ref_are_the_same_parent(self) -> None:
        # The Gateway in the route's own namespace, written without group, kind or namespace.
        here = owner({"gateway": {"name": "edge", "grpc": False}})
        short = {"name": "edge"}
        exposed = exposure_now(
            here, {"HTTPRoute": route("HTTPRoute", said(ACCEPTED, RESOLVED, parent=short))}
        )
        assert exposed is not None
        assert exposed.status == "True"

    def test_accepted_without_resolved_refs_is_not_yet_accepted(self) -> None:
        exposed = exposure_now(OWNER, both(said(ACCEPTED), said(ACCEPTED, RESOLVED)))
        assert exposed is not None
        assert (exposed.status, exposed.reason) == ("Unknown", "Pending")


class TestRefused:
    @pytest.mark.parametrize(
        "reason",
        [
            "NotAllowedByListeners",
            "NoMatchingListenerHostname",
            "NoMatchingParent",
            "UnsupportedValue",
        ],
    )
    def test_not_accepted_with_the_gateways_reason_and_message(self, reason: str) -> None:
        refusal = condition("Accepted", "False", reason, "listener https admits namespace infra")
        exposed = exposure_now(OWNER, both(said(refusal, RESOLVED), said(ACCEPTED, RESOLVED)))
        assert exposed is not None
        assert (exposed.status, exposed.reason) == ("False", reason)
        assert exposed.refused
        assert exposed.message == (
            f"HTTPRoute resnet50: the Gateway infra/edge did not accept it: {reason}: "
            "listener https admits namespace infra"
        )
        assert exposed.routes == [
            f"HTTPRoute resnet50: refused ({reason})",
            "GRPCRoute resnet50: accepted",
        ]

    @pytest.mark.parametrize("reason", ["BackendNotFound", "RefNotPermitted", "InvalidKind"])
    def test_accepted_with_backends_it_cannot_use(self, reason: str) -> None:
        unresolved = condition("ResolvedRefs", "False", reason, "service resnet50 not found")
        exposed = exposure_now(OWNER, both(said(ACCEPTED, RESOLVED), said(ACCEPTED, unresolved)))
        assert exposed is not None
        assert (exposed.status, exposed.reason) == ("False", reason)
        assert exposed.message == (
            "GRPCRoute resnet50: the Gateway infra/edge accepted it but cannot use its backends: "
            f"{reason}: service resnet50 not found"
        )
        assert exposed.routes[1] == f"GRPCRoute resnet50: accepted, backends unusable ({reason})"

    def test_both_refused_are_both_named_and_the_first_reason_is_the_conditions(self) -> None:
        exposed = exposure_now(
            OWNER,
            both(
                said(condition("Accepted", "False", "NoMatchingListenerHostname"), RESOLVED),
                said(condition("Accepted", "False", "NotAllowedByListeners"), RESOLVED),
            ),
        )
        assert exposed is not None
        assert exposed.reason == "NoMatchingListenerHostname"
        assert exposed.message == (
            "HTTPRoute resnet50: the Gateway infra/edge did not accept it: "
            "NoMatchingListenerHostname; GRPCRoute resnet50: the Gateway infra/edge did not "
            "accept it: NotAllowedByListeners"
        )

    def test_a_refusal_outweighs_a_route_still_pending(self) -> None:
        refusal = condition("Accepted", "False", "NotAllowedByListeners")
        exposed = exposure_now(
            OWNER, {"HTTPRoute": route("HTTPRoute"), "GRPCRoute": route("GRPCRoute", said(refusal))}
        )
        assert exposed is not None
        assert exposed.status == "False"
        assert exposed.routes == [
            "HTTPRoute resnet50: pending",
            "GRPCRoute resnet50: refused (NotAllowedByListeners)",
        ]


class TestPending:
    WAITING = (
        "applied; waiting for the Gateway infra/edge to accept the routes "
        "(HTTPRoute resnet50, GRPCRoute resnet50)"
    )

    def test_no_status_yet(self) -> None:
        exposed = exposure_now(
            OWNER, {"HTTPRoute": route("HTTPRoute"), "GRPCRoute": route("GRPCRoute")}
        )
        assert exposed is not None
        assert (exposed.status, exposed.reason, exposed.message) == (
            "Unknown",
            "Pending",
            self.WAITING,
        )
        assert exposed.routes == ["HTTPRoute resnet50: pending", "GRPCRoute resnet50: pending"]

    def test_a_route_not_there_yet(self) -> None:
        exposed = exposure_now(OWNER, {"HTTPRoute": None, "GRPCRoute": None})
        assert exposed is not None
        assert exposed.status == "Unknown"
        assert exposed.routes[0] == "HTTPRoute resnet50: pending (not created yet)"

    def test_the_gateway_apis_own_pending_reason(self) -> None:
        pending = condition("Accepted", "Unknown", "Pending")
        also = condition("Accepted", "False", "Pending")  # some controllers write False
        exposed = exposure_now(OWNER, both(said(pending, RESOLVED), said(also, RESOLVED)))
        assert exposed is not None
        assert (exposed.status, exposed.message) == ("Unknown", self.WAITING)

    def test_conditions_of_an_older_generation_are_not_an_answer(self) -> None:
        # Refused at generation 1; the operator has since changed the route (generation 2).
        old = condition("Accepted", "False", "NotAllowedByListeners", observedGeneration=1)
        http = route("HTTPRoute", said(old, {**RESOLVED, "observedGeneration": 1}), generation=2)
        current = said({**ACCEPTED, "observedGeneration": 2}, {**RESOLVED, "observedGeneration": 2})
        exposed = exposure_now(
            OWNER, {"HTTPRoute": http, "GRPCRoute": route("GRPCRoute", current, generation=2)}
        )
        assert exposed is not None
        assert exposed.status == "Unknown"
        assert exposed.routes == [
            "HTTPRoute resnet50: pending (a change not seen yet)",
            "GRPCRoute resnet50: accepted",
        ]
        assert exposed.message.endswith("(HTTPRoute resnet50)")

    def test_another_parents_entry_is_ignored(self) -> None:
        other_listener = {**PARENT, "sectionName": "http"}
        other_gateway = {**PARENT, "name": "internal"}
        other_namespace = {**PARENT, "namespace": "edge-system"}
        refusal = condition("Accepted", "False", "NotAllowedByListeners")
        entries = [
            said(refusal, parent=p) for p in (other_listener, other_gateway, other_namespace)
        ]
        exposed = exposure_now(
            OWNER,
            {
                "HTTPRoute": route("HTTPRoute", *entries),
                "GRPCRoute": route("GRPCRoute", *entries, said(ACCEPTED, RESOLVED)),
            },
        )
        assert exposed is not None
        assert exposed.status == "Unknown"  # the HTTPRoute: nothing from infra/edge yet
        assert exposed.routes == ["HTTPRoute resnet50: pending", "GRPCRoute resnet50: accepted"]


class TestOneRouteOrNone:
    def test_without_grpc_only_the_httproute_counts(self) -> None:
        http_only = owner({"gateway": {**GATEWAY, "grpc": False}})
        refusal = condition("Accepted", "False", "NotAllowedByListeners")
        exposed = exposure_now(
            http_only,
            {
                "HTTPRoute": route("HTTPRoute", said(ACCEPTED, RESOLVED)),
                "GRPCRoute": route("GRPCRoute", said(refusal)),  # left over: not this spec's
            },
        )
        assert exposed is not None
        assert exposed.status == "True"
        assert exposed.routes == ["HTTPRoute resnet50: accepted"]


INGRESS: dict[str, Any] = {"ingress": {"host": "m.example.com"}}


class TestTheIngress:
    def test_applied_is_all_it_can_say(self) -> None:
        ingress = {"kind": "Ingress", "metadata": {"name": "resnet50"}, "status": {}}
        exposed = exposure_now(owner(INGRESS), {"Ingress": ingress})
        assert exposed is not None
        assert (exposed.status, exposed.reason) == ("True", "Applied")
        assert (
            exposed.message
            == "http://m.example.com/ via Ingress (default class): resnet50: applied"
        )
        assert exposed.routes == ["Ingress resnet50: applied"]

    def test_with_the_load_balancers_address(self) -> None:
        balancer = {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.net"}]}
        ingress = {"kind": "Ingress", "status": {"loadBalancer": balancer}}
        exposed = exposure_now(owner(INGRESS), {"Ingress": ingress})
        assert exposed is not None
        assert exposed.message.endswith(": applied, address 203.0.113.7, lb.example.net")
        assert exposed.routes == ["Ingress resnet50: applied, address 203.0.113.7, lb.example.net"]


def test_nothing_without_an_exposure() -> None:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}}
    )
    assert exposure_now(Owner("m", NS, "uid", spec), {}) is None
