"""The Helm chart: it lints, renders valid Kubernetes objects, carries the operator's settings."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from batchpilot.operator.settings import OperatorSettings
from tests.deploy.chart import (
    CHART,
    DOWNWARD_API,
    KUBE_VERSIONS,
    NAMESPACE,
    NAMESPACED,
    RELEASE,
    ROOT,
    SCENARIOS,
    SINGLE_OPERATOR,
    RenderError,
    find,
    leader_election_role,
    load,
    one,
    operator_deployment,
    render,
    run_helm,
)

MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
"""prometheus-operator kinds: no offline schema; test_monitoring_and_network checks the monitors
field by field, test_prometheus_rule the rule with promtool."""


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    """The operator container's environment as the process sees it: downward-API variables
    filled in as the kubelet would."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {
        item["name"]: item["value"]
        if "value" in item
        else DOWNWARD_API[item["valueFrom"]["fieldRef"]["fieldPath"]]
        for item in container["env"]
    }


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> OperatorSettings:
    """The operator's settings as the process in the pod would read them."""
    for name in list(OperatorSettings.model_fields):
        monkeypatch.delenv(f"BATCHPILOT_OPERATOR_{name.upper()}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return OperatorSettings()


class TestTheChartIsSound:
    def test_its_crd_is_a_byte_for_byte_copy_of_crds(self) -> None:
        ours = (CHART / "crds" / "inferenceservice.yaml").read_bytes()
        assert ours == (ROOT / "crds" / "inferenceservice.yaml").read_bytes(), (
            "charts/batchpilot/crds/ drifted from crds/: "
            "cp crds/inferenceservice.yaml charts/batchpilot/crds/"
        )
        assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted(
            p.name for p in (ROOT / "crds").iterdir()
        )

    def test_every_documented_crd_upgrade_takes_the_schema_over_from_helm(self) -> None:
        # Helm creates crds/ as field manager "helm", which owns .spec.versions: a server-side
        # apply that changes the schema is refused as a conflict unless it forces it.
        places = [
            CHART / "templates" / "NOTES.txt",
            ROOT / "docs" / "operations.md",
            ROOT / "README.md",
        ]
        for place in places:
            lines = [
                line
                for line in place.read_text().splitlines()
                if "kubectl apply --server-side" in line and "crds/" in line
            ]
            assert lines, f"{place.name} says how to upgrade the CRD"
            for line in lines:
                assert "--force-conflicts" in line, f"{place.name}: {line.strip()}"

    def test_helm_lint_strict_passes(self) -> None:
        result = run_helm("lint", "--strict", str(CHART))
        assert result.returncode == 0, result.stdout + result.stderr

    @pytest.mark.parametrize("scenario", sorted(SCENARIOS))
    def test_helm_lint_strict_passes_with_non_default_values(
        self, scenario: str, tmp_path: Any
    ) -> None:
        values = tmp_path / "values.json"
        values.write_text(json.dumps(SCENARIOS[scenario]))
        result = run_helm("lint", "--strict", str(CHART), "--values", str(values))
        assert result.returncode == 0, result.stdout + result.stderr

    def test_the_default_images_follow_the_charts_app_version(self) -> None:
        chart = load(CHART / "Chart.yaml")
        values = load(CHART / "values.yaml")
        app_version = chart["appVersion"]
        assert values["runtime"]["images"]["cpu"].endswith(f":{app_version}")
        assert values["runtime"]["images"]["gpu"].endswith(f":{app_version}")
        assert values["runtime"]["images"]["torch"].endswith(f":{app_version}")
        image = operator_deployment(render())["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"ghcr.io/batchpilot/operator:{app_version}"


class TestRenderedManifestsAreValid:
    @pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
    @pytest.mark.parametrize("scenario", sorted(SCENARIOS))
    def test_every_object_validates_strictly(self, scenario: str, kube_version: str) -> None:
        docs = render(SCENARIOS[scenario], kube_version=kube_version, include_crds=True)
        problems = []
        for doc in docs:
            if doc["kind"] in MONITORING_KINDS:
                continue
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                first_line = str(exc).splitlines()[0]
                problems.append(f"{doc['kind']} {doc['metadata']['name']}: {first_line}")
        assert problems == []
        kinds = {doc["kind"] for doc in docs}
        assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= kinds or (
            scenario == "bring-your-own-account"
        )

    @pytest.mark.parametrize("scenario", sorted(SCENARIOS))
    def test_namespaced_objects_say_where_they_go(self, scenario: str) -> None:
        cluster_scoped = {
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "FlowSchema",
        }
        for doc in render(SCENARIOS[scenario], include_crds=True):
            if doc["kind"] not in cluster_scoped:
                assert doc["metadata"].get("namespace"), f"{doc['kind']} has no namespace"

    def test_the_crd_is_rendered_only_from_crds(self) -> None:
        docs = render(include_crds=True)
        (crd,) = find(docs, "CustomResourceDefinition")
        assert crd == load(ROOT / "crds" / "inferenceservice.yaml")
        assert find(render(), "CustomResourceDefinition") == []


class TestHighAvailability:
    def test_two_operators_one_leading_and_upgrades_start_a_standby_first(self) -> None:
        docs = render()
        spec = operator_deployment(docs)["spec"]
        assert spec["replicas"] == 2
        # Never fewer pods than asked: the leader stops (and hands over) only once a new
        # standby is up.
        assert spec["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
        env = env_of(operator_deployment(docs))
        assert env["BATCHPILOT_OPERATOR_LEADER_ELECTION"] == "true"
        assert leader_election_role(docs) is not None

    def test_the_pod_knows_its_name_and_namespace_from_the_downward_api(self) -> None:
        (container,) = operator_deployment(render())["spec"]["template"]["spec"]["containers"]
        downward = {
            item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"]
            for item in container["env"]
            if "valueFrom" in item
        }
        assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}

    def test_the_operator_uses_the_lease_that_rbac_names(self) -> None:
        docs = render(NAMESPACED)
        env = env_of(operator_deployment(docs))
        role = leader_election_role(docs)
        assert role is not None
        assert role["metadata"]["namespace"] == env["BATCHPILOT_OPERATOR_LEASE_NAMESPACE"]
        assert env["BATCHPILOT_OPERATOR_LEASE_NAMESPACE"] == NAMESPACE
        named = [rule["resourceNames"] for rule in role["rules"] if "resourceNames" in rule]
        assert named == [[env["BATCHPILOT_OPERATOR_LEASE_NAME"]]]
        assert env["BATCHPILOT_OPERATOR_LEASE_NAME"] == f"{RELEASE}-operator"

    def test_the_leases_requests_have_a_flow_of_their_own(self) -> None:
        """API Priority and Fairness: the renewals go to the leader-election priority level,
        apart from the operator's own writes, which an API server in trouble throttles."""
        docs = render(NAMESPACED)
        env = env_of(operator_deployment(docs))
        (schema,) = find(docs, "FlowSchema")
        assert schema["spec"]["priorityLevelConfiguration"] == {"name": "leader-election"}
        (rule,) = schema["spec"]["rules"]
        (subject,) = rule["subjects"]
        account = operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
        assert subject["serviceAccount"] == {"name": account, "namespace": NAMESPACE}
        (resources,) = rule["resourceRules"]
        assert resources["resources"] == ["leases"]
        assert resources["apiGroups"] == ["coordination.k8s.io"]
        assert resources["namespaces"] == [env["BATCHPILOT_OPERATOR_LEASE_NAMESPACE"]]
        assert (
            find(render({"operator": {"leaderElection": {"priorityLevel": ""}}}), "FlowSchema")
            == []
        )
        assert find(render(SINGLE_OPERATOR), "FlowSchema") == []

    def test_a_budget_keeps_an_operator_pod_through_drains(self) -> None:
        docs = render(NAMESPACED)
        budget = one(docs, "PodDisruptionBudget", f"{RELEASE}-operator")
        assert budget["spec"]["minAvailable"] == 1
        selector = operator_deployment(docs)["spec"]["selector"]
        assert budget["spec"]["selector"] == selector

    def test_operator_pods_prefer_different_nodes(self) -> None:
        deployment = operator_deployment(render())
        anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        # Preferred, not required: a one-node cluster still runs a standby.
        (term,) = anti.pop("preferredDuringSchedulingIgnoredDuringExecution")
        assert anti == {}
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert term["podAffinityTerm"]["labelSelector"] == deployment["spec"]["selector"]

    def test_an_affinity_of_ones_own_replaces_the_default(self) -> None:
        spread = {
            "topologyKey": "topology.kubernetes.io/zone",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
        }
        own = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}}
        pod = operator_deployment(render({"operator": {"affinity": own}}))["spec"]["template"]
        assert pod["spec"]["affinity"] == own

    def test_one_operator_without_leader_election_is_recreated(self) -> None:
        docs = render(SINGLE_OPERATOR)
        spec = operator_deployment(docs)["spec"]
        assert spec["replicas"] == 1
        assert spec["strategy"] == {"type": "Recreate"}  # the old pod stops before the new one
        assert env_of(operator_deployment(docs))["BATCHPILOT_OPERATOR_LEADER_ELECTION"] == "false"
        assert find(docs, "PodDisruptionBudget") == []  # it would block every drain
        assert leader_election_role(docs) is None

    def test_more_operators_without_leader_election_are_refused(self) -> None:
        with pytest.raises(RenderError, match=r"needs operator\.leaderElection\.enabled"):
            render({"operator": {"leaderElection": {"enabled": False}}})


class TestTheOperatorDeployment:
    def test_it_runs_the_operator_with_kopfs_liveness_endpoint(self) -> None:
        pod = operator_deployment(render())["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ["batchpilot"]
        assert container["args"] == [
            "operator",
            "run",
            "--liveness",
            "http://0.0.0.0:8081/healthz",
        ]
        probe = container["livenessProbe"]["httpGet"]
        assert probe["path"] == "/healthz"
        port, metrics = container["ports"]
        assert probe["port"] == port["name"]
        assert port["containerPort"] == 8081
        # The operator's own metrics, on the port its setting names.
        assert (metrics["name"], metrics["containerPort"]) == ("metrics", 8084)
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert env["BATCHPILOT_OPERATOR_METRICS_PORT"] == "8084"
        # A standby answers it too: ready as soon as the process is, whether it leads or not.
        assert container["readinessProbe"]["httpGet"] == probe

    def test_its_service_account_is_the_one_rbac_binds(self) -> None:
        docs = render(NAMESPACED)
        account = operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
        assert one(docs, "ServiceAccount")["metadata"]["name"] == account
        for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
            ]

    def test_bring_your_own_account_renders_no_account_and_no_rbac(self) -> None:
        docs = render(SCENARIOS["bring-your-own-account"])
        kinds = {doc["kind"] for doc in docs}
        assert kinds.isdisjoint({"ServiceAccount", "ClusterRole", "Role", "RoleBinding"})
        pod = operator_deployment(docs)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "batchpilot-operator"
        assert pod["containers"][0]["image"] == "ghcr.io/batchpilot/operator:0.1.1"

    def test_a_digest_wins_over_the_tag(self) -> None:
        pod = operator_deployment(render(NAMESPACED))["spec"]["template"]["spec"]
        image = pod["containers"][0]["image"]
        assert image == "registry.example.com/batchpilot/operator@sha256:" + "b" * 64
        assert pod["containers"][0]["args"][-1] == "--verbose"


class TestSettings:
    def test_every_operator_setting_is_a_chart_value(self, monkeypatch: pytest.MonkeyPatch) -> None:
        env = env_of(operator_deployment(render(NAMESPACED)))
        ours = {name for name in env if name.startswith("BATCHPILOT_OPERATOR_")}
        fields = {f"BATCHPILOT_OPERATOR_{name.upper()}" for name in OperatorSettings.model_fields}
        assert ours == fields, "the chart and operator/batchpilot/operator/settings.py disagree"

    def test_the_operator_reads_back_what_the_values_say(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        env = env_of(operator_deployment(render(NAMESPACED)))
        settings = settings_from(env, monkeypatch)
        runtime, gpu = NAMESPACED["runtime"], NAMESPACED["gpu"]
        assert settings.namespaces == ["team-a", "team-b"]
        assert settings.prometheus_url == NAMESPACED["prometheus"]["url"]
        assert settings.runtime_image_cpu == runtime["images"]["cpu"]
        assert settings.runtime_image_gpu == runtime["images"]["gpu"]
        assert settings.runtime_image_torch == runtime["images"]["torch"]
        assert settings.image_pull_policy == "Always"
        assert settings.runtime_image_pull_secrets == ["mirror", "mirror-2"]
        assert settings.runtime_port == 9000
        assert settings.storage_initializer_image == runtime["storageInitializerImage"]
        assert settings.drain_grace_seconds == 40
        assert settings.pre_stop_sleep_seconds == 3
        assert settings.rollout_in_place_after_seconds == 300
        assert settings.rollout_in_place_max_services == 5
        assert settings.gpu_resource == gpu["resource"]
        assert settings.gpu_node_selector == gpu["nodeSelector"]
        assert settings.gpu_tolerations == gpu["tolerations"]
        assert settings.utilization_source == "dcgm"
        assert settings.autopilot_interval_seconds == 7.5
        assert settings.metrics_window_seconds == 120
        assert settings.pod_metrics_fallback is False
        assert settings.metrics_port == 8084
        assert settings.reconcile_interval_seconds == 30
        assert settings.leader_election is True
        assert settings.lease_name == "batchpilot-operator"
        assert settings.lease_namespace == NAMESPACE
        assert settings.lease_duration_seconds == 30
        assert settings.renew_deadline_seconds == 20
        assert settings.retry_period_seconds == 4
        assert env["TZ"] == "UTC"

    def test_default_values_give_the_operators_defaults(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        env = env_of(operator_deployment(render()))
        assert "BATCHPILOT_OPERATOR_STORAGE_INITIALIZER_IMAGE" not in env
        # The operator's defaults in that pod: the lease in its own namespace (POD_NAMESPACE),
        # and leader election on (its default with in-cluster credentials; the chart says so);
        # its metrics on a port (none by hand, where a port of its own could be taken).
        pod = {name: value for name, value in env.items() if name.startswith("POD_")}
        defaults = settings_from(pod, monkeypatch).model_copy(
            update={"leader_election": True, "metrics_port": 8084}
        )
        assert settings_from(env, monkeypatch) == defaults

    @pytest.mark.parametrize("source", ["busy", "nvml", "dcgm"])
    def test_each_gpu_metric_source_reaches_the_operator(
        self, source: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        env = env_of(operator_deployment(render({"gpu": {"utilizationSource": source}})))
        assert settings_from(env, monkeypatch).utilization_source == source


class TestValuesSchema:
    @pytest.mark.parametrize(
        ("values", "complaint"),
        [
            ({"gpu": {"utilizationSource": "prometheus"}}, "utilizationSource"),
            ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
            ({"prometheus": {"url": "prometheus:9090"}}, "prometheus.url"),
            ({"runtime": {"port": 0}}, "runtime.port"),
            ({"operator": {"image": {"digest": "latest"}}}, "digest"),
            ({"autopilot": {"intervalSeconds": 0}}, "intervalSeconds"),
            ({"monitoring": {"podMonitor": {"enabled": True, "interval": "soon"}}}, "interval"),
            (
                {"monitoring": {"prometheusRule": {"alerts": {"fast": {"longWindow": "1 hour"}}}}},
                "longWindow",
            ),
            (
                {"monitoring": {"prometheusRule": {"alerts": {"slow": {"burnRate": 0}}}}},
                "burnRate",
            ),
            ({"prometheusUrl": "http://x:9090"}, "prometheusUrl"),
            ({"operator": {"replicas": 0}}, "replicas"),
            (
                {"operator": {"leaderElection": {"leaseDurationSeconds": 10}}},
                "leaseDurationSeconds must be longer than renewDeadlineSeconds",
            ),
            (
                {"operator": {"leaderElection": {"retryPeriodSeconds": 9}}},
                r"renewDeadlineSeconds must be over 1\.2",
            ),
            ({"operator": {"leaderElection": {"leaseName": "x"}}}, "leaseName"),
        ],
    )
    def test_wrong_values_are_refused_with_the_key(self, values: Any, complaint: str) -> None:
        with pytest.raises(RenderError, match=complaint):
            render(values)

    @pytest.mark.parametrize(
        ("monitoring", "autopilot", "complaint"),
        [
            (
                {"podMonitor": {"enabled": True, "interval": "1m"}},
                {},
                r"autopilot\.metricsWindowSeconds \(60 s\) must hold two scrapes of "
                r"monitoring\.podMonitor\.interval \(1m\)",
            ),
            (
                {"serviceMonitor": {"enabled": True, "interval": "20s"}},
                {},
                r"autopilot\.recentWindowSeconds \(30 s\) must hold two scrapes of "
                r"monitoring\.serviceMonitor\.interval \(20s\)",
            ),
            (
                {"podMonitor": {"enabled": True, "interval": "1m30s"}},
                {"metricsWindowSeconds": 179, "recentWindowSeconds": 180},
                r"metricsWindowSeconds \(179 s\)",
            ),
        ],
    )
    def test_windows_that_cannot_hold_two_scrapes_are_refused(
        self, monitoring: Any, autopilot: Any, complaint: str
    ) -> None:
        with pytest.raises(RenderError, match=complaint):
            render({"monitoring": monitoring, "autopilot": autopilot})

    def test_windows_of_two_scrapes_or_more_render(self) -> None:
        for interval, windows in (("30s", (60, 60)), ("5s", (60, 10)), ("500ms", (10, 2))):
            render(
                {
                    "monitoring": {"podMonitor": {"enabled": True, "interval": interval}},
                    "autopilot": dict(
                        zip(("metricsWindowSeconds", "recentWindowSeconds"), windows, strict=True)
                    ),
                }
            )

    def test_both_monitors_at_once_are_refused(self) -> None:
        both = {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}
        with pytest.raises(RenderError, match="not both"):
            render({"monitoring": both})

    def test_the_chart_refuses_kubernetes_older_than_cel_needs(self) -> None:
        with pytest.raises(RenderError, match="kubeVersion"):
            render(kube_version="1.28.0")
