"""Deletion as the API server and its controllers do it: finalizers, propagation, cascades.

An object with finalizers is only marked (`deletionTimestamp`, generation + 1) until the
finalizers are removed; kopf relies on this. `propagationPolicy` decides what happens to its
dependents: Background (the default) deletes them after it, Foreground before it (it waits
with the `foregroundDeletion` finalizer), Orphan keeps them and drops their references.
`collect_garbage()` then does what the garbage collector and the namespace controller would
do (planned in `lifecycle.py`), until there is nothing left to do. Planning looks at every live
object, so after a create or update that cannot have given the controllers work (`settled`)
it is skipped: at fleet scale, planning after every write made the sandbox quadratic.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from batchpilot.sandbox import builtin_kinds, errors, lifecycle
from batchpilot.sandbox.objects import Key, ObjectTable, metadata
from batchpilot.sandbox.resources import Registry, ResourceType


class Deleter:
    def __init__(self, table: ObjectTable, registry: Registry, *, now: Callable[[], str]) -> None:
        self._table = table
        self._registry = registry
        self._now = now

    def type_of(self, key: Key) -> ResourceType:
        """The kind whose storage this key is in (its own API first, for shared storage)."""
        found = self._registry.for_storage(key[0])
        if not found:  # pragma: no cover - objects outlive their kind only briefly
            raise errors.no_such_resource()
        storage = key[0]
        own = [
            rt
            for rt in found
            if (rt.group, rt.version, rt.plural) == (storage.group, storage.version, storage.plural)
        ]
        return (own or found)[0]

    def blocking_finalizers(self, rt: ResourceType, obj: Mapping[str, Any]) -> list[str]:
        blocking = list(metadata(obj).get("finalizers") or [])
        if (rt.group, rt.version, rt.plural) == builtin_kinds.NAMESPACES:
            blocking += list((obj.get("spec") or {}).get("finalizers") or [])
        return blocking

    def delete(self, key: Key, stored: Mapping[str, Any], *, policy: str) -> dict[str, Any]:
        """Delete now, or mark for deletion while finalizers hold; returns the stored state."""
        rt = self.type_of(key)
        uid = str(metadata(stored).get("uid"))
        dependents = [
            (dep_key, dep)
            for dep_key, dep in self._table.live()
            if uid in lifecycle.owner_uids(dep)
        ]
        if policy == "Orphan":
            for dep_key, dep in dependents:
                self._drop_owners(dep_key, dep, frozenset({uid}))
            dependents = []
        finalizers = list(metadata(stored).get("finalizers") or [])
        if policy == "Foreground" and dependents and lifecycle.FOREGROUND not in finalizers:
            finalizers.append(lifecycle.FOREGROUND)
        if finalizers or self.blocking_finalizers(rt, stored):
            marked = copy.deepcopy(dict(stored))
            meta = metadata(marked)
            meta["deletionTimestamp"] = self._now()
            meta["deletionGracePeriodSeconds"] = 0
            meta["finalizers"] = finalizers
            if not finalizers:
                meta.pop("finalizers")
            if "generation" in meta:
                meta["generation"] = int(meta["generation"]) + 1
            if (rt.group, rt.version, rt.plural) == builtin_kinds.NAMESPACES:
                marked.setdefault("status", {})["phase"] = "Terminating"
            return self._table.write(key, marked, "MODIFIED", stored)
        return self._table.remove(key)

    def remove_if_released(self, key: Key, obj: Mapping[str, Any]) -> None:
        """Remove an object being deleted once nothing holds it any more."""
        if lifecycle.deleting(obj) and not self.blocking_finalizers(self.type_of(key), obj):
            self._table.remove(key)

    def _drop_owners(self, key: Key, stored: Mapping[str, Any], uids: frozenset[str]) -> None:
        updated = copy.deepcopy(dict(stored))
        meta = metadata(updated)
        refs = [ref for ref in meta.get("ownerReferences") or [] if ref.get("uid") not in uids]
        if refs:
            meta["ownerReferences"] = refs
        else:
            meta.pop("ownerReferences", None)
        self._table.write(key, updated, "MODIFIED", stored)

    def _release(self, key: Key, stored: Mapping[str, Any], finalizer: str) -> None:
        updated = copy.deepcopy(dict(stored))
        meta = metadata(updated)
        meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != finalizer]
        if not meta["finalizers"]:
            del meta["finalizers"]
        self._table.write(key, updated, "MODIFIED", stored)
        self.remove_if_released(key, updated)

    def _finalize_namespace(self, key: Key, stored: Mapping[str, Any]) -> None:
        updated = copy.deepcopy(dict(stored))
        spec = updated.setdefault("spec", {})
        spec["finalizers"] = [
            f for f in spec.get("finalizers") or [] if f != lifecycle.NAMESPACE_FINALIZER
        ]
        self._table.write(key, updated, "MODIFIED", stored)
        self.remove_if_released(key, updated)

    def settled(self, key: Key, new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
        """Whether a create (`old` None) or an update of one object leaves the controllers
        nothing to do, given they had nothing to do before it: it is neither being deleted nor
        a namespace, its namespace is not terminating, and its owners are the ones it had,
        alive and not being deleted. Anything else may have given them work: plan it."""
        namespaces = self._registry.get(*builtin_kinds.NAMESPACES)
        assert namespaces is not None
        if lifecycle.deleting(new) or key[0] == namespaces.storage:
            return False
        owners = lifecycle.owner_uids(new)
        if old is not None and owners != lifecycle.owner_uids(old):
            return False
        if key[1] is not None:
            namespace = self._table.get((namespaces.storage, None, key[1]))
            if namespace is not None and lifecycle.deleting(namespace):
                return False
        for uid in owners:
            owner = self._table.by_uid(uid)
            if owner is None or lifecycle.deleting(owner[1]):
                return False
        return True

    def collect_garbage(self, *, rounds: int = 100) -> None:
        """Do what the garbage collector and namespace controller would do, until done."""
        namespaces = self._registry.get(*builtin_kinds.NAMESPACES)
        assert namespaces is not None
        for _ in range(rounds):
            actions = lifecycle.plan(list(self._table.live()), namespaces=namespaces.storage)
            if not actions:
                return
            for action in actions:
                stored = self._table.get(action.key)
                if stored is None:
                    continue
                match action:
                    case lifecycle.Delete():
                        if not lifecycle.deleting(stored):
                            self.delete(action.key, stored, policy="Background")
                    case lifecycle.DropOwners(uids=uids):
                        self._drop_owners(action.key, stored, uids)
                    case lifecycle.ReleaseFinalizer(finalizer=finalizer):
                        self._release(action.key, stored, finalizer)
                    case lifecycle.FinalizeNamespace():
                        self._finalize_namespace(action.key, stored)
