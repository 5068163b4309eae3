"""The sandbox's Service: a round-robin HTTP proxy over the ready runtime processes.

On a cluster, clients reach an InferenceService through its Service, which spreads requests
over the ready pods. The sandbox has no kube-proxy, so this process plays it: the pod runner
writes the ready endpoints to a JSON file and the proxy re-reads it within 50 ms (kube-proxy
takes longer: the EndpointSlice controller, then its own sync, a second or so; a pod's
readiness reaches the operator first there).
With no ready endpoint it answers 503 with Retry-After, which the load generator counts as shed
load; a refused connection (a pod that just went away) is retried once on the next endpoint.

It balances one of two ways (`--balance`):

- `request` (the default): each request goes to the next ready endpoint, as an L7 mesh (Istio,
  Linkerd) balances, so a new replica takes its share at once even over kept-alive connections.
- `connection`: as kube-proxy does on a cluster without a mesh. Each client connection is pinned
  to the next ready endpoint when its first request arrives, and every request on it goes there,
  over an upstream connection of its own, even once that endpoint has left the ready list
  (conntrack keeps an established flow; a terminating pod answers 503 `Connection: close`
  itself). When the pod's answer says `Connection: close` (the runtime retiring a connection by
  age or when the operator asks), the answer to the client says it too and the client's
  connection closes after it, so the client reconnects and is pinned anew, as it would be through
  kube-proxy's NAT. A pinned endpoint that refuses the connection (its process is gone) is
  replaced by the next one, the single retry above. What differs from kube-proxy: an upstream
  connection the pod closed while idle is reopened to the same pod, where kube-proxy would pass
  the close on to the client; and with no endpoint the client gets the 503 above, not a refused
  connection.

It also counts what passes through it, for the sandbox's live view: `GET /sandbox/stats` (with,
in connection mode, the client connections pinned to each endpoint).
It runs as its own process (`python -m batchpilot.sandbox.service`) so that the
bytes it copies do not compete with the load generator for one interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

# The callers' API keys go through to the pods, which check them (a Service does not look at
# them either); the pods' 401 challenge and 429 Retry-After come back.
_FORWARD_REQUEST = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "Accept",
    "Authorization",
    "X-Api-Key",
    # A retry says so (`batchpilot.runtime.attempts`): kube-proxy passes every header.
    "X-Envoy-Attempt-Count",
    "Grpc-Previous-Rpc-Attempts",
)
_FORWARD_RESPONSE = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "Retry-After",
    "WWW-Authenticate",
)
_RECENT_S = 5.0


class Stats:
    """Cumulative counts and the latencies of the last few seconds."""

    def __init__(self) -> None:
        self.received = 0
        self.ok = 0
        self.shed = 0
        self.failed = 0
        self.recent: deque[tuple[float, float]] = deque()

    def record(self, status: int, latency_s: float) -> None:
        now = time.monotonic()
        if 200 <= status < 300:
            self.ok += 1
            self.recent.append((now, latency_s))
        elif status in (429, 503):
            self.shed += 1
        else:
            self.failed += 1
        while self.recent and self.recent[0][0] < now - _RECENT_S:
            self.recent.popleft()

    def p99_ms(self) -> float | None:
        now = time.monotonic()
        values = sorted(v for t, v in self.recent if t >= now - _RECENT_S)
        if not values:
            return None
        return 1e3 * values[max(0, math.ceil(0.99 * len(values)) - 1)]


Balance = Literal["request", "connection"]
BALANCES: tuple[Balance, ...] = ("request", "connection")


@dataclass
class Pin:
    """Where one client connection goes in connection mode, and its own upstream connection."""

    endpoint: str
    session: aiohttp.ClientSession


def _says_close(headers: Mapping[str, str]) -> bool:
    tokens = headers.get("Connection", "").lower().split(",")
    return "close" in (token.strip() for token in tokens)


class Proxy:
    def __init__(self, endpoints_file: Path, *, balance: Balance = "request") -> None:
        self.endpoints_file = endpoints_file
        self.balance = balance
        self.endpoints: list[str] = []
        self.next = 0
        self.stats = Stats()
        self.session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=120)
        self.pins: dict[RequestHandler, Pin] = {}
        """Connection mode: each open client connection's pin, by its aiohttp protocol."""
        self._closing: set[asyncio.Task[None]] = set()
        self._mtime = 0.0

    def reload(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            mtime = self.endpoints_file.stat().st_mtime
            if mtime != self._mtime:
                self.endpoints = [str(e) for e in json.loads(self.endpoints_file.read_text())]
                self._mtime = mtime

    async def watch(self) -> None:
        while True:
            self.reload()
            self.forget_closed()
            await asyncio.sleep(0.05)

    def pick(self) -> str | None:
        if not self.endpoints:
            return None
        self.next = (self.next + 1) % len(self.endpoints)
        return self.endpoints[self.next]

    def pin(self, connection: RequestHandler, *, anew: bool = False) -> Pin | None:
        """The client connection's pin: the one it has (unless `anew`), else the next ready
        endpoint (None: there is none, and the connection stays unpinned)."""
        pinned = self.pins.get(connection)
        if pinned is not None and not anew:
            return pinned
        self.unpin(connection)
        endpoint = self.pick()
        if endpoint is None:
            return None
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), timeout=self.timeout
        )
        pinned = self.pins[connection] = Pin(endpoint, session)
        return pinned

    def unpin(self, connection: RequestHandler) -> None:
        pinned = self.pins.pop(connection, None)
        if pinned is not None:
            task = asyncio.get_running_loop().create_task(pinned.session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def forget_closed(self) -> None:
        """Drop the pins of the client connections that have closed (and their upstream ones)."""
        for connection in [c for c in self.pins if c.transport is None]:
            self.unpin(connection)

    async def close(self) -> None:
        for connection in list(self.pins):
            self.unpin(connection)
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def stats_view(self, _: web.Request) -> web.Response:
        s = self.stats
        doc: dict[str, Any] = {
            "received": s.received,
            "ok": s.ok,
            "shed": s.shed,
            "failed": s.failed,
            "p99_ms": s.p99_ms(),
            "endpoints": self.endpoints,
            "balance": self.balance,
        }
        if self.balance == "connection":
            doc["pinned"] = dict(Counter(pin.endpoint for pin in self.pins.values()))
        return web.json_response(doc)

    def route(
        self, request: web.Request, *, retry: bool
    ) -> tuple[str, aiohttp.ClientSession] | None:
        """Where this request goes: the next endpoint (request mode; `retry`: the one after a
        refusal), or its connection's pin (connection mode; `retry`: pinned anew)."""
        if self.balance == "connection":
            pinned = self.pin(request.protocol, anew=retry)
            return None if pinned is None else (pinned.endpoint, pinned.session)
        endpoint = self.pick()
        assert self.session is not None
        return None if endpoint is None else (endpoint, self.session)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        self.stats.received += 1
        body = await request.read()
        headers = {k: request.headers[k] for k in _FORWARD_REQUEST if k in request.headers}
        pinned = self.balance == "connection"
        for attempt in range(2):
            route = self.route(request, retry=attempt > 0)
            if route is None:
                break
            endpoint, session = route
            url = f"http://{endpoint}{request.rel_url}"
            try:
                async with session.request(
                    request.method, url, data=body, headers=headers
                ) as upstream:
                    payload = await upstream.read()
                    out = {
                        k: upstream.headers[k] for k in _FORWARD_RESPONSE if k in upstream.headers
                    }
                    closing = _says_close(upstream.headers)
            except aiohttp.ClientConnectionError:
                if attempt == 1:
                    self.stats.record(502, time.monotonic() - started)
                    failed = web.json_response({"error": f"upstream {endpoint} failed"}, status=502)
                    if pinned:  # as a reset would: the client connects again
                        failed.force_close()
                        self.unpin(request.protocol)
                    return failed
                continue
            self.stats.record(upstream.status, time.monotonic() - started)
            response = web.Response(status=upstream.status, body=payload, headers=out)
            if pinned and closing:
                # The pod closes its end; through kube-proxy the client's connection goes with
                # it, and its next one is placed afresh.
                response.force_close()
                self.unpin(request.protocol)
            return response
        self.stats.record(503, time.monotonic() - started)
        return web.json_response(
            {"error": "no ready endpoints"}, status=503, headers={"Retry-After": "1"}
        )


def create_app(proxy: Proxy) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_get("/sandbox/stats", proxy.stats_view)
    app.router.add_route("*", "/{tail:.*}", proxy.forward)
    return app


async def serve(port: int, endpoints_file: Path, *, balance: Balance = "request") -> None:
    proxy = Proxy(endpoints_file, balance=balance)
    app = create_app(proxy)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=256)
    async with aiohttp.ClientSession(connector=connector, timeout=proxy.timeout) as session:
        proxy.session = session
        watcher = asyncio.create_task(proxy.watch())
        # A client that gives up (its timeout) cancels its request upstream too, as a mesh
        # resets the upstream stream when the downstream one goes. Without it a request hung on
        # a pod whose node is lost waited here for the upstream timeout, and was sent again to
        # another pod (the retry below) when the pod was killed at its eviction, minutes after
        # its client had left: a burst of requests nobody waited for.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await asyncio.Event().wait()
        finally:
            watcher.cancel()
            await runner.cleanup()
            await proxy.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoints", type=Path, required=True)
    parser.add_argument(
        "--balance",
        choices=BALANCES,
        default="request",
        help="per request, as a mesh (default), or per connection, as kube-proxy",
    )
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.endpoints, balance=args.balance))


if __name__ == "__main__":
    main()
