"""What the garbage collector and the namespace controller would do next, planned purely.

The operator relies on ownerReferences: deleting an InferenceService must take its
Deployment, Service and ConfigMap with it, and a terminating Namespace must empty itself.
No controllers run in the sandbox, so after every write the store asks `plan()` what these
controllers would do and does it at once (synchronously: the real ones act within moments).

- A dependent whose owners are all gone is deleted (background cascade); one that lost only
  some owners loses those references.
- An object deleted with `propagationPolicy: Foreground` waits for its dependents: they are
  deleted, then its `foregroundDeletion` finalizer is released.
- A terminating Namespace has its objects deleted, then its `kubernetes` finalizer released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kmock

Key = tuple[kmock.resource, str | None, str]
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
NAMESPACE_FINALIZER = "kubernetes"


@dataclass(frozen=True)
class Delete:
    key: Key


@dataclass(frozen=True)
class DropOwners:
    key: Key
    uids: frozenset[str]


@dataclass(frozen=True)
class ReleaseFinalizer:
    key: Key
    finalizer: str


@dataclass(frozen=True)
class FinalizeNamespace:
    key: Key


Action = Delete | DropOwners | ReleaseFinalizer | FinalizeNamespace


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    return [
        str(ref.get("uid"))
        for ref in _meta(obj).get("ownerReferences") or []
        if isinstance(ref, Mapping) and ref.get("uid")
    ]


def plan(
    objects: Sequence[tuple[Key, Mapping[str, Any]]], *, namespaces: kmock.resource
) -> list[Action]:
    """The controllers' next actions for the current (live) objects."""
    actions: list[Action] = []
    alive = {str(_meta(obj).get("uid")) for _, obj in objects if _meta(obj).get("uid")}
    dependents: dict[str, list[tuple[Key, Mapping[str, Any]]]] = {}
    for key, obj in objects:
        for uid in owner_uids(obj):
            dependents.setdefault(uid, []).append((key, obj))

    for key, obj in objects:
        owners = owner_uids(obj)
        if not owners:
            continue
        dangling = frozenset(uid for uid in owners if uid not in alive)
        if dangling and len(dangling) == len(set(owners)):
            if not deleting(obj):
                actions.append(Delete(key))
        elif dangling:
            actions.append(DropOwners(key, dangling))

    for key, obj in objects:
        if not deleting(obj):
            continue
        uid = str(_meta(obj).get("uid"))
        if FOREGROUND in (_meta(obj).get("finalizers") or []):
            waiting = dependents.get(uid, [])
            if not waiting:
                actions.append(ReleaseFinalizer(key, FOREGROUND))
            actions.extend(Delete(dep_key) for dep_key, dep in waiting if not deleting(dep))
        if key[0] == namespaces:
            contents = [(k, o) for k, o in objects if k[1] == key[2]]
            spec_finalizers = (obj.get("spec") or {}).get("finalizers") or []
            if not contents and NAMESPACE_FINALIZER in spec_finalizers:
                actions.append(FinalizeNamespace(key))
            actions.extend(Delete(k) for k, o in contents if not deleting(o))
    return _unique(actions)


def _unique(actions: list[Action]) -> list[Action]:
    seen: set[Action] = set()
    result: list[Action] = []
    for action in actions:
        if action not in seen:
            seen.add(action)
            result.append(action)
    return result
