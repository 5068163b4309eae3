"""The routes the operator renders for `spec.exposure`, checked against the Gateway API's own
CRDs (v1.3.0, standard channel, vendored in tests/data/gateway-api): every variant the operator
can render is accepted by the sandbox's Kubernetes API with those CRDs installed — their OpenAPI
schema and their CEL rules, as kube-apiserver applies them — and stored as rendered (nothing
pruned, nothing defaulted that was not sent); broken routes are refused with the upstream
messages; the same variants fit the vendored schema with jsonschema too (the fast path, no
server, no CEL); and the operator itself, through its real client, makes routes the CRDs accept.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.exposure import (
    build_grpc_route,
    build_http_route,
    gateway_duration,
    request_timeout_ms,
)
from batchpilot.operator.kinds import GRPC_ROUTE, HTTP_ROUTE
from batchpilot.operator.kube import KubeClient, KubeError
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox import LocalKubernetesAPI, cel, crds, errors
from tests.operator import gateway_api
from tests.operator.election_support import client_for
from tests.operator.test_reconciler import T0, isvc

ROOT = Path(__file__).resolve().parents[2]
NS = "vision"
GATEWAY = {"name": "edge", "namespace": "infra", "sectionName": "https"}
HOSTS = ["resnet.example.com", "*.models.example.com"]


def exposure_of(**gateway: Any) -> dict[str, Any]:
    return {"gateway": {**GATEWAY, **gateway}}


def canary(weight: int) -> dict[str, Any]:
    return {**exposure_of(), "canary": {"service": "resnet50-v2", "weight": weight}}


VARIANTS: dict[str, tuple[dict[str, Any], int]] = {
    "this-namespace": ({"gateway": {"name": "edge"}}, 100),
    "other-namespace": ({"gateway": {"name": "edge", "namespace": "infra"}}, 100),
    "listener": (exposure_of(), 100),
    "hostnames": (exposure_of(hostnames=HOSTS), 250),
    "sixteen-hostnames": (exposure_of(hostnames=[f"m{i}.example.com" for i in range(16)]), 100),
    "no-grpc": (exposure_of(grpc=False), 100),
    "hostnames-no-grpc": ({"gateway": {"name": "edge", "hostnames": HOSTS, "grpc": False}}, 100),
    "canary-0": (canary(0), 100),
    "canary-10": (canary(10), 100),
    "canary-100": (canary(100), 100),
    "canary-hostnames": ({**canary(10), **exposure_of(hostnames=HOSTS)}, 100),
    "sla-1ms": (exposure_of(), 1),
    "sla-999ms": (exposure_of(), 999),
    "sla-1500ms": (exposure_of(), 1500),
    "sla-1min": (exposure_of(), 60_000),
    "sla-99999ms": (exposure_of(), 99_999),
    "sla-10min": (exposure_of(), 600_000),
}
"""Every shape of route the operator renders: (spec.exposure, the SLA's P99 in ms)."""
SLAS_MS = sorted(
    {1, 2, 499, 500, 999, 1000, 1001, 1999, 2000, 59_999, 60_000, 99_999, 100_000}
    | {3_599_999 // 6, 599_999, 600_000}
    | set(range(7, 600_000, 37_813))
)
"""The SLAs whose request timeouts are checked against GEP-2257's pattern (the spec allows
1 ms to 10 min)."""


def owner(exposure: dict[str, Any], *, sla_ms: int = 100, name: str = "resnet50") -> Owner:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": sla_ms}, "exposure": exposure}
    )
    return Owner(name=name, namespace=NS, uid=f"{name}-uid", spec=spec)


def routes(name: str, exposure: dict[str, Any], sla_ms: int) -> list[dict[str, Any]]:
    """The HTTPRoute, and the GRPCRoute when the exposure has one, as the operator renders them."""
    rendered = owner(copy.deepcopy(exposure), sla_ms=sla_ms, name=name)
    found = [build_http_route(rendered), build_grpc_route(rendered)]
    return [route for route in found if route is not None]


def http_route(**changes: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """An HTTPRoute as rendered for a Gateway listener with hostnames, named after the one
    change given (`upper_host=...`: "upper-host"), with the change made to its spec."""
    ((name, change),) = changes.items()
    (route,) = routes(name.replace("_", "-"), exposure_of(grpc=False, hostnames=HOSTS), 100)
    route = copy.deepcopy(route)
    change(route["spec"])
    return route


def _rule(spec: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = spec["rules"][0]
    return rule


BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "negative-weight": (
        http_route(negative_weight=lambda s: _rule(s)["backendRefs"][0].update(weight=-1)),
        "spec.rules[0].backendRefs[0].weight: Invalid value: -1: spec.rules[0].backendRefs[0]"
        ".weight in body should be greater than or equal to 0",
    ),
    "weight-over-a-million": (
        http_route(big_weight=lambda s: _rule(s)["backendRefs"][0].update(weight=1_000_001)),
        "spec.rules[0].backendRefs[0].weight in body should be less than or equal to 1000000",
    ),
    "uppercase-hostname": (
        http_route(upper_host=lambda s: s.update(hostnames=["Resnet.example.com"])),
        'spec.hostnames[0]: Invalid value: "Resnet.example.com": spec.hostnames[0] in body'
        r" should match '^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
    ),
    "ip-hostname": (
        http_route(ip_host=lambda s: s.update(hostnames=["10.0.0.1:80"])),
        'spec.hostnames[0]: Invalid value: "10.0.0.1:80"',
    ),
    "fractional-timeout": (
        http_route(fraction=lambda s: _rule(s).update(timeouts={"request": "1.5s"})),
        'spec.rules[0].timeouts.request: Invalid value: "1.5s": spec.rules[0].timeouts.request'
        " in body should match '^([0-9]{1,5}(h|m|s|ms)){1,4}$'",
    ),
    "six-digit-timeout": (
        http_route(six_digits=lambda s: _rule(s).update(timeouts={"request": "100000s"})),
        "spec.rules[0].timeouts.request in body should match",
    ),
    "backend-timeout-over-request": (
        http_route(
            backend_longer=lambda s: _rule(s).update(
                timeouts={"request": "1s500ms", "backendRequest": "2s"}
            )
        ),
        'spec.rules[0].timeouts: Invalid value: "object": backendRequest timeout cannot be'
        " longer than request timeout",
    ),
    "service-without-port": (
        http_route(no_port=lambda s: _rule(s)["backendRefs"][0].pop("port")),
        'spec.rules[0].backendRefs[0]: Invalid value: "object": Must have port for Service'
        " reference",
    ),
    "same-listener-twice": (
        http_route(twice=lambda s: s.update(parentRefs=s["parentRefs"] * 2)),
        'spec.parentRefs: Invalid value: "array": sectionName must be unique when parentRefs'
        " includes 2 or more references to the same parent",
    ),
    "same-gateway-with-and-without-listener": (
        http_route(
            mixed=lambda s: s.update(
                parentRefs=[
                    {"name": "edge", "namespace": "infra", "sectionName": "https"},
                    {"name": "edge", "namespace": "infra"},
                ]
            )
        ),
        'spec.parentRefs: Invalid value: "array": sectionName must be specified when parentRefs'
        " includes 2 or more references to the same parent",
    ),
    "path-not-absolute": (
        http_route(
            relative=lambda s: _rule(s).update(
                matches=[{"path": {"type": "PathPrefix", "value": "v1"}}]
            )
        ),
        'spec.rules[0].matches[0].path: Invalid value: "object": value must be an absolute'
        " path and start with '/' when type one of ['Exact', 'PathPrefix']",
    ),
}
"""Routes the operator must never render, and what the Gateway API's CRD says of each."""


# --- The vendored CRDs ----------------------------------------------------------------------------


class TestTheVendoredCRDs:
    @pytest.mark.parametrize("path", gateway_api.CRD_FILES, ids=lambda p: p.name)
    def test_the_standard_channel_of_the_release_named(self, path: Path) -> None:
        (crd,) = yaml.safe_load_all(path.read_text(encoding="utf-8"))
        annotations = crd["metadata"]["annotations"]
        assert annotations["gateway.networking.k8s.io/bundle-version"] == gateway_api.VERSION
        assert annotations["gateway.networking.k8s.io/channel"] == "standard"
        assert crd["spec"]["group"] == gateway_api.GROUP
        assert [v["name"] for v in crd["spec"]["versions"]] == ["v1"]
        assert path.name == f"gateway.networking.k8s.io_{crd['spec']['names']['plural']}.yaml"

    @pytest.mark.parametrize("kind", ["HTTPRoute", "GRPCRoute", "Gateway"])
    def test_every_rule_compiles_in_the_sandbox(self, kind: str) -> None:
        crd = gateway_api.crd(kind)
        assert crds.validate(crd) == []
        rules = _rules(gateway_api.openapi_schema(kind))
        assert len(rules) >= {"HTTPRoute": 40, "GRPCRoute": 20, "Gateway": 10}[kind]
        for rule in rules:
            cel.compile_expression(rule)

    def test_the_readme_says_where_they_come_from(self) -> None:
        readme = (gateway_api.CRD_DIR / "README.md").read_text(encoding="utf-8")
        assert "kubernetes-sigs/gateway-api" in readme
        assert f"tag `{gateway_api.VERSION}`" in readme
        assert "config/crd/standard/" in readme
        assert "Apache-2.0" in readme


def _rules(schema: Any) -> list[str]:
    found: list[str] = []
    if isinstance(schema, dict):
        found += [rule["rule"] for rule in schema.get("x-kubernetes-validations") or []]
        for value in schema.values():
            found += _rules(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _rules(value)
    return found


# --- Without a server: jsonschema against the vendored openAPIV3Schema --------------------------


class TestTheFastPath:
    @pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
    def test_every_variant_fits_the_schema(self, variant: str) -> None:
        exposure, sla_ms = VARIANTS[variant]
        rendered = routes(variant, exposure, sla_ms)
        assert [route["kind"] for route in rendered] == (
            ["HTTPRoute", "GRPCRoute"] if exposure["gateway"].get("grpc", True) else ["HTTPRoute"]
        )
        for route in rendered:
            assert gateway_api.problems(route) == []
            gateway_api.validate(route)

    @pytest.mark.parametrize("sla_ms", SLAS_MS)
    def test_the_request_timeout_is_a_gateway_api_duration(self, sla_ms: int) -> None:
        (route,) = routes("m", exposure_of(grpc=False), sla_ms)
        assert _rule(route["spec"])["timeouts"] == {
            "request": gateway_duration(request_timeout_ms(sla_ms))
        }
        assert gateway_api.problems(route) == []

    @pytest.mark.parametrize(
        ("case", "where"),
        [
            ("negative-weight", "spec.rules.0.backendRefs.0.weight: -1 is less than the minimum"),
            ("uppercase-hostname", "spec.hostnames.0: 'Resnet.example.com' does not match"),
            ("fractional-timeout", "spec.rules.0.timeouts.request: '1.5s' does not match"),
        ],
    )
    def test_broken_routes_do_not_fit(self, case: str, where: str) -> None:
        route, _ = BROKEN[case]
        found = gateway_api.problems(route)
        assert len(found) == 1
        assert found[0].startswith(where), found

    def test_an_undeclared_field_does_not_fit_the_strict_schema(self) -> None:
        route = http_route(typo=lambda s: _rule(s).update(timeout={"request": "1s"}))
        assert gateway_api.problems(route, strict=False) == []
        (problem,) = gateway_api.problems(route)
        assert problem.startswith("spec.rules.0: Additional properties are not allowed")

    def test_the_cel_rules_need_the_server(self) -> None:
        # No port for a Service is refused by a CEL rule, which jsonschema does not evaluate.
        route, _ = BROKEN["service-without-port"]
        assert gateway_api.problems(route) == []

    def test_the_duration_pattern_is_gep_2257s(self) -> None:
        assert gateway_api.duration_pattern() == r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"

    def test_not_a_gateway_api_object(self) -> None:
        with pytest.raises(ValueError, match="not a Gateway API object"):
            gateway_api.validate({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress"})


# --- In the sandbox's Kubernetes API, with the CRDs installed ------------------------------------


@pytest.fixture(scope="module")
def api() -> Iterator[LocalKubernetesAPI]:
    sandbox = LocalKubernetesAPI(crds=gateway_api.CRD_FILES, namespaces=[NS, "infra"], seed=5)
    with sandbox.threaded() as server:
        yield server


@pytest.fixture(scope="module")
def kube(api: LocalKubernetesAPI, tmp_path_factory: pytest.TempPathFactory) -> KubeClient:
    return client_for(api, tmp_path_factory.mktemp("gateway-crds") / "kubeconfig")


class TestTheCRDsInstalled:
    def test_the_kinds_are_served(self, api: LocalKubernetesAPI) -> None:
        served = {rt.qualified for rt in api.call(lambda: list(api.store.registry)) if rt.custom}
        assert served == {
            "httproutes.gateway.networking.k8s.io",
            "grpcroutes.gateway.networking.k8s.io",
            "gateways.gateway.networking.k8s.io",
        }

    def test_a_rule_the_sandbox_cannot_evaluate_refuses_the_crd(self) -> None:
        crd = gateway_api.crd("HTTPRoute")
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        schema["properties"]["spec"]["properties"]["hostnames"]["x-kubernetes-validations"] = [
            {"rule": "self.all(h, !isIP(h))", "message": "no IPs"}
        ]
        with pytest.raises(errors.ApiError) as caught, LocalKubernetesAPI(crds=[crd]).threaded():
            pass  # pragma: no cover - the CRD is refused on the way in
        message = caught.value.message
        assert caught.value.code == 422
        assert "properties[hostnames].x-kubernetes-validations[0].rule" in message
        assert "self.all(h, !isIP(h))" in message
        assert "undeclared reference to 'isIP'" in message


class TestEveryVariantIsAccepted:
    @pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
    def test_created_as_rendered(self, kube: KubeClient, variant: str) -> None:
        exposure, sla_ms = VARIANTS[variant]
        for route in routes(variant, exposure, sla_ms):
            created = kube.create(copy.deepcopy(route))
            assert created["kind"] == route["kind"]
            assert created["metadata"]["name"] == variant
            assert created["spec"] == route["spec"]  # nothing pruned, nothing defaulted

    def test_the_same_gateway_name_in_two_namespaces_is_two_parents(self, kube: KubeClient) -> None:
        # Upstream's rule reads parentRefs[].namespace as `__namespace__` (CEL's reserved word,
        # escaped): without the escaping both would look like this namespace's "edge".
        route = http_route(
            two_parents=lambda s: s.update(
                parentRefs=[
                    {"name": "edge", "namespace": "infra"},
                    {"name": "edge", "namespace": "edge-2"},
                ]
            )
        )
        created = kube.create(route)
        assert [ref["kind"] for ref in created["spec"]["parentRefs"]] == ["Gateway", "Gateway"]


class TestBrokenRoutesAreRefused:
    @pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
    def test_with_the_upstream_message(self, kube: KubeClient, case: str) -> None:
        route, message = BROKEN[case]
        with pytest.raises(KubeError) as caught:
            kube.create(copy.deepcopy(route))
        assert caught.value.status == 422
        assert f'HTTPRoute.gateway.networking.k8s.io "{route["metadata"]["name"]}" is invalid' in (
            caught.value.message
        )
        assert message in caught.value.message, caught.value.message

    def test_a_grpc_route_without_a_port(self, kube: KubeClient) -> None:
        (_, route) = routes("grpc-no-port", exposure_of(), 100)
        del route["spec"]["rules"][0]["backendRefs"][0]["port"]
        with pytest.raises(KubeError) as caught:
            kube.create(route)
        assert caught.value.status == 422
        assert (
            'spec.rules[0].backendRefs[0]: Invalid value: "object": Must have port for Service'
            " reference" in caught.value.message
        )


class TestTheGateway:
    def _create(self, api: LocalKubernetesAPI, body: dict[str, Any]) -> dict[str, Any]:
        def create() -> dict[str, Any]:
            rt = api.store.registry.get(gateway_api.GROUP, "v1", "gateways")
            assert rt is not None
            created, _ = api.store.create(
                rt, "infra", copy.deepcopy(body), field_validation="Strict"
            )
            return created

        return api.call(create)

    @staticmethod
    def gateway(name: str, *listeners: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name},
            "spec": {"gatewayClassName": "example", "listeners": list(listeners), **spec},
        }

    def test_the_one_the_routes_name_waits_for_its_controller(
        self, api: LocalKubernetesAPI
    ) -> None:
        https = {
            "name": "https",
            "port": 443,
            "protocol": "HTTPS",
            "tls": {"certificateRefs": [{"name": "edge-tls"}]},
        }
        created = self._create(api, self.gateway("edge", https, addresses=[{"value": "10.0.0.9"}]))
        (listener,) = created["spec"]["listeners"]
        assert listener["tls"]["mode"] == "Terminate"
        assert listener["allowedRoutes"] == {"namespaces": {"from": "Same"}}
        assert created["spec"]["addresses"] == [{"type": "IPAddress", "value": "10.0.0.9"}]
        assert [c["reason"] for c in created["status"]["conditions"]] == ["Pending", "Pending"]

    @pytest.mark.parametrize(
        ("listeners", "spec", "message"),
        [
            (
                [{"name": "http", "port": 80, "protocol": "HTTP", "tls": {"mode": "Terminate"}}],
                {},
                "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']",
            ),
            (
                [
                    {"name": "a", "port": 80, "protocol": "HTTP"},
                    {"name": "b", "port": 80, "protocol": "HTTP"},
                ],
                {},
                "Combination of port, protocol and hostname must be unique for each listener",
            ),
            (
                [{"name": "http", "port": 80, "protocol": "HTTP"}],
                {"infrastructure": {"labels": {"a/b/c": "x"}}},
                "Label keys must be in the form of an optional DNS subdomain prefix",
            ),
            (
                [{"name": "http", "port": 80, "protocol": "HTTP"}],
                {"addresses": [{"value": "10.0.0.x"}]},
                "spec.addresses[0]",
            ),
        ],
    )
    def test_broken_ones_are_refused(
        self,
        api: LocalKubernetesAPI,
        listeners: list[dict[str, Any]],
        spec: dict[str, Any],
        message: str,
    ) -> None:
        with pytest.raises(errors.ApiError) as caught:
            self._create(api, self.gateway("broken", *listeners, **spec))
        assert caught.value.code == 422
        assert message in caught.value.message, caught.value.message


# --- The operator, through its real client --------------------------------------------------------


def test_the_operator_makes_routes_the_crds_accept(tmp_path: Path) -> None:
    sources = [ROOT / "crds", *gateway_api.CRD_FILES]
    with LocalKubernetesAPI(crds=sources, namespaces=[NS]).threaded() as api:
        kube = client_for(api, tmp_path / "kubeconfig")
        reconciler = Reconciler(
            kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: T0
        )
        sent = isvc(
            exposure={**exposure_of(hostnames=HOSTS), "canary": {"service": "v2", "weight": 25}}
        )
        for key in ("uid", "generation"):
            del sent["metadata"][key]
        body = kube.create(sent)  # the routes' owner, or the emulator collects them
        outcome = reconciler.reconcile(copy.deepcopy(body))
        (exposed,) = [c for c in outcome.status["conditions"] if c["type"] == "Exposed"]
        # Applied: "Unknown" while no Gateway controller has said (or "True", applied, where
        # the operator does not read the routes' status); never False (refused, or missing).
        assert exposed["status"] in ("True", "Unknown"), exposed
        http = kube.get(HTTP_ROUTE, NS, "resnet50")
        grpc = kube.get(GRPC_ROUTE, NS, "resnet50")
        assert http is not None
        assert grpc is not None
        assert [ref["weight"] for ref in _rule(http["spec"])["backendRefs"]] == [75, 25]
        assert http["spec"]["hostnames"] == HOSTS
        assert [ref["port"] for ref in _rule(grpc["spec"])["backendRefs"]] == [8081, 8081]
