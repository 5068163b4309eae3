"""The API server's error vocabulary: `ApiError` and the `Status` bodies it becomes.

kubectl, kopf and the official client read failures from the `Status` object the real API
server sends (`reason`, `code`, `details.causes`), and kubectl builds its messages from them
("The InferenceService "x" is invalid: spec.scaling.maxReplicas: Invalid value: 0: ...").
Every layer of the sandbox raises `ApiError`; the HTTP layer renders it once, here.
`FieldError` mirrors Go's `field.Error`, so validation messages read like the real server's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Go's field.ErrorType: (cause reason in details.causes, prefix of the message).
FIELD_ERROR_TYPES: dict[str, str] = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "FieldValueTypeInvalid": "Invalid value",
    "InternalError": "Internal error",
}

_NO_VALUE = object()


def render_value(value: Any) -> str:
    """A value as Go's `field.Error` prints it: strings quoted, numbers and booleans bare."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class FieldError:
    """One invalid field: `spec.scaling.maxReplicas: Invalid value: 0: ... should be >= 1`."""

    field: str
    type: str = "FieldValueInvalid"
    detail: str = ""
    value: Any = dataclasses.field(default=_NO_VALUE, compare=False)

    @property
    def has_value(self) -> bool:
        return self.value is not _NO_VALUE

    def body(self) -> str:
        """The message without the field path (what `details.causes[].message` holds)."""
        prefix = FIELD_ERROR_TYPES.get(self.type, "Invalid value")
        text = prefix
        if self.type in (
            "FieldValueRequired",
            "FieldValueForbidden",
            "FieldValueTooLong",
            "InternalError",
        ):
            if self.detail:
                text = f"{text}: {self.detail}"
            return text
        if self.has_value:
            text = f"{text}: {render_value(self.value)}"
        if self.detail:
            text = f"{text}: {self.detail}"
        return text

    def message(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()

    def cause(self) -> dict[str, str]:
        return {"reason": self.type, "message": self.body(), "field": self.field}


class ApiError(Exception):
    """A failed API call, as the real server would answer it."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class ResourceName:
    """What an error needs to know about the resource it is about."""

    group: str
    plural: str
    kind: str

    @property
    def qualified(self) -> str:
        """`inferenceservices.batchpilot.io`, or `configmaps` for the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _details(what: ResourceName, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": what.plural}
    if what.group:
        details["group"] = what.group
    return details


def not_found(what: ResourceName, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{what.qualified} "{name}" not found', details=_details(what, name)
    )


def no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def already_exists(what: ResourceName, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{what.qualified} "{name}" already exists',
        details=_details(what, name),
    )


def conflict(what: ResourceName, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {what.qualified} "{name}": {why}',
        details=_details(what, name),
    )


def modified_conflict(what: ResourceName, name: str) -> ApiError:
    return conflict(
        what,
        name,
        "the object has been modified; please apply your changes to the latest version"
        " and try again",
    )


def invalid(what: ResourceName, name: str, errors: Sequence[FieldError]) -> ApiError:
    """422 Invalid: `Kind.group "name" is invalid: <field errors>` with one cause each."""
    qualified_kind = f"{what.kind}.{what.group}" if what.group else what.kind
    messages = [error.message() for error in errors]
    joined = messages[0] if len(messages) == 1 else f"[{', '.join(messages)}]"
    details = {
        "name": name,
        "kind": what.kind,
        "causes": [error.cause() for error in errors],
    }
    if what.group:
        details["group"] = what.group
    return ApiError(
        422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details=details
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "Forbidden", message)


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type or 'none'})"
        f" - accepted media types include: {', '.join(accepted)}",
    )


def not_acceptable(accept: str) -> ApiError:
    return ApiError(
        406,
        "NotAcceptable",
        f"only the following media types are accepted: application/json, application/yaml"
        f" (asked for {accept})",
    )


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", message)
