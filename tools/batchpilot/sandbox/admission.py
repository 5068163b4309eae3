"""Admission of an object into storage: every check the server makes before it writes.

Metadata is checked for all kinds; custom resources are pruned, defaulted and validated
against their CRD's schema and CEL rules; CRDs themselves are checked before they are served.
`fieldValidation` decides what undeclared fields do: `Strict` refuses them (400, as kubectl's
default would), `Warn` keeps the request and answers with a warning (the server default),
`Ignore` drops them silently (kubectl `--validate=false`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchpilot.sandbox import cel, crds, errors, objectmeta, schema
from batchpilot.sandbox.errors import FieldError
from batchpilot.sandbox.resources import ResourceType

FIELD_VALIDATION = ("Strict", "Warn", "Ignore")
_BLOCKING = (
    "some validation rules were not checked because the object was invalid; correct the"
    " existing errors to complete validation"
)


@dataclass(frozen=True)
class Admitted:
    obj: dict[str, Any]
    warnings: tuple[str, ...] = ()


def field_validation_mode(value: str | None) -> str:
    if value is None or value == "":
        return "Warn"
    if value not in FIELD_VALIDATION:
        raise errors.bad_request(
            f'fieldValidation parameter unsupported: "{value}". Supported values: '
            '"Strict", "Warn", "Ignore"'
        )
    return value


def admit(
    rt: ResourceType,
    obj: dict[str, Any],
    *,
    old: Mapping[str, Any] | None,
    field_validation: str,
) -> Admitted:
    """The object as it will be stored, or `ApiError` (422 Invalid, 400 for Strict fields)."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    problems: list[FieldError] = []
    if old is None:  # names are checked once: they cannot change (generated ones too)
        label = (rt.group, rt.plural) in objectmeta.LABEL_NAMED
        dns1035 = (rt.group, rt.plural) in objectmeta.DNS1035_NAMED
        problems.extend(objectmeta.check_name(metadata.get("name"), label=label, dns1035=dns1035))
    problems.extend(objectmeta.check(metadata))
    warnings: tuple[str, ...] = ()
    if rt.custom and rt.schema is not None:
        result = schema.admit(obj, rt.schema)
        if result.pruned:
            unknown = [f'unknown field "{path}"' for path in result.pruned]
            if field_validation == "Strict":
                raise errors.bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}:'
                    f" strict decoding error: {', '.join(unknown)}"
                )
            if field_validation == "Warn":
                warnings = tuple(unknown)
        obj = result.obj
        problems.extend(result.errors)
        if any(problem.type == "FieldValueTypeInvalid" for problem in result.errors):
            problems.append(FieldError(cel.ROOT_PATH, detail=_BLOCKING, value=None))
        else:
            problems.extend(cel.validate(obj, rt.schema, old=old))
    elif (rt.group, rt.plural) == ("apiextensions.k8s.io", "customresourcedefinitions"):
        problems.extend(crds.validate(obj))
    if problems:
        raise errors.invalid(rt.name, name, problems)
    return Admitted(obj, warnings)
