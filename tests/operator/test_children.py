"""The child builders: golden manifests for each example, valid against Kubernetes' own schemas.

`UPDATE_GOLDEN=1 pytest tests/operator/test_children.py` rewrites the golden files after an
intended change; review the diff like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from batchpilot.operator.children.common import BATCHING_FILE, Owner
from batchpilot.operator.children.deployment import UnsupportedModelSource, build_deployment
from batchpilot.operator.kinds import DEPLOYMENT
from batchpilot.operator.plan import Owned, desired_children
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.live_settings import parse_batching

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSIONS = ["1.28", "1.33"]


GPU = "nvidia.com/gpu"


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

    @pytest.mark.parametrize(
        ("device", "resources", "want"),
        [
            ("gpu", None, {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU: "1"}}),
            # Limits alone are the requests too (Kubernetes copies them): no default request
            # above a smaller limit, which the API server would refuse.
            (
                "cpu",
                {"limits": {"cpu": "500m", "memory": "512Mi"}},
                {"limits": {"cpu": "500m", "memory": "512Mi"}},
            ),
            ("cpu", {"limits": {"cpu": 2}}, {"requests": {"memory": "1Gi"}, "limits": {"cpu": 2}}),
            # The GPUs the spec asks for, request and limit alike (an extended resource's must
            # be equal).
            (
                "gpu",
                {"requests": {GPU: 2}},
                {"requests": {GPU: 2, "cpu": "1", "memory": "1Gi"}, "limits": {GPU: 2}},
            ),
            (
                "gpu",
                {"limits": {GPU: 8}, "requests": {"cpu": "4"}},
                {"requests": {"cpu": "4", "memory": "1Gi"}, "limits": {GPU: 8}},
            ),
            # Any extended resource asked for as a request alone gets it as its limit too.
            (
                "cpu",
                {"requests": {"example.com/fpga": 1}},
                {"requests": {"example.com/fpga": 1, "cpu": "1", "memory": "1Gi"},
                 "limits": {"example.com/fpga": 1}},
            ),
            # A device claimed through DRA is the GPU: no device plugin's GPU beside it.
            (
                "gpu",
                {"claims": [{"name": "gpu"}]},
                {"requests": {"cpu": "1", "memory": "1Gi"}, "claims": [{"name": "gpu"}]},
            ),
            (
                "gpu",
                {"claims": [{"name": "gpu"}], "limits": {GPU: 1}},
                {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU: 1},
                 "claims": [{"name": "gpu"}]},
            ),
        ],
    )  # fmt: skip
    def test_the_runtime_asks_for_what_the_spec_does_and_defaults_only_the_rest(
        self, device: str, resources: dict[str, Any] | None, want: dict[str, Any]
    ) -> None:
        runtime: dict[str, Any] = {"device": device}
        if resources is not None:
            runtime["resources"] = resources
        if resources and resources.get("claims"):
            runtime["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        spec = {"model": {"uri": "pvc://models/m.onnx"}, "sla": {"latencyP99Ms": 100}}
        owner = Owner(
            name="m", namespace="ns", uid="u",
            spec=InferenceServiceSpec.model_validate({**spec, "runtime": runtime}),
        )  # fmt: skip
        deployment = build_deployment(owner, OperatorSettings(), replicas=1)
        assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"] == want
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)

    def test_the_pods_claim_what_the_spec_claims(self) -> None:
        claims = [
            {"name": "gpu", "resourceClaimTemplateName": "single-gpu"},
            {"name": "shared", "resourceClaimName": "rdma-pool"},
        ]
        spec = {
            "model": {"uri": "pvc://models/m.onnx"},
            "sla": {"latencyP99Ms": 100},
            "runtime": {"resourceClaims": claims, "resources": {"claims": [{"name": "gpu"}]}},
        }
        owner = Owner(
            name="m", namespace="ns", uid="u", spec=InferenceServiceSpec.model_validate(spec)
        )
        deployment = build_deployment(owner, OperatorSettings(), replicas=1)
        pod = deployment["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == claims
        assert pod["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
        assert GPU not in str(pod["containers"][0]["resources"])
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)

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
        assert a[DEPLOYMENT]["spec"]["template"] == b[DEPLOYMENT]["spec"]["template"]  # type: ignore[index]

    def test_the_grace_period_covers_the_pre_stop_pause_and_the_drain(self) -> None:
        settings = OperatorSettings(pre_stop_sleep_seconds=5, drain_grace_seconds=25)
        deployment = build_deployment(
            owner_of(ROOT / "examples" / "resnet50-gpu.yaml"), settings, replicas=1
        )
        pod = deployment["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > 5 + 25
        args = pod["containers"][0]["args"]
        assert args[args.index("--drain-grace-s") + 1] == "25"

    def test_a_deadline_longer_than_the_drain_lengthens_the_drain(self) -> None:
        """Requests taken on were promised an answer within their deadline (the SLA's): the
        drain on SIGTERM lasts at least that long, and the grace period with it."""
        settings = OperatorSettings(pre_stop_sleep_seconds=5, drain_grace_seconds=25)
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        slow = with_spec(
            owner,
            sla={
                **owner.spec.sla.model_dump(by_alias=True, exclude_none=True),
                "latencyP99Ms": 60_000,
            },
        )
        pod = pod_of(slow, settings)["spec"]
        args = pod["containers"][0]["args"]
        assert args[args.index("--drain-grace-s") + 1] == "61"
        assert pod["terminationGracePeriodSeconds"] == 5 + 61 + 5

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


def with_spec(owner: Owner, **changes: Any) -> Owner:
    """`owner` with its spec changed, parsed again as the API server would hand it over."""
    spec = {**owner.spec.model_dump(by_alias=True, exclude_none=True, mode="json"), **changes}
    return Owner(
        name=owner.name,
        namespace=owner.namespace,
        uid=owner.uid,
        spec=InferenceServiceSpec.model_validate(spec),
    )


def pod_of(owner: Owner, settings: OperatorSettings | None = None) -> dict[str, Any]:
    deployment = build_deployment(owner, settings or OperatorSettings(), replicas=1)
    return deployment["spec"]["template"]  # type: ignore[no-any-return]


class TestServingPath:
    """Variants, the pipeline, instances and gRPC reach the runtime's command line and files."""

    def test_an_https_model_fetches_the_variant_and_the_pipelines_files_beside_it(self) -> None:
        owner = owner_of(ROOT / "examples" / "orientation-cpu.yaml")
        model = {**owner.spec.model.dump(), "variant": "int8"}
        template = pod_of(with_spec(owner, model=model))
        (fetch,) = template["spec"]["initContainers"]
        assert fetch["args"] == [
            "runtime",
            "fetch",
            "https://models.example.com/rapid_orientation.int8.onnx",
            "/models/model.int8.onnx",
            "https://models.example.com/orientation-labels.txt",
            "/models/orientation-labels.txt",
        ]
        args = template["spec"]["containers"][0]["args"]
        assert args[args.index("--model") + 1] == "/models/model.onnx"
        assert args[args.index("--variant") + 1] == "int8"

    @pytest.mark.parametrize(
        ("uri", "variant", "fetched"),
        [
            # A presigned URL: its signature is the model file's, fetched as written.
            (
                "https://h.example/m/resnet50.onnx?X-Amz-Signature=abc#x",
                "original",
                "https://h.example/m/resnet50.onnx?X-Amz-Signature=abc#x",
            ),
            (
                "https://h.example/m/resnet50.onnx?sig=1",
                "fp16",
                "https://h.example/m/resnet50.fp16.onnx",
            ),
            # A file not named .onnx: the original is the URI itself.
            ("https://h.example/models/resnet50", "original", "https://h.example/models/resnet50"),
            (
                "https://h.example/models/resnet50",
                "int8",
                "https://h.example/models/resnet50.int8.onnx",
            ),
        ],
    )
    def test_an_https_model_is_fetched_from_its_own_uri_and_variants_beside_it(
        self, uri: str, variant: str, fetched: str
    ) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        template = pod_of(with_spec(owner, model={"uri": uri, "variant": variant}))
        (fetch,) = template["spec"]["initContainers"]
        assert fetch["args"][2] == fetched

    def test_an_s3_model_with_a_pipeline_fetches_its_whole_folder(self) -> None:
        owner = owner_of(ROOT / "examples" / "orientation-cpu.yaml")
        s3 = with_spec(owner, model={"uri": "s3://bucket/orientation/model.onnx"})
        settings = OperatorSettings(storage_initializer_image="kserve/storage-initializer:v0.14")
        (fetch,) = pod_of(s3, settings)["spec"]["initContainers"]
        assert fetch["args"] == ["s3://bucket/orientation/", "/models"]

    def test_a_changed_pipeline_rolls_the_pods_and_reaches_them_in_the_configmap(self) -> None:
        owner = owner_of(ROOT / "examples" / "orientation-cpu.yaml")
        assert owner.spec.pipeline is not None
        pipeline = owner.spec.pipeline.model_dump(by_alias=True, exclude_unset=True, mode="json")
        pipeline["postprocess"]["topK"]["k"] = 1
        changed = with_spec(owner, pipeline=pipeline)
        before, after = pod_of(owner), pod_of(changed)
        key = "batchpilot.io/pipeline-sha256"
        assert before["metadata"]["annotations"][key] != after["metadata"]["annotations"][key]
        configmap = next(c for c in render(changed) if c["kind"] == "ConfigMap")
        assert yaml.safe_load(configmap["data"]["pipeline.json"]) == pipeline
        args = after["spec"]["containers"][0]["args"]
        assert args[args.index("--pipeline-config") + 1] == "/etc/batchpilot/batching/pipeline.json"

    def test_without_a_pipeline_there_is_no_pipeline_file_flag_or_hash(self) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        assert owner.spec.pipeline is None
        template = pod_of(owner)
        assert "batchpilot.io/pipeline-sha256" not in template["metadata"]["annotations"]
        assert "--pipeline-config" not in template["spec"]["containers"][0]["args"]
        configmap = next(c for c in render(owner) if c["kind"] == "ConfigMap")
        assert set(configmap["data"]) == {"batching.json"}

    def test_the_sla_and_objective_reach_the_runtime_in_the_batching_document(self) -> None:
        owner = with_spec(
            owner_of(ROOT / "examples" / "resnet50-gpu.yaml"),
            sla={"latencyP99Ms": 120, "objectivePercent": 99.9, "window": "6h"},
        )
        configmap = next(c for c in render(owner) if c["kind"] == "ConfigMap")
        document = configmap["data"]["batching.json"]
        assert json.loads(document)["slaMs"] == 120
        assert json.loads(document)["objectivePercent"] == 99.9
        # what the runtime makes of it: the values its gauges export
        settings = parse_batching(
            document.encode(), current=BatchSettings(max_batch_size=1, max_queue_delay_s=0)
        )
        assert (settings.sla_s, settings.objective) == (0.12, 0.999)

    def test_instances_accelerator_and_async_settings_reach_the_runtime(self) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        runtime = {
            **owner.spec.runtime.dump(),
            "instances": 2,
            "accelerator": "tensorrt",
            "asyncInference": {"resultTtlSeconds": 60, "capacity": 10, "deadlineSeconds": 120},
        }
        args = pod_of(with_spec(owner, runtime=runtime))["spec"]["containers"][0]["args"]
        flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
        assert flags["--instances"] == "2"
        assert flags["--accelerator"] == "tensorrt"
        assert flags["--async-result-ttl-s"] == "60"
        assert flags["--async-capacity"] == "10"
        assert flags["--async-deadline-s"] == "120"
        # not set: not passed (the runtime's default), so that no pod rolls for the field
        assert "--async-deadline-s" not in pod_of(owner)["spec"]["containers"][0]["args"]

    def test_a_simulated_accelerators_variation_reaches_the_runtime(self) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-simulated.yaml")
        runtime = owner.spec.runtime.dump()
        steady = pod_of(owner)["spec"]["containers"][0]["args"]
        latency = {**runtime["simulatedLatency"], "cv": 0.25}
        varying = pod_of(with_spec(owner, runtime={**runtime, "simulatedLatency": latency}))
        args = varying["spec"]["containers"][0]["args"]
        timing = args[args.index("--simulated-latency") + 1]
        assert timing.endswith(",cv=0.25")
        assert steady[steady.index("--simulated-latency") + 1] == timing.removesuffix(",cv=0.25")

    @pytest.mark.parametrize("mode", ["auto", "recommend", "off"])
    @pytest.mark.parametrize(("ceiling", "rows"), [(16, 16), (64, 64), (512, 64)])
    def test_the_start_up_timing_reaches_the_largest_batch_limit_allowed(
        self, ceiling: int, rows: int, mode: str
    ) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        scaling = {**owner.spec.scaling.dump(), "maxBatchSize": ceiling, "mode": mode}
        changed = with_spec(owner, scaling=scaling)
        configmap = {c["kind"]: c for c in render(changed)}["ConfigMap"]
        document = json.loads(configmap["data"][BATCHING_FILE])
        # in the document new pods read at start, capped where the runtime caps it: in mode
        # auto as the burst size (the runtime times up to it, 64 rows at most)
        if mode == "auto":
            assert "calibrationRows" not in document
            assert min(document["burstBatchSize"], 64) == rows
        else:
            assert document["calibrationRows"] == rows
        # not in the pod template: a change of the ceiling rolls no pod
        assert pod_of(changed) == pod_of(owner)

    def test_grpc_is_a_named_port_of_the_pods_and_the_service(self) -> None:
        owner = owner_of(ROOT / "examples" / "resnet50-gpu.yaml")
        children = {c["kind"]: c for c in render(owner)}
        container = children["Deployment"]["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "grpc", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
        assert container["args"][container["args"].index("--grpc-port") + 1] == "8081"
        (grpc,) = [p for p in children["Service"]["spec"]["ports"] if p["name"] == "grpc"]
        assert grpc["targetPort"] == "grpc"
        assert grpc["appProtocol"] == "kubernetes.io/h2c"
