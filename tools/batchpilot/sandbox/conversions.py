"""One stored object, several APIs: conversion between how objects are stored and served.

A CRD with several versions stores every object under its storage version (conversion
strategy `None`: only `apiVersion` changes). Events are stored once as core v1 Events and also
served as `events.k8s.io/v1` Events with renamed fields, so `kubectl describe` (core API) sees
an Event that a client posted through the newer API, and the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchpilot.sandbox.objects import copy_json
from batchpilot.sandbox.resources import ResourceType

# events.k8s.io/v1 field -> core/v1 field
_EVENT_FIELDS = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}


def _rename(obj: Mapping[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    return {mapping.get(key, key): value for key, value in obj.items()}


def _typed(api_version: str, kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    rest = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind")}
    return {"apiVersion": api_version, "kind": kind, **rest}


def _is_events_v1(rt: ResourceType) -> bool:
    return rt.group == "events.k8s.io" and rt.plural == "events"


def to_storage(rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form of an object sent to the `rt` API."""
    result = copy_json(dict(obj))
    if _is_events_v1(rt):
        result = _rename(result, _EVENT_FIELDS)
    return _typed(rt.storage_api_version, rt.kind, result)


def from_storage(rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as the `rt` API serves it."""
    result = copy_json(dict(obj))
    if _is_events_v1(rt):
        result = _rename(result, {core: new for new, core in _EVENT_FIELDS.items()})
    return _typed(rt.api_version, rt.kind, result)
