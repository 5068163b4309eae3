"""A replica added under load takes its share of clients that keep their connections.

A Kubernetes Service (kube-proxy) balances connections, not requests, so a client's kept-alive
HTTP connections and a gRPC channel's one connection stay on the replicas that were ready when
they opened. The runtime retires a connection once it is `--max-connection-age-s` old: its next
answer says `Connection: close` (gRPC: GOAWAY), the client reconnects, and the Service places it
again; and when the operator sees a replica join, it asks the serving ones to retire every
connection at once (`POST /admin/connections/retire`). Real server processes on loopback, the
simulated accelerator, real clients (httpx, Triton's gRPC client, the operator's own POST), and
`ConnectionBalancer` playing kube-proxy in front of them.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest
import tritonclient.grpc as tc

from batchpilot.operator.autopilot.push import retire_connections
from batchpilot.runtime.routes_admin import RETIRE_AFTER_S, RETIRE_SPREAD_S
from batchpilot.sandbox.kubeproxy import ConnectionBalancer
from tests.runtime_process import RuntimeProcess, Scrape, outcomes, runtime_process, send
from tests.test_server_process import mlp_rows, v2_request

pytestmark = pytest.mark.slow

SIMULATED = ("--engine", "simulated", "--simulated-latency", "alpha_ms=1,beta_ms=0.1")
INFER = "/v2/models/mlp/infer"
AGE_S = 0.5
CLIENTS = 4
"""Connections the client keeps: each one closed loop."""
LOAD_S = 2.5
"""How long the load runs once the second replica is in the Service."""
RETIRED = "batchpilot_connections_retired_total"
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@contextmanager
def serve_pair(
    mlp_model: Path, tmp_path: Path, age_s: float, *args: str
) -> Iterator[list[RuntimeProcess]]:
    with ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            log_dir = tmp_path / f"{name}-{age_s:g}"
            log_dir.mkdir()
            servers.append(
                stack.enter_context(
                    runtime_process(
                        mlp_model,
                        *SIMULATED,
                        "--max-connection-age-s",
                        str(age_s),
                        *args,
                        grpc=True,
                        log_dir=log_dir,
                    )
                )
            )
        yield servers


def live(sock: socket.socket, reader: BinaryIO) -> dict[str, str]:
    """`GET /v2/health/live` on a kept connection: the answer's headers (lower-cased names),
    its body read whole."""
    sock.sendall(LIVE)
    status = reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    head = {}
    while (line := reader.readline().strip()) != b"":
        name, _, value = line.decode().partition(": ")
        head[name.lower()] = value
    assert len(reader.read(int(head["content-length"]))) == int(head["content-length"])
    return head


def served(server: RuntimeProcess) -> float:
    return outcomes(Scrape(server)).get("success", 0.0)


async def http_load(
    balancer: ConnectionBalancer,
    second: tuple[str, int],
    joined: Callable[[], Awaitable[None]] | None = None,
    load_s: float = LOAD_S,
) -> list[str]:
    """`CLIENTS` kept-alive connections through the balancer, closed loops; once each has had an
    answer from the first replica alone, the second joins the Service (then `joined()`, while
    the load goes on) and the load goes on for `load_s`. The transport errors the clients met."""
    body, headers = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
    url = f"http://127.0.0.1:{balancer.port}{INFER}"
    errors: list[str] = []
    warm = asyncio.Barrier(CLIENTS + 1)
    stop_at = [float("inf")]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    async def client() -> None:
        async with httpx.AsyncClient(limits=limits, timeout=10) as session:
            for n in range(20_000):
                if time.monotonic() >= stop_at[0]:
                    return
                try:
                    response = await session.post(url, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                assert response.status_code == 200, response.text
                if n == 0:
                    await warm.wait()

    tasks = [asyncio.create_task(client()) for _ in range(CLIENTS)]
    try:
        await asyncio.wait_for(warm.wait(), timeout=20)
        balancer.set_endpoints([*balancer.endpoints, second])
        stop_at[0] = time.monotonic() + load_s
        if joined is not None:
            await joined()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=load_s + 20)
    finally:
        for task in tasks:
            task.cancel()
    return errors


@pytest.mark.parametrize("age_s", [0.0, AGE_S], ids=["age-off", "age-on"])
async def test_kept_alive_http_clients_reach_a_replica_added_under_load(
    mlp_model: Path, tmp_path: Path, age_s: float
) -> None:
    with serve_pair(mlp_model, tmp_path, age_s) as (a, b):
        async with ConnectionBalancer([("127.0.0.1", a.port)]) as balancer:
            errors = await http_load(balancer, ("127.0.0.1", b.port))
        assert not errors, errors[:5]
        share = served(b) / (served(a) + served(b))
        retired = Scrape(a).value(RETIRED, reason="age")
        if age_s == 0:
            # what kube-proxy alone does: the connections stay where they were opened
            assert served(b) == 0, share
            assert balancer.connections[("127.0.0.1", b.port)] == 0
            assert retired == 0
        else:
            # connections retire from AGE_S × 0.9 on and reconnect alternately to a and b
            assert share > 0.2, (share, balancer.connections)
            assert balancer.connections[("127.0.0.1", b.port)] >= 2, balancer.connections
            assert retired >= CLIENTS
        assert Scrape(a).value(RETIRED, reason="asked") == 0


async def test_asked_to_retire_its_connections_a_replica_hands_clients_to_one_that_joined(
    mlp_model: Path, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("admin-secret\n")
    # no age: only the operator's request moves the connections
    with serve_pair(mlp_model, tmp_path, 0, "--admin-token-file", str(token)) as (a, b):
        counts: list[tuple[float, float]] = []

        async def ask() -> None:
            """As the operator asks (its defaults: each connection 1 to 4 s later); what each
            had served once they all had retired."""
            endpoint = f"127.0.0.1:{a.admin_port}"
            asked = time.monotonic()
            await asyncio.to_thread(retire_connections, endpoint, token="admin-secret", document="")
            assert time.monotonic() - asked < 1.0  # before any could retire
            assert served(b) == 0
            await asyncio.sleep(RETIRE_AFTER_S + RETIRE_SPREAD_S + 0.3)
            counts.append((served(a), served(b)))

        async with ConnectionBalancer([("127.0.0.1", a.port)]) as balancer:
            errors = await http_load(balancer, ("127.0.0.1", b.port), joined=ask, load_s=6.5)
        assert not errors, errors[:5]
        ((a0, b0),) = counts
        share = (served(b) - b0) / (served(a) - a0 + served(b) - b0)  # once all had moved
        assert share > 0.3, (share, balancer.connections)
        # each client's connection (the POST's own said Connection: close itself)
        assert Scrape(a).value(RETIRED, reason="asked") >= CLIENTS
        assert Scrape(a).value(RETIRED, reason="age") == 0
        assert Scrape(a).value("batchpilot_open_connections") >= 1  # (the scrape's own)


def test_retiring_connections_needs_the_admin_token(mlp_model: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("admin-secret\n")
    with runtime_process(
        mlp_model, *SIMULATED, "--admin-token-file", str(token), log_dir=tmp_path
    ) as server:
        path = "/admin/connections/retire"
        refused = send(server, "POST", path, port=server.admin_port)
        assert refused.status == 401, refused
        assert send(server, "POST", path, port=server.port).status == 404  # not for clients
        admin = {"Authorization": "Bearer admin-secret"}
        for bad in (
            b"[]",
            b"{",
            b'{"afterSeconds": -1}',
            b'{"after": 1}',
            b'{"spreadSeconds": true}',
        ):
            reply = send(server, "POST", path, bad, admin, port=server.admin_port)
            assert reply.status == 400, (bad, reply)
            assert "error" in reply.json()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
            reader = idle.makefile("rb")
            assert "connection" not in live(idle, reader)
            now = b'{"afterSeconds": 0, "spreadSeconds": 0}'
            reply = send(server, "POST", path, now, admin, port=server.admin_port)
            assert reply.status == 200, reply
            assert reply.json()["retiring"] >= 2  # the idle one and the asking one
            assert live(idle, reader)["connection"] == "close"

        # by default, from a second on: after the Service's endpoints have the new replica
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as kept:
            reader = kept.makefile("rb")
            assert "connection" not in live(kept, reader)
            reply = send(server, "POST", path, b"", admin, port=server.admin_port)
            asked = time.monotonic()
            assert reply.json() == {"retiring": 2, "afterSeconds": 1.0, "spreadSeconds": 2.0}
            for _ in range(200):  # one every 50 ms: bounded well past the spread
                if live(kept, reader).get("connection") == "close":
                    break
                time.sleep(0.05)
            else:
                pytest.fail("never retired")
            assert (
                RETIRE_AFTER_S <= time.monotonic() - asked <= RETIRE_AFTER_S + RETIRE_SPREAD_S + 2
            )


async def test_a_grpc_channel_reaches_a_replica_added_under_load(
    mlp_model: Path, tmp_path: Path
) -> None:
    x = mlp_rows(1, seed=0)["x"]
    with serve_pair(mlp_model, tmp_path, AGE_S) as (a, b):
        assert a.grpc_port is not None
        assert b.grpc_port is not None
        async with ConnectionBalancer([("127.0.0.1", a.grpc_port)]) as balancer:
            client = tc.InferenceServerClient(f"127.0.0.1:{balancer.port}")

            def calls(count: int) -> None:
                tensor = tc.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                for _ in range(count):
                    result = client.infer("mlp", [tensor])  # GOAWAY is no error to the caller
                    assert result.as_numpy("logits") is not None

            try:
                await asyncio.to_thread(calls, 5)
                balancer.set_endpoints([*balancer.endpoints, ("127.0.0.1", b.grpc_port)])
                deadline = time.monotonic() + 10
                while served(b) < 20 and time.monotonic() < deadline:
                    await asyncio.to_thread(calls, 20)
            finally:
                client.close()
        assert served(b) >= 20, (served(a), balancer.connections)


def test_an_old_connection_is_closed_after_a_complete_answer(
    mlp_model: Path, tmp_path: Path
) -> None:
    with (
        runtime_process(
            mlp_model, *SIMULATED, "--max-connection-age-s", str(AGE_S), log_dir=tmp_path
        ) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock,
    ):
        opened = time.monotonic()
        reader = sock.makefile("rb")
        for _ in range(200):  # one a few milliseconds apart: bounded well past the age
            if live(sock, reader).get("connection") == "close":
                break
            time.sleep(0.01)
        else:
            pytest.fail("no answer said Connection: close")
        lived = time.monotonic() - opened
        assert AGE_S * 0.9 - 0.05 <= lived <= AGE_S * 1.1 + 2.0, lived  # (a slow machine: late)
        assert reader.read() == b""  # and the server closed it
