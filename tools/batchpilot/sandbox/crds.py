"""CustomResourceDefinitions: read from YAML, checked, and turned into served kinds.

The sandbox installs the project's CRDs (`crds/*.yaml`) at start-up, and anyone may
`kubectl apply` more. A CRD object becomes one `ResourceType` per served version, carrying the
schema, printer columns and subresources that the rest of the server uses. A CRD the real
server would refuse (a name that is not `<plural>.<group>`, no storage version, a CEL rule
that does not compile) is refused here too, so a broken CRD fails in the sandbox first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from batchpilot.sandbox import cel, jsonpath
from batchpilot.sandbox.errors import FieldError
from batchpilot.sandbox.resources import ResourceType, ScaleSpec

CRD_API_VERSION = "apiextensions.k8s.io/v1"
CRD_KIND = "CustomResourceDefinition"


class CRDLoadError(ValueError):
    """A file that cannot be read as CRDs."""


def load_documents(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in the given YAML/JSON files or directories."""
    found: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        files = (
            sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
            if path.is_dir()
            else [path]
        )
        for file in files:
            try:
                documents = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
            except (OSError, yaml.YAMLError) as exc:
                raise CRDLoadError(f"cannot read {file}: {exc}") from exc
            for document in documents:
                if isinstance(document, dict) and document.get("kind") == CRD_KIND:
                    found.append(document)
    return found


def _path(text: str | None) -> tuple[str, ...] | None:
    return jsonpath.simple_path(text) if text else None


def resource_types(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The kinds a (valid) CRD serves: one per served version."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    storage = next(
        (v["name"] for v in spec.get("versions") or [] if v.get("storage")),
        versions[0]["name"] if versions else "",
    )
    types = []
    for version in versions:
        subresources = version.get("subresources") or {}
        scale_raw = subresources.get("scale")
        scale = None
        if isinstance(scale_raw, Mapping):
            scale = ScaleSpec(
                spec_replicas_path=_path(scale_raw.get("specReplicasPath")) or ("spec", "replicas"),
                status_replicas_path=_path(scale_raw.get("statusReplicasPath"))
                or ("status", "replicas"),
                label_selector_path=_path(scale_raw.get("labelSelectorPath")),
            )
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        types.append(
            ResourceType(
                group=str(spec.get("group", "")),
                version=str(version["name"]),
                plural=str(names.get("plural", "")),
                kind=str(names.get("kind", "")),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=str(names.get("singular") or str(names.get("kind", "")).lower()),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status="status" in subresources,
                scale=scale,
                generation=True,
                custom=True,
                crd_name=str((crd.get("metadata") or {}).get("name", "")),
                schema=schema if isinstance(schema, Mapping) else None,
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
                storage_version=storage,
            )
        )
    return types


def validate(crd: Mapping[str, Any]) -> list[FieldError]:
    """What the real server would refuse in a CRD (the checks that matter to its authors)."""
    errors: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group")
    plural = names.get("plural")
    name = (crd.get("metadata") or {}).get("name")
    if not group:
        errors.append(FieldError("spec.group", "FieldValueRequired"))
    for key in ("plural", "kind"):
        if not names.get(key):
            errors.append(FieldError(f"spec.names.{key}", "FieldValueRequired"))
    if group and plural and name != f"{plural}.{group}":
        errors.append(
            FieldError(
                "metadata.name",
                detail='must be spec.names.plural+"."+spec.group',
                value=name,
            )
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errors.append(
            FieldError(
                "spec.scope",
                "FieldValueNotSupported",
                'supported values: "Cluster", "Namespaced"',
                value=spec.get("scope"),
            )
        )
    versions = spec.get("versions") or []
    if not versions:
        errors.append(
            FieldError(
                "spec.versions",
                detail="must have exactly one version marked as storage version",
                value=versions,
            )
        )
    elif sum(1 for v in versions if v.get("storage")) != 1:
        errors.append(
            FieldError(
                "spec.versions",
                detail="must have exactly one version marked as storage version",
                value=[v.get("name") for v in versions],
            )
        )
    for index, version in enumerate(versions):
        where = f"spec.versions[{index}]"
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(schema, Mapping):
            errors.append(FieldError(f"{where}.schema.openAPIV3Schema", "FieldValueRequired"))
            continue
        errors.extend(cel.check_schema_rules(schema, f"{where}.schema.openAPIV3Schema"))
        scale = (version.get("subresources") or {}).get("scale")
        if isinstance(scale, Mapping):
            for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
                if key == "labelSelectorPath" and not scale.get(key):
                    continue
                try:
                    jsonpath.simple_path(str(scale.get(key) or ""))
                except jsonpath.JSONPathError as exc:
                    errors.append(
                        FieldError(
                            f"{where}.subresources.scale.{key}",
                            detail=str(exc),
                            value=scale.get(key),
                        )
                    )
        for col_index, column in enumerate(version.get("additionalPrinterColumns") or []):
            try:
                jsonpath.parse(str(column.get("jsonPath", "")))
            except jsonpath.JSONPathError as exc:
                errors.append(
                    FieldError(
                        f"{where}.additionalPrinterColumns[{col_index}].jsonPath",
                        detail=str(exc),
                        value=column.get("jsonPath"),
                    )
                )
    return errors


def status(crd: Mapping[str, Any], now: str) -> dict[str, Any]:
    """What the apiextensions controllers would report for an accepted CRD."""
    spec = crd.get("spec") or {}
    names = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
    previous = {
        condition.get("type"): condition
        for condition in (crd.get("status") or {}).get("conditions") or []
    }

    def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        old = previous.get(kind) or {}
        return {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": old.get("lastTransitionTime", now),
        }

    stored = list((crd.get("status") or {}).get("storedVersions") or [])
    for version in storage:
        if version not in stored:
            stored.append(version)
    return {
        "acceptedNames": names,
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition(
                "Established", "InitialNamesAccepted", "the initial names have been accepted"
            ),
        ],
        "storedVersions": stored,
    }
