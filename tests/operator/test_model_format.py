"""`spec.model.format`: ONNX files go to onnxruntime (or the simulated engine), TorchScript and
torch.export programs to the torch engine, and the pods fetch or mount the program as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from celpy.adapter import json_to_cel
from pydantic import ValidationError

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox.cel import compile_expression


def owner(model: dict[str, Any], **spec: Any) -> Owner:
    return Owner(
        name="resnet50",
        namespace="ml",
        uid="uid-1",
        spec=InferenceServiceSpec.model_validate(
            {"model": model, "sla": {"latencyP99Ms": 100}, **spec}
        ),
    )


def pod(owner: Owner, settings: OperatorSettings | None = None) -> dict[str, Any]:
    deployment = build_deployment(owner, settings or OperatorSettings(), replicas=1)
    return deployment["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def arg(pod: dict[str, Any], flag: str) -> str:
    args = pod["containers"][0]["args"]
    return str(args[args.index(flag) + 1])


def test_onnx_is_the_default_and_keeps_the_engine_it_names() -> None:
    spec = owner({"uri": "pvc://models/r50.onnx"}).spec
    assert spec.model.format == "onnx"
    simulated = owner({"uri": "pvc://models/r50.onnx"}, runtime={"engine": "simulated"})
    assert arg(pod(simulated), "--engine") == "simulated"


@pytest.mark.parametrize(
    ("fmt", "uri", "fetched"),
    [
        ("torchscript", "https://models.example/r50.pt", "/models/model.pt"),
        ("torch-export", "https://models.example/r50.pt2", "/models/model.pt2"),
    ],
)
def test_a_pytorch_program_is_served_by_the_torch_engine(fmt: str, uri: str, fetched: str) -> None:
    spec = pod(owner({"uri": uri, "format": fmt, "variant": "fp16"}))
    assert arg(spec, "--engine") == "torch"
    assert arg(spec, "--model") == fetched
    assert arg(spec, "--variant") == "fp16"  # autocast: the same file, no STEM.fp16.onnx
    (fetch,) = spec["initContainers"]
    assert fetch["args"] == ["runtime", "fetch", uri, fetched]


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_a_pytorch_program_runs_in_the_torch_image_on_either_device(device: str) -> None:
    # The CPU and GPU runtime images have no torch: `--engine torch` there would crash-loop.
    settings = OperatorSettings(runtime_image_torch="registry.example/runtime-torch:1")
    spec = pod(
        owner(
            {"uri": "https://m.example/r50.pt", "format": "torchscript"}, runtime={"device": device}
        ),
        settings,
    )
    (container,) = spec["containers"]
    assert container["image"] == "registry.example/runtime-torch:1"
    (fetch,) = spec["initContainers"]  # the fetcher is the runtime's own `runtime fetch`
    assert fetch["image"] == "registry.example/runtime-torch:1"


@pytest.mark.parametrize(
    ("fmt", "device", "image"),
    [
        ("onnx", "gpu", "ghcr.io/batchpilot/runtime-gpu:0.1.0"),
        ("onnx", "cpu", "ghcr.io/batchpilot/runtime:0.1.0"),
        ("torch-export", "gpu", "ghcr.io/batchpilot/runtime-torch:0.1.0"),
    ],
)
def test_the_default_image_follows_the_format_then_the_device(
    fmt: str, device: str, image: str
) -> None:
    model = {"uri": "pvc://models/m", "format": fmt}
    (container,) = pod(owner(model, runtime={"device": device}))["containers"]
    assert container["image"] == image


def test_the_specs_own_image_wins_over_the_torch_image() -> None:
    model = {"uri": "pvc://models/m.pt", "format": "torchscript"}
    (container,) = pod(owner(model, runtime={"image": "mine/torch-runtime:2"}))["containers"]
    assert container["image"] == "mine/torch-runtime:2"


def test_a_mounted_torchscript_program_is_read_where_its_sidecar_is() -> None:
    spec = pod(owner({"uri": "pvc://models/r50/r50.pt", "format": "torchscript"}))
    assert arg(spec, "--model") == "/models/r50/r50.pt"  # r50.signature.json beside it
    s3 = owner({"uri": "s3://bucket/r50/r50.pt", "format": "torchscript"})
    settings = OperatorSettings(storage_initializer_image="kserve/storage-initializer:v0.14")
    (fetch,) = pod(s3, settings)["initContainers"]
    assert fetch["args"] == ["s3://bucket/r50/", "/models"]  # the folder: the sidecar comes too


@pytest.mark.parametrize(
    ("model", "runtime", "message"),
    [
        ({"format": "torchscript", "variant": "int8"}, {}, "variant int8 is an ONNX file"),
        ({"format": "torch-export"}, {"engine": "simulated"}, "runtime.engine must stay onnx"),
        ({"format": "torchscript"}, {"accelerator": "tensorrt"}, "needs model.format onnx"),
    ],
)
def test_what_the_torch_engine_cannot_do_is_refused_with_the_reason(
    model: dict[str, Any], runtime: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        owner({"uri": "pvc://models/m.pt", **model}, runtime=runtime)


def test_the_crds_rules_refuse_what_the_model_refuses() -> None:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "crds" / "inferenceservice.yaml").read_text()
    )
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_rules = [compile_expression(r["rule"]) for r in spec["x-kubernetes-validations"]]
    model_rules = [
        compile_expression(r["rule"])
        for r in spec["properties"]["model"]["x-kubernetes-validations"]
    ]

    def accepted(doc: dict[str, Any]) -> bool:
        model_ok = all(r.evaluate({"self": json_to_cel(doc["model"])}) for r in model_rules)
        return model_ok and all(r.evaluate({"self": json_to_cel(doc)}) for r in spec_rules)

    base = {"batching": {"batchSize": 1}, "scaling": {"maxBatchSize": 64}}
    runtime = {"engine": "onnx", "accelerator": "default"}
    for model, rt, ok in [
        ({"uri": "x", "format": "onnx", "variant": "int8"}, runtime, True),
        ({"uri": "x", "format": "torchscript", "variant": "fp16"}, runtime, True),
        ({"uri": "x", "format": "torchscript", "variant": "int8"}, runtime, False),
        ({"uri": "x", "format": "torch-export"}, {**runtime, "engine": "simulated"}, False),
        ({"uri": "x", "format": "torchscript"}, {**runtime, "accelerator": "tensorrt"}, False),
        ({"uri": "x", "format": "onnx"}, {**runtime, "engine": "simulated"}, True),
    ]:
        assert accepted({**base, "model": model, "runtime": rt}) == ok, (model, rt)
