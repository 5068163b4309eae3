"""The InferenceService API: the CRD schema and the pydantic models say the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from batchpilot.operator.spec import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    InferenceServiceSpec,
)

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BOUNDS = ("minimum", "maximum", "maxLength", "pattern", "enum")


def crd_spec_schema() -> dict[str, Any]:
    (version,) = CRD["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]  # type: ignore[no-any-return]


def model_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    schema = InferenceServiceSpec.model_json_schema(by_alias=True)
    return schema, schema["$defs"]


def resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow $ref and unwrap Optional (anyOf [X, null])."""
    if "$ref" in node:
        return resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in node:
        (inner,) = [n for n in node["anyOf"] if n.get("type") != "null"]
        node = {k: v for k, v in node.items() if k != "default"}  # None: absent
        return resolve({**inner, **{k: v for k, v in node.items() if k != "anyOf"}}, defs)
    return node


def compare(
    crd: dict[str, Any], model: dict[str, Any], defs: dict[str, Any], path: str
) -> list[str]:
    problems: list[str] = []
    model = resolve(model, defs)
    if crd.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in crd:
        return problems  # free-form maps: the model only types them loosely
    crd_type = crd.get("type")
    model_type = model.get("type")
    if crd_type == "number":
        crd_type = "number" if model_type == "number" else crd_type
    if crd_type != model_type:
        problems.append(f"{path}: CRD type {crd_type}, model type {model_type}")
    if "exclusiveMinimum" in model:
        # pydantic's gt: for integers the CRD's minimum is the next integer; for numbers it is
        # the bound itself, and a CEL rule on the parent object excludes it.
        bound = model["exclusiveMinimum"]
        model = {**model, "minimum": bound + 1 if model_type == "integer" else bound}
    for bound in BOUNDS:
        if crd.get(bound) != model.get(bound):
            problems.append(f"{path}: {bound} CRD {crd.get(bound)!r} model {model.get(bound)!r}")
    if "default" in crd and crd["default"] != {} and crd["default"] != model.get("default"):
        problems.append(f"{path}: default CRD {crd['default']!r} model {model.get('default')!r}")
    if crd_type == "object":
        crd_props, model_props = crd.get("properties", {}), model.get("properties", {})
        if set(crd_props) != set(model_props):
            problems.append(f"{path}: fields CRD {sorted(crd_props)} model {sorted(model_props)}")
        if set(crd.get("required", [])) != set(model.get("required", [])):
            problems.append(
                f"{path}: required CRD {crd.get('required')} model {model.get('required')}"
            )
        for name in set(crd_props) & set(model_props):
            problems += compare(crd_props[name], model_props[name], defs, f"{path}.{name}")
    return problems


class TestCRDAndModelsAgree:
    def test_names(self) -> None:
        assert CRD["spec"]["group"] == GROUP
        assert CRD["spec"]["names"]["kind"] == KIND
        assert CRD["spec"]["names"]["plural"] == PLURAL
        assert [v["name"] for v in CRD["spec"]["versions"]] == [VERSION]
        assert "isvc" not in CRD["spec"]["names"]["shortNames"]  # KServe's

    def test_every_field_type_bound_default_and_requirement(self) -> None:
        schema, defs = model_schema()
        assert compare(crd_spec_schema(), schema, defs, "spec") == []

    def test_cross_field_rules_exist_in_both(self) -> None:
        spec = crd_spec_schema()
        rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
        rules += [r["rule"] for r in spec["properties"]["scaling"]["x-kubernetes-validations"]]
        sla = spec["properties"]["sla"]["properties"]["gpuUtilization"]
        rules += [r["rule"] for r in sla["x-kubernetes-validations"]]
        rules += [r["rule"] for r in spec["properties"]["runtime"]["x-kubernetes-validations"]]
        assert rules == [
            "self.batching.batchSize <= self.scaling.maxBatchSize",
            "self.minReplicas <= self.maxReplicas",
            "self.min < self.max",
            "self.accelerator != 'tensorrt' || self.device == 'gpu'",
        ]
        base = {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}}
        for broken, message in [
            ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not exceed"),
            ({"sla": {"latencyP99Ms": 9, "gpuUtilization": {"min": 90, "max": 80}}}, "min must"),
            ({"scaling": {"maxBatchSize": 4}, "batching": {"batchSize": 8}}, "batchSize must"),
            ({"runtime": {"device": "cpu", "accelerator": "tensorrt"}}, "tensorrt needs"),
        ]:
            with pytest.raises(ValidationError, match=message):
                InferenceServiceSpec.model_validate({**base, **broken})


class TestStatusSubresources:
    def test_status_scale_and_printer_columns(self) -> None:
        (version,) = CRD["spec"]["versions"]
        assert version["subresources"]["status"] == {}
        assert version["subresources"]["scale"]["statusReplicasPath"] == ".status.replicas"
        columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
        assert columns == [
            "Ready",
            "Replicas",
            "Batch",
            "P99",
            "SLA",
            "QPS",
            "GPU",
            "SLA-Met",
            "Age",
        ]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_parse(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == f"{GROUP}/{VERSION}"
    assert doc["kind"] == KIND
    InferenceServiceSpec.model_validate(doc["spec"])
