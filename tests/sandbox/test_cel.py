"""x-kubernetes-validations: CEL rules evaluated as the API server does (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.sandbox import cel, schema
from tests.sandbox.helpers import widget, widget_schema


def failures(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    spec = widget_schema()
    defaulted = schema.apply_defaults(obj, spec)
    previous = schema.apply_defaults(old, spec) if old is not None else None
    return [error.message() for error in cel.validate(defaulted, spec, old=previous)]


class TestRules:
    def test_rules_that_hold_produce_nothing(self) -> None:
        assert failures(widget(scaling={"minReplicas": 2, "maxReplicas": 2})) == []

    def test_message_expression_is_evaluated(self) -> None:
        assert failures(widget(scaling={"minReplicas": 5, "maxReplicas": 2})) == [
            'spec.scaling: Invalid value: "object": minReplicas (5) must not exceed maxReplicas (2)'
        ]

    def test_rules_on_defaulted_values_apply(self) -> None:
        # minReplicas 9 against the default maxReplicas 8
        assert len(failures(widget(scaling={"minReplicas": 9}))) == 1

    def test_root_rules_see_metadata_name(self) -> None:
        assert failures(widget("w" * 41)) == [
            '<nil>: Invalid value: "object": widget names are at most 40 characters'
        ]

    def test_rules_of_absent_fields_are_not_evaluated(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "a": {
                    "type": "object",
                    "x-kubernetes-validations": [{"rule": "self.x > 0"}],
                    "properties": {"x": {"type": "integer"}},
                }
            },
        }
        assert cel.validate({}, spec) == []

    def test_default_message_names_the_rule(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "a": {
                    "type": "integer",
                    "x-kubernetes-validations": [{"rule": "self % 2 == 0"}],
                }
            },
        }
        assert [e.message() for e in cel.validate({"a": 3}, spec)] == [
            'a: Invalid value: "integer": failed rule: self % 2 == 0'
        ]

    def test_reason_and_field_path(self) -> None:
        spec = {
            "type": "object",
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.b) || !has(self.a)",
                    "message": "b is required with a",
                    "reason": "FieldValueRequired",
                    "fieldPath": ".b",
                }
            ],
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        }
        errors = cel.validate({"a": "x"}, spec)
        assert [(e.field, e.type, e.message()) for e in errors] == [
            ("b", "FieldValueRequired", "b: Required value: b is required with a")
        ]

    def test_numbers_are_doubles_where_the_schema_says_number(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "r": {"type": "number", "x-kubernetes-validations": [{"rule": "self < 0.5"}]}
            },
        }
        assert cel.validate({"r": 0}, spec) == []

    def test_kubernetes_library_functions(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "s": {
                    "type": "string",
                    "x-kubernetes-validations": [{"rule": "self.lowerAscii() == self"}],
                },
                "l": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "x-kubernetes-validations": [{"rule": "self.isSorted() && self.sum() < 10"}],
                },
            },
        }
        assert cel.validate({"s": "abc", "l": [1, 2, 3]}, spec) == []
        assert len(cel.validate({"s": "ABC", "l": [3, 2]}, spec)) == 2

    def test_evaluation_errors_are_reported_not_raised(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "a": {
                    "type": "object",
                    "x-kubernetes-validations": [{"rule": "self.missing > 1"}],
                }
            },
        }
        (error,) = cel.validate({"a": {}}, spec)
        assert error.field == "a"
        assert "self.missing > 1" in error.message()


class TestTransitionRules:
    def test_skipped_on_create(self) -> None:
        assert failures(widget()) == []

    def test_enforced_on_update(self) -> None:
        old = widget()
        new = widget(model={"uri": "s3://bucket/other.onnx"})
        assert failures(new, old) == ['spec.model: Invalid value: "object": model.uri is immutable']

    def test_pass_when_unchanged(self) -> None:
        assert failures(widget(replicas=3), widget()) == []


class TestRatcheting:
    def test_unchanged_invalid_values_are_tolerated_on_update(self) -> None:
        bad = widget(scaling={"minReplicas": 5, "maxReplicas": 2})
        assert failures(bad, bad) == []
        assert len(failures(bad, widget())) == 1


class TestCompilation:
    def test_rules_that_do_not_compile_are_found(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >"}]}
            },
        }
        (error,) = cel.check_schema_rules(spec)
        assert error.field == "openAPIV3Schema.properties[a].x-kubernetes-validations[0].rule"
        assert "compilation failed" in error.detail

    def test_the_test_crd_compiles(self) -> None:
        assert cel.check_schema_rules(widget_schema()) == []

    def test_compile_errors_raise_a_dedicated_error(self) -> None:
        with pytest.raises(cel.RuleCompileError):
            cel.compile_expression("1 +")
