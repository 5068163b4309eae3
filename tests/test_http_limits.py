"""The HTTP layer's limits, seen by a client on a raw socket against a real server process: headers
bounded in size and in time, idle connections closed, a connection cap, an answer sent before the
body was read closing its connection, and a client that half-closes still answered while one
that closes altogether is not computed for.

Raw sockets because each case is about bytes a well-behaved client never sends (unterminated
headers, a body that never comes, a shutdown of the sending side), and about what happens to the
connection afterwards, which a client library hides.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.onnx_models import mlp
from tests.runtime_process import (
    RuntimeProcess,
    Scrape,
    free_port,
    outcomes,
    runtime_process,
    send,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MAX_HEADER_BYTES = 4096
HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 1.0
KEEP_ALIVE_TIMEOUT_S = 2.0
INFER = "/v2/models/mlp/infer"
BODY = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
)


def post_head(length: int, path: str = INFER) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"


@dataclass(frozen=True)
class Received:
    data: bytes
    ended: str
    """How the connection ended: "eof" (closed by the server), "reset", or "open" (still open
    when the wait ran out)."""

    @property
    def answers(self) -> list[tuple[int, dict[str, str]]]:
        """Status and lower-cased headers of each answer received, interim ones included."""
        found = []
        for block in self.data.split(b"HTTP/1.1 ")[1:]:
            head = block.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
            found.append((int(head[0].split(" ", 1)[0]), headers))
        return found


def receive_all(sock: socket.socket, *, timeout_s: float) -> Received:
    """Everything the server sends until it closes the connection, or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return Received(data, "reset")
        if not chunk:
            return Received(data, "eof")
        data += chunk
    return Received(data, "open")


def connect(server: RuntimeProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


@pytest.fixture(scope="module")
def server(mlp_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    with runtime_process(
        mlp_model,
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=300,beta_ms=0",
        "--max-header-bytes",
        str(MAX_HEADER_BYTES),
        "--header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--body-timeout-s",
        str(BODY_TIMEOUT_S),
        "--keep-alive-timeout-s",
        str(KEEP_ALIVE_TIMEOUT_S),
        log_dir=tmp_path_factory.mktemp("http-limits"),
    ) as running:
        yield running


class TestHeaderSize:
    def test_headers_within_the_limit_are_served(self, server: RuntimeProcess) -> None:
        with connect(server) as sock:
            sock.sendall(GET_LIVE + b"X-Pad: " + b"a" * (MAX_HEADER_BYTES - 200) + b"\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
            received = receive_all(sock, timeout_s=5)
        assert [status for status, _ in received.answers] == [200]

    def test_complete_headers_over_the_limit_get_431_and_a_closed_connection(
        self, server: RuntimeProcess
    ) -> None:
        with connect(server) as sock:
            sock.sendall(GET_LIVE + b"X-Big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n\r\n")
            received = receive_all(sock, timeout_s=5)
        assert received.ended == "eof"
        [(status, headers)] = received.answers
        assert status == 431
        assert headers["connection"] == "close"
        assert b"limit of 4096 bytes" in received.data

    def test_headers_that_never_end_are_cut_off_before_they_fill_the_memory(
        self, server: RuntimeProcess
    ) -> None:
        """A header value that keeps coming: the server answers while the client still sends,
        after a read or so past the limit, never waiting for the end of it."""
        sent = 0
        with connect(server) as sock:
            sock.sendall(GET_LIVE + b"X-Big: ")
            sock.settimeout(0.05)
            answer = b""
            while not answer and sent < 64 * 1024 * 1024:  # bounded: 64 MiB at most
                try:
                    sock.sendall(b"a" * 65536)
                    sent += 65536
                    answer = sock.recv(65536, socket.MSG_PEEK)
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
            received = receive_all(sock, timeout_s=5)
        assert sent < 8 * 1024 * 1024, f"the server let {sent} bytes of headers in"
        assert [status for status, _ in received.answers] == [431]
        assert send(server, "GET", "/v2/health/live").status == 200


class TestHeaderTime:
    def test_headers_slower_than_the_timeout_get_408_and_a_closed_connection(
        self, server: RuntimeProcess
    ) -> None:
        """Slowloris: many connections, each with a request started and never finished."""
        socks = [connect(server) for _ in range(50)]
        try:
            for sock in socks:
                sock.sendall(GET_LIVE)
            started = time.monotonic()
            # While they wait, the server serves others.
            assert send(server, "POST", INFER, BODY).status == 200
            for sock in socks:
                received = receive_all(sock, timeout_s=HEADER_TIMEOUT_S + 5)
                assert received.ended == "eof"
                assert [status for status, _ in received.answers] == [408]
            assert time.monotonic() - started < HEADER_TIMEOUT_S + 5
        finally:
            for sock in socks:
                sock.close()

    def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
        self, server: RuntimeProcess
    ) -> None:
        """No 408 on a connection with no request: its client would read it as the answer to
        the request it sends next. It is closed as an idle keep-alive connection is."""
        with connect(server) as sock:
            started = time.monotonic()
            received = receive_all(sock, timeout_s=KEEP_ALIVE_TIMEOUT_S + 5)
            waited = time.monotonic() - started
        assert received == Received(b"", "eof")
        assert waited > HEADER_TIMEOUT_S * 2

    def test_keep_alive_connections_serve_requests_one_after_another(
        self, server: RuntimeProcess
    ) -> None:
        with connect(server) as sock:
            for _ in range(3):
                sock.sendall(post_head(len(BODY)) + BODY)
                data = b""
                while b"]}]}" not in data:  # the end of the JSON answer
                    chunk = sock.recv(65536)
                    assert chunk, data
                    data += chunk
                assert data.startswith(b"HTTP/1.1 200 ")
                assert b"connection: close" not in data


class TestBodyTime:
    def test_a_body_that_stops_gets_408_and_frees_its_connection(
        self, server: RuntimeProcess
    ) -> None:
        """A body that stalls holds a connection (and, under the connection cap, every one can
        be held so): after `--body-timeout-s` without a byte, 408 and the connection closes;
        the request waiting for its body counts as cancelled."""
        before = outcomes(Scrape(server))
        socks = [connect(server) for _ in range(20)]
        try:
            for sock in socks:
                sock.sendall(post_head(len(BODY)) + BODY[:10])
            started = time.monotonic()
            assert send(server, "POST", INFER, BODY).status == 200  # others are served meanwhile
            for sock in socks:
                received = receive_all(sock, timeout_s=BODY_TIMEOUT_S + 5)
                assert received.ended == "eof"
                assert [status for status, _ in received.answers] == [408]
                assert b"no byte for 1 s" in received.data
            assert time.monotonic() - started < BODY_TIMEOUT_S + 5
        finally:
            for sock in socks:
                sock.close()
        wait_until(
            lambda: outcomes(Scrape(server))["cancelled"] - before["cancelled"] == 20,
            timeout=5,
            what="the 20 stalled requests counted as cancelled",
        )

    def test_a_body_trickling_in_slower_than_the_timeout_in_all_is_served(
        self, server: RuntimeProcess
    ) -> None:
        """The timeout bounds the pauses, not the whole body: 4 pieces a third of it apart take
        longer than the timeout in all."""
        with connect(server) as sock:
            sock.sendall(post_head(len(BODY)))
            pieces = [
                BODY[i : i + len(BODY) // 4 + 1] for i in range(0, len(BODY), len(BODY) // 4 + 1)
            ]
            started = time.monotonic()
            for piece in pieces:
                time.sleep(BODY_TIMEOUT_S / 3)
                sock.sendall(piece)
            received = receive_all(sock, timeout_s=0.5 + 5)
        assert time.monotonic() - started > BODY_TIMEOUT_S
        assert [status for status, _ in received.answers][:1] == [200]

    def test_a_body_trickling_under_the_minimum_rate_gets_408_after_the_grace(
        self, server: RuntimeProcess
    ) -> None:
        """A byte every half second never pauses past the timeout; at 2 bytes a second the
        395-byte body would hold its connection for minutes (a declared 64 MiB, for ever). Once
        it has taken 5 s, its average is held to 1024 bytes a second (the default)."""
        with connect(server) as sock:
            sock.sendall(post_head(len(BODY)))
            started = time.monotonic()
            sock.settimeout(BODY_TIMEOUT_S / 2)
            answer = b""
            for byte in BODY[:40]:  # bounded: 20 s at most
                try:
                    sock.sendall(bytes([byte]))
                    answer = sock.recv(65536)
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
                if answer:
                    break
            taken = time.monotonic() - started
            received = receive_all(sock, timeout_s=5)
        data = answer + received.data
        assert b"HTTP/1.1 408" in data
        assert b"came too slowly" in data
        assert b"under 1024 bytes a second" in data
        assert 5 <= taken < 10


class TestAnswerBeforeTheBody:
    @pytest.mark.parametrize(
        ("head", "status"),
        [
            (post_head(99_999_999_999), 413),
            (post_head(1000, path="/v2/models/nope/infer"), 404),
            (post_head(10**9) + b"a" * 1_000_000, 413),
        ],
        ids=["body-too-large", "unknown-model", "too-large-with-a-megabyte-sent"],
    )
    def test_the_answer_closes_the_connection(
        self, server: RuntimeProcess, head: bytes, status: int
    ) -> None:
        with connect(server) as sock:
            sock.sendall(head)
            received = receive_all(sock, timeout_s=5)
        assert received.ended == "eof"
        [(got, headers)] = received.answers
        assert got == status
        assert headers["connection"] == "close"

    def test_an_error_after_the_body_keeps_the_connection(self, server: RuntimeProcess) -> None:
        with connect(server) as sock:
            sock.sendall(post_head(5) + b"nope!")
            received = receive_all(sock, timeout_s=0.5)
        assert received.ended == "open"
        [(status, headers)] = received.answers
        assert status == 400
        assert "connection" not in headers


@pytest.fixture(scope="module")
def queued_server(
    mlp_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    """A request waits 300 ms for its batch to fill (no early start): a client that goes in that
    time leaves before the device computes anything for it."""
    with runtime_process(
        mlp_model,
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=50,beta_ms=0",
        "--no-early-start",
        "--max-queue-delay-ms",
        "300",
        "--deadline-ms",
        "5000",
        log_dir=tmp_path_factory.mktemp("http-limits-queued"),
    ) as running:
        yield running


class TestHalfClose:
    def test_a_client_that_half_closes_gets_its_answer(self, server: RuntimeProcess) -> None:
        before = outcomes(Scrape(server))
        with connect(server) as sock:
            sock.sendall(post_head(len(BODY)) + BODY)
            sock.shutdown(socket.SHUT_WR)
            received = receive_all(sock, timeout_s=10)
        assert received.ended == "eof"
        # Interim 100s (one, up to four if the answer takes long) are how the server learns the
        # client is still there: see the next test.
        *interim, (status, headers) = received.answers
        assert status == 200
        assert {status for status, _ in interim} == {100}
        assert headers["connection"] == "close"
        assert b'"outputs"' in received.data
        after = outcomes(Scrape(server))
        assert after["success"] == before["success"] + 1
        assert after["cancelled"] == before["cancelled"]

    @pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
    def test_a_client_that_closes_while_its_request_waits_is_not_computed_for(
        self, server: RuntimeProcess, reset: bool
    ) -> None:
        """Closed altogether (FIN, the same as a half-close until the server writes) or reset:
        the request is cancelled before its 300 ms batch ends, and counted so."""
        before = outcomes(Scrape(server))
        sock = connect(server)
        sock.sendall(post_head(len(BODY)) + BODY)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

        def cancelled() -> bool:
            return outcomes(Scrape(server))["cancelled"] == before["cancelled"] + 1

        wait_until(cancelled, timeout=10, what="the request counted cancelled")
        assert outcomes(Scrape(server))["success"] == before["success"]

    @pytest.mark.parametrize("version", ["1.0", "1.1"])
    def test_a_client_that_closes_while_its_request_is_queued_leaves_before_the_device(
        self, queued_server: RuntimeProcess, version: str
    ) -> None:
        """HTTP/1.0 too (nginx's default upstream protocol, ApacheBench): it cannot be probed
        with a 100 Continue, and its clients never half-close, so its EOF means "gone"."""
        server = queued_server
        before = Scrape(server)
        sock = connect(server)
        head = post_head(len(BODY)).replace(b"HTTP/1.1", f"HTTP/{version}".encode(), 1)
        sock.sendall(head + BODY)
        sock.close()

        def cancelled() -> bool:
            return outcomes(Scrape(server))["cancelled"] == outcomes(before)["cancelled"] + 1

        wait_until(cancelled, timeout=10, what=f"the HTTP/{version} request counted cancelled")
        after = Scrape(server)
        assert outcomes(after)["success"] == outcomes(before)["success"]
        rows = "batchpilot_batch_rows_total"
        assert after.value(rows) == before.value(rows)


def test_a_body_pipelined_behind_a_long_answer_is_not_held_to_the_rate(
    mlp_model: Path, tmp_path: Path
) -> None:
    """The server reads nothing of a request pipelined behind one it still answers (7 s
    here): the part of its body that came with its headers is not a body trickling at 20 bytes
    a second, and the rest, sent at once, is read when its turn comes."""
    with (
        runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=7000,beta_ms=0",
            "--deadline-ms",
            "0",
            "--admission",
            "queue",  # no start-up timing of batches this slow
            log_dir=tmp_path,
        ) as server,
        connect(server) as sock,
    ):
        # The second: a body that is no JSON, answered 400 as soon as it is all read.
        bad = b"x" * len(BODY)
        sock.sendall(post_head(len(BODY)) + BODY)
        time.sleep(0.3)  # the next request while the first is answered: its head, a few bytes
        sock.sendall(post_head(len(bad)) + bad[:20])
        time.sleep(0.3)  # the rest of its body, a moment later
        sock.sendall(bad[20:])
        data = b""
        deadline = time.monotonic() + 15
        while data.count(b"HTTP/1.1 ") < 2 and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
    statuses = [status for status, _ in Received(data, "open").answers]
    assert statuses == [200, 400], data[:400]


def test_requests_beyond_the_connection_limit_get_503_and_a_closed_connection(
    mlp_model: Path, tmp_path: Path
) -> None:
    with runtime_process(
        mlp_model, "--engine", "simulated", "--max-connections", "3", log_dir=tmp_path
    ) as server:
        idle = [connect(server) for _ in range(3)]
        try:
            with connect(server) as sock:
                sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
                received = receive_all(sock, timeout_s=5)
            assert received.ended == "eof"
            [(status, headers)] = received.answers
            assert status == 503
            assert headers["retry-after"] == "1"
            assert headers["connection"] == "close"
            # The kubelet's probes are answered whatever the count: a flood of connections
            # must not fail liveness (a restart) or readiness (every endpoint gone at once).
            for probe in (GET_LIVE, b"GET /v2/health/ready?verbose=1 HTTP/1.1\r\nHost: x\r\n"):
                with connect(server) as sock:
                    sock.sendall(probe + b"\r\n")
                    sock.shutdown(socket.SHUT_WR)
                    received = receive_all(sock, timeout_s=5)
                assert [status for status, _ in received.answers] == [200]
        finally:
            for sock in idle:
                sock.close()
        # The idle ones gone, requests are served again (once the server has seen them go).
        wait_until(
            lambda: send(server, "GET", "/v2/health/live").status == 200,
            timeout=10,
            what="a request served under the limit",
        )


def test_the_connection_limit_holds_the_inference_port_alone(
    mlp_model: Path, tmp_path: Path
) -> None:
    """Prometheus's scrape (the metrics port) and the operator's calls (the admin port) are
    answered while the model's callers hold every connection the cap allows, and connections
    on those ports leave the callers' share whole."""
    metrics_port = free_port()
    with runtime_process(
        mlp_model,
        "--engine", "simulated",
        "--max-connections", "4",
        "--metrics-port", str(metrics_port),
        log_dir=tmp_path,
    ) as server:  # fmt: skip

        def open_connections() -> float:
            """All ports' (the scrape's own included)."""
            reply = send(server, "GET", "/metrics", port=metrics_port)
            assert reply.status == 200, reply
            return sum(
                sample.value
                for family in text_string_to_metric_families(reply.body.decode())
                for sample in family.samples
                if sample.name == "batchpilot_open_connections"
            )

        ports = (server.admin_port, metrics_port, metrics_port)
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for port in ports]
        held += [connect(server) for _ in range(3)]
        try:
            wait_until(
                lambda: open_connections() == 3 + 3 + 1,
                timeout=10,
                what="the server to see the connections held",
            )
            # A fourth caller: within the cap, whatever the other ports hold.
            assert send(server, "GET", "/v2").status == 200
            held += [connect(server) for _ in range(2)]  # five callers: past the cap
            wait_until(
                lambda: open_connections() == 3 + 5 + 1,
                timeout=10,
                what="the server to see the callers past the cap",
            )
            assert send(server, "GET", "/v2").status == 503
            assert send(server, "GET", "/metrics", port=metrics_port).status == 200
            assert send(server, "GET", "/admin/metrics", port=server.admin_port).status == 200
        finally:
            for sock in held:
                sock.close()


def test_a_client_that_never_reads_its_answers_is_cut_off(tmp_path: Path) -> None:
    """Pipelined requests whose answers the client never reads: the server writes until the
    socket's buffers fill, and then reads no more requests (it answers them in order) — no read
    timer runs. Without a write timeout the connection, and the request being answered, stayed
    in flight for as long as the client kept it open."""
    wide = mlp(tmp_path / "wide.onnx", features=1, hidden=4, classes=4096)
    rows = 200  # answers of ~8 MB each: past the kernel's socket buffers (4 MB at most)
    body = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 1], "data": [1.0] * rows}]}
    )
    with runtime_process(
        wide,
        "--engine", "simulated", "--simulated-latency", "alpha_ms=1,beta_ms=0",
        "--max-batch-size", "256",
        "--write-timeout-s", "1",
        log_dir=tmp_path,
    ) as server:  # fmt: skip
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
        sock.settimeout(10)
        sock.connect(("127.0.0.1", server.port))
        with sock:
            sock.sendall((post_head(len(body), "/v2/models/wide/infer") + body) * 3)
            wait_until(
                lambda: "it read nothing of an answer for 1 s" in server.log(),
                timeout=20,
                what="the connection that reads nothing to be closed",
            )
            scrape = Scrape(server)
            assert scrape.value("batchpilot_inflight_requests") == 0
            assert scrape.value("batchpilot_open_connections") == 1  # the scrape's own
            # What the kernel held when the server gave up still arrives, and then the end.
            received = receive_all(sock, timeout_s=10)
        assert received.ended in ("eof", "reset")
        assert len(received.answers) < 3  # the later answers were never written
        assert send(server, "GET", "/v2/health/ready").status == 200
