"""The sandbox's Service proxy balances per request (a mesh) or per connection (kube-proxy).

The proxy in this process, in front of two small aiohttp servers that say who answered (and,
on `/close`, answer `Connection: close` as a runtime retiring a connection does); clients with
one kept-alive connection each.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from batchpilot.sandbox.service import Balance, Proxy, create_app


class Pod:
    """An upstream that answers its name, closing the connection after `/close`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runner: web.AppRunner | None = None
        self.endpoint = ""

    async def answer(self, request: web.Request) -> web.StreamResponse:
        response = web.json_response(
            {"pod": self.name, "attempt": request.headers.get("x-envoy-attempt-count")}
        )
        if request.path == "/close":
            response.force_close()
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.answer)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.endpoint = f"127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


class Box:
    def __init__(self, proxy: Proxy, url: str, pods: list[Pod], endpoints_file: Path) -> None:
        self.proxy = proxy
        self.url = url
        self.pods = pods
        self.endpoints_file = endpoints_file

    def set_ready(self, pods: list[Pod]) -> None:
        self.endpoints_file.write_text(json.dumps([p.endpoint for p in pods]))
        self.proxy.endpoints = [p.endpoint for p in pods]


@asynccontextmanager
async def sandbox_service(tmp_path: Path, balance: Balance) -> AsyncIterator[Box]:
    pods = [Pod("a"), Pod("b")]
    for pod in pods:
        await pod.start()
    endpoints_file = tmp_path / "endpoints.json"
    endpoints_file.write_text(json.dumps([p.endpoint for p in pods]))
    proxy = Proxy(endpoints_file, balance=balance)
    proxy.reload()
    runner = web.AppRunner(create_app(proxy), access_log=None, handler_cancellation=True)
    async with aiohttp.ClientSession() as shared:
        proxy.session = shared
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            yield Box(proxy, f"http://127.0.0.1:{port}", pods, endpoints_file)
        finally:
            await runner.cleanup()
            await proxy.close()
            for pod in pods:
                if pod.runner is not None:
                    await pod.stop()


@asynccontextmanager
async def one_connection() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def who(client: aiohttp.ClientSession, url: str) -> tuple[str, bool]:
    """Which pod answered, and whether the answer closes the connection."""
    async with client.post(url, data=b"x") as response:
        assert response.status == 200, await response.text()
        doc = await response.json()
        return doc["pod"], response.headers.get("Connection", "").lower() == "close"


async def test_per_request_each_request_goes_to_the_next_endpoint(tmp_path: Path) -> None:
    async with sandbox_service(tmp_path, "request") as box, one_connection() as client:
        answers = [(await who(client, f"{box.url}/infer"))[0] for _ in range(4)]
        assert sorted(answers) == ["a", "a", "b", "b"]
        assert answers[0] != answers[1]
        # A mesh ends the pod's connection itself: the client's stays open.
        _, closes = await who(client, f"{box.url}/close")
        assert not closes


async def test_a_retry_says_so_through_the_service(tmp_path: Path) -> None:
    # A client's (or its sidecar's) attempt count reaches the pod, as through kube-proxy.
    async with sandbox_service(tmp_path, "request") as box, one_connection() as client:
        retried = {"x-envoy-attempt-count": "2"}
        async with client.post(f"{box.url}/infer", data=b"x", headers=retried) as response:
            assert (await response.json())["attempt"] == "2"


async def test_per_connection_a_connection_stays_on_its_endpoint_and_the_next_one_moves_on(
    tmp_path: Path,
) -> None:
    async with (
        sandbox_service(tmp_path, "connection") as box,
        one_connection() as first,
        one_connection() as second,
    ):
        on_first = {(await who(first, f"{box.url}/infer"))[0] for _ in range(4)}
        on_second = {(await who(second, f"{box.url}/infer"))[0] for _ in range(4)}
        assert len(on_first) == len(on_second) == 1
        assert on_first != on_second
        assert len(box.proxy.pins) == 2


async def test_per_connection_a_close_from_the_pod_reaches_the_client_which_is_placed_anew(
    tmp_path: Path,
) -> None:
    async with sandbox_service(tmp_path, "connection") as box, one_connection() as client:
        pod, _ = await who(client, f"{box.url}/infer")
        same, closes = await who(client, f"{box.url}/close")
        assert (same, closes) == (pod, True)
        assert box.proxy.pins == {}
        # Its next connection goes to the next endpoint in turn.
        moved, _ = await who(client, f"{box.url}/infer")
        assert moved != pod
        assert [pin.endpoint for pin in box.proxy.pins.values()] == [
            p.endpoint for p in box.pods if p.name == moved
        ]


async def test_per_connection_an_endpoint_that_left_the_ready_list_keeps_its_connections(
    tmp_path: Path,
) -> None:
    async with sandbox_service(tmp_path, "connection") as box, one_connection() as client:
        pod, _ = await who(client, f"{box.url}/infer")
        box.set_ready([p for p in box.pods if p.name != pod])
        assert [(await who(client, f"{box.url}/infer"))[0] for _ in range(3)] == [pod] * 3
        # A new connection goes to what is ready.
        async with one_connection() as other:
            assert (await who(other, f"{box.url}/infer"))[0] != pod


async def test_per_connection_a_pinned_endpoint_that_refuses_is_replaced(tmp_path: Path) -> None:
    async with sandbox_service(tmp_path, "connection") as box, one_connection() as client:
        pod, _ = await who(client, f"{box.url}/infer")
        (gone,) = [p for p in box.pods if p.name == pod]
        await gone.stop()
        gone.runner = None
        answers = [(await who(client, f"{box.url}/infer"))[0] for _ in range(3)]
        assert answers == [p.name for p in box.pods if p is not gone] * 3


async def test_per_connection_a_closed_client_connection_is_forgotten(tmp_path: Path) -> None:
    async with sandbox_service(tmp_path, "connection") as box:
        async with one_connection() as client:
            await who(client, f"{box.url}/infer")
            assert len(box.proxy.pins) == 1
        for _ in range(100):
            box.proxy.forget_closed()
            if not box.proxy.pins:
                break
            await asyncio.sleep(0.01)
        assert box.proxy.pins == {}
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"{box.url}/sandbox/stats") as response,
        ):
            stats = await response.json()
        assert stats["balance"] == "connection"
        assert stats["pinned"] == {}
        assert stats["ok"] == 1
