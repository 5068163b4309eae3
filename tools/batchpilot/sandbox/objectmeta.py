"""Checks of `metadata` that the API server applies to every object, whatever its kind.

Names must be DNS subdomains (DNS labels for Namespaces and Services), label keys and values
must be well-formed, annotations must stay under 256 KiB. A bad name here is a bad name in a
real cluster, and the operator builds names from user input — so the sandbox refuses them
the same way (422, with the same wording).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from batchpilot.sandbox.errors import FieldError

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_MAX_ANNOTATIONS = 256 * 1024

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used"
    " for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and"
    " must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex"
    " used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an"
    " alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or"
    " 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or"
    " 'my_value',  or '12345', regex used for validation is"
    " '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end"
    " with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used"
    " for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)

# Kinds whose names must be DNS labels rather than subdomains…
LABEL_NAMED = frozenset({("", "namespaces"), ("", "services")})
# …and of those, the ones whose names must start with a letter (a Service's is a DNS name).
DNS1035_NAMED = frozenset({("", "services")})


def check_name(
    name: Any, *, label: bool = False, dns1035: bool = False, field: str = "metadata.name"
) -> list[FieldError]:
    if not isinstance(name, str) or not name:
        return [FieldError(field, "FieldValueRequired", "name or generateName is required")]
    if label or dns1035:
        if len(name) > 63:
            return [FieldError(field, detail="must be no more than 63 characters", value=name)]
        if dns1035 and not _DNS1035.match(name):
            return [FieldError(field, detail=DNS1035_MESSAGE, value=name)]
        if not _LABEL.match(name):
            return [FieldError(field, detail=LABEL_MESSAGE, value=name)]
        return []
    if len(name) > 253:
        return [FieldError(field, detail="must be no more than 253 characters", value=name)]
    if not _SUBDOMAIN.match(name):
        return [FieldError(field, detail=SUBDOMAIN_MESSAGE, value=name)]
    return []


def _check_key(key: str, field: str) -> list[FieldError]:
    prefix, _, name = key.rpartition("/")
    errors: list[FieldError] = []
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        errors.append(FieldError(field, detail=f"prefix part {SUBDOMAIN_MESSAGE}", value=key))
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        errors.append(FieldError(field, detail=QUALIFIED_NAME_MESSAGE, value=key))
    return errors


def check(metadata: Mapping[str, Any]) -> list[FieldError]:
    """Everything wrong with an object's metadata (its name is checked by `check_name`)."""
    errors: list[FieldError] = []
    labels = metadata.get("labels") or {}
    if not isinstance(labels, Mapping):
        errors.append(FieldError("metadata.labels", detail="must be a map", value=labels))
    else:
        for key, value in labels.items():
            errors.extend(_check_key(str(key), "metadata.labels"))
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
                errors.append(
                    FieldError("metadata.labels", detail=LABEL_VALUE_MESSAGE, value=value)
                )
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        errors.append(FieldError("metadata.annotations", detail="must be a map", value=annotations))
    else:
        for key, value in annotations.items():
            errors.extend(_check_key(str(key).lower(), "metadata.annotations"))
            if not isinstance(value, str):
                errors.append(
                    FieldError(
                        f"metadata.annotations[{key}]", detail="must be a string", value=value
                    )
                )
        if len(json.dumps(annotations)) > _MAX_ANNOTATIONS:
            errors.append(
                FieldError(
                    "metadata.annotations",
                    "FieldValueTooLong",
                    f"must have at most {_MAX_ANNOTATIONS} bytes",
                )
            )
    finalizers = metadata.get("finalizers") or []
    if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
        errors.append(
            FieldError("metadata.finalizers", detail="must be a list of strings", value=finalizers)
        )
    for index, ref in enumerate(metadata.get("ownerReferences") or []):
        where = f"metadata.ownerReferences[{index}]"
        if not isinstance(ref, Mapping):
            errors.append(FieldError(where, detail="must be an object", value=ref))
            continue
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errors.append(FieldError(f"{where}.{key}", "FieldValueRequired"))
    controllers = [
        ref
        for ref in metadata.get("ownerReferences") or []
        if isinstance(ref, Mapping) and ref.get("controller")
    ]
    if len(controllers) > 1:
        errors.append(
            FieldError(
                "metadata.ownerReferences",
                detail="Only one reference can have Controller set to true",
                value=metadata.get("ownerReferences"),
            )
        )
    return errors
