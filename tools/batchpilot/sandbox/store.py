"""The stateful heart of the sandbox: objects with real API-server write semantics.

kmock keeps the objects (`emulator.objects`, with their history, so tests can assert on past
versions); this module decides what every write does to them, as kube-apiserver does:

- metadata the server owns: `uid`, `creationTimestamp`, an increasing `resourceVersion`
  (one counter for everything, like etcd's revision), and `generation`, bumped only when the
  spec changes — never for status or metadata-only writes;
- optimistic concurrency: a stale `resourceVersion` in a PUT or patch is a 409 Conflict;
  custom resources cannot be PUT without one;
- the status subresource: writes to the object ignore `status`, writes to `/status` change
  only `status`; `/scale` reads and writes the replicas where the kind keeps them;
- `generateName`, namespaces that must exist (and refuse new objects while terminating);
- deletion: finalizers hold an object with a `deletionTimestamp` until they are removed;
  propagation policies Background (default), Foreground and Orphan; garbage collection
  through ownerReferences across kinds (see `lifecycle.py`);
- no-op writes change nothing: no new resourceVersion, no watch event;
- CRD objects are live: creating one serves its kinds, deleting one removes them and their
  objects (at once: the real server's cleanup finalizer is not reproduced).

Storage primitives are in `objects.py`, deletion and garbage collection in `deletion.py`.
Every method is synchronous and runs on the event loop, so each write is atomic; from another
thread, go through `LocalKubernetesAPI.call()`.
"""

from __future__ import annotations

import copy
import datetime
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import kmock

from batchpilot.sandbox import (
    admission,
    builtin_kinds,
    conversions,
    crds,
    defaults,
    errors,
    lifecycle,
    patching,
    scale,
    selectors,
)
from batchpilot.sandbox.deletion import Deleter
from batchpilot.sandbox.errors import FieldError
from batchpilot.sandbox.objects import Key, ObjectTable
from batchpilot.sandbox.objects import metadata as _meta
from batchpilot.sandbox.resources import Registry, ResourceType
from batchpilot.sandbox.watching import Watch, WatchHub, translate

Clock = Callable[[], datetime.datetime]
_SERVER_FIELDS = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
    "name",
    "namespace",
    "managedFields",
    "selfLink",
)
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # as apiserver's generateName suffixes


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _without_version(obj: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(obj)
    result["metadata"] = {k: v for k, v in _meta(obj).items() if k != "resourceVersion"}
    return result


class Store:
    """Objects of every served kind, written with the API server's semantics."""

    def __init__(
        self,
        registry: Registry,
        objects: kmock.ObjectsArray,
        *,
        hub: WatchHub | None = None,
        clock: Clock = _utc_now,
        seed: int | None = None,
        history_limit: int | None = 100,
    ) -> None:
        self.registry = registry
        self.objects = objects
        self.hub = hub or WatchHub()
        self.clock = clock
        self._rng = random.Random(seed)
        self._table = ObjectTable(objects, self.hub, history_limit=history_limit)
        self._table.removal_hooks.append(self._removed)
        self._deleter = Deleter(self._table, registry, now=self.now)
        self._cluster_ips = defaults.ClusterIPs()

    # --- bookkeeping ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion handed out (what a list returns)."""
        return self._table.resource_version

    def now(self) -> str:
        return self.clock().astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return (rt.storage, namespace if rt.namespaced else None, name)

    def _removed(self, key: Key, final: Mapping[str, Any]) -> None:
        if (key[0].group, key[0].plural) == (builtin_kinds.CRDS[0], builtin_kinds.CRDS[2]):
            self._crd_removed(final)

    # --- CRDs are live -------------------------------------------------------------------------

    def _crd_written(self, crd: Mapping[str, Any]) -> None:
        name = str(_meta(crd).get("name"))
        self.registry.remove_crd(name)
        for rt in crds.resource_types(crd):
            self.registry.add(rt)

    def _crd_removed(self, crd: Mapping[str, Any]) -> None:
        gone = self.registry.remove_crd(str(_meta(crd).get("name")))
        for storage in {rt.storage for rt in gone}:
            for key, _ in list(self._table.live(storage)):
                self._table.remove(key)

    def _is_crd(self, rt: ResourceType) -> bool:
        return (rt.group, rt.version, rt.plural) == builtin_kinds.CRDS

    def _is_namespace(self, rt: ResourceType) -> bool:
        return (rt.group, rt.version, rt.plural) == builtin_kinds.NAMESPACES

    # --- reads ---------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        stored = self._table.get(self._key(rt, namespace, name))
        if stored is None:
            raise errors.not_found(rt.name, name)
        return conversions.from_storage(rt, stored)

    def _matcher(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
    ) -> Callable[[Mapping[str, Any]], bool]:
        def matches(stored: Mapping[str, Any]) -> bool:
            meta = stored.get("metadata") or {}
            if rt.namespaced and namespace is not None and meta.get("namespace") != namespace:
                return False
            if not labels.matches(meta.get("labels")):
                return False
            if fields.requirements:
                return fields.matches(conversions.from_storage(rt, stored))
            return True

        return matches

    def list_objects(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        labels: selectors.LabelSelector | None = None,
        fields: selectors.FieldSelector | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Matching objects and the resourceVersion to watch from."""
        matches = self._matcher(
            rt, namespace, labels or selectors.LabelSelector(), fields or selectors.FieldSelector()
        )
        items = [
            conversions.from_storage(rt, stored)
            for _, stored in self._table.live(rt.storage)
            if matches(stored)
        ]
        return items, self._table.resource_version

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        resource_version: str | None,
        labels: selectors.LabelSelector | None = None,
        fields: selectors.FieldSelector | None = None,
        send_initial_events: bool = False,
        timeout: float | None = None,
    ) -> Watch:
        """Open a watch (events come in storage form; convert with `conversions`)."""
        matches = self._matcher(
            rt, namespace, labels or selectors.LabelSelector(), fields or selectors.FieldSelector()
        )
        backlog: list[tuple[str, Mapping[str, Any]]]
        if send_initial_events or resource_version in (None, "", "0"):
            since = self._table.resource_version
            backlog = [
                ("ADDED", copy.deepcopy(stored))
                for _, stored in self._table.live(rt.storage)
                if matches(stored)
            ]
            if send_initial_events:
                bookmark = {
                    "kind": rt.kind,
                    "apiVersion": rt.api_version,
                    "metadata": {
                        "resourceVersion": str(since),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                backlog.append(("BOOKMARK", bookmark))
        else:
            try:
                since = int(str(resource_version))
            except ValueError:
                raise errors.bad_request(
                    f"invalid resource version: {resource_version!r}"
                ) from None
            backlog = []
            for change in self.hub.since(rt.storage, since):
                event = translate(change, matches)
                if event is not None:
                    backlog.append(event)
        return Watch(
            self.hub, rt.storage, backlog=backlog, since=since, matches=matches, timeout=timeout
        )

    # --- create --------------------------------------------------------------------------------

    def _check_type(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON object")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API"
                f" version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise errors.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise errors.bad_request("metadata must be an object")
        return obj

    def _generate_name(self, rt: ResourceType, namespace: str | None, prefix: str) -> str:
        for _ in range(100):
            suffix = "".join(self._rng.choice(_NAME_ALPHABET) for _ in range(5))
            candidate = f"{prefix[: 253 - 5]}{suffix}"
            if self._table.get(self._key(rt, namespace, candidate)) is None:
                return candidate
        raise errors.ApiError(  # pragma: no cover - 27^5 names per prefix
            409, "AlreadyExists", f"unable to generate a unique name for {prefix!r}"
        )

    def _namespace_usable(self, namespace: str) -> None:
        ns_type = self.registry.get(*builtin_kinds.NAMESPACES)
        assert ns_type is not None
        stored = self._table.get(self._key(ns_type, None, namespace))
        if stored is None:
            raise errors.not_found(ns_type.name, namespace)
        if lifecycle.deleting(stored):
            raise errors.forbidden(
                f"unable to create new content in namespace {namespace} because it is being"
                " terminated"
            )

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        field_validation: str = "Warn",
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Create an object; returns it as stored and any warnings."""
        obj = self._check_type(rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise errors.bad_request("a namespace is required to create this object")
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on"
                    " the request"
                )
            meta["namespace"] = namespace
            self._namespace_usable(namespace)
        else:
            namespace = None
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        for field in _SERVER_FIELDS:
            if field not in ("name", "namespace"):
                meta.pop(field, None)
        if not meta.get("name") and isinstance(meta.get("generateName"), str):
            meta["name"] = self._generate_name(rt, namespace, meta["generateName"])
        if rt.status:
            obj.pop("status", None)
        obj = {"apiVersion": rt.api_version, "kind": rt.kind, **obj}
        defaults.apply(rt, obj)
        admitted = admission.admit(rt, obj, old=None, field_validation=field_validation)
        obj = admitted.obj
        meta = obj["metadata"]
        key = self._key(rt, namespace, str(meta["name"]))
        if self._table.get(key) is not None:
            raise errors.already_exists(rt.name, str(meta["name"]))
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = self.now()
        if rt.generation:
            meta["generation"] = 1
        if self._is_namespace(rt):
            obj.setdefault("spec", {}).setdefault("finalizers", [lifecycle.NAMESPACE_FINALIZER])
            obj["status"] = {"phase": "Active"}
        if self._is_crd(rt):
            obj["status"] = crds.status(obj, self.now())
        if (rt.group, rt.plural) == ("", "services") and not dry_run:
            self._cluster_ips.allocate(obj)
        stored = conversions.to_storage(rt, obj)
        if dry_run:
            return conversions.from_storage(rt, stored), admitted.warnings
        self._table.write(key, stored, "ADDED", None)
        if self._is_crd(rt):
            self._crd_written(stored)
        if not self._deleter.settled(key, stored, None):
            self.collect_garbage()
        return conversions.from_storage(rt, stored), admitted.warnings

    # --- update & patch ------------------------------------------------------------------------

    def _current(
        self, rt: ResourceType, namespace: str | None, name: str
    ) -> tuple[Key, dict[str, Any]]:
        key = self._key(rt, namespace, name)
        stored = self._table.get(key)
        if stored is None:
            raise errors.not_found(rt.name, name)
        return key, stored

    def _check_identity(
        self, rt: ResourceType, obj: Mapping[str, Any], name: str, namespace: str | None
    ) -> None:
        meta = _meta(obj)
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL"
                f" ({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the"
                " request"
            )

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: str = "Warn",
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """PUT: replace the object (or, on `/status`, its status)."""
        key, stored = self._current(rt, namespace, name)
        current = conversions.from_storage(rt, stored)
        body = self._check_type(rt, body)
        self._check_identity(rt, body, name, namespace)
        wanted = _meta(body).get("resourceVersion")
        if wanted:
            if str(wanted) != _meta(current).get("resourceVersion"):
                raise errors.modified_conflict(rt.name, name)
        elif rt.custom:
            raise errors.invalid(
                rt.name,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion",
                        detail="must be specified for an update",
                        value=0,
                    )
                ],
            )
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        else:
            new = body
            if rt.status:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
        return self._commit(
            rt, key, stored, current, new, dry_run=dry_run, field_validation=field_validation
        )

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: str = "Warn",
    ) -> tuple[dict[str, Any], tuple[str, ...], bool]:
        """PATCH in any of the supported formats; returns (object, warnings, created)."""
        key = self._key(rt, namespace, name)
        stored = self._table.get(key)
        if rt.custom and content_type == patching.STRATEGIC_MERGE_PATCH:
            raise errors.unsupported_media_type(
                content_type,
                [patching.JSON_PATCH, patching.MERGE_PATCH, patching.APPLY_PATCH],
            )
        if stored is None:
            if content_type == patching.APPLY_PATCH and subresource is None:
                body = self._check_type(rt, patch)
                self._check_identity(rt, body, name, namespace)
                body["metadata"]["name"] = name
                created, warnings = self.create(
                    rt, namespace, body, dry_run=dry_run, field_validation=field_validation
                )
                return created, warnings, True
            raise errors.not_found(rt.name, name)
        current = conversions.from_storage(rt, stored)
        patched = patching.apply(content_type, current, patch)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patched object must be a JSON object")
        self._check_type(rt, patched)
        self._check_identity(rt, patched, name, namespace)
        wanted = _meta(patched).get("resourceVersion")
        if wanted and str(wanted) != _meta(current).get("resourceVersion"):
            raise errors.modified_conflict(rt.name, name)
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in patched:
                new["status"] = patched["status"]
            else:
                new.pop("status", None)
        else:
            new = patched
            if rt.status:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
        obj, warnings = self._commit(
            rt, key, stored, current, new, dry_run=dry_run, field_validation=field_validation
        )
        return obj, warnings, False

    def _spec_changed(
        self, rt: ResourceType, old: Mapping[str, Any], new: Mapping[str, Any]
    ) -> bool:
        if rt.custom:
            ignored = {"metadata", "apiVersion", "kind"} | ({"status"} if rt.status else set())
            return {k: v for k, v in old.items() if k not in ignored} != {
                k: v for k, v in new.items() if k not in ignored
            }
        return old.get("spec") != new.get("spec")

    def _commit(
        self,
        rt: ResourceType,
        key: Key,
        stored: dict[str, Any],
        current: dict[str, Any],
        new: dict[str, Any],
        *,
        dry_run: bool,
        field_validation: str,
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Admit and write a new state of an existing object (or nothing, for a no-op)."""
        new = {"apiVersion": rt.api_version, "kind": rt.kind, **new}
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        old_meta = _meta(current)
        for field in _SERVER_FIELDS:
            if field in old_meta:
                meta[field] = copy.deepcopy(old_meta[field])
            else:
                meta.pop(field, None)
        if lifecycle.deleting(current):
            before = old_meta.get("finalizers") or []
            added = [f for f in meta.get("finalizers") or [] if f not in before]
            if added:
                raise errors.invalid(
                    rt.name,
                    str(meta.get("name")),
                    [
                        FieldError(
                            "metadata.finalizers",
                            "FieldValueForbidden",
                            "no new finalizers can be added if the object is being deleted,"
                            f" found new finalizers {added}",
                        )
                    ],
                )
        defaults.apply(rt, new, current)
        admitted = admission.admit(rt, new, old=current, field_validation=field_validation)
        new = admitted.obj
        meta = new["metadata"]
        if self._is_crd(rt):
            new["status"] = crds.status(new, self.now())
        if rt.generation and "generation" in meta and self._spec_changed(rt, current, new):
            meta["generation"] = int(meta["generation"]) + 1
        if _without_version(new) == _without_version(current):
            return current, admitted.warnings
        result = conversions.to_storage(rt, new)
        if dry_run:
            return conversions.from_storage(rt, result), admitted.warnings
        self._table.write(key, result, "MODIFIED", stored)
        if self._is_crd(rt):
            self._crd_written(result)
        self._deleter.remove_if_released(key, result)
        if not self._deleter.settled(key, result, stored):
            self.collect_garbage()
        return conversions.from_storage(rt, result), admitted.warnings

    # --- delete --------------------------------------------------------------------------------

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Delete (or start deleting) an object; returns its last state."""
        options = options or {}
        key, stored = self._current(rt, namespace, name)
        current = conversions.from_storage(rt, stored)
        preconditions = options.get("preconditions") or {}
        uid, version = _meta(current).get("uid"), _meta(current).get("resourceVersion")
        if preconditions.get("uid") and preconditions["uid"] != uid:
            raise errors.conflict(
                rt.name,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object"
                f" meta: {uid}",
            )
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != version:
            raise errors.conflict(
                rt.name,
                name,
                "Precondition failed: ResourceVersion in precondition:"
                f" {preconditions['resourceVersion']}, ResourceVersion in object meta: {version}",
            )
        policy = options.get("propagationPolicy")
        if policy is None:
            orphan = options.get("orphanDependents")
            policy = "Orphan" if orphan is True else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise errors.bad_request(
                f'propagationPolicy: Unsupported value: "{policy}": supported values:'
                ' "Foreground", "Background", "Orphan"'
            )
        if dry_run or lifecycle.deleting(current):
            return current
        result = self._deleter.delete(key, stored, policy=policy)
        self.collect_garbage()
        return conversions.from_storage(rt, result)

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        labels: selectors.LabelSelector | None = None,
        fields: selectors.FieldSelector | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        items, _ = self.list_objects(rt, namespace, labels=labels, fields=fields)
        deleted = []
        for item in items:
            meta = _meta(item)
            deleted.append(self.delete(rt, meta.get("namespace"), str(meta["name"]), options))
        return deleted

    def collect_garbage(self) -> None:
        """Do what the garbage collector and namespace controller would do, until done."""
        self._deleter.collect_garbage()

    # --- scale ---------------------------------------------------------------------------------

    def _scalable(self, rt: ResourceType) -> None:
        if rt.scale is None:
            raise errors.no_such_resource()

    def get_scale(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        self._scalable(rt)
        return scale.scale_of(rt, self.get(rt, namespace, name))

    def write_scale(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PUT (body) or PATCH (content_type + body) the Scale; returns the new Scale."""
        self._scalable(rt)
        key, stored = self._current(rt, namespace, name)
        current = conversions.from_storage(rt, stored)
        before = scale.scale_of(rt, current)
        wanted = patching.apply(content_type, before, body) if content_type else body
        if not isinstance(wanted, Mapping):
            raise errors.bad_request("a Scale must be a JSON object")
        version = _meta(wanted).get("resourceVersion")
        if version and str(version) != _meta(current).get("resourceVersion"):
            raise errors.modified_conflict(rt.name, name)
        new = scale.with_replicas(rt, current, scale.replicas(wanted))
        obj, _ = self._commit(
            rt, key, stored, current, new, dry_run=dry_run, field_validation="Ignore"
        )
        return scale.scale_of(rt, obj)

    # --- conveniences for tests and the sandbox ------------------------------------------------

    def install_crd(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a CRD (as `kubectl apply` would), outside any HTTP request."""
        rt = self.registry.get(*builtin_kinds.CRDS)
        assert rt is not None
        name = str(_meta(crd).get("name", ""))
        key = self._key(rt, None, name)
        stored = self._table.get(key)
        if stored is None:
            obj, _ = self.create(rt, None, dict(crd), field_validation="Ignore")
            return obj
        body = copy.deepcopy(dict(crd))
        body.setdefault("metadata", {})["resourceVersion"] = _meta(stored)["resourceVersion"]
        obj, _ = self.update(rt, None, name, body, field_validation="Ignore")
        return obj

    def ensure_namespace(self, name: str) -> dict[str, Any]:
        rt = self.registry.get(*builtin_kinds.NAMESPACES)
        assert rt is not None
        stored = self._table.get(self._key(rt, None, name))
        if stored is not None:
            return conversions.from_storage(rt, stored)
        obj, _ = self.create(rt, None, {"metadata": {"name": name}})
        return obj

    def count(self, rt: ResourceType, namespace: str | None = None) -> int:
        items, _ = self.list_objects(rt, namespace)
        return len(items)


def new_registry() -> Registry:
    registry = Registry()
    for rt in builtin_kinds.builtin_types():
        registry.add(rt)
    return registry


def new_store(objects: kmock.ObjectsArray, **kwargs: Any) -> Store:
    """A store with the built-in kinds and the initial namespaces."""
    store = Store(new_registry(), objects, **kwargs)
    for namespace in builtin_kinds.INITIAL_NAMESPACES:
        store.ensure_namespace(namespace)
    return store
