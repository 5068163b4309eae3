"""The periodic pass: every InferenceService reconciled once per interval, for the drift that no
event reports, by a loop of the operator's own rather than by kopf's timer.

kopf registers every `@kopf.timer` as needing a finalizer (kopf/on.py: `requires_finalizer=True`),
so it put one on every InferenceService it saw. The operator needs nothing done when one is
deleted — its children go with it by their owner references — but the finalizer stays when the
operator does not: with the operator uninstalled, or the namespace no longer watched, deleting
the InferenceService, its namespace or the CRD waited for ever. With no handler that needs one,
the operator puts none on, and kopf takes off the one an earlier operator put on the next time it
handles the object (kopf/_core/reactor/processing.py: "Removing the finalizer, as there are no
handlers requiring it").

The loop runs from kopf's start to its cleanup, so only while this process leads (leading.py runs
kopf only then, and closes the writes before it stops kopf on a lost Lease). Each round takes the
InferenceServices as the watch-fed cache holds them, once every kind has had its initial list
(`ready`: before that the resume handlers reconcile each one anyway), and hands each its pass
(`submit`: the handlers run it in kopf's worker threads through `Passes`, as the timer's ran). A
service's pass comes at its own place in the interval, drawn from its name and a salt each process
draws anew: a fleet's passes spread over the interval, each service's an interval apart, as kopf's
timers were spread by when each object was first seen. A pass still running when its next is due
(an API server slow to answer) is not doubled: that service waits for the round after.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import zlib
from collections.abc import Callable, Collection

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name)"""
Submit = Callable[[str, str], "asyncio.Future[None]"]
"""Start one service's pass: a future done when the pass is over (its failure in it)."""


def place(key: Key, salt: int) -> float:
    """Where in the interval the service's pass comes, as a share of it: [0, 1)."""
    namespace, name = key
    return zlib.crc32(f"{salt}/{namespace}/{name}".encode()) / 2**32


async def run_periodically(
    services: Callable[[], Collection[Key] | None],
    submit: Submit,
    *,
    interval_s: float,
    ready: Callable[[], bool] = lambda: True,
    salt: int | None = None,
    each_round: Callable[[Collection[Key]], None] | None = None,
) -> None:
    """A round every `interval_s` — the first an interval after the start, when the services
    have just been reconciled by kopf's resume handlers — for as long as the task runs
    (cancelled at kopf's cleanup). `services()`: the InferenceServices now (None: not known
    yet, no round); `each_round(services)`: called as each round begins (the operator keeps
    memory of those services alone)."""
    loop = asyncio.get_running_loop()
    salt = random.getrandbits(32) if salt is None else salt
    running: dict[Key, asyncio.Future[None]] = {}
    started = loop.time()
    while True:
        # An interval after the last round began; after a pause longer than that (a blocked
        # loop, a suspended machine), one round at once rather than every round missed.
        started = max(started + interval_s, loop.time())
        await asyncio.sleep(max(0.0, started - loop.time()))
        keys = services() if ready() else None
        if keys is None:
            log.debug("periodic pass: the InferenceServices are not listed yet, no round")
            continue
        if each_round is not None:
            try:
                each_round(keys)
            except Exception:  # the loop outlives it
                log.exception("the periodic round's bookkeeping failed")
        late = 0
        for key in sorted(keys, key=lambda key: place(key, salt)):
            await asyncio.sleep(max(0.0, started + place(key, salt) * interval_s - loop.time()))
            if key in running:
                late += 1
                continue
            try:
                future = submit(*key)
            except Exception:  # the loop outlives any one pass
                log.exception("the periodic pass over %s/%s did not start", *key)
                continue
            running[key] = future
            future.add_done_callback(functools.partial(_over, running, key))
        log.debug(
            "periodic pass: %d InferenceServices%s",
            len(keys),
            f", {late} still in their previous pass" if late else "",
        )


def _over(running: dict[Key, asyncio.Future[None]], key: Key, done: asyncio.Future[None]) -> None:
    if running.get(key) is done:
        del running[key]
    if done.cancelled():
        return
    if (error := done.exception()) is not None:
        log.error("the periodic pass over %s/%s failed", *key, exc_info=error)
    else:
        log.debug("periodic pass over %s/%s: over", *key)
