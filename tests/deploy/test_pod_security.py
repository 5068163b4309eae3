"""Every pod batchpilot runs passes the Kubernetes "restricted" Pod Security Standard: the
operator's (from the chart) and the runtime's (as the operator renders them, for every example)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from tests.deploy import pss
from tests.deploy.chart import ROOT, SCENARIOS, operator_deployment, render

INFERENCESERVICE_FILES = [
    *sorted((ROOT / "examples").glob("*.yaml")),
    ROOT / "hack" / "kind" / "inferenceservices.yaml",
]
STORAGE_INITIALIZER = "kserve/storage-initializer:v0.14.1"


def inference_services() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in INFERENCESERVICE_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                found.append((f"{path.parent.name}/{doc['metadata']['name']}", doc))
    # Every way of getting a model into a pod: pvc, file, https (fetch-model), s3 (initializer).
    s3 = copy.deepcopy(found[0][1])
    s3["spec"]["model"]["uri"] = "s3://models/resnet50/model.onnx"
    found.append(("s3/" + s3["metadata"]["name"], s3))
    return found


SERVICES = inference_services()


def runtime_pod(doc: dict[str, Any]) -> dict[str, Any]:
    owner = Owner(
        name=doc["metadata"]["name"],
        namespace=doc["metadata"].get("namespace", "default"),
        uid="uid-1",
        spec=InferenceServiceSpec.model_validate(doc["spec"]),
    )
    settings = OperatorSettings(storage_initializer_image=STORAGE_INITIALIZER)
    return pss.pod_spec_of(build_deployment(owner, settings, replicas=2))


class TestRuntimePods:
    def test_every_model_source_is_covered(self) -> None:
        names = [name for name, _ in SERVICES]
        assert "kind/orientation" in names
        assert "examples/resnet50" in names
        schemes = {doc["spec"]["model"]["uri"].split("://")[0] for _, doc in SERVICES}
        assert schemes >= {"pvc", "file", "https", "s3"}

    @pytest.mark.parametrize(("name", "doc"), SERVICES, ids=[name for name, _ in SERVICES])
    def test_the_runtime_pods_are_restricted(self, name: str, doc: dict[str, Any]) -> None:
        pod = runtime_pod(doc)
        assert pss.restricted_violations(pod) == []

    @pytest.mark.parametrize(("name", "doc"), SERVICES, ids=[name for name, _ in SERVICES])
    def test_the_runtime_root_filesystem_is_read_only(self, name: str, doc: dict[str, Any]) -> None:
        for where, container in pss.containers(runtime_pod(doc)):
            assert container["securityContext"].get("readOnlyRootFilesystem") is True, where


class TestOperatorPod:
    @pytest.mark.parametrize("scenario", sorted(SCENARIOS))
    def test_the_operator_pod_is_restricted(self, scenario: str) -> None:
        pod = pss.pod_spec_of(operator_deployment(render(SCENARIOS[scenario])))
        assert pss.restricted_violations(pod) == []
        for where, container in pss.containers(pod):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where

    def test_every_chart_workload_is_restricted(self) -> None:
        for scenario in SCENARIOS.values():
            for doc in render(scenario):
                if doc["kind"] in pss.POD_KINDS:
                    assert pss.restricted_violations(pss.pod_spec_of(doc)) == []


class TestKindPods:
    def test_the_kind_prometheus_is_restricted(self) -> None:
        docs = yaml.safe_load_all((ROOT / "hack" / "kind" / "prometheus.yaml").read_text())
        workloads = [d for d in docs if d and d["kind"] in pss.POD_KINDS]
        assert workloads
        for doc in workloads:
            assert pss.restricted_violations(pss.pod_spec_of(doc)) == []


def _worst_pod() -> dict[str, Any]:
    """A pod that breaks every control once."""
    bad_context = {
        "privileged": True,
        "allowPrivilegeEscalation": True,
        "runAsNonRoot": False,
        "runAsUser": 0,
        "capabilities": {"add": ["SYS_ADMIN", "NET_RAW"]},
        "procMount": "Unmasked",
        "seccompProfile": {"type": "Unconfined"},
        "seLinuxOptions": {"type": "spc_t", "user": "root"},
        "appArmorProfile": {"type": "Unconfined"},
        "windowsOptions": {"hostProcess": True},
    }
    return {
        "hostNetwork": True,
        "hostPID": True,
        "hostIPC": True,
        "securityContext": {
            "runAsUser": 0,
            "seccompProfile": {"type": "Unconfined"},
            "sysctls": [{"name": "kernel.msgmax", "value": "1"}],
        },
        "containers": [
            {
                "name": "bad",
                "ports": [{"containerPort": 80, "hostPort": 80}],
                "securityContext": bad_context,
            }
        ],
        "volumes": [
            {"name": "root", "hostPath": {"path": "/"}},
            {"name": "nfs", "nfs": {"server": "x", "path": "/"}},
        ],
    }


def _drop_run_as_non_root(pod: dict[str, Any]) -> None:
    pod["securityContext"].pop("runAsNonRoot")
    for _, container in pss.containers(pod):
        container["securityContext"].pop("runAsNonRoot", None)


class TestTheCheckerItself:
    @pytest.mark.parametrize("check", pss.RESTRICTED, ids=lambda c: c.__name__)
    def test_each_control_catches_its_violation(self, check: Any) -> None:
        assert list(check(_worst_pod())), f"{check.__name__} let the worst pod through"

    def test_a_minimal_restricted_pod_passes(self) -> None:
        pod = {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "ok",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                    },
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        }
        assert pss.restricted_violations(pod) == []

    @pytest.mark.parametrize(
        ("change", "control"),
        [
            (_drop_run_as_non_root, "Running as Non-root"),
            (lambda pod: pod["securityContext"].pop("seccompProfile"), "Seccomp"),
            (lambda pod: pod["containers"][0]["securityContext"].pop("capabilities"), "drop ALL"),
            (
                lambda pod: pod["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
                "Privilege Escalation",
            ),
        ],
    )
    def test_a_missing_setting_is_a_violation_too(self, change: Any, control: str) -> None:
        pod = runtime_pod(SERVICES[0][1])
        change(pod)
        assert any(control in message for message in pss.restricted_violations(pod))
