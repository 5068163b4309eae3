"""The sandbox's Service: a round-robin HTTP proxy over the ready runtime processes.

On a cluster, clients reach an InferenceService through its Service, which spreads requests
over the ready pods. The sandbox has no kube-proxy, so this process plays it: the pod runner
writes the ready endpoints to a JSON file and the proxy re-reads it within a quarter second.
It balances per request (as an L7 mesh would, not per connection as kube-proxy does), so a
new replica takes its share at once even over kept-alive connections. With no ready endpoint
it answers 503 with Retry-After, which the load generator counts as shed load; a refused
connection (a pod that just went away) is retried once on the next endpoint.

It also counts what passes through it, for the sandbox's live view: `GET /sandbox/stats`.
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
from collections import deque
from pathlib import Path

import aiohttp
from aiohttp import web

# The callers' API keys go through to the pods, which check them (a Service does not look at
# them either); the pods' 401 challenge and 429 Retry-After come back.
_FORWARD_REQUEST = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "Accept",
    "Authorization",
    "X-Api-Key",
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


class Proxy:
    def __init__(self, endpoints_file: Path) -> None:
        self.endpoints_file = endpoints_file
        self.endpoints: list[str] = []
        self.next = 0
        self.stats = Stats()
        self.session: aiohttp.ClientSession | None = None
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
            await asyncio.sleep(0.25)

    def pick(self) -> str | None:
        if not self.endpoints:
            return None
        self.next = (self.next + 1) % len(self.endpoints)
        return self.endpoints[self.next]

    async def stats_view(self, _: web.Request) -> web.Response:
        s = self.stats
        doc = {
            "received": s.received,
            "ok": s.ok,
            "shed": s.shed,
            "failed": s.failed,
            "p99_ms": s.p99_ms(),
            "endpoints": self.endpoints,
        }
        return web.json_response(doc)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        started = time.monotonic()
        self.stats.received += 1
        body = await request.read()
        headers = {k: request.headers[k] for k in _FORWARD_REQUEST if k in request.headers}
        for attempt in range(2):
            endpoint = self.pick()
            if endpoint is None:
                break
            url = f"http://{endpoint}{request.rel_url}"
            try:
                async with self.session.request(
                    request.method, url, data=body, headers=headers
                ) as upstream:
                    payload = await upstream.read()
                    out = {
                        k: upstream.headers[k] for k in _FORWARD_RESPONSE if k in upstream.headers
                    }
                    self.stats.record(upstream.status, time.monotonic() - started)
                    return web.Response(status=upstream.status, body=payload, headers=out)
            except aiohttp.ClientConnectionError:
                if attempt == 1:
                    self.stats.record(502, time.monotonic() - started)
                    return web.json_response({"error": f"upstream {endpoint} failed"}, status=502)
        self.stats.record(503, time.monotonic() - started)
        return web.json_response(
            {"error": "no ready endpoints"}, status=503, headers={"Retry-After": "1"}
        )


async def serve(port: int, endpoints_file: Path) -> None:
    proxy = Proxy(endpoints_file)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_get("/sandbox/stats", proxy.stats_view)
    app.router.add_route("*", "/{tail:.*}", proxy.forward)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=256)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoints", type=Path, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.endpoints))


if __name__ == "__main__":
    main()
