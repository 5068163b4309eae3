"""Server-side Tables: what `kubectl get` prints, computed by the server as the real one does.

kubectl asks for `application/json;as=Table;v=v1;g=meta.k8s.io` and prints the server's
columns. For custom resources those come from the CRD's `additionalPrinterColumns` (JSONPath
into the object, typed cells, `date` as an age like `5m`); that is how
`kubectl get inferenceservices` reads like a dashboard. Built-in kinds get the columns kubectl
users know (Deployments: READY, UP-TO-DATE, AVAILABLE, AGE); other kinds get NAME and AGE.
Everything here is pure: objects and `now` in, a Table dict out.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchpilot.sandbox import jsonpath, selectors

Obj = Mapping[str, Any]
CellFn = Callable[[Obj, datetime.datetime], Any]


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "string"
    format: str = ""
    description: str = ""
    priority: int = 0
    json_path: str | None = None
    cell: CellFn | None = field(default=None, compare=False)

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }

    def value(self, obj: Obj, now: datetime.datetime) -> Any:
        if self.cell is not None:
            return self.cell(obj, now)
        if self.json_path is None:  # pragma: no cover - columns have one or the other
            return None
        try:
            found = jsonpath.find(self.json_path, obj)
        except jsonpath.JSONPathError:
            return None
        if not found:
            return None
        return json_cell(self.type, found[0], now)


def parse_timestamp(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def human_duration(seconds: float) -> str:
    """Kubernetes' `duration.HumanDuration`: 45s, 2m5s, 3h10m, 4d2h, 2y30d."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def age(timestamp: Any, now: datetime.datetime) -> str:
    moment = parse_timestamp(timestamp)
    if moment is None:
        return "<unknown>"
    return human_duration((now - moment).total_seconds())


def json_cell(column_type: str, value: Any, now: datetime.datetime) -> Any:
    """A cell of a CRD printer column, typed as the apiextensions server types it."""
    match column_type:
        case "string":
            if isinstance(value, str):
                return value
            if isinstance(value, bool):
                return "true" if value else "false"
            if isinstance(value, int | float):
                return str(int(value)) if float(value).is_integer() else str(value)
            return json.dumps(value, separators=(",", ":"))
        case "integer":
            if isinstance(value, int | float) and not isinstance(value, bool):
                return int(value)
            return None
        case "number":
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
            return None
        case "boolean":
            return value if isinstance(value, bool) else None
        case "date":
            return age(value, now) if isinstance(value, str) else None
    return None


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _get(obj: Obj, *path: str) -> Any:
    node: Any = obj
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


NAME = Column(
    "Name",
    format="name",
    description="Name must be unique within a namespace.",
    cell=lambda obj, now: _meta(obj).get("name"),
)
AGE = Column(
    "Age",
    description="CreationTimestamp is a timestamp representing the server time when this object"
    " was created.",
    cell=lambda obj, now: age(_meta(obj).get("creationTimestamp"), now),
)


def crd_columns(printer_columns: Sequence[Mapping[str, Any]]) -> list[Column]:
    """NAME, then the CRD's columns — or NAME and AGE when it declares none."""
    if not printer_columns:
        return [NAME, Column("Age", type="date", json_path=".metadata.creationTimestamp")]
    return [NAME] + [
        Column(
            name=str(column.get("name", "")),
            type=str(column.get("type", "string")),
            format=str(column.get("format", "")),
            description=str(column.get("description", "")),
            priority=int(column.get("priority", 0)),
            json_path=str(column.get("jsonPath", "")),
        )
        for column in printer_columns
    ]


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _containers(obj: Obj) -> list[Mapping[str, Any]]:
    return list(_get(obj, "spec", "template", "spec", "containers") or [])


def _selector(obj: Obj) -> str:
    try:
        selector = selectors.selector_from_label_selector_object(_get(obj, "spec", "selector"))
    except selectors.SelectorError:
        return "<invalid>"
    return str(selector) or "<none>"


def _ports(obj: Obj) -> str:
    parts = []
    for port in _get(obj, "spec", "ports") or []:
        text = str(port.get("port", ""))
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        parts.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(parts) or "<none>"


def _event_last_seen(obj: Obj, now: datetime.datetime) -> str:
    for key in ("lastTimestamp", "deprecatedLastTimestamp", "eventTime"):
        if obj.get(key):
            return age(obj[key], now)
    return age(_meta(obj).get("creationTimestamp"), now)


def _event_object(obj: Obj) -> str:
    ref = obj.get("involvedObject") or obj.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _pod_ready(obj: Obj) -> str:
    statuses = _get(obj, "status", "containerStatuses") or []
    total = len(_get(obj, "spec", "containers") or [])
    return f"{sum(1 for status in statuses if status.get('ready'))}/{total}"


def _column(name: str, cell: CellFn, *, type: str = "string", priority: int = 0) -> Column:
    return Column(name, type=type, priority=priority, cell=cell)


def _event_columns() -> list[Column]:
    return [
        _column("Last Seen", _event_last_seen),
        _column("Type", lambda obj, now: obj.get("type")),
        _column("Reason", lambda obj, now: obj.get("reason")),
        _column("Object", lambda obj, now: _event_object(obj)),
        _column(
            "Source",
            lambda obj, now: (
                _get(obj, "source", "component")
                or obj.get("reportingComponent")
                or obj.get("reportingController")
            ),
            priority=1,
        ),
        _column("Message", lambda obj, now: obj.get("message") or obj.get("note")),
        _column("Count", lambda obj, now: obj.get("count"), type="integer", priority=1),
        _column("Name", lambda obj, now: _meta(obj).get("name"), priority=1),
    ]


def builtin_columns(group: str, plural: str) -> list[Column]:
    """The columns of a built-in kind (NAME and AGE for kinds without their own)."""
    match group, plural:
        case "apps", "deployments":
            return [
                NAME,
                _column(
                    "Ready",
                    lambda obj, now: (
                        f"{_count(_get(obj, 'status', 'readyReplicas'))}"
                        f"/{_count(_get(obj, 'spec', 'replicas'))}"
                    ),
                ),
                _column(
                    "Up-to-date",
                    lambda obj, now: _count(_get(obj, "status", "updatedReplicas")),
                    type="integer",
                ),
                _column(
                    "Available",
                    lambda obj, now: _count(_get(obj, "status", "availableReplicas")),
                    type="integer",
                ),
                AGE,
                _column(
                    "Containers",
                    lambda obj, now: ",".join(str(c.get("name")) for c in _containers(obj)),
                    priority=1,
                ),
                _column(
                    "Images",
                    lambda obj, now: ",".join(str(c.get("image")) for c in _containers(obj)),
                    priority=1,
                ),
                _column("Selector", lambda obj, now: _selector(obj), priority=1),
            ]
        case "apps", "replicasets" | "statefulsets":
            return [
                NAME,
                _column("Desired", lambda obj, now: _count(_get(obj, "spec", "replicas"))),
                _column("Ready", lambda obj, now: _count(_get(obj, "status", "readyReplicas"))),
                AGE,
            ]
        case "", "pods":
            return [
                NAME,
                _column("Ready", lambda obj, now: _pod_ready(obj)),
                _column("Status", lambda obj, now: _get(obj, "status", "phase") or "Pending"),
                _column(
                    "Restarts",
                    lambda obj, now: sum(
                        _count(status.get("restartCount"))
                        for status in _get(obj, "status", "containerStatuses") or []
                    ),
                    type="integer",
                ),
                AGE,
            ]
        case "", "configmaps":
            return [
                NAME,
                _column(
                    "Data",
                    lambda obj, now: len(obj.get("data") or {}) + len(obj.get("binaryData") or {}),
                    type="integer",
                ),
                AGE,
            ]
        case "", "secrets":
            return [
                NAME,
                _column("Type", lambda obj, now: obj.get("type") or "Opaque"),
                _column("Data", lambda obj, now: len(obj.get("data") or {}), type="integer"),
                AGE,
            ]
        case "", "services":
            return [
                NAME,
                _column("Type", lambda obj, now: _get(obj, "spec", "type") or "ClusterIP"),
                _column("Cluster-IP", lambda obj, now: _get(obj, "spec", "clusterIP") or "<none>"),
                _column("External-IP", lambda obj, now: "<none>"),
                _column("Port(s)", lambda obj, now: _ports(obj)),
                AGE,
            ]
        case "", "namespaces":
            return [
                NAME,
                _column("Status", lambda obj, now: _get(obj, "status", "phase") or "Active"),
                AGE,
            ]
        case ("", "events") | ("events.k8s.io", "events"):
            return _event_columns()
        case "policy", "poddisruptionbudgets":
            return [
                NAME,
                _column("Min Available", lambda obj, now: _get(obj, "spec", "minAvailable")),
                _column("Max Unavailable", lambda obj, now: _get(obj, "spec", "maxUnavailable")),
                _column(
                    "Allowed Disruptions",
                    lambda obj, now: _count(_get(obj, "status", "disruptionsAllowed")),
                    type="integer",
                ),
                AGE,
            ]
        case "apiextensions.k8s.io", "customresourcedefinitions":
            return [
                NAME,
                _column("Created At", lambda obj, now: _meta(obj).get("creationTimestamp")),
            ]
        case "coordination.k8s.io", "leases":
            return [
                NAME,
                _column("Holder", lambda obj, now: _get(obj, "spec", "holderIdentity")),
                AGE,
            ]
    return [NAME, AGE]


def _row_object(obj: Obj, include_object: str) -> dict[str, Any] | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(_meta(obj)),
    }


def build_table(
    columns: Sequence[Column],
    objects: Sequence[Obj],
    *,
    now: datetime.datetime,
    resource_version: str | None = None,
    include_object: str = "Metadata",
    api_version: str = "meta.k8s.io/v1",
) -> dict[str, Any]:
    """A `meta.k8s.io` Table of the objects, one row each."""
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [column.value(obj, now) for column in columns]}
        row_object = _row_object(obj, include_object)
        if row_object is not None:
            row["object"] = row_object
        rows.append(row)
    metadata: dict[str, Any] = {}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        "columnDefinitions": [column.definition() for column in columns],
        "rows": rows,
    }
