"""Exposure as spec: `spec.exposure` rendered into a Gateway API HTTPRoute and GRPCRoute, or an
Ingress, field by field; the canary's weights; timeouts from the SLA; the routes reach only the
Service's inference ports; removal deletes them; a cluster without the Gateway API is reported in
a condition with nothing of the exposure applied and every other child reconciled; malformed
exposures refused by the CRD and by the spec with the same reasons; what is in force in
`status.exposure`.

Routes are checked against the Gateway API's own CRDs (vendored in tests/data/gateway-api/,
loaded by tests/operator/gateway_api.py), with no field beyond their schema allowed; their CEL
rules are applied by the sandbox's API in test_gateway_crds.py.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no py.typed marker
import pytest
import yaml
from pydantic import ValidationError

from batchpilot.operator import conditions, events
from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.exposure import (
    NGINX_READ_TIMEOUT,
    NGINX_SEND_TIMEOUT,
    build_grpc_route,
    build_http_route,
    build_ingress,
    exposure_status,
    gateway_duration,
    request_timeout_ms,
)
from batchpilot.operator.kinds import (
    DEPLOYMENT,
    GRPC_ROUTE,
    HTTP_ROUTE,
    INGRESS,
    NETWORK_POLICY,
    SERVICE,
)
from batchpilot.operator.kube import KubeClient, KubeError
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox import LocalKubernetesAPI, errors
from batchpilot.sandbox.store import Store
from tests.deploy.chart import find, render
from tests.operator import gateway_api
from tests.operator.crd_store import crd_store, create_isvc
from tests.operator.election_support import client_for
from tests.operator.fake_kube import FakeKube
from tests.operator.test_reconciler import T0, Cluster, isvc

ROOT = Path(__file__).resolve().parents[2]
NS = "vision"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 80, 8081, 8083
"""The Service's ports (children/service.py)."""
GATEWAY = {"name": "edge", "namespace": "infra", "sectionName": "https"}
CANARY = {"service": "resnet50-v2", "weight": 10}


def owner(exposure: dict[str, Any] | None, *, sla_ms: int = 100, name: str = "resnet50") -> Owner:
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"uri": "file:///m.onnx"},
            "sla": {"latencyP99Ms": sla_ms},
            **({"exposure": exposure} if exposure is not None else {}),
        }
    )
    return Owner(name=name, namespace=NS, uid="isvc-uid", spec=spec)


def gateway(**fields: Any) -> dict[str, Any]:
    return {"gateway": {**GATEWAY, **fields}}


def assert_valid_route(route: dict[str, Any]) -> None:
    gateway_api.validate(route)  # the vendored CRD's schema, no field beyond it
    backend_weights = [
        ref["weight"] for rule in route["spec"]["rules"] for ref in rule["backendRefs"]
    ]
    assert sum(backend_weights) > 0 or len(backend_weights) == 0


# --- The routes, field by field -----------------------------------------------------------------


class TestTheHTTPRoute:
    def test_attached_to_the_named_gateway_and_listener(self) -> None:
        route = build_http_route(owner({**gateway(hostnames=["resnet.example.com"])}))
        assert route is not None
        assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
        assert route["metadata"]["name"] == "resnet50"
        assert route["metadata"]["namespace"] == NS
        (ref,) = route["metadata"]["ownerReferences"]
        assert ref["uid"] == "isvc-uid"
        assert ref["controller"] is True
        assert route["spec"]["parentRefs"] == [
            {
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": "edge",
                "namespace": "infra",
                "sectionName": "https",
            }
        ]
        assert route["spec"]["hostnames"] == ["resnet.example.com"]
        assert_valid_route(route)

    def test_the_gateway_of_this_namespace_and_every_host_by_default(self) -> None:
        route = build_http_route(owner({"gateway": {"name": "edge"}}))
        assert route is not None
        assert route["spec"]["parentRefs"] == [
            {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}
        ]
        assert "hostnames" not in route["spec"]
        assert_valid_route(route)

    def test_one_rule_every_path_to_the_services_http_port_with_the_timeout(self) -> None:
        route = build_http_route(owner(gateway(), sla_ms=250))
        assert route is not None
        (rule,) = route["spec"]["rules"]
        assert rule == {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [
                {
                    "group": "",
                    "kind": "Service",
                    "name": "resnet50",
                    "port": HTTP_PORT,
                    "weight": 100,
                }
            ],
            "timeouts": {"request": "1s250ms"},  # 250 + max(250, 1000)
        }

    def test_no_route_without_a_gateway(self) -> None:
        assert build_http_route(owner(None)) is None
        assert build_http_route(owner({"ingress": {"host": "m.example.com"}})) is None


class TestTheGRPCRoute:
    def test_the_same_gateway_and_hosts_to_the_grpc_port(self) -> None:
        route = build_grpc_route(owner(gateway(hostnames=["grpc.example.com"])))
        assert route is not None
        assert route["kind"] == "GRPCRoute"
        assert route["spec"]["parentRefs"][0]["name"] == "edge"
        assert route["spec"]["hostnames"] == ["grpc.example.com"]
        assert route["spec"]["rules"] == [
            {
                "backendRefs": [
                    {
                        "group": "",
                        "kind": "Service",
                        "name": "resnet50",
                        "port": GRPC_PORT,
                        "weight": 100,
                    }
                ]
            }
        ]
        assert_valid_route(route)

    def test_left_out_when_grpc_is_off(self) -> None:
        assert build_grpc_route(owner(gateway(grpc=False))) is None
        assert build_http_route(owner(gateway(grpc=False))) is not None


@pytest.mark.parametrize(
    "exposure",
    [gateway(), {**gateway(), "canary": CANARY}, {"ingress": {"host": "m.example.com"}}],
    ids=["gateway", "canary", "ingress"],
)
def test_only_the_inference_ports_are_reachable(exposure: dict[str, Any]) -> None:
    of = owner(exposure)
    ports = set()
    for route in (build_http_route(of), build_grpc_route(of)):
        for rule in (route or {}).get("spec", {}).get("rules", []):
            ports |= {ref["port"] for ref in rule["backendRefs"]}
    ingress = build_ingress(of)
    if ingress is not None:
        ports |= {
            path["backend"]["service"]["port"]["name"]
            for rule in ingress["spec"]["rules"]
            for path in rule["http"]["paths"]
        }
    assert ports
    assert ports <= {HTTP_PORT, GRPC_PORT, "http"}
    assert METRICS_PORT not in ports
    assert "metrics" not in ports


class TestTheCanary:
    @pytest.mark.parametrize(
        ("weight", "expected"), [(10, (90, 10)), (0, (100, 0)), (100, (0, 100))]
    )
    def test_two_backends_share_the_route_by_weight(
        self, weight: int, expected: tuple[int, int]
    ) -> None:
        of = owner({**gateway(), "canary": {"service": "resnet50-v2", "weight": weight}})
        for route, port in ((build_http_route(of), HTTP_PORT), (build_grpc_route(of), GRPC_PORT)):
            assert route is not None
            (rule,) = route["spec"]["rules"]
            assert [(r["name"], r["port"], r["weight"]) for r in rule["backendRefs"]] == [
                ("resnet50", port, expected[0]),
                ("resnet50-v2", port, expected[1]),
            ]
            assert_valid_route(route)

    def test_the_status_names_the_split(self) -> None:
        status = exposure_status(owner({**gateway(hostnames=["m.example.com"]), "canary": CANARY}))
        assert status == {
            "via": "Gateway API",
            "gateway": "infra/edge listener https",
            "routes": ["HTTPRoute resnet50", "GRPCRoute resnet50"],
            "hostnames": ["m.example.com"],
            "backends": [
                {"service": "resnet50", "weight": 90},
                {"service": "resnet50-v2", "weight": 10},
            ],
            "requestTimeout": "1s100ms",
            "text": "m.example.com via gateway infra/edge listener https: "
            "90% resnet50, 10% resnet50-v2",
        }


class TestTimeoutsFollowTheSLA:
    @pytest.mark.parametrize(
        ("sla_ms", "route", "nginx_s"),
        [
            (1, "1s1ms", "2"),  # 1 + 1000
            (100, "1s100ms", "2"),  # 100 + 1000 = 1.1 s, rounded up
            (1000, "2s", "2"),  # 1000 + 1000
            (1500, "3s", "3"),  # twice
            (90_000, "3m", "180"),
            (600_000, "20m", "1200"),  # the SLA's maximum
        ],
    )
    def test_twice_the_sla_and_at_least_a_second_more(
        self, sla_ms: int, route: str, nginx_s: str
    ) -> None:
        http = build_http_route(owner(gateway(), sla_ms=sla_ms))
        ingress = build_ingress(owner({"ingress": {"host": "m.example.com"}}, sla_ms=sla_ms))
        assert http is not None
        assert ingress is not None
        assert http["spec"]["rules"][0]["timeouts"] == {"request": route}
        assert ingress["metadata"]["annotations"] == {
            NGINX_READ_TIMEOUT: nginx_s,
            NGINX_SEND_TIMEOUT: nginx_s,
        }

    @pytest.mark.parametrize("sla_ms", [1, 7, 999, 1000, 1001, 12_345, 86_400_00 // 144, 600_000])
    def test_never_shorter_than_the_sla_and_a_valid_duration(self, sla_ms: int) -> None:
        timeout = request_timeout_ms(sla_ms)
        assert timeout >= sla_ms + 1000
        text = gateway_duration(timeout)
        assert re.fullmatch(gateway_api.duration_pattern(), text), text
        assert parse_duration_ms(text) == timeout

    def test_durations(self) -> None:
        assert [gateway_duration(ms) for ms in (0, 1, 1500, 60_000, 3_723_004)] == [
            "0s",
            "1ms",
            "1s500ms",
            "1m",
            "1h2m3s4ms",
        ]


def parse_duration_ms(text: str) -> int:
    units = {"h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", text))


# --- The Ingress --------------------------------------------------------------------------------

INGRESS_FIELDS = {
    "className": "nginx",
    "host": "resnet.example.com",
    "path": "/v2/models/resnet50",
    "tlsSecretName": "resnet-tls",
}


class TestTheIngress:
    def test_host_path_class_and_tls(self) -> None:
        ingress = build_ingress(owner({"ingress": INGRESS_FIELDS}))
        assert ingress is not None
        assert ingress["spec"] == {
            "ingressClassName": "nginx",
            "tls": [{"hosts": ["resnet.example.com"], "secretName": "resnet-tls"}],
            "rules": [
                {
                    "host": "resnet.example.com",
                    "http": {
                        "paths": [
                            {
                                "path": "/v2/models/resnet50",
                                "pathType": "Prefix",
                                "backend": {
                                    "service": {"name": "resnet50", "port": {"name": "http"}}
                                },
                            }
                        ]
                    },
                }
            ],
        }

    def test_plain_http_on_every_path_through_the_default_class(self) -> None:
        ingress = build_ingress(owner({"ingress": {"host": "m.example.com"}}))
        assert ingress is not None
        assert "tls" not in ingress["spec"]
        assert "ingressClassName" not in ingress["spec"]
        assert ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] == "/"

    @pytest.mark.parametrize("version", ["1.28", "1.33"])
    @pytest.mark.parametrize(
        "fields", [INGRESS_FIELDS, {"host": "*.models.example.com"}], ids=["full", "wildcard"]
    )
    def test_a_valid_kubernetes_object(self, fields: dict[str, Any], version: str) -> None:
        ingress = build_ingress(owner({"ingress": fields}))
        kubernetes_validate.validate(ingress, version, strict=True)

    def test_the_status(self) -> None:
        assert exposure_status(owner({"ingress": INGRESS_FIELDS})) == {
            "via": "Ingress",
            "routes": ["Ingress resnet50"],
            "hostnames": ["resnet.example.com"],
            "backends": [{"service": "resnet50", "weight": 100}],
            "requestTimeout": "2s",
            "text": "https://resnet.example.com/v2/models/resnet50 via Ingress nginx: resnet50",
        }
        assert exposure_status(owner(None)) is None


# --- Through the reconciler ---------------------------------------------------------------------


def exposed(exposure: dict[str, Any], *, not_served: frozenset[str] = frozenset()) -> Cluster:
    cluster = Cluster(isvc(exposure=exposure))
    cluster.kube = FakeKube(not_served=not_served)
    cluster.reconciler._kube = cluster.kube
    cluster.reconciler._read_referenced = cluster.kube.get
    return cluster


def exposed_condition(cluster: Cluster) -> dict[str, Any] | None:
    return conditions.find(cluster.body["status"].get("conditions"), conditions.EXPOSED)


class TestTheReconciler:
    def test_creates_the_routes_after_the_service_and_reports_them(self) -> None:
        cluster = exposed({**gateway(), "canary": CANARY})
        writes = cluster.writes_of(cluster.reconcile)
        kinds = [kind for _, kind, _ in writes]
        assert kinds.index("Service") < kinds.index("HTTPRoute") < kinds.index("GRPCRoute")
        route = cluster.kube.of(HTTP_ROUTE, NS, "resnet50")
        assert [r["weight"] for r in route["spec"]["rules"][0]["backendRefs"]] == [90, 10]
        assert cluster.kube.of(GRPC_ROUTE, NS, "resnet50")["kind"] == "GRPCRoute"
        assert cluster.body["status"]["exposure"]["text"] == (
            "every host via gateway infra/edge listener https: 90% resnet50, 10% resnet50-v2"
        )
        condition = exposed_condition(cluster)
        assert condition is not None
        # Applied; whether it works is the Gateway's word, which no controller has given yet.
        assert (condition["status"], condition["reason"]) == ("Unknown", "Pending")
        assert condition["message"] == (
            "applied; waiting for the Gateway infra/edge to accept the routes "
            "(HTTPRoute resnet50, GRPCRoute resnet50)"
        )
        assert cluster.writes_of(cluster.reconcile) == []  # converged: nothing to do

    def test_a_new_weight_or_sla_updates_the_routes(self) -> None:
        cluster = exposed({**gateway(), "canary": CANARY})
        cluster.reconcile()
        cluster.body["spec"]["exposure"]["canary"]["weight"] = 50
        cluster.body["spec"]["sla"]["latencyP99Ms"] = 2000
        writes = cluster.writes_of(cluster.reconcile)
        assert {(w[0], w[1]) for w in writes} >= {
            ("replace", "HTTPRoute"),
            ("replace", "GRPCRoute"),
        }
        (rule,) = cluster.kube.of(HTTP_ROUTE, NS, "resnet50")["spec"]["rules"]
        assert [r["weight"] for r in rule["backendRefs"]] == [50, 50]
        assert rule["timeouts"] == {"request": "4s"}

    def test_removing_the_exposure_deletes_the_routes_and_its_status(self) -> None:
        cluster = exposed(gateway())
        cluster.reconcile()
        del cluster.body["spec"]["exposure"]
        writes = cluster.writes_of(cluster.reconcile)
        assert sorted(writes) == [
            ("delete", "GRPCRoute", "resnet50"),
            ("delete", "HTTPRoute", "resnet50"),
        ]
        assert cluster.body["status"]["exposure"] is None  # a merge patch's null: removed
        assert exposed_condition(cluster) is None
        assert cluster.writes_of(cluster.reconcile) == []

    def test_switching_to_an_ingress_replaces_the_routes(self) -> None:
        cluster = exposed(gateway())
        cluster.reconcile()
        cluster.body["spec"]["exposure"] = {"ingress": INGRESS_FIELDS}
        writes = cluster.writes_of(cluster.reconcile)
        assert writes == [
            ("create", "Ingress", "resnet50"),
            ("delete", "HTTPRoute", "resnet50"),
            ("delete", "GRPCRoute", "resnet50"),
        ]
        assert cluster.body["status"]["exposure"]["via"] == "Ingress"

    def test_ingress_annotations_of_others_are_kept_and_ours_put_back(self) -> None:
        cluster = exposed({"ingress": INGRESS_FIELDS})
        cluster.reconcile()
        stored = cluster.kube.objects[("Ingress", NS, "resnet50")]
        stored["metadata"]["annotations"][NGINX_READ_TIMEOUT] = "1"
        stored["metadata"]["annotations"]["example.com/owner"] = "platform"
        assert [w[:2] for w in cluster.writes_of(cluster.reconcile)] == [("replace", "Ingress")]
        annotations = cluster.kube.of(INGRESS, NS, "resnet50")["metadata"]["annotations"]
        assert annotations[NGINX_READ_TIMEOUT] == "2"
        assert annotations["example.com/owner"] == "platform"

    def test_a_canary_naming_the_service_itself_is_refused(self) -> None:
        cluster = exposed({**gateway(), "canary": {"service": "resnet50", "weight": 5}})
        outcome = cluster.reconcile()
        assert outcome.permanent_error == (
            "spec.exposure.canary.service names another InferenceService, not this one"
        )
        assert cluster.kube.writes == []


def gateway_says(
    cluster: Cluster, kind: str, *, status: str = "True", reason: str = "Accepted"
) -> None:
    """A Gateway controller writes the route's status for infra/edge (listener https)."""
    route = cluster.kube.objects[(kind, NS, "resnet50")]
    generation = route["metadata"].get("generation", 1)
    route["status"] = {
        "parents": [
            {
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", **GATEWAY},
                "controllerName": "example.net/gateway",
                "conditions": [
                    {
                        "type": "Accepted",
                        "status": status,
                        "reason": reason,
                        "message": "" if status == "True" else "listener https: not from vision",
                        "observedGeneration": generation,
                    },
                    {
                        "type": "ResolvedRefs",
                        "status": "True",
                        "reason": "ResolvedRefs",
                        "observedGeneration": generation,
                    },
                ],
            }
        ]
    }


class TestWhatTheGatewaySays:
    """The reconciler reads the routes' status as it finds them (in the operator, the watch-fed
    cache: a Gateway's status write is a route event, which reconciles the owner)."""

    def test_exposed_follows_acceptance_and_a_refusal_warns_once(self) -> None:
        cluster = exposed(gateway(hostnames=["resnet.example.com"]))
        cluster.reconcile()
        gateway_says(cluster, "HTTPRoute")
        gateway_says(cluster, "GRPCRoute")
        outcome = cluster.reconcile()
        condition = exposed_condition(cluster)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("True", "Accepted")
        assert condition["message"] == (
            "resnet.example.com via gateway infra/edge listener https: resnet50: accepted by the "
            "Gateway infra/edge"
        )
        assert cluster.body["status"]["exposure"]["routes"] == [
            "HTTPRoute resnet50: accepted",
            "GRPCRoute resnet50: accepted",
        ]
        assert [e for e in outcome.events if e.type == "Warning"] == []

        gateway_says(cluster, "HTTPRoute", status="False", reason="NotAllowedByListeners")
        outcome = cluster.reconcile()
        condition = exposed_condition(cluster)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "NotAllowedByListeners")
        assert condition["message"] == (
            "HTTPRoute resnet50: the Gateway infra/edge did not accept it: NotAllowedByListeners: "
            "listener https: not from vision"
        )
        (warning,) = [e for e in outcome.events if e.type == "Warning"]
        assert (warning.reason, warning.message) == (events.EXPOSURE_REFUSED, condition["message"])
        assert cluster.body["status"]["exposure"]["routes"][0] == (
            "HTTPRoute resnet50: refused (NotAllowedByListeners)"
        )
        assert cluster.reconcile().events == []  # said once, not on every pass
        assert cluster.writes_of(cluster.reconcile) == []  # and nothing is rewritten for it


class TestAClusterWithoutTheGatewayAPI:
    def test_the_condition_says_so_and_everything_else_is_reconciled(self) -> None:
        cluster = exposed(gateway(), not_served=frozenset({"HTTPRoute", "GRPCRoute"}))
        outcome = cluster.reconcile()
        assert outcome.permanent_error is None
        assert outcome.retry_error is None
        for kind in (NETWORK_POLICY, DEPLOYMENT, SERVICE):
            cluster.kube.of(kind, NS, "resnet50")
        assert cluster.kube.get(HTTP_ROUTE, NS, "resnet50") is None
        condition = exposed_condition(cluster)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "GatewayAPIMissing")
        assert condition["message"].startswith(
            "the cluster has no Gateway API (HTTPRoute, gateway.networking.k8s.io/v1); install "
            "its CRDs or use spec.exposure.ingress"
        )
        assert (
            "exposure" not in cluster.body["status"] or cluster.body["status"]["exposure"] is None
        )
        (warning,) = [e for e in outcome.events if e.type == "Warning"]
        assert warning.reason == events.EXPOSURE_NOT_APPLIED
        # The next pass tries again (the CRDs may have come), and warns no more.
        again = cluster.reconcile()
        assert [e for e in again.events if e.type == "Warning"] == []

    def test_without_grpcroute_the_httproute_is_not_left_half_applied(self) -> None:
        cluster = exposed(gateway(), not_served=frozenset({"GRPCRoute"}))
        cluster.reconcile()
        assert cluster.kube.get(HTTP_ROUTE, NS, "resnet50") is None
        condition = exposed_condition(cluster)
        assert condition is not None
        assert "grpc to false" in condition["message"]

    def test_the_way_in_that_was_in_force_stays(self) -> None:
        cluster = exposed(
            {"ingress": INGRESS_FIELDS}, not_served=frozenset({"HTTPRoute", "GRPCRoute"})
        )
        cluster.reconcile()
        cluster.body["spec"]["exposure"] = gateway()
        writes = cluster.writes_of(cluster.reconcile)
        assert writes == []  # the Ingress is not deleted for routes that cannot be made
        assert cluster.kube.get(INGRESS, NS, "resnet50") is not None
        assert cluster.body["status"]["exposure"]["via"] == "Ingress"

    def test_once_installed_the_routes_are_made(self) -> None:
        cluster = exposed(gateway(), not_served=frozenset({"HTTPRoute", "GRPCRoute"}))
        cluster.reconcile()
        cluster.kube.not_served.clear()
        cluster.reconcile()
        condition = exposed_condition(cluster)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("Unknown", "Pending")
        cluster.kube.of(HTTP_ROUTE, NS, "resnet50")


class _NotFoundApi:
    def param_serialize(self, *, method: str, resource_path: str, **_: Any) -> tuple[Any, ...]:
        return method, resource_path, {}, None

    def call_api(self, *_: Any, **__: Any) -> Any:
        class Response:
            status = 404
            data = b"404 page not found"

            def read(self) -> bytes:
                return self.data

        return Response()


def test_the_client_says_when_the_server_does_not_serve_a_kind() -> None:
    route = build_http_route(owner(gateway()))
    assert route is not None
    with pytest.raises(KubeError) as caught:
        KubeClient(_NotFoundApi()).create(route)
    assert caught.value.status == 404
    assert "httproutes" in caught.value.message


# --- Refusals: the CRD (as the API server applies it) and the spec say the same ------------------

BAD_EXPOSURES = [
    ({}, "exposure takes exactly one of gateway"),
    (
        {"gateway": {"name": "edge"}, "ingress": {"host": "m.example.com"}},
        "exposure takes exactly one of gateway",
    ),
    (
        {"ingress": {"host": "m.example.com"}, "canary": CANARY},
        "exposure.canary needs exposure.gateway",
    ),
    ({"gateway": {"name": "Edge"}}, "gateway.name names a Gateway"),
    ({"gateway": {"name": "edge", "namespace": "in.fra"}}, "gateway.namespace is a namespace"),
    ({"gateway": {"name": "edge", "sectionName": "HTTPS"}}, "gateway.sectionName names one"),
    ({"gateway": {"name": "edge", "hostnames": ["Resnet.example.com"]}}, "a hostname is a DNS"),
    ({"gateway": {"name": "edge", "hostnames": ["10.0.0.1"]}}, "no IP address"),
    ({"gateway": {"name": "edge", "hostnames": ["m.example.com:443"]}}, "a hostname is a DNS"),
    ({"ingress": {"host": "https://m.example.com"}}, "a hostname is a DNS"),
    ({"ingress": {"host": "m.example.com", "path": "v2"}}, "ingress.path is an absolute path"),
    *(
        ({"ingress": {"host": "m.example.com", "path": path}}, "ingress.path is an absolute path")
        for path in ("//", "/v2//models", "/a/../x", "/v2/.", "/v2/..", "/./")
    ),
    ({"ingress": {"host": "m.example.com", "className": "Nginx"}}, "ingress.className names"),
    (
        {"ingress": {"host": "m.example.com", "tlsSecretName": "tls_secret"}},
        "ingress.tlsSecretName names a Secret",
    ),
    (
        {"gateway": {"name": "edge"}, "canary": {"service": "resnet50.v2", "weight": 10}},
        "exposure.canary.service names an InferenceService",
    ),
    (
        {"gateway": {"name": "edge"}, "canary": {"service": "resnet50-v2", "weight": 101}},
        "less than or equal to 100",
    ),
    (
        {"gateway": {"name": "edge"}, "canary": {"service": "resnet50-v2", "weight": -1}},
        "greater than or equal to 0",
    ),
]
GOOD_EXPOSURES = {
    "gateway": {"gateway": {"name": "edge"}},
    "gateway-full": {**gateway(hostnames=["m.example.com", "*.models.example.com"], grpc=False)},
    "canary": {**gateway(), "canary": CANARY},
    "ingress": {"ingress": INGRESS_FIELDS},
}


@pytest.fixture
def store() -> Store:
    return crd_store(NS)


def create(store: Store, exposure: dict[str, Any], *, name: str = "m") -> dict[str, Any]:
    return create_isvc(store, NS, {"exposure": exposure}, name=name)


class TestMalformedExposuresAreRefused:
    @pytest.mark.parametrize(("exposure", "message"), BAD_EXPOSURES)
    def test_by_the_crd(self, store: Store, exposure: dict[str, Any], message: str) -> None:
        with pytest.raises(errors.ApiError) as caught:
            create(store, exposure)
        assert caught.value.code == 422
        assert message in caught.value.message, caught.value.message
        assert "spec.exposure" in caught.value.message

    @pytest.mark.parametrize(("exposure", "message"), BAD_EXPOSURES)
    def test_by_the_spec(self, exposure: dict[str, Any], message: str) -> None:
        expected = {
            "less than or equal to 100": "less than or equal to 100",
            "greater than or equal to 0": "greater than or equal to 0",
        }.get(message, re.escape(message))
        with pytest.raises(ValidationError, match=expected):
            owner(exposure)

    def test_a_canary_of_itself_by_the_crd(self, store: Store) -> None:
        with pytest.raises(errors.ApiError) as caught:
            create(store, {**gateway(), "canary": {"service": "m", "weight": 10}})
        assert caught.value.code == 422
        assert "names another InferenceService, not this one" in caught.value.message
        assert "spec.exposure.canary.service: Invalid value" in caught.value.message  # fieldPath

    @pytest.mark.parametrize("case", GOOD_EXPOSURES, ids=list(GOOD_EXPOSURES))
    def test_good_ones_pass_both(self, store: Store, case: str) -> None:
        exposure = GOOD_EXPOSURES[case]
        created = create(store, copy.deepcopy(exposure))
        for way in exposure:
            assert created["spec"]["exposure"][way]
        assert owner(exposure).spec.exposure is not None

    def test_the_crd_defaults_what_the_spec_defaults(self, store: Store) -> None:
        created = create(store, {"gateway": {"name": "edge"}}, name="a")
        assert created["spec"]["exposure"]["gateway"]["grpc"] is True
        created = create(store, {"ingress": {"host": "m.example.com"}}, name="b")
        assert created["spec"]["exposure"]["ingress"]["path"] == "/"


def test_kubectl_shows_it() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    (column,) = [c for c in version["additionalPrinterColumns"] if c["name"] == "Exposure"]
    assert column["jsonPath"] == ".status.exposure.text"
    assert column["priority"] == 1
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(status["exposure"]["properties"]) == {
        "via",
        "gateway",
        "routes",
        "hostnames",
        "backends",
        "requestTimeout",
        "text",
    }


# --- Against the local Kubernetes API, which serves Ingress and not the Gateway API ---------------


class TestThroughTheLocalAPI:
    """The operator's real client: the emulator answers a POST to httproutes with 404, as an API
    server without the Gateway API's CRDs does."""

    def test_routes_are_reported_missing_and_an_ingress_is_made(self, tmp_path: Path) -> None:
        with LocalKubernetesAPI(crds=[ROOT / "crds"], namespaces=[NS]).threaded() as api:
            kube = client_for(api, tmp_path / "kubeconfig")
            reconciler = Reconciler(
                kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: T0
            )
            sent = isvc(exposure=gateway())
            for key in ("uid", "generation"):
                del sent["metadata"][key]
            body = kube.create(sent)  # the children's owner, or the emulator collects them
            outcome = reconciler.reconcile(copy.deepcopy(body))
            body["status"] = outcome.status
            condition = conditions.find(outcome.status["conditions"], conditions.EXPOSED)
            assert condition is not None
            assert condition["reason"] == "GatewayAPIMissing"
            assert kube.get(SERVICE, NS, "resnet50") is not None
            assert kube.get(DEPLOYMENT, NS, "resnet50") is not None
            assert kube.get(HTTP_ROUTE, NS, "resnet50") is None

            body["spec"]["exposure"] = {"ingress": INGRESS_FIELDS}
            outcome = reconciler.reconcile(copy.deepcopy(body))
            body["status"] = {**body["status"], **outcome.status}
            ingress = kube.get(INGRESS, NS, "resnet50")
            assert ingress is not None
            assert ingress["spec"]["rules"][0]["host"] == "resnet.example.com"
            condition = conditions.find(outcome.status["conditions"], conditions.EXPOSED)
            assert condition is not None
            assert condition["status"] == "True"

            del body["spec"]["exposure"]
            reconciler.reconcile(copy.deepcopy(body))
            assert kube.get(INGRESS, NS, "resnet50") is None


def test_the_chart_grants_the_routes_and_the_ingress_and_no_patch() -> None:
    (role,) = find(render(), "ClusterRole")
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    verbs = {"get", "list", "watch", "create", "update", "delete"}
    assert granted[("gateway.networking.k8s.io", "httproutes")] == verbs
    assert granted[("gateway.networking.k8s.io", "grpcroutes")] == verbs
    assert granted[("networking.k8s.io", "ingresses")] == verbs
