"""Every complete listing kopf makes, told to the operator: what exists of a kind, as of the
list's resourceVersion.

kopf lists a kind when its watch starts, and again whenever the watch cannot resume: the API
server answers 410 Gone (its watch cache has moved past the version the watch resumes from: after
a long disconnection, or a restarted API server), or a list or a watch failed for good. An object
deleted before that list is simply not in it, and no DELETED event ever reports it: kopf has
nothing like an informer's `Replace`, with which client-go's reflectors tell their store what a
new list no longer holds. The watch-fed cache (cache.py) kept such an object for ever — a child
someone deleted while the operator's watch was down was never created again, every pass reading
it from memory, the periodic one included.

kopf offers no hook for this. Its watch calls its listing function through that function's
module, so `listen` wraps the function, once, and tells each listener every listing that
completed. The function is kopf's own (`kopf._cogs.clients.fetching.fetch_objs`, in kopf 1.37
to 1.45 at least): `listen` fails loudly where it is not there, rather than let the operator
run blind to what a relist leaves out.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

Listed = Callable[[str, str, str | None, frozenset[tuple[str, str]], str | None], None]
"""`listed(group_version, plural, namespace, keys, resource_version)`: one complete listing of
a kind, in `namespace` (None: every namespace), with the (namespace, name) of every object in it
and the list's resourceVersion. Called in kopf's event loop: it must not block."""

_listeners: list[Listed] = []
_guard = threading.Lock()
_WRAPPED = "_batchpilot_tells_listings"


def _group_version(resource: Any) -> str:
    group, version = getattr(resource, "group", ""), getattr(resource, "version", "")
    return f"{group}/{version}" if group else str(version)


def _key(item: Any) -> tuple[str, str]:
    meta = item.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name"))


def _telling(original: Callable[..., AsyncIterator[tuple[Any, str]]]) -> Any:
    async def fetch_objs(*args: Any, **kwargs: Any) -> AsyncIterator[tuple[Any, str]]:
        keys: set[tuple[str, str]] = set()
        version: str | None = None
        async for items, version in original(*args, **kwargs):
            keys.update(_key(item) for item in items)
            yield items, version
        # Only a listing that went to its end is told: one that failed part way raised above.
        resource, namespace = kwargs.get("resource"), kwargs.get("namespace")
        if resource is None:
            return
        for listener in list(_listeners):
            listener(
                _group_version(resource),
                str(getattr(resource, "plural", "")),
                namespace,
                frozenset(keys),
                version,
            )

    setattr(fetch_objs, _WRAPPED, True)
    return fetch_objs


def _install() -> None:
    from kopf._cogs.clients import fetching

    current = getattr(fetching, "fetch_objs", None)
    if current is None:
        raise RuntimeError(
            "kopf no longer lists through kopf._cogs.clients.fetching.fetch_objs: the operator "
            "cannot see what a relist leaves out (see batchpilot/operator/relists.py)"
        )
    if not getattr(current, _WRAPPED, False):
        fetching.fetch_objs = _telling(current)


def listen(listener: Listed) -> Callable[[], None]:
    """`listener` hears every complete listing kopf makes from now on, until the function this
    returns is called."""
    with _guard:
        _install()
        _listeners.append(listener)

    def stop() -> None:
        with _guard:
            if listener in _listeners:
                _listeners.remove(listener)

    return stop
