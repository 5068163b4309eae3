"""An in-memory `Kube` (the operator's own API boundary) that counts writes.

Used by the reconciler's unit tests; the integration tests run against the local Kubernetes API.
Like the API server, it assigns uid and resourceVersion, refuses creating what exists (409) and
replacing with a stale resourceVersion (409), and defaults a few fields the way it would, so
"server-assigned fields are not drift" is exercised.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

from batchpilot.operator.kinds import KINDS, ResourceKind
from batchpilot.operator.kube import KubeError


class FakeKube:
    def __init__(self, *, not_served: frozenset[str] = frozenset()) -> None:
        self.not_served = set(not_served)
        """Kinds this API server does not serve (CRDs not installed): creating one is a 404."""
        self.refused: dict[str, str] = {}
        """Kinds whose writes the API server refuses (422), with its words: a cluster's
        validation or admission policy turning the object down."""
        self.admission: Callable[[dict[str, Any]], None] | None = None
        """A mutating admission webhook: changes what is created or replaced before it is
        stored (a toleration added, an image's registry rewritten)."""
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self._versions = itertools.count(1)

    def _key(self, kind: str, namespace: str, name: str) -> tuple[str, str, str]:
        return kind, namespace, name

    def put_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as someone else would have (not counted as our write)."""
        meta = obj["metadata"]
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", f"uid-{meta['name']}-{next(self._versions)}")
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[self._key(obj["kind"], meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get(self._key(kind.kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = self._key(obj["kind"], meta["namespace"], meta["name"])
        if obj["kind"] in self.not_served:
            raise KubeError(404, "the server could not find the requested resource")
        if key in self.objects:
            raise KubeError(409, f"{obj['kind']} {meta['name']} already exists")
        if obj["kind"] in self.refused:
            raise KubeError(422, self.refused[obj["kind"]])
        self.writes.append(("create", obj["kind"], meta["name"]))
        stored = copy.deepcopy(obj)
        if self.admission is not None:
            self.admission(stored)
        _server_defaults(stored)
        return self.put_object(stored)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = self._key(obj["kind"], meta["namespace"], meta["name"])
        current = self.objects.get(key)
        if current is None:
            raise KubeError(404, "not found")
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        self.writes.append(("replace", obj["kind"], meta["name"]))
        stored = copy.deepcopy(obj)
        if self.admission is not None:
            self.admission(stored)
        stored["metadata"]["uid"] = current["metadata"]["uid"]
        if "status" in current:
            stored["status"] = current["status"]
        _server_defaults(stored)
        return self.put_object(stored)

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        current = self.objects.get(self._key(kind.kind, namespace, name))
        if current is None:
            raise KubeError(404, "not found")
        self.writes.append(("patch" + (f"/{subresource}" if subresource else ""), kind.kind, name))
        _merge(current, patch)
        current["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(current)

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> None:
        if self.objects.pop(self._key(kind.kind, namespace, name), None) is not None:
            self.writes.append(("delete", kind.kind, name))

    def kinds(self) -> set[str]:
        return {key[0] for key in self.objects}

    def of(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any]:
        obj = self.get(kind, namespace, name)
        assert obj is not None, f"{kind.kind} {namespace}/{name} does not exist"
        return obj


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _server_defaults(obj: dict[str, Any]) -> None:
    """A few of the fields the real API server fills in."""
    if obj["kind"] == "Deployment":
        obj["spec"].setdefault("revisionHistoryLimit", 10)
        for container in obj["spec"]["template"]["spec"]["containers"]:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
        obj["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = "1"
    if obj["kind"] == "Service":
        obj["spec"].setdefault("clusterIP", "10.96.0.10")
        obj["spec"].setdefault("sessionAffinity", "None")


assert set(KINDS)  # every kind the operator writes is known here
