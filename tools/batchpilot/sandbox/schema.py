"""A custom resource checked against its CRD's own `openAPIV3Schema`, as the API server does it.

The project's CRD refuses specs that cannot work (`maxReplicas: 0`, an unknown `mode`, a model
URI with no scheme) with a message a person understands. For the sandbox to show those
refusals — and for tests to exercise the schema we ship — custom resources go through the same
three steps as on a real server (structural schemas only):

1. pruning: fields the schema does not declare are dropped (and reported, so that
   `fieldValidation=Strict` can refuse them and `Warn` can warn about them), except under
   `x-kubernetes-preserve-unknown-fields`;
2. defaulting: `default` values fill absent (or non-nullable `null`) fields, recursively, so
   defaults inside a defaulted `{}` apply too;
3. validation: type, required, enum, minimum/maximum (exclusive too), multipleOf,
   minLength/maxLength, pattern, format (date-time, date, int32, uuid, ipv4, ipv6),
   minItems/maxItems, uniqueItems, list-type set/map, min/maxProperties, additionalProperties,
   nullable, x-kubernetes-int-or-string, allOf/anyOf/oneOf/not — with the messages of
   kube-openapi.

CEL rules (`x-kubernetes-validations`) are in `cel.py`. `metadata` at the root is not touched
here: the server validates it as ObjectMeta (see `objectmeta.py`).
"""

from __future__ import annotations

import copy
import datetime
import functools
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchpilot.sandbox.errors import FieldError, render_value

Schema = Mapping[str, Any]
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class Result:
    """The object as it would be stored, what was pruned, and what is wrong with it."""

    obj: dict[str, Any]
    pruned: tuple[str, ...]
    errors: tuple[FieldError, ...]


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT_INTEGER_MAX = 2**53
"""The largest whole float kube-openapi takes for an integer (`swag.IsFloat64AJSONInteger`)."""


def is_int64(value: Any) -> bool:
    """Whether a JSON number decodes to an int64 in the API server (a larger one is a float)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return INT64_MIN <= value <= INT64_MAX


def type_name(value: Any) -> str:
    """The JSON type of a value, as kube-openapi names it in messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer" if is_int64(value) else "number"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _is_type(value: Any, expected: str) -> bool:
    match expected:
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "boolean":
            return isinstance(value, bool)
        case "integer":
            if isinstance(value, bool):
                return False
            if isinstance(value, float):
                return value.is_integer() and abs(value) <= FLOAT_INTEGER_MAX
            return is_int64(value)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
    return True


# --- pruning -----------------------------------------------------------------------------------


def _known(schema: Schema) -> tuple[dict[str, Schema], Schema | None, bool]:
    properties: dict[str, Schema] = dict(schema.get("properties") or {})
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    if additional is True:
        return properties, {"x-kubernetes-preserve-unknown-fields": True}, preserve
    return properties, additional if isinstance(additional, Mapping) else None, preserve


def _prune(value: Any, schema: Schema, path: str, pruned: list[str], *, root: bool) -> Any:
    if schema.get("x-kubernetes-int-or-string"):
        return value
    if isinstance(value, dict):
        properties, additional, preserve = _known(schema)
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        result: dict[str, Any] = {}
        for key, item in value.items():
            if (root or embedded) and key in _ROOT_FIELDS:
                result[key] = item
            elif key in properties:
                result[key] = _prune(item, properties[key], join(path, key), pruned, root=False)
            elif additional is not None:
                result[key] = _prune(item, additional, join(path, key), pruned, root=False)
            elif preserve:
                result[key] = item
            else:
                pruned.append(join(path, key))
        return result
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [
                _prune(item, items, f"{path}[{index}]", pruned, root=False)
                for index, item in enumerate(value)
            ]
    return value


# --- defaulting --------------------------------------------------------------------------------


def _default(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict) and not schema.get("x-kubernetes-int-or-string"):
        properties, additional, _ = _known(schema)
        for key, prop in properties.items():
            if key in value and value[key] is None and not prop.get("nullable"):
                del value[key]
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                value[key] = _default(value[key], prop)
        if additional is not None:
            for key in [key for key in value if key not in properties]:
                value[key] = _default(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        items: Schema = schema["items"]
        for index, item in enumerate(value):
            if item is None and not items.get("nullable") and "default" in items:
                value[index] = copy.deepcopy(items["default"])
            value[index] = _default(value[index], items)
    return value


# --- validation --------------------------------------------------------------------------------


def _number(value: Any) -> str:
    return render_value(value)


def _quote_all(values: list[Any]) -> str:
    return ", ".join(render_value(value) for value in values)


@functools.lru_cache(maxsize=256)
def _pattern(pattern: str) -> re.Pattern[str]:
    # ECMA-262 and Python's `re` agree on what CRD authors write; `\d` etc. are ASCII there.
    return re.compile(pattern, re.ASCII)


def _check_format(value: str, fmt: str) -> bool:
    match fmt:
        case "date-time":
            if not _RFC3339.match(value):
                return False
            try:
                datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
            except ValueError:
                return False
            return True
        case "date":
            try:
                datetime.date.fromisoformat(value)
            except ValueError:
                return False
            return len(value) == 10
        case "uuid":
            return bool(_UUID.match(value))
        case "ipv4" | "ipv6":  # kube-openapi: an IP that parses, with a '.' (v4) or ':' (v6)
            try:
                ipaddress.ip_address(value)
            except ValueError:
                return False
            return ("." if fmt == "ipv4" else ":") in value
    return True


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _validate(value: Any, schema: Schema, path: str, errors: list[FieldError]) -> None:
    if value is None:
        if schema.get("nullable") or not schema.get("type"):
            return
        errors.append(
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f'{path} in body must be of type {schema["type"]}: "null"',
                value=None,
            )
        )
        return
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            errors.append(
                FieldError(
                    path,
                    "FieldValueTypeInvalid",
                    f'{path} in body must be of type integer or string: "{type_name(value)}"',
                    value=value,
                )
            )
            return
    else:
        expected = schema.get("type")
        if expected and not _is_type(value, str(expected)):
            errors.append(
                FieldError(
                    path,
                    "FieldValueTypeInvalid",
                    f'{path} in body must be of type {expected}: "{type_name(value)}"',
                    value=value,
                )
            )
            return
    _validate_value(value, schema, path, errors)
    if isinstance(value, dict):
        _validate_object(value, schema, path, errors)
    elif isinstance(value, list):
        _validate_array(value, schema, path, errors)
    for sub in schema.get("allOf") or []:
        _validate(value, sub, path, errors)
    if schema.get("anyOf") and not any(_passes(value, sub, path) for sub in schema["anyOf"]):
        errors.append(
            FieldError(path, detail=f"{path} in body must validate at least one schema (anyOf)")
        )
    if schema.get("oneOf"):
        passing = sum(1 for sub in schema["oneOf"] if _passes(value, sub, path))
        if passing != 1:
            errors.append(
                FieldError(
                    path, detail=f"{path} in body must validate one and only one schema (oneOf)"
                )
            )
    if isinstance(schema.get("not"), Mapping) and _passes(value, schema["not"], path):
        errors.append(FieldError(path, detail=f"{path} in body must not validate the schema (not)"))


def _passes(value: Any, schema: Schema, path: str) -> bool:
    found: list[FieldError] = []
    _validate(value, schema, path, found)
    return not found


def _validate_value(value: Any, schema: Schema, path: str, errors: list[FieldError]) -> None:
    if "enum" in schema and value not in schema["enum"]:
        errors.append(
            FieldError(
                path,
                "FieldValueNotSupported",
                f"supported values: {_quote_all(list(schema['enum']))}",
                value=value,
            )
        )
    if isinstance(value, str):
        if "minLength" in schema and len(value) < int(schema["minLength"]):
            errors.append(
                FieldError(
                    path,
                    detail=f"{path} in body should be at least {schema['minLength']} chars long",
                    value=value,
                )
            )
        if "maxLength" in schema and len(value.encode()) > int(schema["maxLength"]):
            errors.append(
                FieldError(
                    path, "FieldValueTooLong", f"must have at most {schema['maxLength']} bytes"
                )
            )
        if "pattern" in schema and not _pattern(str(schema["pattern"])).search(value):
            errors.append(
                FieldError(
                    path, detail=f"{path} in body should match '{schema['pattern']}'", value=value
                )
            )
        fmt = schema.get("format")
        if fmt and not _check_format(value, str(fmt)):
            errors.append(
                FieldError(
                    path,
                    "FieldValueTypeInvalid",
                    f"{path} in body must be of type {fmt}: {render_value(value)}",
                    value=value,
                )
            )
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            exclusive = bool(schema.get("exclusiveMinimum"))
            bound = schema["minimum"]
            if value < bound or (exclusive and value == bound):
                relation = "greater than" if exclusive else "greater than or equal to"
                errors.append(
                    FieldError(
                        path,
                        detail=f"{path} in body should be {relation} {_number(bound)}",
                        value=value,
                    )
                )
        if "maximum" in schema:
            exclusive = bool(schema.get("exclusiveMaximum"))
            bound = schema["maximum"]
            if value > bound or (exclusive and value == bound):
                relation = "less than" if exclusive else "less than or equal to"
                errors.append(
                    FieldError(
                        path,
                        detail=f"{path} in body should be {relation} {_number(bound)}",
                        value=value,
                    )
                )
        if schema.get("multipleOf"):
            ratio = value / schema["multipleOf"]
            if abs(ratio - round(ratio)) > 1e-9:
                errors.append(
                    FieldError(
                        path,
                        detail=f"{path} in body should be a multiple of"
                        f" {_number(schema['multipleOf'])}",
                        value=value,
                    )
                )
        if schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
            errors.append(
                FieldError(
                    path,
                    "FieldValueTypeInvalid",
                    f"{path} in body must be of type int32: {render_value(value)}",
                    value=value,
                )
            )


def _validate_object(
    value: dict[str, Any], schema: Schema, path: str, errors: list[FieldError]
) -> None:
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(FieldError(join(path, key), "FieldValueRequired"))
    if "minProperties" in schema and len(value) < int(schema["minProperties"]):
        errors.append(
            FieldError(
                path,
                detail=f"{path} in body should have at least {schema['minProperties']} properties",
                value=value,
            )
        )
    if "maxProperties" in schema and len(value) > int(schema["maxProperties"]):
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                f"must have at most {schema['maxProperties']} items",
                value=len(value),
            )
        )
    properties, additional, _ = _known(schema)
    for key, item in value.items():
        if key in properties:
            _validate(item, properties[key], join(path, key), errors)
        elif additional is not None:
            _validate(item, additional, join(path, key), errors)


def _validate_array(value: list[Any], schema: Schema, path: str, errors: list[FieldError]) -> None:
    if "minItems" in schema and len(value) < int(schema["minItems"]):
        errors.append(
            FieldError(
                path,
                detail=f"{path} in body should have at least {schema['minItems']} items",
                value=value,
            )
        )
    if "maxItems" in schema and len(value) > int(schema["maxItems"]):
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                f"must have at most {schema['maxItems']} items",
                value=len(value),
            )
        )
    list_type = schema.get("x-kubernetes-list-type")
    if schema.get("uniqueItems") or list_type == "set":
        seen: set[str] = set()
        for index, item in enumerate(value):
            key = _canonical(item)
            if key in seen:
                errors.append(FieldError(f"{path}[{index}]", "FieldValueDuplicate", value=item))
            seen.add(key)
    elif list_type == "map":
        keys = list(schema.get("x-kubernetes-list-map-keys") or [])
        seen_keys: set[str] = set()
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            identity = _canonical({key: item.get(key) for key in keys})
            if identity in seen_keys:
                dup = {key: item.get(key) for key in keys if key in item}
                errors.append(FieldError(f"{path}[{index}]", "FieldValueDuplicate", value=dup))
            seen_keys.add(identity)
    items = schema.get("items")
    if isinstance(items, Mapping):
        for index, item in enumerate(value):
            _validate(item, items, f"{path}[{index}]", errors)


def validate(obj: Any, schema: Schema, *, path: str = "") -> list[FieldError]:
    """Validate a (defaulted) value against a schema; [] when valid."""
    errors: list[FieldError] = []
    if isinstance(obj, dict) and not path:
        body = {key: value for key, value in obj.items() if key not in _ROOT_FIELDS}
        root = {
            **schema,
            "required": [key for key in schema.get("required") or [] if key not in _ROOT_FIELDS],
        }
        _validate(body, root, path, errors)
    else:
        _validate(obj, schema, path, errors)
    return errors


def prune(obj: dict[str, Any], schema: Schema) -> tuple[dict[str, Any], list[str]]:
    """Drop undeclared fields; returns the pruned copy and the dropped paths."""
    pruned: list[str] = []
    result = _prune(copy.deepcopy(obj), schema, "", pruned, root=True)
    return result, pruned


def apply_defaults(obj: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """Fill in `default`s (a new object; `obj` is not modified)."""
    result: dict[str, Any] = _default(copy.deepcopy(obj), schema)
    return result


def admit(obj: dict[str, Any], schema: Schema) -> Result:
    """Prune, default and validate a custom resource, as the API server does on every write."""
    pruned_obj, pruned = prune(obj, schema)
    defaulted = apply_defaults(pruned_obj, schema)
    return Result(defaulted, tuple(pruned), tuple(validate(defaulted, schema)))
