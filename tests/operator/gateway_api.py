"""The Gateway API's own CRDs (HTTPRoute, GRPCRoute, Gateway), vendored in tests/data, for the
tests of what the operator renders for `spec.exposure`.

Two ways to check a rendered route against them: install `CRD_FILES` in the sandbox's API
(`LocalKubernetesAPI(crds=CRD_FILES)`), which applies their OpenAPI schema and their CEL rules as
kube-apiserver does; or, with no server, `validate(route)`: jsonschema against the same
`openAPIV3Schema` (the CEL rules are not evaluated there). `strict=True` (the default) also refuses
fields the schema does not declare, which a server would drop with a warning: a misspelt field in
the operator's output is a bug either way.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import yaml

VERSION = "v1.3.0"
"""The Gateway API release of the vendored CRDs (bundle-version, standard channel)."""
CRD_DIR = Path(__file__).resolve().parents[1] / "data" / "gateway-api" / VERSION
CRD_FILES = tuple(
    CRD_DIR / f"gateway.networking.k8s.io_{plural}.yaml"
    for plural in ("httproutes", "grpcroutes", "gateways")
)
GROUP = "gateway.networking.k8s.io"


@functools.cache
def _crds() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in CRD_FILES:
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        found[crd["spec"]["names"]["kind"]] = crd
    return found


def crd(kind: str) -> dict[str, Any]:
    """The vendored CRD of `kind` (HTTPRoute, GRPCRoute or Gateway), a copy."""
    try:
        return copy.deepcopy(_crds()[kind])
    except KeyError:
        raise KeyError(f"no vendored Gateway API CRD for {kind!r}: {sorted(_crds())}") from None


def openapi_schema(kind: str, version: str = "v1") -> dict[str, Any]:
    """The CRD's `openAPIV3Schema` for one served version, a copy."""
    for served in crd(kind)["spec"]["versions"]:
        if served["name"] == version:
            schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"the vendored {kind} CRD serves no version {version!r}")


def duration_pattern() -> str:
    """GEP-2257's Duration as the HTTPRoute schema writes it (`timeouts.request`)."""
    rule = openapi_schema("HTTPRoute")["properties"]["spec"]["properties"]["rules"]["items"]
    pattern: str = rule["properties"]["timeouts"]["properties"]["request"]["pattern"]
    return pattern


def _closed(schema: Any) -> Any:
    """Every object schema with declared properties refuses undeclared ones (the root's
    metadata and free-form maps are left as they are)."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        closed.get("type") == "object"
        and "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@functools.cache
def _validator(kind: str, version: str, strict: bool) -> jsonschema.protocols.Validator:
    schema = openapi_schema(kind, version)
    if strict:
        schema = _closed(schema)
    # OpenAPI 3.0 schemas are JSON Schema draft 4 in the keywords CRDs may use.
    return jsonschema.Draft4Validator(
        schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER
    )


def validate(obj: Mapping[str, Any], *, strict: bool = True) -> None:
    """Check a Gateway API object against its vendored schema; `jsonschema.ValidationError`
    (the first problem, with its path) when it does not fit."""
    api_version = str(obj.get("apiVersion", ""))
    group, _, version = api_version.partition("/")
    if group != GROUP:
        raise ValueError(f"not a Gateway API object: apiVersion {api_version!r}")
    _validator(str(obj.get("kind")), version, strict).validate(obj)


def problems(obj: Mapping[str, Any], *, strict: bool = True) -> list[str]:
    """Every way `obj` does not fit its vendored schema, as `path: message` lines."""
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    assert group == GROUP, obj.get("apiVersion")
    validator = _validator(str(obj.get("kind")), version, strict)
    return sorted(
        f"{'.'.join(str(part) for part in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(obj)
    )
