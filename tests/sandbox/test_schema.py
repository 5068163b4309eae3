"""openAPIV3Schema: pruning, defaulting and validation of custom resources, with the real
server's messages (pure; the test CRD's schema and small inline schemas)."""

from __future__ import annotations

from typing import Any

from batchpilot.sandbox import schema
from batchpilot.sandbox.errors import FieldError
from tests.sandbox.helpers import widget, widget_schema


def messages(obj: dict[str, Any], spec_schema: dict[str, Any] | None = None) -> list[str]:
    result = schema.admit(obj, spec_schema or widget_schema())
    return [error.message() for error in result.errors]


class TestDefaulting:
    def test_defaults_fill_absent_fields_recursively_inside_defaulted_objects(self) -> None:
        result = schema.admit(widget(), widget_schema())
        assert result.errors == ()
        assert result.obj["spec"]["replicas"] == 1
        assert result.obj["spec"]["scaling"] == {"mode": "auto", "minReplicas": 1, "maxReplicas": 8}

    def test_given_values_are_kept(self) -> None:
        result = schema.admit(widget(replicas=3, scaling={"maxReplicas": 4}), widget_schema())
        assert result.obj["spec"]["replicas"] == 3
        assert result.obj["spec"]["scaling"]["maxReplicas"] == 4
        assert result.obj["spec"]["scaling"]["minReplicas"] == 1

    def test_null_in_a_non_nullable_field_becomes_its_default(self) -> None:
        result = schema.admit(widget(replicas=None), widget_schema())
        assert result.obj["spec"]["replicas"] == 1

    def test_null_in_a_nullable_field_stays(self) -> None:
        result = schema.admit(widget(ratio=None), widget_schema())
        assert result.errors == ()
        assert result.obj["spec"]["ratio"] is None

    def test_input_is_not_modified(self) -> None:
        obj = widget()
        schema.admit(obj, widget_schema())
        assert "replicas" not in obj["spec"]


class TestPruning:
    def test_undeclared_fields_are_dropped_and_reported(self) -> None:
        result = schema.admit(widget(colour="red", scaling={"speed": 3}), widget_schema())
        assert "colour" not in result.obj["spec"]
        assert "speed" not in result.obj["spec"]["scaling"]
        assert result.pruned == ("spec.colour", "spec.scaling.speed")

    def test_preserve_unknown_fields_keeps_everything_below(self) -> None:
        result = schema.admit(widget(extra={"any": {"thing": [1, 2]}}), widget_schema())
        assert result.obj["spec"]["extra"] == {"any": {"thing": [1, 2]}}
        assert result.pruned == ()

    def test_root_metadata_kind_and_api_version_are_never_pruned(self) -> None:
        obj = widget()
        obj["metadata"]["labels"] = {"a": "b"}
        result = schema.admit(obj, {"type": "object", "properties": {"spec": {"type": "object"}}})
        assert result.obj["metadata"] == obj["metadata"]
        assert result.obj["kind"] == "Widget"

    def test_unknown_top_level_fields_are_pruned(self) -> None:
        obj = widget()
        obj["colour"] = "red"
        assert schema.admit(obj, widget_schema()).pruned == ("colour",)


class TestValidation:
    def test_a_valid_widget_has_no_errors(self) -> None:
        assert messages(widget(port="http", tags=["a", "b"], labels={"x": "y"})) == []

    def test_minimum_reads_like_the_api_server(self) -> None:
        assert messages(widget(scaling={"maxReplicas": 0})) == [
            "spec.scaling.maxReplicas: Invalid value: 0: spec.scaling.maxReplicas in body should"
            " be greater than or equal to 1"
        ]

    def test_maximum(self) -> None:
        assert messages(widget(ratio=1.5)) == [
            "spec.ratio: Invalid value: 1.5: spec.ratio in body should be less than or equal to 1"
        ]

    def test_required_fields(self) -> None:
        obj = widget()
        del obj["spec"]["model"]["uri"]
        assert messages(obj) == ["spec.model.uri: Required value"]
        assert messages({"apiVersion": "v", "kind": "Widget", "metadata": {}}) == [
            "spec: Required value"
        ]

    def test_enum(self) -> None:
        assert messages(widget(scaling={"mode": "fast"})) == [
            'spec.scaling.mode: Unsupported value: "fast": supported values: "auto",'
            ' "recommend", "off"'
        ]

    def test_type(self) -> None:
        assert messages(widget(replicas="three")) == [
            'spec.replicas: Invalid value: "three": spec.replicas in body must be of type'
            ' integer: "string"'
        ]

    def test_integers_written_as_whole_floats_are_integers(self) -> None:
        assert messages(widget(replicas=2.0)) == []

    def test_integers_beyond_int64_are_numbers(self) -> None:
        # the API server decodes them as float64: not an integer, and never a 500
        for big in (2**63, 1e30, -(2**63) - 1):
            assert messages(widget(replicas=big))[0].endswith(
                'must be of type integer: "number"'
            ), big
        assert messages(widget(replicas=2**62)) == []  # an int64 is an integer
        assert messages(widget(replicas=2.0**53)) == messages(widget(replicas=2**53))

    def test_booleans_are_not_integers(self) -> None:
        assert messages(widget(replicas=True))[0].endswith('must be of type integer: "boolean"')

    def test_pattern(self) -> None:
        assert messages(widget(model={"uri": "ftp://x"})) == [
            'spec.model.uri: Invalid value: "ftp://x": spec.model.uri in body should match'
            " '^(file|s3)://.+$'"
        ]

    def test_max_length(self) -> None:
        assert messages(widget(model={"uri": "file://" + "x" * 60})) == [
            "spec.model.uri: Too long: must have at most 64 bytes"
        ]

    def test_min_length_of_list_items_and_max_items(self) -> None:
        assert messages(widget(tags=["a", "", "c", "d"])) == [
            "spec.tags: Too many: 4: must have at most 3 items",
            'spec.tags[1]: Invalid value: "": spec.tags[1] in body should be at least 1 chars long',
        ]

    def test_list_type_set_refuses_duplicates(self) -> None:
        assert messages(widget(tags=["a", "a"])) == ['spec.tags[1]: Duplicate value: "a"']

    def test_list_type_map_refuses_duplicate_keys(self) -> None:
        obj = widget()
        obj["status"] = {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Ready", "status": "False"},
            ]
        }
        assert messages(obj) == ['status.conditions[1]: Duplicate value: {"type":"Ready"}']

    def test_int_or_string(self) -> None:
        assert messages(widget(port=8080)) == []
        assert messages(widget(port="http")) == []
        assert messages(widget(port=[1])) == [
            "spec.port: Invalid value: [1]: spec.port in body must be of type integer or string:"
            ' "array"'
        ]

    def test_additional_properties_are_validated(self) -> None:
        assert messages(widget(labels={"a": 1})) == [
            "spec.labels.a: Invalid value: 1: spec.labels.a in body must be of type string:"
            ' "integer"'
        ]

    def test_date_time_format(self) -> None:
        obj = widget()
        condition = {"type": "Ready", "status": "True", "lastTransitionTime": "yesterday"}
        obj["status"] = {"conditions": [condition]}
        assert messages(obj) == [
            'status.conditions[0].lastTransitionTime: Invalid value: "yesterday":'
            " status.conditions[0].lastTransitionTime in body must be of type date-time:"
            ' "yesterday"'
        ]
        condition["lastTransitionTime"] = "2024-05-01T10:00:00.123456+00:00"
        assert messages(obj) == []

    def test_every_error_is_reported(self) -> None:
        found = messages(widget(replicas=-1, scaling={"mode": "x", "maxReplicas": 101}))
        assert len(found) == 3


class TestSchemaKeywords:
    def test_exclusive_bounds_and_multiple_of(self) -> None:
        spec = {
            "type": "object",
            "properties": {
                "n": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "multipleOf": 0.5}
            },
        }
        assert schema.validate({"n": 0}, spec, path="x") == [
            FieldError("x.n", detail="x.n in body should be greater than 0", value=0)
        ]
        assert [e.detail for e in schema.validate({"n": 0.7}, spec, path="x")] == [
            "x.n in body should be a multiple of 0.5"
        ]

    def test_any_of_and_one_of(self) -> None:
        spec = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[0-9]+%$"}]}
        assert schema.validate(5, spec, path="v") == []
        assert schema.validate("50%", spec, path="v") == []
        assert schema.validate("half", spec, path="v")[0].detail.endswith("(anyOf)")

    def test_min_and_max_properties(self) -> None:
        spec = {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 2,
            "additionalProperties": {"type": "string"},
        }
        assert [e.message() for e in schema.validate({}, spec, path="m")] == [
            "m: Invalid value: {}: m in body should have at least 1 properties"
        ]
        assert [e.message() for e in schema.validate(dict.fromkeys("abc", ""), spec, path="m")] == [
            "m: Too many: 3: must have at most 2 items"
        ]

    def test_ip_formats(self) -> None:
        spec = {"type": "string", "format": "ipv4"}
        assert schema.validate("10.0.0.9", spec, path="a") == []
        assert [e.message() for e in schema.validate("10.0.0.x", spec, path="a")] == [
            'a: Invalid value: "10.0.0.x": a in body must be of type ipv4: "10.0.0.x"'
        ]
        assert schema.validate("fd00::1", spec, path="a") != []
        assert schema.validate("fd00::1", {"type": "string", "format": "ipv6"}, path="a") == []
        assert schema.validate("10.0.0.9", {"type": "string", "format": "ipv6"}, path="a") != []

    def test_one_of_with_ip_formats_as_the_gateway_api_writes_it(self) -> None:
        address = {
            "type": "object",
            "oneOf": [
                {
                    "properties": {
                        "type": {"enum": ["IPAddress"]},
                        "value": {"anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]},
                    }
                },
                {"properties": {"type": {"not": {"enum": ["IPAddress"]}}}},
            ],
            "properties": {"type": {"type": "string"}, "value": {"type": "string"}},
        }
        assert schema.validate({"type": "IPAddress", "value": "fd00::1"}, address, path="a") == []
        assert schema.validate({"type": "Hostname", "value": "gw.example"}, address, path="a") == []
        (error,) = schema.validate({"type": "IPAddress", "value": "gw.example"}, address, path="a")
        assert error.detail == "a in body must validate one and only one schema (oneOf)"
