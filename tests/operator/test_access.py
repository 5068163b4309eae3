"""Network access as spec: `spec.access.allowFrom` and the operator's settings rendered into one
NetworkPolicy per InferenceService, checked rule by rule with NetworkPolicy's own semantics
(`admits` below); malformed selectors refused by the CRD and by the spec with the reason; the
rules in force in `status.access`."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.networkpolicy import access_status, build_network_policy
from batchpilot.operator.kinds import NETWORK_POLICY
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox import errors
from batchpilot.sandbox.store import Store
from tests.operator.crd_store import crd_store, create_isvc
from tests.operator.test_reconciler import Cluster, isvc

ROOT = Path(__file__).resolve().parents[2]
NS = "vision"
SETTINGS = OperatorSettings(
    operator_namespace="batchpilot-system",
    operator_pod_labels={
        "app.kubernetes.io/name": "batchpilot",
        "app.kubernetes.io/component": "operator",
    },
)
HTTP, GRPC, ADMIN, METRICS = 8080, 8081, 8082, 8083


# --- NetworkPolicy semantics, applied to a candidate caller -------------------------------------


@dataclass(frozen=True)
class Caller:
    """A pod that opens a connection: its namespace (with the namespace's labels) and labels."""

    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def namespace_labels_in_force(self) -> dict[str, str]:
        # Kubernetes labels every namespace with its name.
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """metav1.LabelSelector: every matchLabels pair and every expression holds; {} selects all."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for requirement in selector.get("matchExpressions", []):
        key, operator, values = (
            requirement["key"],
            requirement["operator"],
            requirement.get("values", []),
        )
        present = key in labels
        holds = {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not holds:
            return False
    return True


def peer_matches(peer: dict[str, Any], caller: Caller, *, policy_namespace: str) -> bool:
    """NetworkPolicyPeer: podSelector alone is the policy's namespace; namespaceSelector alone
    every pod of the selected namespaces; both: the selected pods in the selected namespaces."""
    assert "ipBlock" not in peer
    assert peer, "a peer selects something"
    assert set(peer) <= {"podSelector", "namespaceSelector"}, peer
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], caller.namespace_labels_in_force())
    else:
        in_namespace = caller.namespace == policy_namespace
    return in_namespace and selects(peer.get("podSelector", {}), caller.labels)


def admits(
    policy: dict[str, Any], target_labels: dict[str, str], port: int, caller: Caller
) -> bool:
    """Whether `policy` lets `caller` open a TCP connection to `port` of a pod labelled
    `target_labels` in the policy's namespace. A pod no policy selects takes everything; one
    selected for Ingress takes only what some rule admits: a rule admits when its `from` (absent:
    everyone) has a matching peer and its `ports` (absent: every port) name the port."""
    spec = policy["spec"]
    if not selects(spec["podSelector"], target_labels) or "Ingress" not in spec["policyTypes"]:
        return True
    namespace = policy["metadata"]["namespace"]
    for rule in spec.get("ingress", []):
        peers = rule.get("from")
        by_peer = peers is None or any(
            peer_matches(p, caller, policy_namespace=namespace) for p in peers
        )
        ports = rule.get("ports")
        by_port = ports is None or any(
            p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports
        )
        if by_peer and by_port:
            return True
    return False


def owner(access: dict[str, Any] | None = None) -> Owner:
    doc = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
    spec = {**doc["spec"], **({"access": access} if access is not None else {})}
    return Owner(
        name="resnet50", namespace=NS, uid="uid-1", spec=InferenceServiceSpec.model_validate(spec)
    )


def pod_labels(of: Owner) -> dict[str, str]:
    deployment = build_deployment(of, SETTINGS, replicas=1)
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def reachable(of: Owner, caller: Caller) -> set[int]:
    """The runtime pod's ports `caller` may reach (of every port a runtime pod opens, and one
    it does not)."""
    policy = build_network_policy(of, SETTINGS)
    labels = pod_labels(of)
    return {p for p in (HTTP, GRPC, ADMIN, METRICS, 9999) if admits(policy, labels, p, caller)}


NEIGHBOUR = Caller(NS, {"app": "web"})
STRANGER = Caller("other-team", {"app": "web"})
OPERATOR = Caller(
    "batchpilot-system",
    {"app.kubernetes.io/name": "batchpilot", "app.kubernetes.io/component": "operator"},
)
PROMETHEUS = Caller("monitoring", {"app.kubernetes.io/name": "prometheus"})


class TestTheRulesByDefault:
    def test_the_pods_of_its_namespace_may_call_the_model_and_nothing_more(self) -> None:
        assert reachable(owner(), NEIGHBOUR) == {HTTP, GRPC}

    def test_a_caller_outside_the_namespace_is_not_admitted(self) -> None:
        assert reachable(owner(), STRANGER) == set()

    def test_the_admin_port_only_from_the_operator(self) -> None:
        assert reachable(owner(), OPERATOR) == {ADMIN}
        for caller in (NEIGHBOUR, STRANGER, PROMETHEUS):
            assert ADMIN not in reachable(owner(), caller), caller
        # the operator's labels in another namespace, or another pod in the operator's: no
        assert reachable(owner(), Caller("evil", OPERATOR.labels)) == set()
        assert reachable(owner(), Caller("batchpilot-system", {"app": "x"})) == set()

    def test_metrics_only_from_prometheus(self) -> None:
        assert reachable(owner(), PROMETHEUS) == {METRICS}
        for caller in (NEIGHBOUR, STRANGER, OPERATOR):
            assert METRICS not in reachable(owner(), caller), caller

    def test_the_policy_selects_exactly_this_services_pods(self) -> None:
        policy = build_network_policy(owner(), SETTINGS)
        assert selects(policy["spec"]["podSelector"], pod_labels(owner()))
        other = {**pod_labels(owner()), "batchpilot.io/inferenceservice": "other"}
        assert not selects(policy["spec"]["podSelector"], other)
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress is not this policy's

    def test_the_ports_are_the_deployments(self) -> None:
        deployment = build_deployment(owner(), SETTINGS, replicas=1)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        policy = build_network_policy(owner(), SETTINGS)
        ports = [[p["port"] for p in rule["ports"]] for rule in policy["spec"]["ingress"]]
        assert ports == [
            [named["http"], named["grpc"]],
            [named["http"]],
            [named["admin"]],
            [named["metrics"]],
        ]

    def test_the_services_own_pods_reach_each_others_http_port_alone(self) -> None:
        # A replica passes the fetch of an async result on to the replica holding the job,
        # whoever else `allowFrom` admits.
        for access in (
            None,
            {"allowFrom": []},
            {"allowFrom": [{"podSelector": {"matchLabels": {"x": "y"}}}]},
        ):
            of = owner(access)
            assert reachable(of, Caller(NS, pod_labels(of))) >= {HTTP}, access
            assert reachable(of, Caller(NS, pod_labels(of))) - {HTTP, GRPC} == set(), access
            # the same labels in another namespace are another service's pods
            assert HTTP not in reachable(of, Caller("elsewhere", pod_labels(of))), access


class TestAllowFrom:
    def test_a_namespace_selector_admits_every_pod_of_those_namespaces(self) -> None:
        of = owner({"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "web"}}}]})
        web = Caller("storefront", {"any": "pod"}, namespace_labels={"team": "web"})
        assert reachable(of, web) == {HTTP, GRPC}
        assert reachable(of, Caller("batch", namespace_labels={"team": "data"})) == set()
        # listing peers replaces the default: the own namespace is no longer in
        assert reachable(of, NEIGHBOUR) == set()

    def test_a_pod_selector_alone_means_this_namespace(self) -> None:
        of = owner({"allowFrom": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]})
        assert reachable(of, Caller(NS, {"app": "gateway"})) == {HTTP, GRPC}
        assert reachable(of, Caller(NS, {"app": "web"})) == set()
        assert reachable(of, Caller("elsewhere", {"app": "gateway"})) == set()

    def test_both_selectors_in_one_peer_must_both_hold(self) -> None:
        peer = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}},
            "podSelector": {"matchLabels": {"app": "gateway"}},
        }
        of = owner({"allowFrom": [peer]})
        assert reachable(of, Caller("edge", {"app": "gateway"})) == {HTTP, GRPC}
        assert reachable(of, Caller("edge", {"app": "web"})) == set()
        assert reachable(of, Caller(NS, {"app": "gateway"})) == set()

    def test_two_peers_admit_either(self) -> None:
        of = owner(
            {
                "allowFrom": [
                    {"podSelector": {}},
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}},
                ]
            }
        )
        assert reachable(of, NEIGHBOUR) == {HTTP, GRPC}
        assert reachable(of, Caller("edge")) == {HTTP, GRPC}
        assert reachable(of, STRANGER) == set()

    def test_match_expressions(self) -> None:
        of = owner(
            {
                "allowFrom": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [
                                {"key": "env", "operator": "In", "values": ["prod", "staging"]},
                                {"key": "quarantined", "operator": "DoesNotExist"},
                            ]
                        },
                        "podSelector": {
                            "matchExpressions": [
                                {"key": "tier", "operator": "NotIn", "values": ["batch"]},
                                {"key": "calls-models", "operator": "Exists"},
                            ]
                        },
                    }
                ]
            }
        )
        good = Caller("shop", {"calls-models": "yes"}, namespace_labels={"env": "prod"})
        assert reachable(of, good) == {HTTP, GRPC}
        for bad in (
            Caller("shop", {"calls-models": "yes"}, namespace_labels={"env": "dev"}),
            Caller("shop", {"calls-models": "y"}, {"env": "prod", "quarantined": "true"}),
            Caller("shop", {"calls-models": "y", "tier": "batch"}, {"env": "prod"}),
            Caller("shop", {"tier": "web"}, namespace_labels={"env": "prod"}),
        ):
            assert reachable(of, bad) == set(), bad

    def test_everyone_must_be_asked_for(self) -> None:
        of = owner({"allowFrom": [{"namespaceSelector": {}}]})
        assert reachable(of, STRANGER) == {HTTP, GRPC}
        assert reachable(of, PROMETHEUS) == {HTTP, GRPC, METRICS}
        assert reachable(of, OPERATOR) == {HTTP, GRPC, ADMIN}

    def test_an_empty_list_admits_no_caller_but_keeps_the_operator_and_prometheus(self) -> None:
        of = owner({"allowFrom": []})
        policy = build_network_policy(of, SETTINGS)
        # A rule without `from` would admit everyone: the callers' rule is left out instead.
        assert all(rule.get("from") for rule in policy["spec"]["ingress"])
        assert reachable(of, NEIGHBOUR) == set()
        assert reachable(of, OPERATOR) == {ADMIN}
        assert reachable(of, PROMETHEUS) == {METRICS}

    def test_prometheus_is_where_the_settings_say(self) -> None:
        settings = SETTINGS.model_copy(
            update={"prometheus_peers": [{"podSelector": {"matchLabels": {"app": "prom"}}}]}
        )
        policy = build_network_policy(owner(), settings)
        labels = pod_labels(owner())
        assert admits(policy, labels, METRICS, Caller(NS, {"app": "prom"}))
        assert not admits(policy, labels, METRICS, PROMETHEUS)
        no_prometheus = SETTINGS.model_copy(update={"prometheus_peers": []})
        policy = build_network_policy(owner(), no_prometheus)
        assert not any(admits(policy, labels, METRICS, c) for c in (PROMETHEUS, NEIGHBOUR))


ACCESS_CASES = {
    "default": None,
    "namespaces": {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "web"}}}]},
    "closed": {"allowFrom": []},
    "expressions": {
        "allowFrom": [
            {
                "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "Exists"}]},
                "podSelector": {
                    "matchLabels": {"app.kubernetes.io/name": "gateway"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge"]}],
                },
            }
        ]
    },
}


@pytest.mark.parametrize("version", ["1.28", "1.33"])
@pytest.mark.parametrize("case", ACCESS_CASES, ids=list(ACCESS_CASES))
def test_the_policy_is_a_valid_kubernetes_object(case: str, version: str) -> None:
    policy = build_network_policy(owner(ACCESS_CASES[case]), SETTINGS)
    kubernetes_validate.validate(policy, version, strict=True)


# --- Refusals: the CRD (as the API server applies it) and the spec say the same ------------------

BAD_ACCESS = [
    ({"allowFrom": [{}]}, "each allowFrom entry needs namespaceSelector, podSelector or both"),
    (
        {"allowFrom": [{"podSelector": {"matchLabels": {"-team": "web"}}}]},
        "a label key is an optional DNS prefix",
    ),
    (
        {"allowFrom": [{"podSelector": {"matchLabels": {"Example.COM/team": "web"}}}]},
        "a label key is an optional DNS prefix",
    ),
    (
        {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "web shop"}}}]},
        "a label value is empty or at most 63",
    ),
    (
        {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "x" * 64}}}]},
        "63",
    ),
    (
        {"allowFrom": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}]},
        "operator In and NotIn need at least one value",
    ),
    (
        {
            "allowFrom": [
                {
                    "podSelector": {
                        "matchExpressions": [
                            {"key": "app", "operator": "Exists", "values": ["web"]}
                        ]
                    }
                }
            ]
        },
        "Exists and DoesNotExist take none",
    ),
    (
        {
            "allowFrom": [
                {"podSelector": {"matchExpressions": [{"key": "a b", "operator": "Exists"}]}}
            ]
        },
        "a label key is an optional DNS prefix",
    ),
    (
        {
            "allowFrom": [
                {
                    "podSelector": {
                        "matchExpressions": [{"key": "app", "operator": "In", "values": ["-x"]}]
                    }
                }
            ]
        },
        "a label value is empty or at most 63",
    ),
    (
        {"allowFrom": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}]},
        "Unsupported value",
    ),
]


@pytest.fixture
def store() -> Store:
    return crd_store(NS)


def create(store: Store, access: dict[str, Any]) -> dict[str, Any]:
    return create_isvc(store, NS, {"access": access})


class TestMalformedSelectorsAreRefused:
    @pytest.mark.parametrize(("access", "message"), BAD_ACCESS)
    def test_by_the_crd(self, store: Store, access: dict[str, Any], message: str) -> None:
        with pytest.raises(errors.ApiError) as caught:
            create(store, access)
        assert caught.value.code == 422
        assert message in caught.value.message, caught.value.message
        assert "spec.access.allowFrom[0]" in caught.value.message

    @pytest.mark.parametrize(("access", "message"), BAD_ACCESS)
    def test_by_the_spec(self, access: dict[str, Any], message: str) -> None:
        spec = {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}}
        expected = "Input should be 'In'" if message == "Unsupported value" else message
        with pytest.raises(ValidationError, match=expected):
            InferenceServiceSpec.model_validate({**spec, "access": access})

    @pytest.mark.parametrize("case", ACCESS_CASES, ids=list(ACCESS_CASES))
    def test_good_ones_pass_both(self, store: Store, case: str) -> None:
        access = ACCESS_CASES[case]
        if access is None:
            return
        created = create(store, copy.deepcopy(access))
        assert created["spec"]["access"] == access
        assert owner(access).spec.access.allow_from is not None

    def test_a_key_with_a_dns_prefix_and_an_empty_value_pass(self, store: Store) -> None:
        labels = {"kubernetes.io/metadata.name": "edge", "example.com/tier": ""}
        access = {"allowFrom": [{"namespaceSelector": {"matchLabels": labels}}]}
        create(store, access)
        owner(access)


class TestTheRulesInForce:
    def test_the_reconciler_creates_the_policy_and_reports_it(self) -> None:
        peer = {"namespaceSelector": {"matchLabels": {"team": "web"}}}
        cluster = Cluster(isvc(access={"allowFrom": [peer]}))
        cluster.reconcile()
        policy = cluster.kube.of(NETWORK_POLICY, NS, "resnet50")
        (ref,) = policy["metadata"]["ownerReferences"]
        assert ref["uid"] == "isvc-uid"
        assert policy["spec"]["ingress"][0]["from"] == [peer]
        access = cluster.body["status"]["access"]
        assert access["networkPolicy"] == "resnet50"
        assert access["inference"] == {
            "ports": [8080, 8081],
            "from": ["pods in namespaces team=web"],
        }
        assert access["text"] == "pods in namespaces team=web"
        assert cluster.writes_of(cluster.reconcile) == []  # converged: nothing to do

    def test_someone_elses_edit_is_put_back(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        policy = cluster.kube.objects[("NetworkPolicy", NS, "resnet50")]
        policy["spec"]["ingress"] = [{}]  # admit everything
        writes = cluster.writes_of(cluster.reconcile)
        assert [w[:2] for w in writes] == [("replace", "NetworkPolicy")]
        assert cluster.kube.of(NETWORK_POLICY, NS, "resnet50")["spec"]["ingress"][0]["from"] == [
            {"podSelector": {}}
        ]

    def test_the_status_in_words(self) -> None:
        default = access_status(owner(), SETTINGS)
        assert default["text"] == "this namespace"
        assert default["inference"]["from"] == [f"pods in namespace {NS}"]
        assert default["admin"] == {
            "ports": [8082],
            "from": [
                "pods app.kubernetes.io/name=batchpilot,app.kubernetes.io/component=operator in "
                "namespaces kubernetes.io/metadata.name=batchpilot-system"
            ],
        }
        assert default["metrics"] == {
            "ports": [8083],
            "from": ["pods in namespaces kubernetes.io/metadata.name=monitoring"],
        }
        assert access_status(owner({"allowFrom": []}), SETTINGS)["text"] == "no one"
        expressions = access_status(owner(ACCESS_CASES["expressions"]), SETTINGS)
        assert expressions["text"] == (
            "pods app.kubernetes.io/name=gateway,tier in (edge) in namespaces env"
        )

    def test_kubectl_shows_it(self) -> None:
        crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
        (version,) = crd["spec"]["versions"]
        (column,) = [c for c in version["additionalPrinterColumns"] if c["name"] == "Access"]
        assert column["jsonPath"] == ".status.access.text"
        assert column["priority"] == 1  # -o wide; `kubectl describe` shows all of status.access
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        assert set(status["access"]["properties"]) == {
            "networkPolicy",
            "inference",
            "admin",
            "metrics",
            "text",
        }
