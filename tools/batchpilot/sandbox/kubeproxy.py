"""A Service as kube-proxy makes one: a TCP balancer that picks an endpoint per connection.

kube-proxy (iptables or IPVS) balances connections, not requests: a kept-alive HTTP connection,
or a gRPC channel's one HTTP/2 connection, stays on the pod it first reached for as long as it
lives. So a replica added under load gets only the connections opened after it is ready; the
clients already connected keep loading the old ones. The sandbox's own Service (`service.py`)
balances per request by default, as a mesh would, which hides that (its `--balance connection`
plays kube-proxy over HTTP, for the whole sandbox); this one relays bytes, so it shows it for
any protocol, gRPC included, and that the runtime's connection age (`--max-connection-age-s`)
undoes it. Used by the tests and by `bench/rebalance.py`.

Endpoints are taken in turn (IPVS' default round robin), so what a test asserts does not hang on
a random draw; a connection to an endpoint that refuses is closed, as a reset would be.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable

HOST = "127.0.0.1"
_CHUNK = 64 * 1024

Endpoint = tuple[str, int]


class ConnectionBalancer:
    """Listens on 127.0.0.1 and relays each accepted connection to one endpoint, whole."""

    def __init__(self, endpoints: Iterable[Endpoint] = ()) -> None:
        self._endpoints: list[Endpoint] = list(endpoints)
        self._next = 0
        self._server: asyncio.Server | None = None
        self._relays: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}
        """Each relay's task, and the sockets to close to end it."""
        self.connections: Counter[Endpoint] = Counter()
        """Connections relayed, by endpoint."""
        self.port = 0

    @property
    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """The ready endpoints from now on; connections already relayed stay where they are."""
        self._endpoints = list(endpoints)

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, HOST, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop listening and close every relayed connection, both ends (each relay ends as it
        would on a reset: its reads fail)."""
        if self._server is not None:
            self._server.close()
        for writers in self._relays.values():
            for writer in writers:
                writer.close()
        await asyncio.gather(*self._relays, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> ConnectionBalancer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _pick(self) -> Endpoint | None:
        if not self._endpoints:
            return None
        endpoint = self._endpoints[self._next % len(self._endpoints)]
        self._next += 1
        return endpoint

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        self._relays[relay] = writers = [writer]
        try:
            endpoint = self._pick()
            if endpoint is None:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*endpoint)
            except OSError:
                return
            writers.append(up_writer)
            self.connections[endpoint] += 1
            try:
                await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            del self._relays[relay]


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes from `source` to `sink` until EOF, which is passed on as a half-close (a client's
    `shutdown(SHUT_WR)` reaches the server as it would through kube-proxy's NAT)."""
    try:
        while chunk := await source.read(_CHUNK):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError):
        with contextlib.suppress(Exception):
            sink.close()
