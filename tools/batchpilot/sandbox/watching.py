"""Watch streams with resourceVersion semantics: what kopf and `kubectl get -w` rely on.

Both list first, then watch from the list's resourceVersion and expect exactly the changes
after it — no replay of what they already have, nothing lost in between. Every committed
change gets the next resourceVersion and goes into a bounded per-kind log; a watch replays
the log after the version it names (or answers 410 Expired when that part of the log is gone,
after which kopf re-lists), then follows live changes. A watch without a resourceVersion
starts with ADDED for every current object, as on a real server. Changes that move an object
into or out of a watch's selector arrive as ADDED or DELETED, also as on a real server.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kmock

from batchpilot.sandbox import errors


@dataclass(frozen=True)
class Change:
    """One committed change, in storage form."""

    resource_version: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None = None


_CLOSED = object()


class _Log:
    def __init__(self, limit: int) -> None:
        self.changes: collections.deque[Change] = collections.deque()
        self.limit = limit
        self.compacted = 0  # changes at or below this resourceVersion are gone
        self.subscribers: set[asyncio.Queue[Any]] = set()


class WatchHub:
    """Per-kind change logs and the live subscribers of each."""

    def __init__(self, *, log_limit: int = 10_000) -> None:
        self._log_limit = log_limit
        self._logs: dict[kmock.resource, _Log] = {}
        self._closed = False

    def _log(self, storage: kmock.resource) -> _Log:
        log = self._logs.get(storage)
        if log is None:
            log = self._logs[storage] = _Log(self._log_limit)
        return log

    def publish(self, storage: kmock.resource, change: Change) -> None:
        log = self._log(storage)
        log.changes.append(change)
        while len(log.changes) > log.limit:
            log.compacted = log.changes.popleft().resource_version
        for queue in log.subscribers:
            queue.put_nowait(change)

    def since(self, storage: kmock.resource, resource_version: int) -> list[Change]:
        """The logged changes after a version; 410 Expired if the log no longer reaches it."""
        log = self._log(storage)
        if resource_version < log.compacted:
            raise errors.expired(
                f"too old resource version: {resource_version} ({log.compacted + 1})"
            )
        return [c for c in log.changes if c.resource_version > resource_version]

    def subscribe(self, storage: kmock.resource) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        if self._closed:
            queue.put_nowait(_CLOSED)
        self._log(storage).subscribers.add(queue)
        return queue

    def unsubscribe(self, storage: kmock.resource, queue: asyncio.Queue[Any]) -> None:
        self._log(storage).subscribers.discard(queue)

    def subscriber_count(self) -> int:
        return sum(len(log.subscribers) for log in self._logs.values())

    def close(self) -> None:
        """End every watch (the server is stopping)."""
        self._closed = True
        for log in self._logs.values():
            for queue in log.subscribers:
                queue.put_nowait(_CLOSED)


Matcher = Callable[[Mapping[str, Any]], bool]


def translate(change: Change, matches: Matcher) -> tuple[str, Mapping[str, Any]] | None:
    """The event a watch with this filter sees for a change (None: it sees nothing)."""
    now = matches(change.obj)
    if change.type == "MODIFIED" and change.old is not None:
        before = matches(change.old)
        if now and before:
            return "MODIFIED", change.obj
        if now:
            return "ADDED", change.obj
        if before:
            return "DELETED", change.obj
        return None
    return (change.type, change.obj) if now else None


class Watch:
    """One open watch: a backlog, then live changes, filtered; iterate with `async for`."""

    def __init__(
        self,
        hub: WatchHub,
        storage: kmock.resource,
        *,
        backlog: list[tuple[str, Mapping[str, Any]]],
        since: int,
        matches: Matcher,
        timeout: float | None,
    ) -> None:
        self._hub = hub
        self._storage = storage
        self._backlog = backlog
        self._since = since
        self._matches = matches
        self._timeout = timeout
        self._queue = hub.subscribe(storage)

    def close(self) -> None:
        self._hub.unsubscribe(self._storage, self._queue)

    async def events(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout is None else loop.time() + self._timeout
        try:
            for event in self._backlog:
                yield event
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    return
                if item is _CLOSED:
                    return
                change: Change = item
                if change.resource_version <= self._since:
                    continue  # already in the backlog
                translated = translate(change, self._matches)
                if translated is not None:
                    yield translated
        finally:
            self.close()
