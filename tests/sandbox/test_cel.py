"""x-kubernetes-validations: CEL rules evaluated as the API server does (pure)."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from batchpilot.sandbox import cel, errors, schema
from batchpilot.sandbox.store import new_store
from tests.sandbox.helpers import widget, widget_crd, widget_schema


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


def rule_failures(rule: str, value: Any, schema_: dict[str, Any]) -> list[str]:
    spec = {
        "type": "object",
        "properties": {"v": {**schema_, "x-kubernetes-validations": [{"rule": rule}]}},
    }
    return [error.message() for error in cel.validate({"v": value}, spec)]


STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}


class TestKubernetesStringLibrary:
    @pytest.mark.parametrize(
        "rule",
        [
            "self.split('/') == ['a', 'b', 'c']",
            "self.split('/', 2) == ['a', 'b/c']",
            "self.split('/', 0) == []",
            "self.split('/', -1).size() == 3",
            "self.split('')[0] == 'a'",
            "self.split('/')[0].size() < 253",
            "self.replace('/', '.') == 'a.b.c'",
            "self.replace('/', '.', 1) == 'a.b/c'",
            "self.substring(2) == 'b/c' && self.substring(0, 1) == 'a'",
            "self.charAt(1) == '/' && self.charAt(5) == ''",
            "self.indexOf('/') == 1 && self.lastIndexOf('/') == 3",
        ],
    )
    def test_string_functions(self, rule: str) -> None:
        assert rule_failures(rule, "a/b/c", STRING) == []

    def test_join(self) -> None:
        assert (
            rule_failures("self.join('-') == 'x-y' && self.join() == 'xy'", ["x", "y"], STRINGS)
            == []
        )

    def test_out_of_range_is_an_evaluation_error(self) -> None:
        (message,) = rule_failures("self.substring(2, 9) == ''", "abc", STRING)
        assert message.startswith("v: Invalid value: index out of range: substring(2, 9) of 3")

    def test_wrong_argument_types_have_no_overload(self) -> None:
        (message,) = rule_failures("self.split(1).size() > 0", "abc", STRING)
        assert "no such overload" in message


class TestPropertyNames:
    def test_reserved_words_and_punctuation_are_escaped_as_the_server_does(self) -> None:
        schema_ = {
            "type": "object",
            "properties": {key: STRING for key in ("namespace", "a-b", "c.d", "e/f", "g__h")},
        }
        value = {"namespace": "n", "a-b": "1", "c.d": "2", "e/f": "3", "g__h": "4"}
        rule = (
            "has(self.__namespace__) && self.__namespace__ == 'n' && self.a__dash__b == '1'"
            " && self.c__dot__d == '2' && self.e__slash__f == '3' && self.g__underscores__h == '4'"
        )
        assert rule_failures(rule, value, schema_) == []
        assert rule_failures("!has(self.__namespace__)", {}, schema_) == []

    def test_map_keys_are_not(self) -> None:
        schema_ = {"type": "object", "additionalProperties": STRING}
        rule = "'namespace' in self && self.all(k, k in ['namespace', 'a-b'])"
        assert rule_failures(rule, {"namespace": "x", "a-b": "y"}, schema_) == []

    def test_escape(self) -> None:
        assert [cel.escape(name) for name in ("namespace", "if", "x-y", "a.b", "p/q", "m__n")] == [
            "__namespace__",
            "__if__",
            "x__dash__y",
            "a__dot__b",
            "p__slash__q",
            "m__underscores__n",
        ]
        assert cel.escape("sectionName") == "sectionName"


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

    def test_a_function_the_sandbox_lacks_is_refused_naming_the_rule(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "a": {
                    "type": "string",
                    "x-kubernetes-validations": [
                        {"rule": "self.size() > 0"},
                        {"rule": "isIP(self) || self.fancy()", "message": "an IP"},
                    ],
                }
            },
        }
        (error,) = cel.check_schema_rules(spec)
        assert error.field == "openAPIV3Schema.properties[a].x-kubernetes-validations[1].rule"
        assert error.value == "isIP(self) || self.fancy()"
        assert "undeclared reference to 'fancy', 'isIP'" in error.detail
        with pytest.raises(cel.RuleCompileError, match="not a function of the sandbox's CEL"):
            cel.compile_expression("self.fancy()")

    def test_macros_and_standard_functions_are_known(self) -> None:
        for rule in (
            "self.all(x, x > 0) && self.exists(x, x > 1) && self.exists_one(x, x > 2)",
            "self.map(x, x * 2).filter(x, x > 2).size() == size(self)",
            "has(self.a) && duration('1s') < duration('1m') && int('1') == 1",
            "'a'.matches('^a$') && 'ab'.startsWith('a') && 'ab'.endsWith('b')",
            "self.min() <= self.max() && self.sum() >= 0 && self.isSorted()",
        ):
            cel.compile_expression(rule)

    def test_a_crd_with_such_a_rule_is_refused_on_install(self) -> None:
        crd = widget_crd()
        spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        spec_schema["x-kubernetes-validations"] = [{"rule": "self.metadata.name.reverse() != ''"}]
        store = new_store(kmock.ObjectsArray())
        with pytest.raises(errors.ApiError) as caught:
            store.install_crd(crd)
        assert caught.value.code == 422
        assert "spec.versions[0].schema.openAPIV3Schema.x-kubernetes-validations[0].rule" in (
            caught.value.message
        )
        assert "undeclared reference to 'reverse'" in caught.value.message
