"""The child builders: golden manifests for each example, valid against Kubernetes' own schemas.

`UPDATE_GOLDEN=1 pytest tests/operator/test_children.py` rewrites the golden files after an
intended change; review the diff like code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import UnsupportedModelSource, build_deployment
from batchpilot.operator.plan import Owned, desired_children
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSIONS = ["1.28", "1.33"]


def owner_of(path: Path) -> Owner:
    doc = yaml.safe_load(path.read_text())
    return Owner(
        name=doc["metadata"]["name"],
        namespace=doc["metadata"]["namespace"],
        uid="0b7e2f4c-uid",
        spec=InferenceServiceSpec.model_validate(doc["spec"]),
    )


def render(owner: Owner, *, replicas: int = 2) -> list[dict[str, Any]]:
    owned = Owned(replicas=replicas, batch_size=4, max_queue_delay_ms=5.0, token="test-token")
    children = desired_children(owner, OperatorSettings(), owned)
    return [child for child in children.values() if child is not None]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_children_match_the_golden_manifests(example: Path) -> None:
    rendered = yaml.safe_dump_all(render(owner_of(example)), sort_keys=True)
    golden = GOLDEN / f"{example.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text(), f"rerun with UPDATE_GOLDEN=1 if {golden} should change"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_children_are_valid_kubernetes_objects(example: Path, version: str) -> None:
    for child in render(owner_of(example)):
        kubernetes_validate.validate(child, version, strict=True)


class TestDeployment:
    def test_gpu_replicas_get_one_gpu_and_the_gpu_node_tolerations(self) -> None:
        deployment = build_deployment(
            owner_of(ROOT / "examples" / "resnet50-gpu.yaml"), OperatorSettings(), replicas=1
        )
        pod = deployment["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"

    def test_cpu_replicas_get_no_gpu(self) -> None:
        deployment = build_deployment(
            owner_of(ROOT / "examples" / "orientation-cpu.yaml"), OperatorSettings(), replicas=1
        )
        pod = deployment["spec"]["template"]["spec"]
        assert "nvidia.com/gpu" not in str(pod)
        assert pod["initContainers"][0]["args"][:2] == ["runtime", "fetch"]

    def test_batch_settings_are_not_in_the_pod_template(self) -> None:
        # Changing the batch size must never roll the pods.
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        a = desired_children(owner, OperatorSettings(), Owned(1, 1, 5.0, "t"))
        b = desired_children(owner, OperatorSettings(), Owned(1, 32, 2.0, "t"))
        assert list(a.values())[2]["spec"]["template"] == list(b.values())[2]["spec"]["template"]

    def test_the_grace_period_covers_the_pre_stop_pause_and_the_drain(self) -> None:
        settings = OperatorSettings(pre_stop_sleep_seconds=5, drain_grace_seconds=25)
        deployment = build_deployment(
            owner_of(ROOT / "examples" / "resnet50-gpu.yaml"), settings, replicas=1
        )
        pod = deployment["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > 5 + 25
        args = pod["containers"][0]["args"]
        assert args[args.index("--drain-grace-s") + 1] == "25"

    def test_an_s3_model_uses_the_storage_initializer_when_configured(self) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        s3 = Owner(
            name=owner.name,
            namespace=owner.namespace,
            uid=owner.uid,
            spec=owner.spec.model_copy(
                update={"model": owner.spec.model.model_copy(update={"uri": "s3://b/r50.onnx"})}
            ),
        )
        with pytest.raises(UnsupportedModelSource):
            build_deployment(s3, OperatorSettings(), replicas=1)
        settings = OperatorSettings(storage_initializer_image="kserve/storage-initializer:v0.14")
        pod = build_deployment(s3, settings, replicas=1)["spec"]["template"]["spec"]
        assert pod["initContainers"][0]["args"] == ["s3://b/r50.onnx", "/models"]
        args = pod["containers"][0]["args"]
        assert args[args.index("--model") + 1] == "/models/r50.onnx"
