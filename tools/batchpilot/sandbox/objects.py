"""Storage primitives under the API semantics: versioned writes into kmock's object array.

Every committed change takes the next resourceVersion (one counter for all kinds, like etcd's
revision), is appended to the object's history in `emulator.objects` (kmock keeps it, so tests
can look at earlier versions), and is published to the watch hub. Removal is a soft delete in
kmock's terms: the history stays, the object is gone for the API.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kmock

from batchpilot.sandbox.watching import Change, WatchHub

Key = tuple[kmock.resource, str | None, str]
RemovalHook = Callable[[Key, Mapping[str, Any]], None]


def metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    found = obj.get("metadata")
    return found if isinstance(found, dict) else {}


class ObjectTable:
    """Live objects by (storage kind, namespace, name), with versions and change events."""

    def __init__(
        self,
        objects: kmock.ObjectsArray,
        hub: WatchHub,
        *,
        history_limit: int | None = 100,
    ) -> None:
        self.objects = objects
        self.hub = hub
        self.removal_hooks: list[RemovalHook] = []
        self._history_limit = history_limit
        self._version = 0

    @property
    def resource_version(self) -> int:
        return self._version

    def get(self, key: Key) -> dict[str, Any] | None:
        """The stored object (treat as read-only), or None."""
        if key not in self.objects:
            return None
        entry = self.objects[key]
        return None if entry.deleted else entry.raw

    def live(self, storage: kmock.resource | None = None) -> Iterator[tuple[Key, dict[str, Any]]]:
        for key, entry in list(self.objects.items()):
            if (storage is None or key[0] == storage) and not entry.deleted:
                yield key, entry.raw

    def write(
        self, key: Key, obj: dict[str, Any], kind: str, old: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """Store a new version (ADDED or MODIFIED) under the next resourceVersion."""
        self._version += 1
        metadata(obj)["resourceVersion"] = str(self._version)
        if key in self.objects:
            history = self.objects[key].history
            history.append(obj)
            if self._history_limit is not None and len(history) > self._history_limit:
                del history[: len(history) - self._history_limit]
        else:
            self.objects[key] = obj
        self.hub.publish(key[0], Change(self._version, kind, copy.deepcopy(obj), old))
        return obj

    def remove(self, key: Key) -> dict[str, Any]:
        """Remove an object (DELETED); returns its final state."""
        stored = self.get(key)
        if stored is None:  # pragma: no cover - callers check first
            raise KeyError(key)
        final = copy.deepcopy(stored)
        self._version += 1
        metadata(final)["resourceVersion"] = str(self._version)
        self.objects[key].delete()
        self.hub.publish(key[0], Change(self._version, "DELETED", final, stored))
        for hook in list(self.removal_hooks):
            hook(key, final)
        return final
