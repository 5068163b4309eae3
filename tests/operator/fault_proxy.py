"""An unhealthy control plane for the tests: an HTTP proxy between the operator and the local
Kubernetes API that answers what a real API server answers on its worst day.

The local API stays honest; the proxy lies on its behalf, per verb and path pattern:

- `Answer(503)`, `Answer(500)`: the API server failing (etcd down, a webhook timing out);
- `Answer(429, retry_after=2)`: API Priority and Fairness turning a request away, as the real
  server does (a `Retry-After` header and `details.retryAfterSeconds`);
- `Answer(409)`: another writer got there first;
- `Reset()`: the connection dropped before the request reaches the API; `LoseAnswer()`: the
  request goes through, the connection drops before its answer (the write happened; the client
  cannot know);
- `Delay(s)`: a slow API server (then the request goes through, or `then` happens);
- `Gone()`: a watch answered "resourceVersion too old" (410 in an ERROR event in the stream, as
  the real server does once its watch cache has moved past the version: the client must list
  again);
- `CutWatch(after_events=n)`: a watch stream that ends after `n` events (a load balancer, an API
  server restarting).

`cut_watches()` ends every watch stream open now. Every request is recorded with its arrival
time, verb, path and what was answered, so a test can count the requests per second that the
operator sends while the API fails. Bound to 127.0.0.1; runs on a thread with its own loop, as
`LocalKubernetesAPI.threaded()` does (both through `batchpilot.sandbox.background`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import yaml

from batchpilot.sandbox.background import HOST, in_thread, listen

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass(frozen=True)
class Answer:
    """Answer with this status (a `Status` body) instead of the API."""

    status: int
    retry_after: float | None = None
    message: str = "injected by the test's proxy"


@dataclass(frozen=True)
class Reset:
    """Drop the connection (RST) before the request reaches the API."""


@dataclass(frozen=True)
class LoseAnswer:
    """Forward the request, then drop the connection instead of answering: the write happened."""


@dataclass(frozen=True)
class Delay:
    """Hold the request `seconds`, then do `then` (None: forward it)."""

    seconds: float
    then: Answer | Reset | LoseAnswer | Gone | CutWatch | None = None


@dataclass(frozen=True)
class Gone:
    """A watch answered 200 with one ERROR event, 410 Expired, and the stream's end."""


@dataclass(frozen=True)
class CutWatch:
    """Forward a watch, and end its stream after `after_events` events."""

    after_events: int = 0


Action = Answer | Reset | LoseAnswer | Delay | Gone | CutWatch

_REASONS = {
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Fault:
    """`action` for the requests whose verb is `method` (None: any) and whose path (without the
    query) matches `path` (a regular expression, searched); `watch`: only watches (True), only
    other requests (False), or both (None). `times`: how many requests it takes (None: every
    one until removed)."""

    action: Action
    path: str = ""
    method: str | None = None
    watch: bool | None = None
    times: int | None = None
    taken: int = 0

    def matches(self, method: str, path: str, watching: bool) -> bool:
        if self.times is not None and self.taken >= self.times:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        if self.watch is not None and self.watch != watching:
            return False
        return re.search(self.path, path) is not None


@dataclass(frozen=True)
class Seen:
    """One request as the proxy saw it."""

    at: float
    """time.monotonic() at arrival"""
    method: str
    path: str
    query: str
    watch: bool
    outcome: str
    """the status answered ("503", "200"), or "reset", "lost", "cut", "gone\""""
    retry_after: float | None = None


@dataclass
class Requests:
    """What the proxy has seen (thread-safe reads through `FaultProxy.seen`)."""

    items: list[Seen] = field(default_factory=list)

    def where(
        self,
        *,
        method: str | None = None,
        path: str = "",
        since: float = 0.0,
        watch: bool | None = None,
    ) -> list[Seen]:
        return [
            s
            for s in self.items
            if s.at >= since
            and (method is None or s.method == method.upper())
            and (watch is None or s.watch == watch)
            and re.search(path, s.path)
        ]


def _is_watch(request: aiohttp.web.BaseRequest) -> bool:
    return request.query.get("watch") in ("true", "1") or "/watch/" in request.path


def _status_body(answer: Answer) -> bytes:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": answer.message,
        "reason": _REASONS.get(answer.status, "InternalError"),
        "code": answer.status,
    }
    if answer.retry_after is not None:
        body["details"] = {"retryAfterSeconds": int(answer.retry_after)}
    return json.dumps(body).encode()


def _reset(request: aiohttp.web.BaseRequest) -> None:
    """Close the client's connection with a TCP RST, nothing answered."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Dropped(Exception):
    """The connection was dropped on purpose: nothing to answer."""


class FaultProxy:
    """`FaultProxy(upstream_url)`: serve with `threaded()`, point a kubeconfig at `url`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._requests = Requests()
        self._arrived: list[tuple[float, str, str]] = []
        self._streams: set[aiohttp.web.StreamResponse] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._port: int | None = None
        self._session: aiohttp.ClientSession | None = None

    # --- what tests use ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._port is not None, "the proxy is not running"
        return f"http://{HOST}:{self._port}"

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @contextlib.contextmanager
    def failing(self, *faults: Fault) -> Iterator[tuple[Fault, ...]]:
        """The faults while the block runs."""
        for fault in faults:
            self.add(fault)
        try:
            yield faults
        finally:
            for fault in faults:
                self.remove(fault)

    def seen(
        self,
        *,
        method: str | None = None,
        path: str = "",
        since: float = 0.0,
        watch: bool | None = None,
    ) -> list[Seen]:
        with self._lock:
            return self._requests.where(method=method, path=path, since=since, watch=watch)

    def arrived(self, *, method: str | None = None, path: str = "") -> list[float]:
        """When the requests of `method` on a `path` (searched) arrived, answered or not yet."""
        with self._lock:
            return [
                at
                for at, m, p in self._arrived
                if (method is None or m == method.upper()) and re.search(path, p)
            ]

    def cut_watches(self) -> int:
        """End every watch stream open now; how many there were."""
        loop = self._loop
        assert loop is not None
        done = threading.Event()
        count = [0]

        def cut() -> None:
            for stream in list(self._streams):
                _reset_stream(stream)
                count[0] += 1
            done.set()

        loop.call_soon_threadsafe(cut)
        assert done.wait(10)
        return count[0]

    def open_watches(self) -> int:
        return len(self._streams)

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "faulty", "cluster": {"server": self.url}}],
            "users": [{"name": "faulty", "user": {}}],
            "contexts": [
                {
                    "name": "faulty",
                    "context": {"cluster": "faulty", "user": "faulty", "namespace": "default"},
                }
            ],
            "current-context": "faulty",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    @contextlib.contextmanager
    def threaded(self) -> Iterator[FaultProxy]:
        with in_thread(self._serving, name="fault-proxy") as proxy:
            yield proxy

    # --- inside --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[FaultProxy]:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        try:
            runner, self._port = await listen(self._serve)
            self._loop = asyncio.get_running_loop()
            try:
                yield self
            finally:
                for stream in list(self._streams):
                    _reset_stream(stream)
                await runner.cleanup()
        finally:
            await self._session.close()

    def _fault_for(self, method: str, path: str, watching: bool) -> Action | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, watching):
                    fault.taken += 1
                    return fault.action
        return None

    def _record(
        self,
        request: aiohttp.web.BaseRequest,
        arrived: float,
        watching: bool,
        outcome: str,
        retry_after: float | None = None,
    ) -> None:
        with self._lock:
            self._requests.items.append(
                Seen(
                    arrived,
                    request.method,
                    request.path,
                    request.query_string,
                    watching,
                    outcome,
                    retry_after,
                )
            )

    async def _serve(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        try:
            return await self._handle(request)
        except _Dropped:
            # The connection is gone: aiohttp finds it closed and writes nothing of this.
            return aiohttp.web.Response(status=499)

    async def _handle(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        arrived = time.monotonic()
        watching = _is_watch(request)
        with self._lock:
            self._arrived.append((arrived, request.method, request.path))
        action = self._fault_for(request.method, request.path, watching)
        body = await request.read()
        if isinstance(action, Delay):
            await asyncio.sleep(action.seconds)
            action = action.then
        if isinstance(action, Answer):
            self._record(request, arrived, watching, str(action.status), action.retry_after)
            headers = {"Content-Type": "application/json"}
            if action.retry_after is not None:
                headers["Retry-After"] = str(int(action.retry_after))
            return aiohttp.web.Response(
                status=action.status, body=_status_body(action), headers=headers
            )
        if isinstance(action, Reset):
            self._record(request, arrived, watching, "reset")
            _reset(request)
            raise _Dropped
        if isinstance(action, Gone) and watching:
            self._record(request, arrived, watching, "gone")
            response = aiohttp.web.StreamResponse(
                status=200, headers={"Content-Type": "application/json"}
            )
            await response.prepare(request)
            expired = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "too old resource version (injected by the test's proxy)",
                "reason": "Expired",
                "code": 410,
            }
            await response.write(json.dumps({"type": "ERROR", "object": expired}).encode() + b"\n")
            await response.write_eof()
            return response
        return await self._forward(request, body, arrived, watching, action)

    async def _forward(
        self,
        request: aiohttp.web.BaseRequest,
        body: bytes,
        arrived: float,
        watching: bool,
        action: Action | None,
    ) -> aiohttp.web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        url = self.upstream + request.path_qs
        try:
            upstream = await self._session.request(
                request.method, url, data=body or None, headers=headers
            )
        except aiohttp.ClientError:
            self._record(request, arrived, watching, "upstream-failed")
            _reset(request)
            raise _Dropped from None
        async with upstream:
            if isinstance(action, LoseAnswer):
                await upstream.read()
                self._record(request, arrived, watching, "lost")
                _reset(request)
                raise _Dropped
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS
            }
            if not watching:
                data = await upstream.read()
                self._record(request, arrived, watching, str(upstream.status))
                return aiohttp.web.Response(status=upstream.status, body=data, headers=out_headers)
            self._record(request, arrived, watching, str(upstream.status))
            response = aiohttp.web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            self._streams.add(response)
            limit = action.after_events if isinstance(action, CutWatch) else None
            events = 0
            try:
                buffered = b""
                async for chunk in upstream.content.iter_any():
                    if limit is None:
                        await response.write(chunk)
                        continue
                    buffered += chunk
                    while b"\n" in buffered and events < limit:
                        line, buffered = buffered.split(b"\n", 1)
                        await response.write(line + b"\n")
                        events += 1
                    if events >= limit:
                        _reset_stream(response)
                        raise _Dropped
                await response.write_eof()
            except (ConnectionError, RuntimeError):
                raise _Dropped from None
            finally:
                self._streams.discard(response)
            return response


def _reset_stream(response: aiohttp.web.StreamResponse) -> None:
    """End a watch stream as a dropped connection does: the client sees it cut mid-way."""
    request = response._req
    if request is not None:
        _reset(request)
