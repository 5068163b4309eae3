"""The kinds the sandbox serves: what each one is, and the registry that discovery reads.

A `ResourceType` is one served group/version/plural with what the server must know about it:
scope, names for kubectl (short names, categories), its subresources (status, scale and how
scale maps into the object), and for custom resources the CRD's schema and printer columns.
Built-in kinds are listed in `builtin_kinds.py`; custom ones come from CRD objects (`crds.py`), so
creating or deleting a CRD through the API adds or removes its kinds, as on a real server.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

from batchpilot.sandbox import errors

STANDARD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")
_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


@dataclass(frozen=True)
class ScaleSpec:
    """How `/scale` maps into the object (dotted paths, as in a CRD's scale subresource)."""

    spec_replicas_path: tuple[str, ...] = ("spec", "replicas")
    status_replicas_path: tuple[str, ...] = ("status", "replicas")
    label_selector_path: tuple[str, ...] | None = None
    # Built-in workloads: the Scale's selector is their `spec.selector`, formatted.
    selector_from_spec: bool = False


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = STANDARD_VERBS
    status: bool = False
    scale: ScaleSpec | None = None
    generation: bool = False  # whether the server maintains metadata.generation
    # Custom resources only:
    custom: bool = False
    crd_name: str | None = None
    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    printer_columns: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)
    # Where objects live: CRDs store all versions under the storage version; events.k8s.io/v1
    # Events are core v1 Events seen through another API.
    storage_group: str | None = None
    storage_version: str | None = None
    storage_plural: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def name(self) -> errors.ResourceName:
        return errors.ResourceName(self.group, self.plural, self.kind)

    @property
    def storage(self) -> kmock.resource:
        """The key under which objects of this kind live in `emulator.objects`."""
        return _storage_key(
            self.storage_group if self.storage_group is not None else self.group,
            self.storage_version or self.version,
            self.storage_plural or self.plural,
        )

    @property
    def storage_api_version(self) -> str:
        resource = self.storage
        return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)


@functools.lru_cache(maxsize=1024)
def _storage_key(group: str, version: str, plural: str) -> kmock.resource:
    """One key object per kind: building a `kmock.resource` parses its arguments, and every
    request asks for its kind's key several times."""
    return kmock.resource(group, version, plural)


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order: v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > others by name."""
    found = _VERSION.match(version)
    if not found:
        return (0, 0, 0, version)
    major = int(found.group(1))
    stability = {"alpha": 1, "beta": 2, None: 3}[found.group(2)]
    minor = int(found.group(3) or 0)
    return (stability, major, minor, "")


class Registry:
    """The served kinds, by group/version/plural."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}

    def add(self, resource_type: ResourceType) -> None:
        key = (resource_type.group, resource_type.version, resource_type.plural)
        self._types[key] = resource_type

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        gone = [rt for rt in self._types.values() if rt.crd_name == crd_name]
        for rt in gone:
            del self._types[(rt.group, rt.version, rt.plural)]
        return gone

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))

    def groups(self) -> dict[str, list[str]]:
        """Non-core groups and their versions, the preferred version first."""
        found: dict[str, set[str]] = {}
        for rt in self._types.values():
            if rt.group:
                found.setdefault(rt.group, set()).add(rt.version)
        return {
            group: sorted(versions, key=version_priority, reverse=True)
            for group, versions in sorted(found.items())
        }

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return sorted(
            (rt for rt in self._types.values() if (rt.group, rt.version) == (group, version)),
            key=lambda rt: rt.plural,
        )

    def for_storage(self, storage: kmock.resource) -> list[ResourceType]:
        """Every served kind whose objects live under this storage key."""
        return [rt for rt in self._types.values() if rt.storage == storage]
