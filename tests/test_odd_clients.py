"""Clients the other HTTP tests do not play, on a raw socket against a real server process: ones
that pipeline (write requests back to back before reading), send bodies chunked, cut short, or
behind `Expect: 100-continue` or an `Upgrade` the server does not take, or in a transfer-coding
it does not decode, send HTTP the parser refuses, ask with HEAD, or ask for rows that hold no
data.

What each must get: its answers in the order of its requests, none lost; a refusal as a JSON
`{"error": ...}` with a reason, as the connection's last answer, after the answers ahead of it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import resource
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.runtime_process import RuntimeProcess, Scrape, outcomes, runtime_process, send
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MAX_HEADER_BYTES = 4096
INFER = "/v2/models/variable_length/infer"


def infer_body(rows: int = 2) -> bytes:
    tokens = {"name": "tokens", "datatype": "FP32", "shape": [rows, 3], "data": [1.0] * 3 * rows}
    return orjson.dumps({"inputs": [tokens]})


BODY = infer_body()


@pytest.fixture(scope="module")
def server(
    variable_length_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    """Batches of 100 ms: a request is still being answered when the next one is read."""
    with runtime_process(
        variable_length_model,
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=100,beta_ms=0",
        "--max-header-bytes",
        str(MAX_HEADER_BYTES),
        log_dir=tmp_path_factory.mktemp("odd-clients"),
    ) as running:
        yield running
    assert "Traceback" not in running.log(), running.log()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def post(
    body: bytes = BODY, *, headers: bytes = b"", path: str = INFER, length: int | None = None
) -> bytes:
    """A POST; `length`: the Content-Length to declare (None: the body's; -1: none)."""
    length = len(body) if length is None else length
    declared = b"" if length < 0 else b"Content-Length: %d\r\n" % length
    return b"POST %s HTTP/1.1\r\nHost: x\r\n%s%s\r\n%s" % (path.encode(), headers, declared, body)


def get(path: str, method: bytes = b"GET") -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: x\r\n\r\n" % (method, path.encode())


def chunked(body: bytes, *, sizes: tuple[bytes, ...] = (), trailer: bytes = b"") -> bytes:
    """`body` in two chunks (their sizes as given, else the right ones), then the last chunk."""
    half = len(body) // 2
    parts = (body[:half], body[half:])
    sizes = sizes or tuple(b"%x" % len(part) for part in parts)
    chunks = b"".join(
        b"%s\r\n%s\r\n" % (size, part) for size, part in zip(sizes, parts, strict=True)
    )
    return chunks + b"0\r\n" + trailer + b"\r\n"


CHUNKED = b"Transfer-Encoding: chunked\r\n"


def exchange(
    server: RuntimeProcess,
    *writes: bytes,
    half_close: bool = False,
    timeout_s: float = 5,
    heads: int = 0,
) -> tuple[list[Answer], str]:
    """Write `writes` on one connection (10 ms apart), then read until the server closes it or
    `timeout_s` passes. Returns the final answers (interim 1xx ones left out; the first `heads`
    answer HEAD requests: no body) and how the connection ended: "eof", "reset" or "open"."""
    data, ended = b"", "open"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        for i, chunk in enumerate(writes):
            if i:
                time.sleep(0.01)
            sock.sendall(chunk)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                received = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                ended = "reset"
                break
            if not received:
                ended = "eof"
                break
            data += received
    return parse_answers(data, heads=heads), ended


def parse_answers(data: bytes, *, heads: int = 0) -> list[Answer]:
    answers: list[Answer] = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        if status < 200:
            continue
        length = 0 if len(answers) < heads else int(headers.get("content-length", "0"))
        answers.append(Answer(status, headers, data[:length]))
        data = data[length:]
    return answers


def assert_served(answer: Answer, rows: int = 2) -> None:
    assert answer.status == 200, answer
    assert answer.json()["outputs"][0]["shape"] == [rows, 1]


def assert_refused(answer: Answer, status: int, reason: str) -> None:
    """A refusal: `status`, a JSON reason that says `reason`, and the connection's last answer."""
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    assert reason in answer.json()["error"], answer
    assert answer.headers["connection"] == "close"


NOT_HTTP = [
    pytest.param(b"GARBAGE\r\n\r\n", "Invalid method", id="not-a-request-line"),
    pytest.param(
        post(headers=b"Content-Length: -1\r\n", length=-1),
        "Invalid character in Content-Length",
        id="negative-content-length",
    ),
    pytest.param(
        post(headers=b"Content-Length: 3\r\n"), "Duplicate Content-Length", id="two-lengths"
    ),
    pytest.param(
        post(chunked(BODY), headers=CHUNKED),
        "Content-Length can't be present with Transfer-Encoding",
        id="chunked-and-a-length",
    ),
    pytest.param(
        post(chunked(BODY, sizes=(b"zz", b"1")), headers=CHUNKED, length=-1),
        "Invalid character in chunk size",
        id="bad-chunk-size",
    ),
    pytest.param(
        post(chunked(BODY, sizes=(b"f" * 20, b"1")), headers=CHUNKED, length=-1),
        "Chunk size overflow",
        id="chunk-size-overflow",
    ),
    pytest.param(
        get("http://a:99999/v2/health/live"), "invalid url", id="url-uvicorn-cannot-parse"
    ),
    pytest.param(
        b"GET /v2/health/live HTTP/1.1\r\n\r\n",
        "it must name its Host once (RFC 9112 §3.2), this one names 0",
        id="no-host",
    ),
    pytest.param(
        b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "it must name its Host once (RFC 9112 §3.2), this one names 2",
        id="two-hosts",
    ),
]


class TestRequestsThatAreNotHttp:
    @pytest.mark.parametrize(("request_", "reason"), NOT_HTTP)
    def test_get_400_in_json_with_the_parsers_reason(
        self, server: RuntimeProcess, request_: bytes, reason: str
    ) -> None:
        answers, ended = exchange(server, request_)
        assert len(answers) == 1, answers
        assert_refused(answers[0], 400, f"the request is not valid HTTP/1.1: {reason}")
        assert ended == "eof"

    def test_a_body_refused_for_its_framing_counts_as_invalid_not_cancelled(
        self, server: RuntimeProcess
    ) -> None:
        # the app, waiting for the body, sees only the connection close: before, it counted a
        # request its client had withdrawn, which the autopilot reads as load
        before = outcomes(Scrape(server))
        answers, _ = exchange(
            server, post(chunked(BODY, sizes=(b"zz", b"1")), headers=CHUNKED, length=-1)
        )
        assert [answer.status for answer in answers] == [400]
        wait_until(
            lambda: outcomes(Scrape(server))["invalid"] == before["invalid"] + 1,
            timeout=10,
            what="the refused request to be counted",
        )
        assert outcomes(Scrape(server))["cancelled"] == before["cancelled"]

    @pytest.mark.parametrize(("request_", "reason"), NOT_HTTP)
    def test_behind_a_pipelined_request_wait_for_its_answer(
        self, server: RuntimeProcess, request_: bytes, reason: str
    ) -> None:
        """Once written first, read as the answer to the good request, whose own was lost."""
        answers, ended = exchange(server, post() + request_)
        assert len(answers) == 2, answers
        assert_served(answers[0])
        assert_refused(answers[1], 400, reason)
        assert ended == "eof"

    def test_headers_over_the_limit_behind_pipelined_requests_wait_for_their_answers(
        self, server: RuntimeProcess
    ) -> None:
        too_large = b"GET /v2/health/live HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEADER_BYTES
        answers, ended = exchange(server, post() + post() + too_large + b"\r\n\r\n")
        assert [a.status for a in answers] == [200, 200, 431], answers
        assert_refused(answers[2], 431, "headers are over the limit")
        assert ended == "eof"


class TestPipelining:
    def test_answers_come_in_the_order_of_the_requests(self, server: RuntimeProcess) -> None:
        answers, ended = exchange(
            server, post() + get("/v2/health/live") + post(infer_body(3)), timeout_s=1
        )
        assert [a.status for a in answers] == [200, 200, 200], answers
        assert_served(answers[0])
        assert answers[1].json() == {"live": True}
        assert_served(answers[2], rows=3)
        assert ended == "open"

    @pytest.mark.parametrize(
        ("version", "connection"),
        [("1.1", "CLOSE"), ("1.1", "keep-alive, Close"), ("1.0", None), ("1.0", "Keep-Alive")],
    )
    def test_a_request_that_asks_to_close_is_the_last_answered(
        self, server: RuntimeProcess, version: str, connection: str | None
    ) -> None:
        """HTTP/1.0 closes whatever it asks: the server does not keep 1.0 connections alive."""
        header = b"" if connection is None else b"Connection: %s\r\n" % connection.encode()
        first = post(headers=header).replace(b"HTTP/1.1", f"HTTP/{version}".encode(), 1)
        answers, ended = exchange(server, first + post(infer_body(3)))
        assert len(answers) == 1, answers
        assert_served(answers[0])
        assert answers[0].headers["connection"] == "close"
        assert ended == "eof"

    def test_http_1_0_needs_no_host(self, server: RuntimeProcess) -> None:
        """Only HTTP/1.1 must name its Host: an old health checker's 1.0 request is served."""
        answers, _ = exchange(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        assert [a.status for a in answers] == [200], answers


class TestBodies:
    @pytest.mark.parametrize(
        "request_",
        [
            pytest.param(post(chunked(BODY), headers=CHUNKED, length=-1), id="chunked"),
            pytest.param(
                post(chunked(BODY, trailer=b"X-Checksum: 1\r\n"), headers=CHUNKED, length=-1),
                id="chunked-with-a-trailer",
            ),
            pytest.param(
                post(gzip.compress(BODY), headers=b"Content-Encoding: gzip\r\n"), id="gzip"
            ),
        ],
    )
    def test_are_served(self, server: RuntimeProcess, request_: bytes) -> None:
        answers, _ = exchange(server, request_, timeout_s=1)
        assert len(answers) == 1, answers
        assert_served(answers[0])

    def test_expect_100_continue_gets_it_then_the_answer(self, server: RuntimeProcess) -> None:
        head = post(b"", headers=b"Expect: 100-continue\r\n", length=len(BODY))
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(head)
            assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(BODY)
            data = b""
            while len(answers := parse_answers(data)) < 1 or len(answers[0].body) < int(
                answers[0].headers["content-length"]
            ):
                data += sock.recv(65536)
        assert_served(answers[0])

    def test_cut_short_by_a_half_close_gets_400_after_the_answers_ahead(
        self, server: RuntimeProcess
    ) -> None:
        """The client said all it will say: the body its Content-Length declares never comes."""
        short = post(length=len(BODY) + 10)
        answers, ended = exchange(server, short, half_close=True)
        assert len(answers) == 1, answers
        assert_refused(answers[0], 400, "the client stopped sending within its body")
        assert ended == "eof"
        answers, ended = exchange(server, post() + short, half_close=True)
        assert [a.status for a in answers] == [200, 400], answers
        assert_served(answers[0])
        assert ended == "eof"


class TestTransferCodings:
    @pytest.mark.parametrize("coding", ["gzip, chunked", "gzip"])
    def test_other_than_chunked_get_501_naming_the_coding(
        self, server: RuntimeProcess, coding: str
    ) -> None:
        """No transfer-coding but chunked is decoded: read as it is, a gzip'd body was refused
        as "not valid JSON" (compression goes in Content-Encoding)."""
        header = b"Transfer-Encoding: %s\r\n" % coding.encode()
        request_ = post(chunked(gzip.compress(BODY)), headers=header, length=-1)
        answers, ended = exchange(server, request_)
        assert len(answers) == 1, answers
        assert_refused(answers[0], 501, f"Transfer-Encoding '{coding}' is not supported")
        assert ended == "eof"


class TestUpgradeIsIgnored:
    """`curl --http2` on http:// asks to switch to h2c; the server stays on HTTP/1.1 and must read
    the request whole (its body was dropped: 400 "not valid JSON: empty document")."""

    H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAA\r\n"

    @pytest.mark.parametrize(
        "request_",
        [
            pytest.param(post(headers=H2C), id="h2c"),
            pytest.param(post(chunked(BODY), headers=H2C + CHUNKED, length=-1), id="h2c-chunked"),
            pytest.param(
                post(headers=b"Connection: Upgrade\r\nUpgrade: websocket\r\n"), id="websocket"
            ),
        ],
    )
    def test_a_body_is_read_as_the_requests(self, server: RuntimeProcess, request_: bytes) -> None:
        answers, ended = exchange(server, request_ + get("/v2/health/live"), timeout_s=1)
        assert [a.status for a in answers] == [200, 200], answers
        assert_served(answers[0])
        assert answers[1].json() == {"live": True}
        assert ended == "open"


class TestMethods:
    @pytest.mark.parametrize(
        "path", ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/variable_length"]
    )
    def test_head_is_answered_as_get_without_a_body(
        self, server: RuntimeProcess, path: str
    ) -> None:
        answers, ended = exchange(server, get(path, b"HEAD") + get(path), timeout_s=1, heads=1)
        assert [a.status for a in answers] == [200, 200], answers
        assert answers[0].body == b""
        assert answers[0].headers["content-length"] == str(len(answers[1].body))
        assert ended == "open"

    @pytest.mark.parametrize(
        ("method", "path", "status", "reason"),
        [
            ("GET", "/v2/nothing", 404, "GET /v2/nothing: Not Found"),
            ("OPTIONS", INFER, 405, f"OPTIONS {INFER}: Method Not Allowed"),
            ("DELETE", "/v2/health/live", 405, "DELETE /v2/health/live: Method Not Allowed"),
        ],
    )
    def test_no_such_route_is_an_error_like_every_other(
        self, server: RuntimeProcess, method: str, path: str, status: int, reason: str
    ) -> None:
        reply = send(server, method, path)
        assert reply.status == status
        assert reply.json() == {"error": reason}
        if status == 405:
            assert reply.headers["allow"]


class TestRowsThatHoldNothing:
    def test_are_refused_rather_than_answered_in_full(self, server: RuntimeProcess) -> None:
        """A 100-byte request of 10**8 empty rows was answered with 10**8 output rows (400 MB)."""
        doc = {"inputs": [{"name": "tokens", "datatype": "FP32", "shape": [10**8, 0], "data": []}]}
        reply = send(server, "POST", INFER, orjson.dumps(doc))
        assert reply.status == 400
        assert reply.json()["error"] == (
            "input 'tokens' has shape [100000000, 0]: its rows hold no elements (a dimension "
            "other than the batch is 0)"
        )


IDLE_CONNECTIONS = 2000


def test_connections_past_a_low_soft_open_files_limit_get_503_not_a_reset(
    variable_length_model: Path, tmp_path: Path
) -> None:
    """A container's soft limit is often 1024 under a far higher hard one: the server raises its
    own, or its accepts fail past it and clients are reset instead of answered 503."""
    original = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = original[1]
    # Beside what this process holds open already (the tests before it in the same run).
    room = len(os.listdir("/proc/self/fd")) + 2 * IDLE_CONNECTIONS + 256
    if hard != resource.RLIM_INFINITY and hard < room:
        pytest.skip(f"the hard limit on open files, {hard}, is under the {room} the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what the server starts with
    try:
        with (
            runtime_process(
                variable_length_model,
                "--engine",
                "simulated",
                "--max-connections",
                str(IDLE_CONNECTIONS - 500),
                log_dir=tmp_path,
            ) as server,
            contextlib.ExitStack() as idle,
        ):
            resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
            for _ in range(IDLE_CONNECTIONS):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                idle.enter_context(sock)
            # (a health check would be answered past the cap: ask for the server's metadata)
            answers, ended = exchange(server, get("/v2"))
            assert [a.status for a in answers] == [503], (answers, ended)
            assert answers[0].headers["retry-after"] == "1"
            idle.close()
            assert send(server, "GET", "/v2/health/live").status == 200
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, original)
