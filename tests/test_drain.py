"""SIGTERM under keep-alive load resets no connection.

A rollout sends SIGTERM to a pod that still has clients on open keep-alive connections. Every
request read on any of them must get an answer: its result if it was queued, else 503 with
Retry-After and `Connection: close`; the server then closes that connection itself, after a
complete answer, and a client that reconnects during the drain still gets a 503 rather than a
refusal. No client may see "server disconnected without sending a response", which leaves it
not knowing whether its request ran.

Real server processes on loopback, the simulated accelerator (so the CPU of the machine running
the tests is not the limit), real clients: httpx (asyncio, one keep-alive connection per
client; the client with which the resets were first seen) and Triton's own `tritonclient.http`
(geventhttpclient, one connection per client, one thread each as it is synchronous).
"""

from __future__ import annotations

import asyncio
import http.client
import re
import signal
import socket
import threading
import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import gevent
import httpx
import pytest
import tritonclient.http as triton
from pydantic import ValidationError
from tritonclient.utils import InferenceServerException

from batchpilot.runtime.settings import RuntimeSettings
from tests.runtime_process import RuntimeProcess, Scrape, runtime_process, send
from tests.test_server_process import mlp_rows, v2_request
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

SIMULATED = ("--engine", "simulated", "--simulated-latency", "alpha_ms=2,beta_ms=0.5")
INFER = "/v2/models/mlp/infer"
CLIENTS = 64
WARM_REQUESTS = 3
"""Successes each client has had before the signal: every connection is in use when it comes."""
MAX_REQUESTS = 2000
"""Per client and repetition, a bound on the closed loop that is never reached."""
LINGER_S = 1.0
"""The default linger: a client on a loaded machine may take longer than 0.3 s to send again."""


@dataclass
class Received:
    """What the clients of one repetition received, in total."""

    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    """Requests sent that got no HTTP answer: reset, disconnected, timed out."""
    refused_at: list[float] = field(default_factory=list)
    """Wall-clock times of connections refused: the request never left the client, which is
    safe, but only once the port has closed at the end of the linger."""
    bad_503s: list[str] = field(default_factory=list)
    """503 answers without `Connection: close` and `Retry-After`."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, status: int) -> None:
        with self.lock:
            self.statuses[status] += 1

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if isinstance(error, (httpx.ConnectError, ConnectionRefusedError)):
                self.refused_at.append(time.time())
            else:
                self.errors.append(f"{type(error).__name__}: {error}")


def port_closed_at(log: str) -> float:
    """The earliest wall-clock time the port may close: the queue empty, then the linger."""
    emptied = re.search(r"^(\S+ \S+) INFO \S+ drain: queue empty; the port answers 503", log, re.M)
    assert emptied is not None, log
    when = datetime.strptime(emptied[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return when + LINGER_S


def final_tally(log: str) -> dict[str, int]:
    """The server's `_log_final_tally` line: answered requests by outcome."""
    tally = re.search(r"stopped; requests by outcome: (.*)", log)
    assert tally is not None, log
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", tally[1])}


def start_draining_server(
    model: Path, log_dir: Path, *args: str, grpc: bool = False
) -> AbstractContextManager[RuntimeProcess]:
    return runtime_process(
        model,
        *SIMULATED,
        "--max-batch-size",
        "8",
        "--max-queue-delay-ms",
        "1",
        "--drain-grace-s",
        "10",
        *args,
        grpc=grpc,
        log_dir=log_dir,
    )


# --- clients ----------------------------------------------------------------------------------


def answered_kept_alive(
    connection: http.client.HTTPConnection, request: tuple[bytes, dict[str, str]]
) -> None:
    """One request on `connection`, answered 200, the connection kept alive."""
    connection.request("POST", INFER, body=request[0], headers=request[1])
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 200
    assert answer.getheader("connection") is None


def raw_head(body: bytes, headers: dict[str, str]) -> bytes:
    """An inference request's head, to send apart from its body on a socket."""
    return (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "\r\n"
    ).encode()


async def httpx_repetition(server: RuntimeProcess) -> Received:
    """64 asyncio clients, each its own session with one keep-alive connection, closed loop;
    SIGTERM once each has had WARM_REQUESTS answers; each stops at its first 503."""
    received = Received()
    body, headers = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
    url = f"{server.url}{INFER}"
    warm = 0
    all_warm = asyncio.Event()

    def ready() -> None:
        nonlocal warm
        warm += 1
        if warm == CLIENTS:
            all_warm.set()

    async def client() -> None:
        answered = 0
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        try:
            async with httpx.AsyncClient(limits=limits, timeout=20) as session:
                for _ in range(MAX_REQUESTS):
                    try:
                        # "Server disconnected without sending a response" is a
                        # RemoteProtocolError: an HTTPError like every other transport failure
                        response = await session.post(url, content=body, headers=headers)
                    except httpx.HTTPError as exc:
                        received.fail(exc)
                        return
                    received.add(response.status_code)
                    answered += 1
                    if answered == WARM_REQUESTS:
                        ready()
                    if response.status_code == 503:
                        if not (
                            response.headers.get("Connection", "").lower() == "close"
                            and response.headers.get("Retry-After") == "1"
                        ):
                            received.bad_503s.append(str(dict(response.headers)))
                        return  # a real client would go to another replica
                    if response.status_code != 200:
                        return
        finally:
            if answered < WARM_REQUESTS:  # it stopped early: the assertions will say why
                ready()

    clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
    try:
        await asyncio.wait_for(all_warm.wait(), timeout=30)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*clients), timeout=30)
    finally:
        for task in clients:
            task.cancel()
    return received


def triton_repetition(server: RuntimeProcess) -> Received:
    """The same with Triton's HTTP client: one client (concurrency=1: one connection) per
    thread, as its API is synchronous."""
    received = Received()
    x = mlp_rows(1, seed=0)["x"]
    warm = threading.Semaphore(0)
    stop = threading.Event()  # only set when the test gives up

    def client() -> None:
        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        connection = triton.InferenceServerClient(
            f"127.0.0.1:{server.port}",
            concurrency=1,
            connection_timeout=20,
            network_timeout=20,
        )
        answered = 0
        try:
            for _ in range(MAX_REQUESTS):
                if stop.is_set():
                    return
                try:
                    connection.infer("mlp", [tensor])
                except InferenceServerException as exc:
                    status = exc.status()
                    if status is None or not status.isdigit():
                        received.fail(exc)
                        return
                    received.add(int(status))
                    return  # 503: a real client would go to another replica
                except Exception as exc:  # anything else: the request got no answer
                    received.fail(exc)
                    return
                received.add(200)
                answered += 1
                if answered == WARM_REQUESTS:
                    warm.release()
        finally:
            connection.close()
            # The client's gevent hub is this thread's, with its loop's descriptors: left alone
            # they outlive the thread (two for each of the 640 threads of the test).
            gevent.get_hub().destroy(destroy_loop=True)
            if answered < WARM_REQUESTS:  # it stopped early: the assertions will say why
                warm.release()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        for _ in range(CLIENTS):
            assert warm.acquire(timeout=max(0.0, deadline - time.monotonic())), (
                f"clients did not all get answers before the signal: {received.errors[:3]}"
            )
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "clients still running 30 s after SIGTERM"
    finally:
        stop.set()
    return received


# --- tests ------------------------------------------------------------------------------------


class TestSigtermUnderKeepAliveLoad:
    REPETITIONS = 10
    """Per client library."""

    async def test_every_request_is_answered_and_no_connection_is_reset(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        summary: list[str] = []
        for kind in ("httpx", "tritonclient.http"):
            totals: Counter[int] = Counter()
            errors: list[str] = []
            refused = 0
            queued_at_signal = 0
            started = time.monotonic()
            for n in range(self.REPETITIONS):
                log_dir = tmp_path / f"{kind}-{n}"
                log_dir.mkdir()
                with start_draining_server(
                    mlp_model, log_dir, "--drain-linger-s", str(LINGER_S)
                ) as server:
                    if kind == "httpx":
                        received = await httpx_repetition(server)
                    else:
                        received = await asyncio.to_thread(triton_repetition, server)
                    exit_code = await asyncio.to_thread(server.process.wait, 20)
                log = server.log()
                where = f"{kind}, repetition {n}"
                assert exit_code == 0, f"{where}: exit status {exit_code}\n{log}"
                assert not received.errors, f"{where}: {received.errors[:5]}\n{log}"
                # a client starved past the linger (a loaded test machine) may find the port
                # shut when it reconnects; before that, a reconnect must be answered
                closed_at = port_closed_at(log)
                early = [closed_at - t for t in received.refused_at if t < closed_at - 0.01]
                assert not early, f"{where}: refused {early[:5]} s before the linger's end\n{log}"
                assert set(received.statuses) <= {200, 503}, f"{where}: {received.statuses}"
                assert not received.bad_503s, f"{where}: {received.bad_503s[:3]}"
                # every client got its 503, or reconnected after the port closed
                assert received.statuses[503] + len(received.refused_at) == CLIENTS, (
                    f"{where}: {received.statuses}, {len(received.refused_at)} refused"
                )
                counts = final_tally(log)
                assert counts["success"] == received.statuses[200], (where, counts)
                assert counts["rejected"] == received.statuses[503], (where, counts)
                assert counts["cancelled"] == counts["error"] == counts["timeout"] == 0, where
                assert "timeout graceful shutdown exceeded" not in log, log
                assert "still queued" not in log, log
                totals += received.statuses
                errors += received.errors
                refused += len(received.refused_at)
                draining = re.search(r"signal 15: draining (\d+) queued requests", log)
                assert draining is not None, log
                queued_at_signal += int(draining[1])
            # the signals came while requests waited in the queue, and those were served
            assert queued_at_signal > 0, kind
            summary.append(
                f"{kind}: {self.REPETITIONS} SIGTERMs x {CLIENTS} clients, "
                f"{totals[200]} x 200, {totals[503]} x 503, {len(errors)} connection errors, "
                f"{refused} reconnects after the port closed, "
                f"{queued_at_signal} requests queued at the signals, "
                f"{time.monotonic() - started:.1f} s"
            )
        print("\n" + "\n".join(summary))


class TestLinger:
    LINGER_S = 3.0

    def test_idle_and_new_connections_get_503_with_connection_close(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        request = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
        with start_draining_server(
            mlp_model, tmp_path, "--drain-linger-s", str(self.LINGER_S), grpc=True
        ) as server:
            assert server.grpc_port is not None
            idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            try:
                answered_kept_alive(idle, request)

                server.process.send_signal(signal.SIGTERM)
                wait_until(
                    lambda: "the port answers 503" in server.log(),
                    timeout=10,
                    what="the drain to reach its linger",
                )

                # the connection opened before the signal, idle since: an answer, not a reset
                idle.request("POST", INFER, body=request[0], headers=request[1])
                late = idle.getresponse()
                body = late.read()
                assert late.status == 503, body
                assert late.getheader("connection") == "close"
                assert late.getheader("retry-after") == "1"
                assert b"shutting down" in body
            finally:
                idle.close()

            # a new connection during the linger: 503, not a refusal
            fresh = send(server, "POST", INFER, *request)
            assert fresh.status == 503, fresh.body
            assert fresh.headers["connection"] == "close"
            assert fresh.headers["retry-after"] == "1"
            # every other answer closes its connection too
            ready = send(server, "GET", "/v2/health/ready")
            assert (ready.status, ready.headers["connection"]) == (503, "close")
            live = send(server, "GET", "/v2/health/live")
            assert (live.status, live.headers["connection"]) == (200, "close")
            # gRPC sent GOAWAY and closed its port when the drain started, not after the linger
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", server.grpc_port)) != 0
            assert "Shutting down" not in server.log(), "the linger ended before the checks"

            assert server.process.wait(timeout=20) == 0
        counts = final_tally(server.log())
        assert (counts["success"], counts["rejected"]) == (1, 2), counts


class TestConnectionsOpenAtTheSignal:
    def test_the_next_request_of_each_is_served_and_closes_it(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        """Behind a Service (kube-proxy) a connection stays on its pod after the pod has left
        the endpoints, so its client's next request can only come here: a 503 would be an error
        to every client that does not retry one. It is served, with `Connection: close`; the
        client's next connection goes to a replica in the endpoints (here: 503)."""
        request = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
        with start_draining_server(mlp_model, tmp_path, "--drain-linger-s", "3") as server:
            pinned = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            quiet = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            try:
                for connection in (pinned, quiet):
                    answered_kept_alive(connection, request)

                server.process.send_signal(signal.SIGTERM)
                wait_until(
                    lambda: (
                        "the next request of 2 open connections is still served" in server.log()
                    ),
                    timeout=10,
                    what="the drain to start",
                )
                pinned.request("POST", INFER, body=request[0], headers=request[1])
                served = pinned.getresponse()
                body = served.read()
                assert served.status == 200, body
                assert served.getheader("connection") == "close"
                # once is all: the connection is closed after that answer
                assert pinned.sock is None or pinned.sock.recv(1) == b""

                fresh = send(server, "POST", INFER, *request)  # opened after the signal
                assert fresh.status == 503, fresh.body
                assert fresh.headers["connection"] == "close"
                # the other, idle, is waited for until it has been quiet for a linger
                wait_until(
                    lambda: (
                        "drain: 1 open connections sent nothing since the signal" in server.log()
                    ),
                    timeout=10,
                    what="the drain to stop waiting for the idle connection",
                )
            finally:
                pinned.close()
                quiet.close()
            assert server.process.wait(timeout=20) == 0
        counts = final_tally(server.log())
        assert (counts["success"], counts["rejected"]) == (3, 1), counts


def test_a_pinned_connections_request_whose_body_comes_later_is_served(
    mlp_model: Path, tmp_path: Path
) -> None:
    """The one connection open at the signal sends its headers, then its body a while later (a
    large body, a client that writes them apart): the queue waits for the request, not only
    for its headers, until it is answered."""
    body, headers = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
    head = raw_head(body, headers)
    with start_draining_server(mlp_model, tmp_path, "--drain-linger-s", "1") as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            pinned = sock.makefile("rb")
            sock.sendall(head + body)
            assert pinned.readline().startswith(b"HTTP/1.1 200")
            while pinned.readline() not in (b"\r\n", b""):
                pass  # the headers
            server.process.send_signal(signal.SIGTERM)
            wait_until(
                lambda: "the next request of 1 open connections is still served" in server.log(),
                timeout=10,
                what="the drain to start",
            )
            sock.sendall(head)
            time.sleep(0.3)  # the client's pace: the body comes later
            sock.sendall(body)
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                answer += chunk
        assert b"HTTP/1.1 200" in answer, answer[:300]
        assert b"connection: close" in answer.lower()
        assert server.process.wait(timeout=20) == 0
    counts = final_tally(server.log())
    assert (counts["success"], counts["rejected"]) == (2, 0), counts


def test_a_request_whose_body_is_still_coming_is_refused_when_the_drain_starts(
    mlp_model: Path, tmp_path: Path
) -> None:
    """It would be refused once its body was in anyway; until then it held the drain to the end
    of the grace, where uvicorn cancelled it with a plain-text 500 no tally counted."""
    body, headers = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
    head = raw_head(body, headers)
    with start_draining_server(mlp_model, tmp_path, "--drain-linger-s", "0.5") as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + body[:5])  # the rest never comes before the signal
            wait_until(
                lambda: Scrape(server).value("batchpilot_inflight_requests") == 1,
                timeout=5,
                what="the request to wait for its body",
            )
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"retry-after: 1" in answer.lower()
        assert b"connection: close" in answer.lower()
        assert b"shutting down" in answer
        assert server.process.wait(timeout=20) == 0
        assert time.monotonic() - signalled < 5  # the queue and the linger, not the 10 s grace
    assert "refused 1 requests whose body was still coming" in server.log()
    counts = final_tally(server.log())
    assert (counts["rejected"], counts["error"], counts["cancelled"]) == (1, 0, 0), counts


def test_the_linger_must_fit_inside_the_grace(mlp_model: Path) -> None:
    with pytest.raises(ValidationError, match="must fit inside"):
        RuntimeSettings(model_path=mlp_model, drain_grace_s=0.5, drain_linger_s=1)
    assert RuntimeSettings(model_path=mlp_model).drain_linger_s == 1.0
    # the default shrinks to a shorter grace rather than refusing it
    assert RuntimeSettings(model_path=mlp_model, drain_grace_s=0.5).drain_linger_s == 0.5
