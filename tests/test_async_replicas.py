"""Async results behind a Service: any replica answers for any replica's job.

The ids and their signatures (`job_routes`) are checked alone; the relay (`job_relay`) against
small servers of this test that answer, refuse, or never answer; then real runtime processes,
two replicas of one service (the same admin token, each advertising its own address) and one of
another service: a job submitted to one is fetched, long-polled and deleted through the other,
with API keys the holder still decides who reads it, and a job of a replica that stopped is the
unknown id's 404. A replica told to stop holds its ports open until its results are fetched, up
to its hold.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import signal
import socket
import string
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from batchpilot.runtime.app import create_app
from batchpilot.runtime.job_relay import (
    FORWARDED_HEADER,
    RELAYED_FOR_HEADER,
    Gone,
    JobRelay,
    NotAnswering,
)
from batchpilot.runtime.job_routes import PENDING_CAP_S, RELAY_CREDENTIAL_S, JobRoutes, lifetime
from batchpilot.runtime.settings import RuntimeSettings
from tests.runtime_process import RuntimeProcess, metric, runtime_process, send
from tests.test_access_process import key_args, publish, write_document
from tests.test_async_inference import json_body, logits, rows, simulated_server
from tests.waiting import wait_until

# --- ids ----------------------------------------------------------------------------------------

ONE = JobRoutes.from_token("service-token", host="10.1.0.1", port=8080)
TWO = JobRoutes.from_token("service-token", host="10.1.0.2", port=8080)
STRANGER = JobRoutes.from_token("another-service", host="10.9.0.9", port=8080)


class TestIds:
    def test_a_replica_finds_the_holder_of_its_peers_jobs(self) -> None:
        job_id = ONE.new_id()
        assert TWO.elsewhere(job_id) == "10.1.0.1:8080"
        assert ONE.elsewhere(job_id) is None  # its own: looked up at home

    def test_ids_are_fresh_and_fit_a_url_path(self) -> None:
        ids = {ONE.new_id() for _ in range(100)}
        assert len(ids) == 100
        url_safe = set(string.ascii_letters + string.digits + "-_.")
        assert all(set(i) <= url_safe for i in ids)

    def test_another_services_ids_and_forged_ones_name_no_one(self) -> None:
        assert TWO.elsewhere(STRANGER.new_id()) is None
        random_part, _, signature = ONE.new_id().split(".")
        forged = base64.urlsafe_b64encode(b"169.254.169.254:80").rstrip(b"=").decode()
        assert TWO.elsewhere(f"{random_part}.{forged}.{signature}") is None
        for odd in ("", "plain-uuid-hex", "a.b.c", "é.é.é", "a.b.c.d.e", "x" * 300, "..", "a.!!.b"):
            assert TWO.elsewhere(odd) is None, odd

    def test_an_ipv6_pod_address_is_bracketed(self) -> None:
        six = JobRoutes.from_token("service-token", host="fd00::7", port=8080)
        assert six.address == "[fd00::7]:8080"
        assert ONE.elsewhere(six.new_id()) == "[fd00::7]:8080"

    def test_an_id_lapses_when_no_replica_can_hold_its_job_any_more(self) -> None:
        """A holder deleted with its pod takes no connection (no reset from an address that
        is gone): its clients were answered 504 "retry" for ever. An id says until when its job
        can be held; past that, a holder that does not answer has lost it (404)."""
        now = [1_000_000.0]
        life = lifetime(result_ttl_s=300, drain_hold_s=30)
        assert life == PENDING_CAP_S + 330
        one = dataclasses.replace(ONE, lifetime_s=life, clock=lambda: now[0])
        two = dataclasses.replace(TWO, lifetime_s=life, clock=lambda: now[0])
        job_id = one.new_id()
        assert two.elsewhere(job_id) == "10.1.0.1:8080"
        assert not two.lapsed(job_id)
        now[0] += life + 1
        assert two.lapsed(job_id)
        assert two.elsewhere(job_id) == "10.1.0.1:8080"  # asked still, where it answers
        # Its lapse is signed: a caller cannot make an id lapse, nor keep one from it.
        random_part, address_part, lapses, signed_relay, signature = job_id.split(".")
        later = f"{random_part}.{address_part}.{int(lapses) + 10**6}.{signed_relay}.{signature}"
        assert two.elsewhere(later) is None
        assert not two.lapsed(later)
        assert not two.lapsed(ONE.new_id())  # an id made before lapses were written

    def test_a_relay_credential_names_the_caller_for_one_request_of_one_job(self) -> None:
        now = [1_000_000.0]
        one = dataclasses.replace(ONE, lifetime_s=600, clock=lambda: now[0])
        two = dataclasses.replace(TWO, lifetime_s=600, clock=lambda: now[0])
        job_id = one.new_id()
        assert two.signed_relay(job_id)
        assert not two.signed_relay(ONE.new_id())  # an id of an older replica: keys travel
        credential = two.relay_credential("GET", job_id, "alice")
        assert "alice-0123" not in credential  # the key id, never the key
        assert one.relayed_for(credential, "GET", job_id) == "alice"
        assert one.relayed_for(credential, "DELETE", job_id) is None
        assert one.relayed_for(credential, "GET", one.new_id()) is None
        forged = credential.replace("alice", "bob", 1)
        assert one.relayed_for(forged, "GET", job_id) is None
        other_service = dataclasses.replace(ONE, key=b"another service's key")
        assert other_service.relayed_for(credential, "GET", job_id) is None
        assert one.relayed_for(two.relay_credential("GET", job_id, None), "GET", job_id) == ""
        now[0] += RELAY_CREDENTIAL_S + 1
        assert one.relayed_for(credential, "GET", job_id) is None

    def test_the_token_is_not_the_signing_key(self) -> None:
        assert ONE.key != b"service-token"
        assert b"service-token" not in ONE.new_id().encode()


# --- the relay ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def tiny_server(answer: bytes | None) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server on a loopback port that reads one request and sends `answer` (None: nothing,
    ever); yields its address and the requests it read."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        if answer is None:
            await asyncio.sleep(3600)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}", seen
    finally:
        server.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ninference-header-content-length: 2"
    b"\r\nset-cookie: no=1\r\nx-internal: secret\r\ncontent-length: 4\r\n\r\n{}ab"
)


class TestRelay:
    async def test_the_holders_answer_comes_back_with_the_callers_key_sent_once(self) -> None:
        relay = JobRelay(TWO)
        try:
            async with tiny_server(ANSWER) as (address, seen):
                answer = await relay.relay(
                    "GET",
                    address,
                    "/v2/models/m/infer/async/ID?wait_s=1",
                    [("x-api-key", "k"), ("cookie", "c"), ("Authorization", "Bearer t")],
                    job_id=ONE.new_id(),  # an id of an older replica: the caller's key travels
                    owner="alice",
                )
        finally:
            await relay.close()
        assert answer.status_code == 200
        assert answer.body == b"{}ab"
        assert answer.headers["inference-header-content-length"] == "2"
        assert "set-cookie" not in answer.headers
        assert "x-internal" not in answer.headers
        (request,) = seen
        head = request.decode().lower()
        assert head.startswith("get /v2/models/m/infer/async/id?wait_s=1 http/1.1")
        assert "x-api-key: k" in head
        assert "authorization: bearer t" in head
        assert "cookie" not in head
        assert f"{FORWARDED_HEADER}: 10.1.0.2:8080" in head

    async def test_a_reused_address_gets_no_key_and_its_answer_is_no_result(self) -> None:
        """An id of a holder that takes a signed relay: what listens at its address now (the
        pod's IP reused by another workload) receives a credential good for that job alone,
        not the caller's key, and its answer, unsigned, is a holder gone (404), not a result."""
        relay = JobRelay(dataclasses.replace(TWO, lifetime_s=600))
        job_id = dataclasses.replace(ONE, lifetime_s=600).new_id()
        try:
            async with tiny_server(ANSWER) as (address, seen):
                with pytest.raises(Gone):
                    await relay.relay(
                        "GET",
                        address,
                        f"/v2/models/m/infer/async/{job_id}",
                        [("x-api-key", "k"), ("Authorization", "Bearer t")],
                        job_id=job_id,
                        owner="alice",
                    )
        finally:
            await relay.close()
        (request,) = seen
        head = request.decode().lower()
        assert "x-api-key" not in head
        assert "authorization" not in head
        assert f"{RELAYED_FOR_HEADER}: alice." in head

    async def test_a_refused_connection_is_a_holder_gone(self) -> None:
        relay = JobRelay(TWO)
        try:
            with pytest.raises(Gone):
                await relay.relay(
                    "GET", f"127.0.0.1:{closed_port()}", "/x", [], job_id="x", owner=None
                )
        finally:
            await relay.close()

    async def test_a_holder_that_never_answers_is_given_up_in_time(self) -> None:
        relay = JobRelay(TWO, answer_timeout_s=0.2)
        try:
            async with tiny_server(None) as (address, _):
                with pytest.raises(NotAnswering):
                    await relay.relay("GET", address, "/x", [], job_id="x", owner=None, wait_s=0.1)
        finally:
            await relay.close()


# --- real replicas ------------------------------------------------------------------------------

SUBMIT = "/v2/models/mlp/infer/async"
ALICE = "alice-0123456789abcdef0123"
BOB = "bob-0123456789abcdef012345"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("tokens")
    (where / "service").write_text("one-service-admin-token\n")
    (where / "other").write_text("another-service-admin-token\n")
    return where / "service", where / "other"


def replica(model: Path, token: Path, log_dir: Path, *args: str) -> Iterator[RuntimeProcess]:
    return runtime_process(
        model,
        "--device", "cpu",
        "--admin-token-file", str(token),
        "--advertise-host", "127.0.0.1",
        *args,
        log_dir=log_dir,
    )  # fmt: skip


@pytest.mark.slow
class TestReplicas:
    def test_any_replica_fetches_and_deletes_another_replicas_job(
        self, mlp_model: Path, tmp_path: Path, tokens: tuple[Path, Path]
    ) -> None:
        service, other = tokens
        with (
            replica(mlp_model, service, tmp_path) as one,
            replica(mlp_model, service, tmp_path) as two,
            replica(mlp_model, other, tmp_path) as stranger,
        ):
            x = rows(3, seed=7)
            taken = send(one, "POST", SUBMIT, json_body(x))
            assert taken.status == 202, taken.body
            job_id = taken.json()["id"]
            assert taken.headers["location"] == f"{SUBMIT}/{job_id}"

            # The long poll travels too: the first answer through `two` is the result.
            through = send(two, "GET", f"{SUBMIT}/{job_id}?wait_s=10")
            at_home = send(one, "GET", f"{SUBMIT}/{job_id}")
            assert through.status == at_home.status == 200, through.body
            assert through.body == at_home.body
            assert through.headers["content-type"] == at_home.headers["content-type"]
            sync = send(one, "POST", "/v2/models/mlp/infer", json_body(x))
            np.testing.assert_allclose(logits(through), logits(sync), rtol=1e-5, atol=1e-6)

            # Another service's replica does not know it, and passes nothing on.
            unknown = send(stranger, "GET", f"{SUBMIT}/{job_id}")
            assert unknown.status == 404, unknown.body

            deleted = send(two, "DELETE", f"{SUBMIT}/{job_id}")
            assert (deleted.status, deleted.json()["status"]) == (200, "deleted"), deleted.body
            assert send(one, "GET", f"{SUBMIT}/{job_id}").status == 404
            assert send(two, "GET", f"{SUBMIT}/{job_id}").status == 404

            # A job of a replica that has stopped: the unknown id's 404, saying it may be so.
            orphan = send(one, "POST", SUBMIT, json_body(x)).json()["id"]
            assert send(one, "GET", f"{SUBMIT}/{orphan}?wait_s=10").status == 200
            assert one.terminate() == 0
            gone = send(two, "GET", f"{SUBMIT}/{orphan}")
            assert gone.status == 404, gone.body
            assert "the replica that took it has stopped" in gone.json()["error"]

    def test_the_holder_decides_who_reads_a_job(
        self, mlp_model: Path, tmp_path: Path, tokens: tuple[Path, Path]
    ) -> None:
        service, _ = tokens
        publish(tmp_path / "keys", {"alice": ALICE, "bob": BOB})
        write_document(tmp_path / "access.json", {"allowedKeyIds": ["alice", "bob"]})
        keys = key_args(tmp_path / "keys", tmp_path / "access.json")
        alice = {"x-api-key": ALICE}
        bob = {"Authorization": f"Bearer {BOB}"}
        with (
            replica(mlp_model, service, tmp_path, *keys) as one,
            replica(mlp_model, service, tmp_path, *keys) as two,
        ):
            job_id = send(one, "POST", SUBMIT, json_body(rows(1, seed=3)), alice).json()["id"]
            path = f"{SUBMIT}/{job_id}?wait_s=10"
            assert send(two, "GET", path, headers=alice).status == 200
            not_bobs = send(two, "GET", path, headers=bob)
            never = send(two, "GET", f"{SUBMIT}/{job_id}0", headers=bob)
            assert not_bobs.status == never.status == 404
            assert not_bobs.json()["error"].replace(job_id, "ID") == never.json()["error"].replace(
                f"{job_id}0", "ID"
            )
            # No key: refused where it arrives, nothing passed on.
            no_key = send(two, "GET", path)
            assert no_key.status == 401
            assert "www-authenticate" in no_key.headers
            assert send(two, "DELETE", f"{SUBMIT}/{job_id}", headers=bob).status == 404
            assert send(two, "DELETE", f"{SUBMIT}/{job_id}", headers=alice).status == 200


def finished(server: RuntimeProcess, count: int) -> bool:
    return metric(server, "batchpilot_async_jobs", state="succeeded") == count


@pytest.mark.slow
class TestDrain:
    def test_a_stopping_replica_holds_on_until_its_results_are_fetched(
        self, mlp_model: Path, tmp_path: Path, tokens: tuple[Path, Path]
    ) -> None:
        service, _ = tokens
        with (
            replica(mlp_model, service, tmp_path) as one,
            replica(mlp_model, service, tmp_path) as two,
        ):
            job_id = send(one, "POST", SUBMIT, json_body(rows(2, seed=5))).json()["id"]
            wait_until(lambda: finished(one, 1), timeout=10, what="the job done, not fetched")
            signalled = time.monotonic()
            one.process.send_signal(signal.SIGTERM)
            wait_until(
                lambda: "async results not fetched yet" in one.log(),
                timeout=10,
                what="the drain holding for the result",
            )
            assert send(one, "POST", SUBMIT, json_body(rows(1, seed=6))).status == 503
            # Out of the endpoints, the result still reaches its client through a peer.
            fetched = send(two, "GET", f"{SUBMIT}/{job_id}")
            assert fetched.status == 200, fetched.body
            assert one.process.wait(timeout=15) == 0
            # Gone once it was read, not at the end of the 20 s hold.
            assert time.monotonic() - signalled < 10, one.log()
            assert "never fetched" not in one.log()

    def test_results_nobody_fetches_are_held_for_the_hold_alone(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(
            mlp_model, "--device", "cpu", "--async-drain-hold-s", "1", log_dir=tmp_path
        ) as server:
            send(server, "POST", SUBMIT, json_body(rows(1, seed=8)))
            wait_until(lambda: finished(server, 1), timeout=10, what="the job done")
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=15) == 0
            assert "drain: 1 async results never fetched are dropped" in server.log()


def test_the_hold_must_fit_inside_the_grace(mlp_model: Path) -> None:
    with pytest.raises(ValidationError, match="must fit inside"):
        RuntimeSettings(model_path=mlp_model, drain_grace_s=5, async_drain_hold_s=6)
    assert RuntimeSettings(model_path=mlp_model).async_drain_hold_s == 20
    assert RuntimeSettings(model_path=mlp_model, drain_grace_s=5).async_drain_hold_s == 5


def blackhole() -> tuple[socket.socket, list[socket.socket], int]:
    """A loopback address that takes no connection and refuses none, as a deleted pod's address
    does (its SYNs dropped): a listener whose accept backlog is full."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    return listener, fillers, port


async def test_a_fetch_for_a_lapsed_job_whose_holder_takes_no_connection_is_a_404(
    tmp_path: Path,
) -> None:
    """Before its lapse the holder may come back (504, retry); after it, its job is gone (404)
    — where a holder deleted with its pod was answered 504 for ever."""
    now = [1_000_000.0]
    life = lifetime(result_ttl_s=300, drain_hold_s=30)
    here = dataclasses.replace(ONE, lifetime_s=life, clock=lambda: now[0])
    listener, fillers, port = blackhole()
    holder = dataclasses.replace(here, address=f"127.0.0.1:{port}")
    server = simulated_server(tmp_path)
    app = create_app(server, job_routes=here)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            job_id = holder.new_id()
            young = await client.get(f"/v2/models/mlp/infer/async/{job_id}")
            assert young.status_code == 504
            now[0] += life + 1
            old = await client.get(f"/v2/models/mlp/infer/async/{job_id}")
            assert old.status_code == 404
    finally:
        await server.close()
        listener.close()
        for filler in fillers:
            filler.close()
