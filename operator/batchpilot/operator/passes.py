"""Every pass over one InferenceService runs here: one at a time per object, on the newest copy,
and its status written by one route, whatever triggered it.

kopf runs each trigger in a worker of its own: the resource's create/update/resume handler, the
periodic reconcile (periodic.py, in kopf's workers too), the autopilot's ticks, and the event
handlers of five child kinds. Left
alone, two of them can pass over one InferenceService at once: both read the same status and
each writes a whole `conditions` list computed from it (the later write drops what the earlier
one set), and both create or replace the same child (409s, retries, duplicate Events). So a pass

1. holds the object's lock (keyed by namespace/name) from its read to its status write;
2. reads the InferenceService under it, through `Kube`: the body kopf handed its trigger may
   predate the pass that held the lock before. In the operator `Kube` is the watch-fed cache
   (cache.py), which holds the newer of what the watch brought and what the last pass wrote
   (its status write's answer goes in at once), so the read costs no request;
3. runs the reconcile or the autopilot tick on that body;
4. writes the status fields that changed as a merge patch of the status subresource, through
   `Kube`, still under the lock. Not through kopf's `patch`: kopf applies that after the handler
   returns, outside any lock, and a child's event handler has none for its owner;
5. then, and only once that write went through, does what the status must remember having
   been done (`then`: the autopilot applying a decision, see autopilot/pilot.py).

Why child events run the same reconcile rather than poke the owner (an annotation that kopf's
update handler would see): the poke would be a write per child event — a pod turning ready
writes the Deployment's status, which is a child event — so a quiet InferenceService would no
longer be a pass that writes nothing; and it would go round the API server for what a function
call does.

The locks are `threading.Lock`s: kopf runs these sync handlers in its thread pool. A lock lives
only while a pass holds or waits for it, so memory is bounded by the passes in flight rather
than by every object ever seen, and nothing depends on hearing of a deletion (an InferenceService
deleted while the operator was down is never heard of).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from batchpilot.operator.kinds import INFERENCESERVICE
from batchpilot.operator.kube import Kube

K = TypeVar("K", bound=Hashable)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self, lock: AbstractContextManager[Any]) -> None:
        self.lock = lock
        self.users = 0


class KeyedLocks(Generic[K]):
    """A lock per key, created on first use and dropped when no one holds or waits for it."""

    def __init__(
        self, *, new_lock: Callable[[], AbstractContextManager[Any]] = threading.Lock
    ) -> None:
        self._new_lock = new_lock
        self._guard = threading.Lock()
        self._entries: dict[K, _Entry] = {}

    @contextmanager
    def hold(self, key: K) -> Iterator[None]:
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(self._new_lock())
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._guard:
                entry.users -= 1
                if entry.users == 0:
                    del self._entries[key]

    def __len__(self) -> int:
        """Keys with a lock now: those held or waited for."""
        with self._guard:
            return len(self._entries)


class WritesStatus(Protocol):
    """What a pass returns: the status fields it wants written (others are left as they are)."""

    @property
    def status(self) -> dict[str, Any]: ...


OutcomeT = TypeVar("OutcomeT", bound=WritesStatus)


@dataclass(frozen=True, slots=True)
class Ran(Generic[OutcomeT]):
    body: dict[str, Any]
    """The InferenceService as the pass read it: what its Events are about."""
    outcome: OutcomeT


class Passes:
    """`run(namespace, name, step)`: `step` over the InferenceService, serialized per object."""

    def __init__(self, kube: Kube, *, locks: KeyedLocks[tuple[str, str]] | None = None) -> None:
        self._kube = kube
        self._locks: KeyedLocks[tuple[str, str]] = locks if locks is not None else KeyedLocks()

    def run(
        self,
        namespace: str,
        name: str,
        step: Callable[[dict[str, Any]], OutcomeT],
        *,
        then: Callable[[OutcomeT], None] | None = None,
    ) -> Ran[OutcomeT] | None:
        """None when the InferenceService is gone or going (its children go with it: a pass now
        would recreate what the garbage collector is deleting). Raises `KubeError` when the
        read or the status write fails. `then(outcome)` runs after the status write went
        through, still under the lock: what must not happen unless the status remembers it
        (the autopilot applying a decision)."""
        with self._locks.hold((namespace, name)):
            body = self._kube.get(INFERENCESERVICE, namespace, name)
            if body is None or body.get("metadata", {}).get("deletionTimestamp"):
                return None
            outcome = step(body)
            current = body.get("status") or {}
            changed = {
                key: value for key, value in outcome.status.items() if current.get(key) != value
            }
            if changed:
                self._kube.patch(
                    INFERENCESERVICE, namespace, name, {"status": changed}, subresource="status"
                )
            if then is not None:
                then(outcome)
            return Ran(body, outcome)
