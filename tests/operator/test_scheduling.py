"""Where and how the runtime pods run: affinity, topology spread, priority class, service
account, image pull secrets, pod labels and annotations — from `spec.runtime` into the pod
template, refused by the CRD (and the spec models, with the same words) when they cannot work."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox import errors
from tests.operator.crd_store import crd_store, create_isvc

NS = "vision"
ZONES = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
}
GPU_NODES = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "nvidia.com/gpu.product",
                            "operator": "In",
                            "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"],
                        }
                    ]
                }
            ]
        }
    }
}
PLACED = {
    "affinity": GPU_NODES,
    "topologySpreadConstraints": [
        ZONES,
        {
            "maxSkew": 2,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"team": "vision"}},
        },
    ],
    "priorityClassName": "inference-critical",
    "serviceAccountName": "model-reader",
    "imagePullSecrets": [{"name": "regcred"}],
    "podLabels": {"team": "vision", "app.kubernetes.io/instance": "not-this"},
    "podAnnotations": {"sidecar.istio.io/inject": "false", "prometheus.io/port": "1"},
}


def owner(runtime: dict[str, Any]) -> Owner:
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"uri": "pvc://models/r50.onnx"},
            "sla": {"latencyP99Ms": 100},
            "runtime": runtime,
        }
    )
    return Owner(name="resnet50", namespace=NS, uid="uid-1", spec=spec)


def template(runtime: dict[str, Any], settings: OperatorSettings | None = None) -> dict[str, Any]:
    deployment = build_deployment(owner(runtime), settings or OperatorSettings(), replicas=2)
    return deployment["spec"]["template"]  # type: ignore[no-any-return]


class TestThePodTemplate:
    def test_every_field_reaches_the_pods_as_written(self) -> None:
        pod = template(copy.deepcopy(PLACED))
        spec = pod["spec"]
        assert spec["affinity"] == GPU_NODES
        assert spec["priorityClassName"] == "inference-critical"
        assert spec["serviceAccountName"] == "model-reader"
        assert spec["automountServiceAccountToken"] is False  # the account, not its API token
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        zones, hosts = spec["topologySpreadConstraints"]
        # Without a labelSelector a constraint spreads this service's pods; one given is kept.
        assert zones == {
            **ZONES,
            "labelSelector": {"matchLabels": {"batchpilot.io/inferenceservice": "resnet50"}},
        }
        assert hosts["labelSelector"] == {"matchLabels": {"team": "vision"}}

    def test_the_operators_labels_and_annotations_win(self) -> None:
        metadata = template(copy.deepcopy(PLACED))["metadata"]
        assert metadata["labels"]["team"] == "vision"
        assert metadata["labels"]["app.kubernetes.io/instance"] == "resnet50"  # the selector's
        assert metadata["annotations"]["sidecar.istio.io/inject"] == "false"
        assert metadata["annotations"]["prometheus.io/port"] == "8083"  # where metrics are

    def test_the_result_is_a_valid_deployment(self) -> None:
        deployment = build_deployment(owner(copy.deepcopy(PLACED)), OperatorSettings(), replicas=2)
        kubernetes_validate.validate(deployment, "1.33", strict=True)

    def test_pull_secrets_default_to_the_operators_and_the_spec_may_say_none(self) -> None:
        settings = OperatorSettings(runtime_image_pull_secrets=["mirror"])
        assert template({}, settings)["spec"]["imagePullSecrets"] == [{"name": "mirror"}]
        assert "imagePullSecrets" not in template({"imagePullSecrets": []}, settings)["spec"]
        own = template({"imagePullSecrets": [{"name": "own"}]}, settings)["spec"]
        assert own["imagePullSecrets"] == [{"name": "own"}]
        assert "imagePullSecrets" not in template({})["spec"]

    def test_without_them_the_template_is_as_before(self) -> None:
        spec = template({})["spec"]
        for field in ("affinity", "topologySpreadConstraints", "priorityClassName"):
            assert field not in spec
        assert "serviceAccountName" not in spec

    def test_the_settings_come_from_the_environment_as_the_chart_writes_them(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("BATCHPILOT_OPERATOR_RUNTIME_IMAGE_PULL_SECRETS", '["a","b"]')
        assert OperatorSettings().runtime_image_pull_secrets == ["a", "b"]


BAD = [
    ({"priorityClassName": "Critical_Tier"}, "priorityClassName names a PriorityClass"),
    ({"serviceAccountName": "model reader"}, "serviceAccountName names a ServiceAccount"),
    ({"imagePullSecrets": [{"name": "Reg.Cred-"}]}, "imagePullSecrets[].name names a Secret"),
    ({"podLabels": {"team/": "x"}}, "a label key is an optional DNS prefix"),
    ({"podLabels": {"team": "a b"}}, "a label value is empty or at most 63"),
    ({"podAnnotations": {"-bad": "any value at all"}}, "a label key is an optional DNS prefix"),
]


class TestBadSpecsAreRefused:
    @pytest.mark.parametrize(("runtime", "message"), BAD)
    def test_by_the_crd(self, runtime: dict[str, Any], message: str) -> None:
        with pytest.raises(errors.ApiError) as caught:
            create_isvc(crd_store(NS), NS, {"runtime": runtime})
        assert caught.value.code == 422
        assert message in caught.value.message, caught.value.message

    @pytest.mark.parametrize(("runtime", "message"), BAD)
    def test_by_the_spec(self, runtime: dict[str, Any], message: str) -> None:
        with pytest.raises(ValidationError) as caught:
            owner(runtime)
        assert message in str(caught.value)

    @pytest.mark.parametrize(
        ("constraint", "message"),
        [
            ({"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}, "topologyKey: Required value"),
            ({**ZONES, "maxSkew": 0}, "should be greater than or equal to 1"),
            ({**ZONES, "whenUnsatisfiable": "Sometimes"}, 'Unsupported value: "Sometimes"'),
        ],
    )
    def test_a_spread_constraint_kubernetes_would_refuse(
        self, constraint: dict[str, Any], message: str
    ) -> None:
        runtime = {"topologySpreadConstraints": [constraint]}
        with pytest.raises(errors.ApiError) as caught:
            create_isvc(crd_store(NS), NS, {"runtime": runtime})
        assert message in caught.value.message, caught.value.message

    def test_a_good_one_passes_both(self) -> None:
        created = create_isvc(crd_store(NS), NS, {"runtime": copy.deepcopy(PLACED)})
        assert (
            created["spec"]["runtime"]["topologySpreadConstraints"]
            == PLACED["topologySpreadConstraints"]
        )
        assert (
            owner(created["spec"]["runtime"]).spec.runtime.priority_class_name
            == "inference-critical"
        )
