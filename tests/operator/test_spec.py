"""The InferenceService API: the CRD schema and the pydantic models say the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from celpy.adapter import json_to_cel
from pydantic import ValidationError

from batchpilot.operator.spec import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    InferenceServiceSpec,
    SLASpec,
    window_seconds,
)
from batchpilot.sandbox.cel import compile_expression

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
    if model.get("additionalProperties") is True and "properties" not in model:
        return problems  # a core/v1 object passed through as written: the CRD types it alone
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
        objective = spec["properties"]["sla"]["properties"]["objectivePercent"]
        rules += [r["rule"] for r in objective["x-kubernetes-validations"]]
        rules += [r["rule"] for r in spec["properties"]["model"]["x-kubernetes-validations"]]
        assert rules == [
            "self.batching.batchSize <= self.scaling.maxBatchSize",
            "!has(self.model.format) || self.model.format == 'onnx' || !has(self.runtime) || "
            "!has(self.runtime.engine) || self.runtime.engine == 'onnx'",
            "!has(self.model.format) || self.model.format == 'onnx' || !has(self.runtime) || "
            "!has(self.runtime.accelerator) || self.runtime.accelerator == 'default'",
            "self.minReplicas <= self.maxReplicas",
            "self.min < self.max",
            "self.accelerator != 'tensorrt' || self.device == 'gpu'",
            "!has(self.resources) || !has(self.resources.claims) || self.resources.claims.all(c, "
            "has(self.resourceClaims) && self.resourceClaims.exists(p, p.name == c.name))",
            "self < 100.0",
            "!has(self.format) || self.format == 'onnx' || !has(self.variant) || "
            "self.variant != 'int8'",
        ]
        base = {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}}
        for broken, message in [
            ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not exceed"),
            ({"sla": {"latencyP99Ms": 9, "gpuUtilization": {"min": 90, "max": 80}}}, "min must"),
            ({"scaling": {"maxBatchSize": 4}, "batching": {"batchSize": 8}}, "batchSize must"),
            ({"runtime": {"device": "cpu", "accelerator": "tensorrt"}}, "tensorrt needs"),
            ({"runtime": {"resources": {"claims": [{"name": "gpu"}]}}}, "claims its container"),
            ({"sla": {"latencyP99Ms": 9, "objectivePercent": 100}}, "objectivePercent must be"),
            ({"sla": {"latencyP99Ms": 9, "window": "29d"}}, "window must be between"),
            (
                {"model": {"uri": "file:///m.pt", "format": "torchscript", "variant": "int8"}},
                "variant int8 is an ONNX file",
            ),
            (
                {
                    "model": {"uri": "file:///m.pt2", "format": "torch-export"},
                    "runtime": {"engine": "simulated"},
                },
                "runtime.engine must stay onnx",
            ),
            (
                {
                    "model": {"uri": "file:///m.pt", "format": "torchscript"},
                    "runtime": {"accelerator": "tensorrt"},
                },
                "it needs model.format onnx",
            ),
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
            "SLO",
            "Age",
        ]
        (slo,) = [c for c in version["additionalPrinterColumns"] if c["name"] == "SLO"]
        assert slo["jsonPath"] == ".status.slo.text"


def window_rules() -> tuple[Any, Any]:
    """The CRD's rules for sla.window: its syntax, then its range (quiet on bad syntax)."""
    window = crd_spec_schema()["properties"]["sla"]["properties"]["window"]
    syntax, in_range = window["x-kubernetes-validations"]
    return compile_expression(syntax["rule"]), compile_expression(in_range["rule"])


def window_rule() -> Any:
    return window_rules()[1]


class TestTheObjective:
    BASE: ClassVar[dict[str, Any]] = {"model": {"uri": "file:///m.onnx"}}

    def sla(self, **sla: Any) -> SLASpec:
        return InferenceServiceSpec.model_validate(
            {**self.BASE, "sla": {"latencyP99Ms": 100, **sla}}
        ).sla

    def test_99_percent_over_an_hour_by_default(self) -> None:
        sla = self.sla()
        assert (sla.objective_percent, sla.window, sla.window_s) == (99, "1h", 3600)
        assert sla.dump() == {
            "latencyP99Ms": 100,
            "gpuUtilization": {"min": 70, "max": 95},
            "objectivePercent": 99,
            "window": "1h",
        }

    @pytest.mark.parametrize(
        ("window", "seconds"),
        [
            ("5m", 300),
            ("300s", 300),
            ("30m", 1800),
            ("6h", 21_600),
            ("7d", 604_800),
            ("28d", 2_419_200),
            ("672h", 2_419_200),
            ("40320m", 2_419_200),
        ],
    )
    def test_windows_in_any_unit(self, window: str, seconds: int) -> None:
        assert self.sla(window=window).window_s == seconds
        assert window_seconds(window) == seconds
        syntax, in_range = window_rules()  # the CRD agrees
        assert syntax.evaluate({"self": json_to_cel(window)})
        assert in_range.evaluate({"self": json_to_cel(window)})

    @pytest.mark.parametrize(
        ("window", "message"),
        [
            ("4m", "sla.window must be between 5m and 28d"),
            ("299s", "sla.window must be between 5m and 28d"),
            ("29d", "sla.window must be between 5m and 28d"),
            ("673h", "sla.window must be between 5m and 28d"),
            ("40321m", "sla.window must be between 5m and 28d"),
            ("1w", "a whole number and one unit"),
            ("1h30m", "a whole number and one unit"),
            ("0h", "a whole number and one unit"),
            ("1.5h", "a whole number and one unit"),
            ("h", "a whole number and one unit"),
            ("", "a whole number and one unit"),
            (" 1h", "a whole number and one unit"),
        ],
    )
    def test_bad_windows_are_refused_with_the_reason(self, window: str, message: str) -> None:
        with pytest.raises(ValidationError, match=message):
            self.sla(window=window)
        # the CRD: one rule refuses bad syntax, the other (quiet on bad syntax) the range
        syntax_rule, range_rule = window_rules()
        syntax = bool(syntax_rule.evaluate({"self": json_to_cel(window)}))
        in_range = bool(range_rule.evaluate({"self": json_to_cel(window)}))
        assert (syntax, in_range) == (False, True) if "unit" in message else (True, False)

    @pytest.mark.parametrize("percent", [50, 90, 99, 99.9, 99.99, 99.999])
    def test_objectives_from_50_up_to_below_100(self, percent: float) -> None:
        assert self.sla(objectivePercent=percent).objective_percent == percent

    @pytest.mark.parametrize(
        ("percent", "message"),
        [
            (100, "sla.objectivePercent must be below 100: an objective of 100 % leaves no"),
            (100.0, "leaves no error budget"),
            (49.9, "greater than or equal to 50"),
            (0, "greater than or equal to 50"),
            (101, "less than or equal to 100"),
            ("high", "valid number"),
        ],
    )
    def test_out_of_range_objectives_are_refused_with_the_reason(
        self, percent: Any, message: str
    ) -> None:
        with pytest.raises(ValidationError, match=message):
            self.sla(objectivePercent=percent)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_parse(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == f"{GROUP}/{VERSION}"
    assert doc["kind"] == KIND
    InferenceServiceSpec.model_validate(doc["spec"])
