"""The InferenceServices, their children and their pods, read from memory that the watches keep
current; writes go to the API, and what it answers goes into that memory.

A pass over an InferenceService reads it and its five children; with GETs that is six requests
per pass, and an idle fleet of 2,000 passes every interval. kopf already watches every one of
those kinds (the InferenceService for its handlers, the children for their events), so the
objects are in the operator's hands anyway: `WatchCache` keeps them, and a pass reads memory.

Why fed by kopf rather than by informers of our own: a second watch per kind would double the
watch traffic, and kopf's `@kopf.index` is the one hook that sees every object of the initial
list and every later change *before* any handler runs — kopf starts no resource handler until
every index has its initial list. So no pass of a handler ever sees a half-listed cache, which
is what would otherwise make it create a child that exists. Why our own store rather than
kopf's index contents: an index is read-only to us (no write-through), is shaped per key and
value by kopf, and is updated on kopf's loop while passes read from its worker threads. The
index functions (handlers.py) only hand each object to `seen`; deletions come from the same
per-object stream through `gone` (kopf does not show them to index functions).

What keeps it right:
- Newest wins, by `resourceVersion`: what a write returned (`create`, `replace`, `patch`) goes in
  at once, so the next pass neither re-creates nor re-patches from a copy the watch has not
  brought yet, and an older watch event arriving later does not overwrite it. Kubernetes calls
  resource versions opaque, but they are etcd's revision (an increasing integer) on every real
  API server and on the sandbox's; a version that is not an integer makes the later arrival win.
- Our own delete hides the object until the watch's DELETED arrives.
- Someone else's edit or deletion arrives as a watch event like any other: the cache has it
  before the child-event handler that triggers the repair runs (same object, same stream, the
  index first).
- A deletion no watch event reports — made while a watch was down and could not resume (410
  Gone), so that kopf listed the kind again — is told by that list: what the cache holds and
  the list does not, no newer than the list, goes (`relisted`, fed by relists.py).
- Until the first handler runs (`mark_synced`), a miss is asked of the API: the autopilot's
  fleet loop starts with the operator, not after kopf's initial lists. Or it lists what its
  rounds read itself (`take_stock`: one list per kind, where kopf takes each object of its lists
  through its machinery, about 17 s over the 6,000 objects of 1,000 services): a miss of a kind
  so listed is "no such object" from then on, and kopf's own lists correct the cache as they
  come in (newer versions win; what a list no longer shows goes, `relisted`).
- A write answered 409 or 404 means what was read is behind the API (a name taken by someone
  else's object, which no label filter brought in, or a newer version): the object is read
  afresh into the cache before the error goes up, so the reconciler's one retry sees it.
- Children are kept when they carry the operator's labels, or when their name is already known
  (a child whose labels someone edited, a foreign object met by a 409): a miss is then "no
  such object", and the PodDisruptionBudget that should not exist costs no GET either.
- What a spec names and the operator does not own (the API keys' Secret) is kept too, from the
  moment an object that names it is in memory (`references`): the watch brings its creation, its
  edits and its deletion, and `referrers` says whom to reconcile for them (handlers.py). Read
  through `get_referenced`: a miss is asked of the API once after it is first named (it may
  predate the naming, which the watch did not know to keep), then means "no such object". An
  object no one names any longer is dropped, unless `keep` wants it anyway.

Memory: the children are kept as their JSON text (`packed`) and parsed on each read — a
Deployment's dict is several times its text, and at 2,000 services the children's dicts alone
were ~80 MiB; a pass parses its six in well under a millisecond. `slim` trims what is kept: a pod
to what its endpoints need, a Secret the operator does not control to the API keys check's
verdict, never its keys (children/keys_secret.py). The InferenceServices stay dicts: one per
service, read by each of its passes and ticks. Objects handed out that
are not packed are shared with the cache: callers read them and never change them (the plan
deep-copies what it writes back).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from batchpilot.operator.kinds import KINDS, POD, ResourceKind
from batchpilot.operator.kube import Kube, KubeError, ready_pod_endpoints, ready_pods

Obj = dict[str, Any]
Key = tuple[str, str]
"""(namespace, name)"""
Ref = tuple[ResourceKind, Key]
References = Callable[[ResourceKind, Obj], Iterable[tuple[ResourceKind, str]]]
"""What an object names in its own namespace that the cache keeps for it: (kind, name)."""


class ApiClient(Kube, Protocol):
    """What the cache needs of the API beside `Kube`: the pods by label."""

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]: ...

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, float | None]: ...

    def list_objects(
        self, kind: ResourceKind, namespace: str | None, selector: Mapping[str, str | None]
    ) -> list[Obj]: ...


def _version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace") or ""), str(meta.get("name"))


def _older(obj: Mapping[str, Any], than: int | None) -> bool:
    """Whether `obj` predates resourceVersion `than` (never, when either is unknown)."""
    version = _version(obj)
    return version is not None and than is not None and version < than


def _slim_container_status(container: Obj) -> Obj | None:
    """What a container waits on or last exited with (`rollout`); None for one with neither
    (a healthy fleet keeps nothing of its containers)."""
    waiting = (container.get("state") or {}).get("waiting")
    terminated = (container.get("lastState") or {}).get("terminated")
    if not waiting and not terminated:
        return None
    slim: Obj = {k: container[k] for k in ("name", "restartCount") if k in container}
    if waiting:
        slim["state"] = {"waiting": {k: waiting[k] for k in ("reason", "message") if k in waiting}}
    if terminated:
        slim["lastState"] = {
            "terminated": {
                k: terminated[k] for k in ("reason", "message", "exitCode") if k in terminated
            }
        }
    return slim


def slim_pod(pod: Obj) -> Obj:
    """What `ready_pod_endpoints` and `rollout.why_not_ready` read of a pod, and no more: a
    fleet's pods in a few MiB."""
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    containers = {
        key: slim
        for key in ("initContainerStatuses", "containerStatuses")
        if (slim := [s for c in status.get(key) or [] if (s := _slim_container_status(c))])
    }
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "labels", "resourceVersion", "deletionTimestamp")
            if k in meta
        },
        "spec": {
            "containers": [
                {"ports": c.get("ports", [])} for c in pod.get("spec", {}).get("containers", [])
            ]
        },
        "status": {k: status[k] for k in ("podIP", "conditions") if k in status} | containers,
    }


def without_managed_fields(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


class _Kept:
    """One object as the cache keeps it, with its resourceVersion beside it."""

    __slots__ = ("_obj", "_text", "version")

    def __init__(self, obj: Obj, *, packed: bool) -> None:
        self.version = _version(obj)
        self._obj: Obj | None = None if packed else obj
        self._text = json.dumps(obj, separators=(",", ":")) if packed else None

    @property
    def packed(self) -> bool:
        return self._text is not None

    def value(self) -> Obj:
        if self._text is not None:
            found: Obj = json.loads(self._text)
            return found
        assert self._obj is not None
        return self._obj


class WatchCache:
    """`Kube` (and the autopilot's `Pods`) over `api`: reads of `kinds` come from memory.

    Fed by `seen(kind, obj)` (an object listed, added or changed) and `gone(kind, obj)`
    (deleted), both from kopf's loop; read and written through from kopf's worker threads.
    `keep(kind, obj)` says whether an object not known yet belongs in the cache (children: the
    operator's labels). `slim[kind]` trims what is kept of an object (default: managedFields);
    `packed` kinds are kept as JSON text, and each read of one is a new dict. `references(kind,
    obj)`: what `obj` names that is kept while it does (the API keys' Secret an InferenceService
    names), whatever `keep` says of it. `index_label`: a label whose value indexes the objects of
    every kind per namespace, so that a selector naming it (`pods`) looks at that value's objects
    only rather than every one in memory (every pod of 2,000 services, for one service's).
    `flag[kind](obj)`: whether an object of `kind` is one of a few that `flagged(kind)` lists
    at once, fleet-wide, without reading every object of the kind (the Deployments whose
    rollouts go in place, among 2,000 packed ones); asked of each object as it is kept.
    """

    def __init__(
        self,
        api: ApiClient,
        kinds: Iterable[ResourceKind],
        *,
        keep: Callable[[ResourceKind, Obj], bool] = lambda kind, obj: True,
        slim: Mapping[ResourceKind, Callable[[Obj], Obj]] | None = None,
        packed: Iterable[ResourceKind] = (),
        references: References = lambda kind, obj: (),
        index_label: str | None = None,
        flag: Mapping[ResourceKind, Callable[[Obj], bool]] | None = None,
    ) -> None:
        self._api = api
        self._keep = keep
        self._slim = dict(slim or {})
        self._packed = frozenset(packed)
        self._lock = threading.Lock()
        self._objects: dict[ResourceKind, dict[Key, _Kept]] = {kind: {} for kind in kinds}
        self._deleted: dict[tuple[ResourceKind, Key], int | None] = {}
        """Objects this operator deleted, by the version it deleted, until the watch says so."""
        self._references = references
        self._names: dict[Ref, frozenset[Ref]] = {}
        """What each object in memory names (only objects that name something)."""
        self._named_by: dict[Ref, set[Ref]] = {}
        """The other way round: each object named, and who names it."""
        self._absent: set[Ref] = set()
        """Named objects the API said do not exist since they were named: a miss is final."""
        self._synced = threading.Event()
        self._stocked: set[ResourceKind] = set()
        """Kinds listed whole by `take_stock`: a miss is final for them, as once synced."""
        self._index_label = index_label
        self._index: dict[tuple[ResourceKind, str, str], set[Key]] = {}
        """(kind, namespace, value of `index_label`) → the keys of the objects in memory."""
        self._indexed_as: dict[tuple[ResourceKind, Key], str] = {}
        """Each indexed object's value of `index_label`, to find it when it changes or goes."""
        self._flag = dict(flag or {})
        self._flagged: dict[ResourceKind, set[Key]] = {kind: set() for kind in self._flag}
        """The keys of the objects in memory that `flag` holds for, per kind."""

    # --- fed by the watches ------------------------------------------------------------------

    def seen(self, kind: ResourceKind, obj: Obj) -> None:
        """An object of `kind` as a watch (or a list) shows it now."""
        if kind not in self._objects:
            return
        with self._lock:
            if self._wanted(kind, obj):
                self._put(kind, obj, watched=True)

    def gone(self, kind: ResourceKind, obj: Obj) -> None:
        """An object of `kind` the watch saw deleted (its last state)."""
        if kind not in self._objects:
            return
        key = _key(obj)
        with self._lock:
            current = self._objects[kind].get(key)
            if current is not None and not _older(obj, current.version):
                self._drop(kind, key)
                self._name(kind, key, ())
                if (kind, key) in self._named_by:
                    self._absent.add((kind, key))
            if (kind, key) in self._deleted and not _older(obj, self._deleted[(kind, key)]):
                del self._deleted[(kind, key)]

    def relisted(
        self,
        kind: ResourceKind,
        namespace: str | None,
        listed: Iterable[Key],
        version: str | None,
    ) -> list[Obj]:
        """A complete list of `kind` (in `namespace`; None: every namespace) as of
        resourceVersion `version` (relists.py): what the cache holds of it that the list does
        not show, and that is not newer than the list, was deleted while no watch could say so
        (a watch that resumed with 410 Gone, then listed again). It goes, as a DELETED event
        would take it. Returns what went, as last kept (the handlers reconcile its owners).
        What a write answered after the list stays; so does everything when either version is
        not an integer."""
        if kind not in self._objects:
            return []
        try:
            as_of = int(version or "")
        except ValueError:
            return []
        present = set(listed)
        gone: list[Obj] = []
        with self._lock:
            for key, kept in list(self._objects[kind].items()):
                if (namespace is not None and key[0] != namespace) or key in present:
                    continue
                if kept.version is None or kept.version > as_of:
                    continue
                gone.append(kept.value())
                self._drop(kind, key)
                self._name(kind, key, ())
                if (kind, key) in self._named_by:
                    self._absent.add((kind, key))
            for ref, deleted in list(self._deleted.items()):
                held_kind, key = ref
                if held_kind != kind or key in present:
                    continue
                if namespace is not None and key[0] != namespace:
                    continue
                if deleted is not None and deleted <= as_of:
                    del self._deleted[ref]  # its DELETED event is in the gap: it never comes
        return gone

    def take_stock(
        self,
        kind: ResourceKind,
        namespaces: Iterable[str] | None,
        selector: Mapping[str, str | None],
    ) -> list[Obj]:
        """List `kind` from the API — in every namespace (None) or in each of `namespaces`,
        with every label of `selector` — into memory, ahead of the watch's own list; what it
        kept, as kept. From then on a read of `kind` that misses means "no such object" (as once
        synced), not a request. Raises `KubeError` where a list fails (nothing marked then)."""
        listed: list[Obj] = []
        for namespace in (None,) if namespaces is None else namespaces:
            listed.extend(self._api.list_objects(kind, namespace, selector))
        if kind not in self._objects:
            return listed
        kept: list[Obj] = []
        with self._lock:
            for obj in listed:
                if self._wanted(kind, obj):
                    self._put(kind, obj)
                    found = self._objects[kind].get(_key(obj))
                    if found is not None:
                        kept.append(found.value())
            self._stocked.add(kind)
        return kept

    def _complete(self, kind: ResourceKind) -> bool:
        """Whether memory holds every object of `kind` there is (as the watch or a list left
        it): a miss is "no such object"."""
        return self.synced or kind in self._stocked

    def mark_synced(self) -> None:
        """Every watched kind has had its initial list: a miss now means "no such object"."""
        self._synced.set()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(objects) for objects in self._objects.values())

    # --- Kube: reads -------------------------------------------------------------------------

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Obj | None:
        if kind not in self._objects:
            return self._api.get(kind, namespace, name)
        # No lock: each dict lookup is atomic (the GIL), and a read racing a write sees the
        # object before or after it, as a read from the API would. With the lock, every tick's
        # three reads queued behind whichever thread held it when the interpreter switched
        # threads (a py-spy profile of the operator at 2,000 services: 15 % of its busy
        # samples waiting here).
        if (kind, (namespace, name)) in self._deleted:
            return None
        found = self._objects[kind].get((namespace, name))
        if found is not None:
            return found.value()
        if self._complete(kind):
            return None
        return self._refresh(kind, namespace, name)

    def get_referenced(self, kind: ResourceKind, namespace: str, name: str) -> Obj | None:
        """An object a spec names that is not a child (the API keys' Secret). Kept from the
        watch once named (`references`); a miss is asked of the API, once after it is named,
        since it may have been listed before anything named it. What the API answers is kept,
        and the watch keeps it current."""
        found = self.get(kind, namespace, name)
        ref = (kind, (namespace, name))
        if found is not None or kind not in self._objects:
            return found
        with self._lock:
            if self.synced and ref in self._absent:
                return None
        found = self._refresh(kind, namespace, name)
        with self._lock:
            if found is None and ref in self._named_by:
                self._absent.add(ref)
        return found

    def referrers(self, kind: ResourceKind, namespace: str, name: str) -> list[str]:
        """The names of the objects in memory that name this one (`references`)."""
        with self._lock:
            return sorted(key[1] for _, key in self._named_by.get((kind, (namespace, name)), ()))

    def pods(self, namespace: str, selector: dict[str, str]) -> list[Obj]:
        """The pods in `namespace` with every label of `selector`, as `slim_pod` keeps them."""
        if POD not in self._objects or not self._complete(POD):
            return [slim_pod(pod) for pod in self._api.list_objects(POD, namespace, selector)]
        with self._lock:  # a copy of the references only: the filtering holds no lock
            objects, label = self._objects[POD], self._index_label
            if label is not None and label in selector:
                filed = self._index.get((POD, namespace, selector[label]), ())
                kept = [(key, objects[key]) for key in filed]
            else:
                kept = list(objects.items())
        wanted = tuple(selector.items())
        found = []
        for (ns, _), entry in kept:
            if ns != namespace:
                continue
            pod = entry.value()
            labels = pod.get("metadata", {}).get("labels") or {}
            for label, value in wanted:
                if labels.get(label) != value:
                    break
            else:
                found.append(pod)
        return found

    def keys(self, kind: ResourceKind) -> set[Key] | None:
        """The (namespace, name) of every object of `kind` in memory, in every namespace
        watched; None until memory holds every object of `kind` there is (as `flagged`)."""
        if kind not in self._objects or not self._complete(kind):
            return None
        with self._lock:
            return {key for key in self._objects[kind] if (kind, key) not in self._deleted}

    def flagged(self, kind: ResourceKind) -> set[Key] | None:
        """The (namespace, name) of the objects of `kind` in memory that `flag[kind]` holds
        for, in every namespace watched; None until memory holds every object of `kind` there
        is (before the watch's list, or `take_stock`'s), when they are not known."""
        if kind not in self._flagged or not self._complete(kind):
            return None
        with self._lock:
            return set(self._flagged[kind])

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        if POD not in self._objects or not self._complete(POD):
            return self._api.ready_pod_endpoints(namespace, selector)
        return ready_pod_endpoints(self.pods(namespace, selector))

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, float | None]:
        if POD not in self._objects or not self._complete(POD):
            return self._api.ready_pods(namespace, selector)
        return ready_pods(self.pods(namespace, selector))

    # --- Kube: writes, through ---------------------------------------------------------------

    def create(self, obj: Obj) -> Obj:
        return self._written(KINDS[obj["kind"]], obj, lambda: self._api.create(obj))

    def replace(self, obj: Obj) -> Obj:
        return self._written(KINDS[obj["kind"]], obj, lambda: self._api.replace(obj))

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: Obj,
        *,
        subresource: str = "",
    ) -> Obj:
        target = {"metadata": {"namespace": namespace, "name": name}}
        return self._written(
            kind,
            target,
            lambda: self._api.patch(kind, namespace, name, patch, subresource=subresource),
        )

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> None:
        self._api.delete(kind, namespace, name)
        if kind not in self._objects:
            return
        key = (namespace, name)
        with self._lock:
            current = self._drop(kind, key)
            if current is not None:  # hidden until the watch's DELETED: it shows it until then
                self._deleted[(kind, key)] = current.version

    # --- inside ------------------------------------------------------------------------------

    def _wanted(self, kind: ResourceKind, obj: Obj) -> bool:
        """Whether memory keeps `obj` (call with the lock held): it is there already, something
        kept names it, or `keep` wants it."""
        key = _key(obj)
        return key in self._objects[kind] or (kind, key) in self._named_by or self._keep(kind, obj)

    def _put(self, kind: ResourceKind, obj: Obj, *, watched: bool = False) -> None:
        """Store `obj` unless what is stored is newer (call with the lock held). Of two copies
        of one version, a dict kept stays the watch's (`watched`), which kopf shares."""
        key = _key(obj)
        objects = self._objects[kind]
        version = _version(obj)
        current = objects.get(key)
        if current is not None:
            if _older(obj, current.version):
                return  # an event the cache is past
            same = version is not None and version == current.version
            if same and (current.packed or not watched):
                return  # the same version again (a no-op write's answer, its event)
        if (kind, key) in self._deleted:
            deleted = self._deleted[(kind, key)]
            if _older(obj, deleted) or version == deleted:
                return  # the object this operator deleted, as it was before
            del self._deleted[(kind, key)]  # a newer object of that name: created again
        objects[key] = _Kept(
            self._slim.get(kind, without_managed_fields)(obj), packed=kind in self._packed
        )
        self._reindex(kind, key, obj)
        if kind in self._flag:
            if self._flag[kind](obj):
                self._flagged[kind].add(key)
            else:
                self._flagged[kind].discard(key)
        self._name(kind, key, self._references(kind, obj))
        self._absent.discard((kind, key))

    def _drop(self, kind: ResourceKind, key: Key) -> _Kept | None:
        """Forget the object `key` of `kind`, and its place in the index (call with the lock
        held); what was kept, if anything."""
        self._reindex(kind, key, None)
        if kind in self._flagged:
            self._flagged[kind].discard(key)
        return self._objects[kind].pop(key, None)

    def _reindex(self, kind: ResourceKind, key: Key, obj: Obj | None) -> None:
        """File the object `key` of `kind` under its value of `index_label` now (None: gone),
        and out of the one it was under (call with the lock held)."""
        if self._index_label is None:
            return
        value = None
        if obj is not None:
            value = (obj.get("metadata", {}).get("labels") or {}).get(self._index_label)
        before = self._indexed_as.pop((kind, key), None)
        if before is not None and before != value:
            filed = self._index.get((kind, key[0], before))
            if filed is not None:
                filed.discard(key)
                if not filed:
                    del self._index[(kind, key[0], before)]
        if value is not None:
            self._indexed_as[(kind, key)] = value
            self._index.setdefault((kind, key[0], value), set()).add(key)

    def _name(
        self, kind: ResourceKind, key: Key, names: Iterable[tuple[ResourceKind, str]]
    ) -> None:
        """What the object `key` of `kind` names now (call with the lock held). An object that
        no one names any longer goes, unless `keep` wants it."""
        referrer = (kind, key)
        now = frozenset((named, (key[0], name)) for named, name in names)
        before = self._names.pop(referrer, frozenset())
        if now:
            self._names[referrer] = now
        for ref in now - before:
            self._named_by.setdefault(ref, set()).add(referrer)
        for ref in before - now:
            by = self._named_by.get(ref)
            if by is None:
                continue
            by.discard(referrer)
            if by:
                continue
            del self._named_by[ref]
            self._absent.discard(ref)
            named_kind, named_key = ref
            kept = self._objects.get(named_kind, {}).get(named_key)
            if kept is not None and not self._keep(named_kind, kept.value()):
                self._drop(named_kind, named_key)

    def _written(self, kind: ResourceKind, target: Obj, write: Callable[[], Obj]) -> Obj:
        try:
            result = write()
        except KubeError as exc:
            if kind in self._objects and exc.status in (404, 409):
                namespace, name = _key(target)
                self._refresh(kind, namespace, name)
            raise
        if kind in self._objects:
            with self._lock:
                self._put(kind, result)
        return result

    def fresh(self, kind: ResourceKind, namespace: str, name: str) -> Obj | None:
        """One object as the API server has it now, read past the memory (and kept in it)."""
        return self._refresh(kind, namespace, name)

    def _refresh(self, kind: ResourceKind, namespace: str, name: str) -> Obj | None:
        """Read one object from the API into the cache (whatever its labels)."""
        fresh = self._api.get(kind, namespace, name)
        key = (namespace, name)
        with self._lock:
            self._deleted.pop((kind, key), None)
            if fresh is None:
                if self._drop(kind, key) is not None:
                    self._name(kind, key, ())
                return None
            self._put(kind, fresh)
            kept = self._objects[kind].get(key)
            return None if kept is None else kept.value()
