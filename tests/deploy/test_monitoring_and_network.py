"""The chart's optional parts meet the pods the operator actually creates: the Pod/ServiceMonitor
select the runtime pods and their metrics port, the NetworkPolicies let exactly the operator,
Prometheus and clients in. Checked against the operator's own builders, not against copies."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.networkpolicy import build_network_policy
from batchpilot.operator.children.service import build_service
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from tests.deploy.chart import (
    CLUSTERWIDE_MONITORED,
    NAMESPACE,
    NAMESPACED,
    ROOT,
    find,
    one,
    operator_deployment,
    render,
)
from tests.deploy.test_chart import env_of, settings_from


def runtime_children(*, port: int = 8080) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
    owner = Owner(
        name=doc["metadata"]["name"],
        namespace="team-a",
        uid="uid-1",
        spec=InferenceServiceSpec.model_validate(doc["spec"]),
    )
    settings = OperatorSettings(runtime_port=port)
    return build_deployment(owner, settings, replicas=1), build_service(owner)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are used"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


class TestMonitors:
    def test_none_by_default(self) -> None:
        kinds = {doc["kind"] for doc in render()}
        assert kinds.isdisjoint({"PodMonitor", "ServiceMonitor", "NetworkPolicy"})

    def test_the_pod_monitor_scrapes_the_runtime_pods_metrics_port(self) -> None:
        monitor = one(render(NAMESPACED), "PodMonitor", "batchpilot-runtime")
        deployment, _ = runtime_children()
        template = deployment["spec"]["template"]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert selects(monitor["spec"]["selector"], template["metadata"]["labels"])
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        (container,) = template["spec"]["containers"]
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
        assert endpoint["path"] == template["metadata"]["annotations"]["prometheus.io/path"]
        assert endpoint.get("honorLabels", False) is False
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
        assert monitor["metadata"]["labels"]["release"] == "kps"
        assert monitor["metadata"]["namespace"] == NAMESPACE

    def test_the_service_monitor_scrapes_the_runtime_services(self) -> None:
        monitor = one(render(CLUSTERWIDE_MONITORED), "ServiceMonitor")
        _, service = runtime_children()
        assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"
        assert monitor["spec"]["namespaceSelector"] == {"any": True}
        assert monitor["metadata"]["namespace"] == "monitoring"

    def test_the_operators_own_pod_is_not_scraped_as_a_runtime(self) -> None:
        monitor = one(render(NAMESPACED), "PodMonitor", "batchpilot-runtime")
        operator_labels = operator_deployment(render(NAMESPACED))["spec"]["template"]["metadata"]
        assert not selects(monitor["spec"]["selector"], operator_labels["labels"])

    def test_the_operators_own_metrics_have_a_pod_monitor_of_their_own(self) -> None:
        docs = render(NAMESPACED)
        monitor = one(docs, "PodMonitor", "batchpilot-operator")
        template = operator_deployment(docs)["spec"]["template"]
        assert selects(monitor["spec"]["selector"], template["metadata"]["labels"])
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        (container,) = template["spec"]["containers"]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert monitor["metadata"]["labels"]["release"] == "kps"
        # Without a metrics port, no monitor for it (and no port).
        quiet = render({**NAMESPACED, "operator": {**NAMESPACED["operator"], "metricsPort": 0}})
        assert [m["metadata"]["name"] for m in find(quiet, "PodMonitor")] == ["batchpilot-runtime"]
        (container,) = operator_deployment(quiet)["spec"]["template"]["spec"]["containers"]
        assert [p["name"] for p in container["ports"]] == ["healthz"]


class TestNetworkPolicies:
    def test_only_the_operator_is_fenced_by_the_chart(self) -> None:
        # The runtime pods' policies are the operator's, one per InferenceService.
        for values in (CLUSTERWIDE_MONITORED, NAMESPACED):
            (policy,) = find(render(values), "NetworkPolicy")
            assert policy["metadata"]["namespace"] == NAMESPACE

    def test_the_operator_policy_selects_the_operator_and_lets_it_do_its_job(self) -> None:
        docs = render(NAMESPACED)
        policy = one(docs, "NetworkPolicy", "batchpilot-operator")
        pod = operator_deployment(docs)["spec"]["template"]
        assert selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        ingress, metrics = policy["spec"]["ingress"]
        assert [p["port"] for p in ingress["ports"]] == [9081]  # the liveness port, from anyone
        # Its metrics port, from Prometheus only.
        assert [p["port"] for p in metrics["ports"]] == [8084]
        assert metrics["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
        egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        # DNS, the API server (values), Prometheus, the runtime pods' admin port (its default).
        assert egress_ports == {53, 443, 9090, 8082}
        (api_rule,) = [r for r in policy["spec"]["egress"] if r["ports"][0]["port"] == 443]
        assert api_rule["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}]
        deployment, _ = runtime_children(port=9000)
        (runtime_rule,) = [r for r in policy["spec"]["egress"] if r["ports"][0]["port"] == 8082]
        (peer,) = runtime_rule["to"]
        assert selects(peer["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "admin", "containerPort": 8082, "protocol": "TCP"} in container["ports"]

    def test_the_inference_services_policies_admit_this_operator_and_prometheus(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        docs = render(NAMESPACED)
        settings = settings_from(env_of(operator_deployment(docs)), monkeypatch)
        doc = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
        owner = Owner(
            name="resnet50",
            namespace="team-a",
            uid="uid-1",
            spec=InferenceServiceSpec.model_validate(doc["spec"]),
        )
        policy = build_network_policy(owner, settings)
        inference, peers, admin, metrics = policy["spec"]["ingress"]
        assert [p["port"] for p in inference["ports"]] == [9000, 8081]  # runtime.port, grpcPort
        assert [p["port"] for p in peers["ports"]] == [9000]  # async fetches passed on
        (operator_peer,) = admin["from"]
        operator_labels = operator_deployment(docs)["spec"]["template"]["metadata"]["labels"]
        assert selects(operator_peer["podSelector"], operator_labels)
        assert operator_peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
        }
        assert metrics["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
        assert [p["port"] for p in admin["ports"] + metrics["ports"]] == [8082, 8083]
