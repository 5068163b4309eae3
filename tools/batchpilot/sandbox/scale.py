"""The `/scale` subresource: an `autoscaling/v1` Scale mapped onto the object it scales.

`kubectl scale`, HPAs and KEDA talk to `/scale` only. For a custom resource, the CRD says
where the replicas live (`specReplicasPath`, `statusReplicasPath`, `labelSelectorPath`); for
built-in workloads it is `spec.replicas`, `status.replicas` and `spec.selector`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from batchpilot.sandbox import errors, selectors
from batchpilot.sandbox.errors import FieldError
from batchpilot.sandbox.resources import ResourceType, ScaleSpec


def _read(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = obj
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _spec(rt: ResourceType) -> ScaleSpec:
    if rt.scale is None:  # pragma: no cover - callers check first
        raise errors.no_such_resource()
    return rt.scale


def _int(value: Any) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return 0


def scale_of(rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The Scale the server shows for an object."""
    spec = _spec(rt)
    metadata = obj.get("metadata") or {}
    status: dict[str, Any] = {"replicas": _int(_read(obj, spec.status_replicas_path))}
    if spec.selector_from_spec:
        try:
            selector = selectors.selector_from_label_selector_object(
                _read(obj, ("spec", "selector"))
            )
        except selectors.SelectorError:
            selector = selectors.LabelSelector()
        if selector.requirements:
            status["selector"] = str(selector)
    elif spec.label_selector_path is not None:
        selector_text = _read(obj, spec.label_selector_path)
        if isinstance(selector_text, str) and selector_text:
            status["selector"] = selector_text
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: metadata[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in metadata
        },
        "spec": {"replicas": _int(_read(obj, spec.spec_replicas_path))},
        "status": status,
    }


def replicas(scale: Any) -> int:
    """The desired replicas of a Scale sent by a client (422 when it is not a count)."""
    value = _read(scale, ("spec", "replicas")) if isinstance(scale, Mapping) else None
    if value is None:
        value = 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.invalid(
            errors.ResourceName("autoscaling", "scale", "Scale"),
            str(_read(scale, ("metadata", "name")) or ""),
            [FieldError("spec.replicas", "FieldValueTypeInvalid", "must be an integer", value)],
        )
    if value < 0:
        raise errors.invalid(
            errors.ResourceName("autoscaling", "scale", "Scale"),
            str(_read(scale, ("metadata", "name")) or ""),
            [FieldError("spec.replicas", detail="must be greater than or equal to 0", value=value)],
        )
    return value


def with_replicas(rt: ResourceType, obj: Mapping[str, Any], count: int) -> dict[str, Any]:
    """A copy of the object with its desired replicas set."""
    result = copy.deepcopy(dict(obj))
    path = _spec(rt).spec_replicas_path
    node = result
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = count
    return result
