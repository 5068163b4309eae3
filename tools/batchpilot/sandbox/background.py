"""An aiohttp server on 127.0.0.1, and an async server served from a thread of its own.

The sandbox's Kubernetes API (`LocalKubernetesAPI.threaded()`) and the tests' fault-injecting
proxy both serve asyncio code to synchronous callers (the official client, kopf's `KopfRunner`,
subprocesses): the server runs on a background thread with its own event loop, the caller goes
on once it listens, and a server that could not start fails in the caller, not silently on its
thread. This is that one way of doing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import aiohttp.web

HOST = "127.0.0.1"
JOIN_TIMEOUT_S = 30.0
T = TypeVar("T")
Handler = Callable[[aiohttp.web.BaseRequest], Awaitable[aiohttp.web.StreamResponse]]


async def listen(handler: Handler, *, port: int = 0) -> tuple[aiohttp.web.ServerRunner, int]:
    """Serve `handler` on 127.0.0.1:`port` (0: any free port); the runner and the bound port.

    A request whose client goes away is cancelled (as a real server's would be), nothing is
    access-logged, and `runner.cleanup()` gives open requests one second to finish.
    """
    server = aiohttp.web.Server(handler, handler_cancellation=True, access_log=None)
    runner = aiohttp.web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, HOST, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])


@contextlib.contextmanager
def in_thread(serving: Callable[[], AbstractAsyncContextManager[T]], *, name: str) -> Iterator[T]:
    """Enter `serving()` on a thread named `name` with an event loop of its own, and give what it
    gives once entered; exit it, and end the thread, when the block ends.

    What `serving()` raises while entering is raised here, in the caller.
    """
    ready = threading.Event()
    started: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, T]] = []
    failures: list[BaseException] = []

    async def serve() -> None:
        async with serving() as served:
            stop = asyncio.Event()
            started.append((asyncio.get_running_loop(), stop, served))
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            failures.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    if failures:
        raise failures[0]
    loop, stop, served = started[0]
    try:
        yield served
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=JOIN_TIMEOUT_S)
