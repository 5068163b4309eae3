"""Async results with API keys, against a real runtime process: a job belongs to the key id that
submitted it. Another allowed key gets 404 for it — the same answer as for an id never
submitted, so a leaked job id neither reads a result nor confirms that the job exists — and
cannot cancel or delete it; no key is 401 and a key not allowed 403, as for every call; a
rotated key (same id, new value) keeps its jobs; without API keys nothing changes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_process import Reply, RuntimeProcess, metric, runtime_process, send
from tests.test_access_process import FAST_POLL, key_args, publish, write_document
from tests.test_async_inference import json_body, logits, rows
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ALICE = "alice-0123456789abcdef0123"
BOB = "bob-0123456789abcdef012345"
CAROL = "carol-0123456789abcdef0123"
KEYS = {"alice": ALICE, "bob": BOB, "carol": CAROL}
ACCESS = {"allowedKeyIds": ["alice", "bob"]}  # carol is known, not allowed on this model

SUBMIT = "/v2/models/mlp/infer/async"

PENDING_FOR_SECONDS = (
    # A batch takes 3 s, within the 10 s deadline: what another key does to a job meanwhile is
    # seen while the job is still pending (queue admission: no start-up timing of 3 s batches).
    "--engine", "simulated",
    "--simulated-latency", "alpha_ms=3000,beta_ms=0",
    "--admission", "queue",
    "--deadline-ms", "10000",
)  # fmt: skip


def as_key(key: str | None) -> dict[str, str]:
    return {} if key is None else {"x-api-key": key}


def submit(server: RuntimeProcess, key: str | None, seed: int = 0) -> Reply:
    return send(server, "POST", SUBMIT, json_body(rows(1, seed)), as_key(key))


def fetch(server: RuntimeProcess, job_id: str, key: str | None, *, wait_s: float = 0) -> Reply:
    return send(server, "GET", f"{SUBMIT}/{job_id}?wait_s={wait_s:g}", headers=as_key(key))


def delete(server: RuntimeProcess, job_id: str, key: str | None) -> Reply:
    return send(server, "DELETE", f"{SUBMIT}/{job_id}", headers=as_key(key))


def anonymised(reply: Reply, job_id: str) -> tuple[int, str, str]:
    """What a 404 says, with the id asked for taken out: equal for every id that is not yours."""
    return reply.status, reply.headers["content-type"], reply.json()["error"].replace(job_id, "ID")


@pytest.fixture(scope="module")
def keyed(mlp_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    where = tmp_path_factory.mktemp("async-keyed")
    publish(where / "keys", KEYS)
    write_document(where / "access.json", ACCESS)
    args = (*key_args(where / "keys", where / "access.json"), *PENDING_FOR_SECONDS)
    with runtime_process(mlp_model, *args, log_dir=where) as server:
        yield server


class TestAJobIsItsKeys:
    def test_another_key_gets_the_answer_of_an_id_never_submitted(
        self, keyed: RuntimeProcess
    ) -> None:
        accepted = submit(keyed, ALICE)
        assert accepted.status == 202, accepted.body
        job_id = accepted.json()["id"]
        never = uuid.uuid4().hex  # the shape of a real id
        for key in (ALICE, BOB):
            unknown = fetch(keyed, never, key)
            assert unknown.status == 404
            # bob's view of alice's job, pending now and done later, is that of any unknown id
            assert anonymised(fetch(keyed, job_id, BOB), job_id) == anonymised(unknown, never)
        assert "only with the key that submitted it" in unknown.json()["error"]
        # a long poll with the wrong key does not wait for someone else's job: 404 at once,
        # while the job is still pending for its owner
        assert fetch(keyed, job_id, BOB, wait_s=10).status == 404
        assert fetch(keyed, job_id, ALICE).status == 202
        # nor can another key cancel it
        assert anonymised(delete(keyed, job_id, BOB), job_id) == anonymised(
            delete(keyed, never, BOB), never
        )
        assert metric(keyed, "batchpilot_async_jobs", state="pending") == 1
        # the owner's result is whole
        result = fetch(keyed, job_id, ALICE, wait_s=10)
        assert result.status == 200, result.body
        sync = send(keyed, "POST", "/v2/models/mlp/infer", json_body(rows(1, 0)), as_key(ALICE))
        assert logits(result).shape == logits(sync).shape == (1, 16)
        assert anonymised(fetch(keyed, job_id, BOB), job_id) == anonymised(
            fetch(keyed, never, BOB), never
        )
        # and only the owner deletes it
        assert delete(keyed, job_id, BOB).status == 404
        assert fetch(keyed, job_id, ALICE).status == 200
        deleted = delete(keyed, job_id, ALICE)
        assert (deleted.status, deleted.json()["status"]) == (200, "deleted")
        assert fetch(keyed, job_id, ALICE).status == 404

    def test_no_key_and_a_key_not_allowed_are_refused_as_before(
        self, keyed: RuntimeProcess
    ) -> None:
        job_id = submit(keyed, ALICE).json()["id"]
        no_key = fetch(keyed, job_id, None)
        assert no_key.status == 401
        assert no_key.headers["www-authenticate"] == 'Bearer realm="batchpilot"'
        assert fetch(keyed, job_id, "not-a-key-0123456789").status == 401
        assert fetch(keyed, job_id, CAROL).status == 403
        assert delete(keyed, job_id, None).status == 401
        assert delete(keyed, job_id, CAROL).status == 403
        assert submit(keyed, None).status == 401
        assert submit(keyed, CAROL).status == 403
        assert delete(keyed, job_id, ALICE).json()["status"] == "cancelled"

    def test_each_key_reads_its_own_jobs(self, keyed: RuntimeProcess) -> None:
        mine = submit(keyed, ALICE, seed=1).json()["id"]
        theirs = submit(keyed, BOB, seed=2).json()["id"]
        alice, bob = fetch(keyed, mine, ALICE, wait_s=10), fetch(keyed, theirs, BOB, wait_s=10)
        assert (alice.status, bob.status) == (200, 200)
        assert (fetch(keyed, theirs, ALICE).status, fetch(keyed, mine, BOB).status) == (404, 404)


def test_a_rotated_key_keeps_its_jobs(mlp_model: Path, tmp_path: Path) -> None:
    """Jobs belong to the key id, not to the key's value: after the Secret gives alice a new key,
    her results are read with the new key (and no longer with the retired one)."""
    rotated = "alice-new-0123456789abcdef"
    publish(tmp_path / "keys", {"alice": ALICE, "bob": BOB})
    args = key_args(tmp_path / "keys")
    with runtime_process(mlp_model, *args, log_dir=tmp_path, env=FAST_POLL) as server:
        job_id = submit(server, ALICE).json()["id"]
        assert fetch(server, job_id, ALICE, wait_s=10).status == 200
        publish(tmp_path / "keys", {"alice": rotated, "bob": BOB})
        wait_until(
            lambda: fetch(server, job_id, ALICE).status == 401, what="the retired key refused"
        )
        assert fetch(server, job_id, rotated).status == 200
        assert fetch(server, job_id, BOB).status == 404


def test_a_key_that_floods_the_store_leaves_the_other_key_its_share(
    mlp_model: Path, tmp_path: Path
) -> None:
    """Four places and two allowed keys (carol is not): two each. Alice's third submit is 429
    while bob's two still go through; a result alice deletes gives her a place back."""
    publish(tmp_path / "keys", KEYS)
    write_document(tmp_path / "access.json", ACCESS)
    args = (
        *key_args(tmp_path / "keys", tmp_path / "access.json"),
        "--async-capacity", "4",
        "--async-drain-hold-s", "0",  # results left unfetched at the end: no hold
    )  # fmt: skip
    with runtime_process(mlp_model, *args, log_dir=tmp_path) as server:
        mine = [submit(server, ALICE, seed) for seed in range(2)]
        assert [reply.status for reply in mine] == [202, 202]
        refused = submit(server, ALICE)
        assert refused.status == 429
        assert (
            "'alice' holds 2 of the async job store's 4 places, its share (2 keys"
            in (refused.json()["error"])
        )
        assert int(refused.headers["retry-after"]) >= 1
        assert [submit(server, BOB, seed).status for seed in range(2)] == [202, 202]
        assert submit(server, BOB).status == 429
        job_id = mine[0].json()["id"]
        assert fetch(server, job_id, ALICE, wait_s=10).status == 200
        assert delete(server, job_id, ALICE).status == 200
        assert submit(server, ALICE).status == 202


def test_without_api_keys_any_caller_reads_any_job(mlp_model: Path, tmp_path: Path) -> None:
    with runtime_process(mlp_model, "--device", "cpu", log_dir=tmp_path) as server:
        job_id = submit(server, ALICE).json()["id"]  # a key header means nothing here
        assert fetch(server, job_id, None, wait_s=10).status == 200
        assert fetch(server, job_id, BOB).status == 200
        assert delete(server, job_id, None).json()["status"] == "deleted"
