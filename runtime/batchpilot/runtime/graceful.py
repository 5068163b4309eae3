"""A uvicorn server that shuts down without resetting a connection it accepted: the drain on
SIGTERM.

Kubernetes sends SIGTERM and, at the same time, starts taking the pod out of the Service's
endpoints — which takes seconds to reach every client. uvicorn's own shutdown would close idle
keep-alive connections at once and refuse new ones, so a client with a request on the wire gets
"server disconnected" without knowing whether it ran. This one drains first (see
`DrainingServer.shutdown`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any

import uvicorn

from batchpilot.runtime.draining import CloseWhenDraining
from batchpilot.runtime.http_protocol import OpenConnections
from batchpilot.runtime.server import ModelServer

log = logging.getLogger("batchpilot.runtime")


LINGER_STRETCH = 5
"""The linger lasts while connections are still open, up to this many times `--drain-linger-s`."""
OWED_POLL_S = 0.05
"""How often a drain serving the connections opened before the signal looks whether each has
brought its request (uvicorn offers no event for it)."""
HOLD_POLL_S = 0.1
"""How often a drain holding for async results looks whether they have all been fetched."""


async def hold_unfetched(
    unfetched: Callable[[], int], *, until: float, forced: asyncio.Event
) -> int:
    """Keep a draining replica's ports open, once its queue is served, while async results wait
    to be fetched — its peers pass fetches on to it by its pod IP (`job_relay`), and a client
    may still hold a connection to it — until `until` on the loop's clock or a forced exit.
    Returns how many results were left unread (logged: they are lost with the process)."""
    loop = asyncio.get_running_loop()
    left = unfetched()
    if left and loop.time() < until and not forced.is_set():
        log.info(
            "drain: %d async results not fetched yet; the port stays open for them up to %.1f s",
            left,
            until - loop.time(),
        )
    while left and loop.time() < until and not forced.is_set():
        await asyncio.sleep(min(HOLD_POLL_S, max(0.0, until - loop.time())))
        left = unfetched()
    if left:
        log.warning("drain: %d async results never fetched are dropped with the process", left)
    return left


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT starts a drain that resets no connection it
    accepted: new requests get 503 and readiness fails, but each connection opened before the
    signal has its next request served, as gRPC's connections have theirs until their age
    retires them (a Service keeps a connection on its pod after the pod has left the
    endpoints: a 503 would be the client's error); every HTTP answer from then on says
    `Connection: close`; the sockets close only once the queue is served and a linger has
    passed. (Connections still arriving when the
    listener closes are the kernel's to refuse, with a reset; behind a Service none arrive by
    then.) The process exits 0 after a clean drain instead of
    re-raising the signal; a second signal forces the exit."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        model_server: ModelServer,
        closing: CloseWhenDraining,
        grace_s: float,
        linger_s: float,
        on_drain: Sequence[Callable[[], Awaitable[None]]] = (),
        unfetched: Callable[[], int] = lambda: 0,
        hold_s: float = 0.0,
        connections: OpenConnections | None = None,
    ) -> None:
        """`unfetched`: the async results nobody has read yet, which the drain holds the ports
        open for, up to `hold_s` from its start (within `grace_s`). `connections`: the HTTP
        connections, whose requests with a body still coming are refused at the drain's start
        (`OpenConnections.refuse_bodies`)."""
        super().__init__(config)
        self._connections = connections
        self._unfetched = unfetched
        self._hold_s = hold_s
        self._model_server = model_server
        self._closing = closing
        self._grace_s = grace_s
        self._linger_s = linger_s
        self._on_drain = on_drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_started: float | None = None
        self._drain_tasks: list[asyncio.Future[None]] = []
        self._forced: asyncio.Event | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._forced = asyncio.Event()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            log.warning("second signal: exiting without finishing queued requests")
            self.force_exit = True
            if self._loop is not None and self._forced is not None:
                self._loop.call_soon_threadsafe(self._forced.set)
            return
        log.info("signal %d: draining %d queued requests", sig, self._model_server.queued)
        self.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        """Refuse new requests (but those of the connections gRPC's drain still serves, and the
        next request of each HTTP connection open now), answer `Connection: close` from now
        on, and start gRPC's drain and the wait for those HTTP requests."""
        if self._drain_started is not None:
            return
        self._drain_started = asyncio.get_running_loop().time()
        self._model_server.refuse_new()
        self._closing.start()
        if self._connections is not None:
            refused = self._connections.refuse_bodies(
                "the server is shutting down and accepts no new requests; retry elsewhere"
            )
            if refused:
                log.info("drain: refused %d requests whose body was still coming", refused)
        self._drain_tasks = [asyncio.ensure_future(stop()) for stop in self._on_drain]
        connections = self._connections
        if connections is not None and (connections.owe_answers() or connections.kept_unanswered):
            self._drain_tasks.append(asyncio.ensure_future(self._owed_requests()))

    async def _owed_requests(self) -> None:
        """Serve the next request of each connection opened before the signal, and the one on
        its way at it (`OpenConnections.owe_answers`): the queue takes them until each is
        answered — its body may still be coming, or being decoded — and until each idle
        connection has brought its own or closed, or none has for a linger (a client that has
        not sent by then is not sending soon); at most half the grace, as gRPC's drain (whose
        connections' requests are served alongside)."""
        assert self._connections is not None
        connections = self._connections
        loop = asyncio.get_running_loop()
        started = loop.time()
        until = started + self._grace_s / 2
        owing = connections.owing()
        log.info("drain: the next request of %d open connections is still served", owing)
        while owing or connections.kept_unanswered:
            if self._forced is not None and self._forced.is_set():
                return
            now = loop.time()
            if now >= until:
                log.info(
                    "drain: half the grace passed with %d requests owed, %d unanswered",
                    owing,
                    connections.kept_unanswered,
                )
                return
            quiet_until = (connections.owed_request_at or started) + self._linger_s
            if not connections.kept_unanswered and now >= quiet_until:
                log.info("drain: %d open connections sent nothing since the signal", owing)
                return
            await asyncio.sleep(OWED_POLL_S)
            owing = connections.owing()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain before uvicorn's own shutdown, which closes the listening socket and every
        idle keep-alive connection at once. "Idle" is only the server's view: the client may
        have a request on the wire right then, and gets "server disconnected without a
        response", not knowing whether it ran; a client that reconnects finds the port shut.

        So first gRPC's drain, where there is one (the requests of its connections are taken
        until their age retires them: `GrpcEndpoint.drain`), and beside it the next request of
        each HTTP connection that was open at the signal (`_owed_requests`); then the batcher
        serves what is queued (within the grace), and the queue takes nothing more; meanwhile
        each answer says `Connection: close`, so busy connections are closed by the server
        right after a complete answer, and those clients reconnect — through a Service, to
        another replica; here, to a port that still answers 503. Then
        `linger_s` more with the port open, for clients that have not yet heard (in Kubernetes,
        endpoints take seconds to drop a terminating pod), and while async results wait to be
        fetched, up to `hold_s` (`hold_unfetched`). Only then uvicorn's shutdown, given
        what is left of the grace: close the listener and idle connections, wait for answers
        being written, run the lifespan shutdown (gRPC's stop, the batcher, the engine)."""
        self._begin_drain()
        assert self._drain_started is not None
        assert self._forced is not None
        loop = asyncio.get_running_loop()
        deadline = self._drain_started + self._grace_s
        forced = loop.create_task(self._forced.wait())
        if self._drain_tasks:
            # gRPC's drain first: the queue takes its kept connections' requests until it stops.
            parts: asyncio.Future[Any] = asyncio.gather(*self._drain_tasks, return_exceptions=True)
            await asyncio.wait(
                {parts, forced},
                timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        drained = loop.create_task(
            self._model_server.drain(grace_s=max(0.0, deadline - loop.time()))
        )
        await asyncio.wait({drained, forced}, return_when=asyncio.FIRST_COMPLETED)
        linger_s = min(self._linger_s, max(0.0, deadline - loop.time()))
        if drained.done() and linger_s > 0:
            log.info("drain: queue empty; the port answers 503 for %.1f s more", linger_s)
            await asyncio.wait({forced}, timeout=linger_s)
            # Connections still open have not had their `Connection: close` answer yet: a
            # client slower than the linger (a loaded machine) would otherwise send into a
            # connection being closed. Give them up to LINGER_STRETCH lingers, within the grace.
            # uvicorn offers no event for a closed connection: look every 50 ms, as its own
            # shutdown does every 100 ms.
            stretch = min(deadline, loop.time() + (LINGER_STRETCH - 1) * linger_s)
            while self.server_state.connections and not forced.done() and loop.time() < stretch:
                await asyncio.wait({forced}, timeout=0.05)
            if self.server_state.connections:
                log.info(
                    "drain: closing %d connections that sent nothing since the signal",
                    len(self.server_state.connections),
                )
        if drained.done():
            hold_until = min(deadline, self._drain_started + self._hold_s)
            await hold_unfetched(self._unfetched, until=hold_until, forced=self._forced)
        forced.cancel()
        # uvicorn's wait for answers still being written; at least 1 s, as uvicorn's own floor.
        self.config.timeout_graceful_shutdown = max(1, int(deadline - loop.time()))
        await super().shutdown(sockets)
