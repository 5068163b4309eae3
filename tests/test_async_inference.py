"""Async inference: submit now, fetch later. The job store with a fake clock, then the real server.

The store's rules are checked with an injected clock, so expiry is exact: a result kept 300 s
is there at 299.9 s after it finished and gone at 300 s, whenever it was submitted. The HTTP
side runs `batchpilot runtime serve` as a real process, and compares async answers with what
the sync path answers for the same request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import itertools
import signal
import weakref
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from batchpilot.runtime.app import create_app
from batchpilot.runtime.async_jobs import Job, JobState, JobStore, OverShare, StoreFull
from batchpilot.runtime.errors import DeadlineExceeded, Overloaded, RefusedByModel
from batchpilot.runtime.server import ModelServer
from tests import onnx_models
from tests.runtime_process import Reply, RuntimeProcess, metric, runtime_process, send
from tests.test_infer_dispatch import model_server
from tests.waiting import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_store(*, capacity: int = 4, ttl_s: float = 300.0) -> tuple[JobStore[str], FakeClock]:
    clock = FakeClock()
    ids = (f"job-{n}" for n in itertools.count())
    return JobStore(capacity=capacity, ttl_s=ttl_s, clock=clock, new_id=lambda: next(ids)), clock


class TestStoreLifecycle:
    def test_a_submitted_job_is_pending_until_it_succeeds(self) -> None:
        store, _ = make_store()
        job = store.submit()
        assert store.get(job.id) is job
        assert job.state is JobState.PENDING
        assert not job.finished.is_set()
        assert store.succeed(job, "answer")
        assert store.get(job.id) is job
        assert (job.state, job.result) == (JobState.SUCCEEDED, "answer")
        assert job.finished.is_set()

    def test_a_failed_job_keeps_its_error(self) -> None:
        store, _ = make_store()
        job = store.submit()
        error = DeadlineExceeded("too slow")
        assert store.fail(job, error)
        assert (job.state, job.error) == (JobState.FAILED, error)

    def test_a_job_finishes_once(self) -> None:
        store, _ = make_store()
        job = store.submit()
        assert store.succeed(job, "first")
        assert not store.fail(job, DeadlineExceeded("late"))
        assert not store.succeed(job, "second")
        assert job.result == "first"

    def test_unknown_ids_are_none(self) -> None:
        store, _ = make_store()
        assert store.get("nope") is None
        assert store.discard("nope") is None

    def test_ids_are_unique_even_when_the_generator_repeats(self) -> None:
        ids = iter(["a", "a", "a", "b"])
        store: JobStore[str] = JobStore(capacity=4, ttl_s=1, new_id=lambda: next(ids))
        assert [store.submit().id, store.submit().id] == ["a", "b"]

    def test_counts_cover_every_state(self) -> None:
        store, _ = make_store()
        ok, bad, _pending = store.submit(), store.submit(), store.submit()
        store.succeed(ok, "x")
        store.fail(bad, DeadlineExceeded("late"))
        assert store.counts() == {"pending": 1, "succeeded": 1, "failed": 1}

    def test_settings_are_validated(self) -> None:
        with pytest.raises(ValueError, match="capacity"):
            JobStore(capacity=0, ttl_s=1)
        with pytest.raises(ValueError, match="TTL"):
            JobStore(capacity=1, ttl_s=0)


class TestExpiry:
    def test_a_result_expires_its_ttl_after_it_finished_not_after_submit(self) -> None:
        store, clock = make_store(ttl_s=300)
        job = store.submit()
        clock.now += 1000  # pending for 1000 s: pending jobs never expire
        assert store.get(job.id) is job
        store.succeed(job, "x")
        clock.now += 299.9
        assert store.get(job.id) is job
        clock.now += 0.1  # 300 s after it finished
        assert store.get(job.id) is None
        assert store.expired_total == 1
        assert store.counts() == {"pending": 0, "succeeded": 0, "failed": 0}

    def test_results_expire_in_the_order_they_finished(self) -> None:
        store, clock = make_store(ttl_s=10)
        a, b, c = store.submit(), store.submit(), store.submit()
        store.succeed(b, "b")  # t = 0
        clock.now += 4
        store.fail(a, DeadlineExceeded("late"))  # t = 4
        clock.now += 4
        store.succeed(c, "c")  # t = 8
        clock.now += 3  # t = 11: only b is past its 10 s
        assert store.expire() == 1
        assert [store.get(j.id) for j in (a, b, c)] == [a, None, c]
        clock.now += 5  # t = 16: a (finished at 4) goes too, c (8) stays
        assert [store.get(j.id) for j in (a, b, c)] == [None, None, c]
        assert store.expired_total == 2

    def test_a_discarded_result_is_not_counted_as_expired(self) -> None:
        store, clock = make_store(ttl_s=10)
        job = store.submit()
        store.succeed(job, "x")
        assert store.discard(job.id) is job
        clock.now += 20
        assert store.expire() == 0
        assert store.expired_total == 0

    def test_stale_entries_of_discarded_results_do_not_pile_up(self) -> None:
        store, _ = make_store(capacity=10, ttl_s=1e6)
        for _ in range(1000):
            job = store.submit()
            store.succeed(job, "x")
            store.discard(job.id)
        assert len(store) == 0
        assert len(store._finished) <= 64 + 1  # compacted as it goes


class TestCapacity:
    def test_a_full_store_refuses_at_once_and_says_when_to_retry(self) -> None:
        store, clock = make_store(capacity=2, ttl_s=30)
        first, _second = store.submit(), store.submit()
        with pytest.raises(StoreFull, match=r"full \(2 jobs: 2 pending, 0 finished") as full:
            store.submit()
        assert full.value.retry_after_s == 1.0  # all pending: no better guess than soon
        store.succeed(first, "x")
        clock.now += 10
        with pytest.raises(StoreFull) as full:
            store.submit()
        assert full.value.retry_after_s == 20  # the finished result expires in 30 - 10 s

    def test_room_comes_back_by_expiry_or_discard_never_by_dropping_a_job(self) -> None:
        store, clock = make_store(capacity=2, ttl_s=30)
        done, pending = store.submit(), store.submit()
        store.succeed(done, "x")
        clock.now += 29
        with pytest.raises(StoreFull):
            store.submit()
        assert store.get(pending.id) is pending
        assert store.get(done.id) is done
        clock.now += 1  # done expires: one place free
        third = store.submit()
        with pytest.raises(StoreFull):
            store.submit()
        store.discard(third.id)
        store.submit()
        assert store.get(pending.id) is pending  # the pending job was never touched


class TestDiscard:
    async def test_discarding_a_pending_job_cancels_its_work(self) -> None:
        store, _ = make_store()
        job = store.submit()
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await asyncio.Event().wait()

        job.work = asyncio.get_running_loop().create_task(work())
        await started.wait()
        assert store.discard(job.id) is job
        with pytest.raises(asyncio.CancelledError):
            await job.work
        assert job.finished.is_set()  # a long poll on it wakes up
        assert store.get(job.id) is None
        assert not store.succeed(job, "too late")  # a result after discard goes nowhere
        assert store.counts()["pending"] == 0

    def test_discarding_a_finished_job_frees_its_place(self) -> None:
        store, _ = make_store(capacity=1)
        job: Job[str] = store.submit()
        store.succeed(job, "x")
        assert store.discard(job.id) is job
        assert store.discard(job.id) is None
        store.submit()


class TestOwnership:
    """A job submitted by an owner (an API key's id) exists for that owner only."""

    def test_another_owner_sees_nothing_and_cannot_discard(self) -> None:
        store, _ = make_store()
        job = store.submit(owner="alice")
        assert job.owner == "alice"
        assert store.get(job.id, owner="bob") is None
        assert store.get(job.id) is None  # no owner is another owner too
        assert store.discard(job.id, owner="bob") is None
        assert store.get(job.id, owner="alice") is job  # untouched
        store.succeed(job, "x")
        assert store.get(job.id, owner="bob") is None
        assert store.discard(job.id, owner="alice") is job
        assert store.get(job.id, owner="alice") is None

    async def test_another_owner_cannot_cancel_a_pending_job(self) -> None:
        store, _ = make_store()
        job = store.submit(owner="alice")

        async def work() -> None:
            await asyncio.Event().wait()

        job.work = asyncio.get_running_loop().create_task(work())
        assert store.discard(job.id, owner="bob") is None
        await asyncio.sleep(0)
        assert not job.work.cancelled()
        assert store.counts()["pending"] == 1
        assert store.discard(job.id, owner="alice") is job
        with pytest.raises(asyncio.CancelledError):
            await job.work

    def test_owners_share_the_capacity_and_expiry(self) -> None:
        store, clock = make_store(capacity=2, ttl_s=10)
        mine, theirs = store.submit(owner="alice"), store.submit(owner="bob")
        with pytest.raises(StoreFull):
            store.submit(owner="carol")
        store.succeed(mine, "x")
        store.succeed(theirs, "y")
        clock.now += 10
        assert store.expire() == 2
        assert len(store) == 0


class TestFairShare:
    """With K keys each holds at most capacity // K jobs, so one key flooding the store leaves
    every other key its share; a lone key has the whole store."""

    def test_one_key_alone_may_fill_the_store(self) -> None:
        store, _ = make_store(capacity=8)
        for _ in range(8):
            store.submit(owner="alice", owners=1)
        with pytest.raises(StoreFull) as refused:
            store.submit(owner="alice", owners=1)
        assert not isinstance(refused.value, OverShare)

    def test_a_flooding_key_leaves_every_other_key_its_share(self) -> None:
        store, _ = make_store(capacity=13)  # 3 keys: a share of 4 each
        for _ in range(4):
            store.submit(owner="alice", owners=3)
        with pytest.raises(OverShare) as refused:
            store.submit(owner="alice", owners=3)
        assert "holds 4 of the async job store's 13 places, its share (3 keys" in str(refused.value)
        for who in ("bob", "carol"):
            for _ in range(4):
                store.submit(owner=who, owners=3)
            with pytest.raises(OverShare):
                store.submit(owner=who, owners=3)
        assert len(store) == 12

    def test_a_key_at_its_share_gets_room_back_as_its_own_jobs_leave(self) -> None:
        store, clock = make_store(capacity=4, ttl_s=10)  # 2 keys: 2 each
        alice = [store.submit(owner="alice", owners=2) for _ in range(2)]
        store.succeed(alice[0], "a")
        clock.now += 4
        store.succeed(alice[1], "b")
        with pytest.raises(OverShare) as refused:
            store.submit(owner="alice", owners=2)
        assert refused.value.retry_after_s == 6  # when alice's oldest result expires
        clock.now += 6
        assert store.held("alice") == 1
        store.submit(owner="alice", owners=2)
        with pytest.raises(OverShare):
            store.submit(owner="alice", owners=2)
        assert store.discard(alice[1].id, owner="alice") is alice[1]
        store.submit(owner="alice", owners=2)
        assert store.held("alice") == 2

    def test_without_owners_the_store_is_shared_as_one(self) -> None:
        store, _ = make_store(capacity=3)
        for _ in range(3):
            store.submit(owners=5)
        with pytest.raises(StoreFull):
            store.submit(owners=5)

    def test_a_share_is_at_least_one_place_and_the_store_still_bounds_them_all(self) -> None:
        store, _ = make_store(capacity=2)
        assert store.share(5) == 1
        store.submit(owner="a", owners=5)
        with pytest.raises(OverShare):
            store.submit(owner="a", owners=5)
        store.submit(owner="b", owners=5)
        with pytest.raises(StoreFull):
            store.submit(owner="c", owners=5)


# --- The real server --------------------------------------------------------------------------

FEATURES = 64


def rows(n: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, FEATURES)).astype(np.float32)


def json_body(x: np.ndarray[Any, Any], *, request_id: str = "r") -> bytes:
    doc = {
        "id": request_id,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel()}],
    }
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def binary_body(x: np.ndarray[Any, Any], *, request_id: str = "b") -> tuple[bytes, dict[str, str]]:
    data = np.ascontiguousarray(x).tobytes()
    header = orjson.dumps(
        {
            "id": request_id,
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    )
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def logits(reply: Reply) -> np.ndarray[Any, Any]:
    """The output of a JSON or binary infer response."""
    assert reply.status == 200, reply.body
    length = reply.headers.get("inference-header-content-length")
    if length is None:
        out = reply.json()["outputs"][0]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])
    header = orjson.loads(reply.body[: int(length)])
    out = header["outputs"][0]
    return np.frombuffer(reply.body[int(length) :], np.float32).reshape(out["shape"])


def submit(server: RuntimeProcess, body: bytes, headers: dict[str, str] | None = None) -> Reply:
    return send(server, "POST", "/v2/models/mlp/infer/async", body, headers)


def fetch(server: RuntimeProcess, job_id: str, *, wait_s: float | None = None) -> Reply:
    query = "" if wait_s is None else f"?wait_s={wait_s:g}"
    return send(server, "GET", f"/v2/models/mlp/infer/async/{job_id}{query}")


@pytest.mark.slow
class TestAsyncOverHttp:
    def test_async_answers_equal_the_sync_answers(self, mlp_model: Path, tmp_path: Path) -> None:
        with runtime_process(mlp_model, "--device", "cpu", log_dir=tmp_path) as server:
            requests: list[tuple[bytes, dict[str, str]]] = []
            for i in range(6):
                x = rows(1 + i % 3, seed=i)
                if i % 2:
                    requests.append(binary_body(x, request_id=f"req-{i}"))
                else:
                    requests.append((json_body(x, request_id=f"req-{i}"), {}))
            accepted = [submit(server, body, headers) for body, headers in requests]
            for reply in accepted:
                assert reply.status == 202, reply.body
                doc = reply.json()
                assert doc["status"] == "queued"
                assert doc["model_name"] == "mlp"
                assert reply.headers["location"] == f"/v2/models/mlp/infer/async/{doc['id']}"
            assert len({r.json()["id"] for r in accepted}) == len(requests)

            for (body, headers), reply in zip(requests, accepted, strict=True):
                result = fetch(server, reply.json()["id"], wait_s=10)
                sync = send(server, "POST", "/v2/models/mlp/infer", body, headers)
                assert result.status == sync.status == 200
                assert result.headers["content-type"] == sync.headers["content-type"]
                np.testing.assert_allclose(logits(result), logits(sync), rtol=1e-5, atol=1e-6)
                length = sync.headers.get("inference-header-content-length")
                assert result.headers.get("inference-header-content-length") == length
                if length is None:
                    got, want = result.json(), sync.json()
                else:
                    got = orjson.loads(result.body[: int(length)])
                    want = orjson.loads(sync.body[: int(length)])
                for doc in (got, want):
                    for out in doc["outputs"]:
                        out.pop("data", None)
                assert got == want  # same id, model, output names, shapes, datatypes
                # fetching again gives the same answer until it expires or is deleted
                assert fetch(server, reply.json()["id"]).body == result.body

            assert metric(server, "batchpilot_async_jobs", state="succeeded") == len(requests)
            assert metric(server, "batchpilot_requests_total", outcome="success") == 2 * len(
                requests
            )
            deleted = send(
                server, "DELETE", f"/v2/models/mlp/infer/async/{accepted[0].json()['id']}"
            )
            assert deleted.status == 200
            assert deleted.json()["status"] == "deleted"
            assert fetch(server, accepted[0].json()["id"]).status == 404

    def test_bad_requests_fail_at_submit_and_store_nothing(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        # Its results are never fetched: no hold for them at the end.
        with runtime_process(
            mlp_model, "--device", "cpu", "--async-drain-hold-s", "0", log_dir=tmp_path
        ) as server:
            wrong_name = orjson.dumps(
                {"inputs": [{"name": "y", "datatype": "FP32", "shape": [1, 64], "data": [0] * 64}]}
            )
            cases = {
                b"{": "not valid JSON",
                wrong_name: "has no input 'y'",
                json_body(np.zeros((1, 63), np.float32)): "has shape [1, 63]",
            }
            for body, message in cases.items():
                reply = submit(server, body)
                assert reply.status == 400, reply.body
                assert message in reply.json()["error"]
            other = send(server, "POST", "/v2/models/other/infer/async", json_body(rows(1, 0)))
            assert other.status == 404
            assert "is not served here" in other.json()["error"]
            assert metric(server, "batchpilot_async_jobs") == 0

            unknown = fetch(server, "no-such-job")
            assert unknown.status == 404
            assert "never submitted, was deleted, its result expired" in unknown.json()["error"]
            assert send(server, "DELETE", "/v2/models/mlp/infer/async/no-such-job").status == 404
            job_id = submit(server, json_body(rows(1, 0))).json()["id"]
            for bad in ("-1", "31", "soon", "nan"):
                reply = send(server, "GET", f"/v2/models/mlp/infer/async/{job_id}?wait_s={bad}")
                assert reply.status == 400
                assert "wait_s must be a number of seconds from 0 to 30" in reply.json()["error"]

    def test_results_expire_after_their_ttl(self, mlp_model: Path, tmp_path: Path) -> None:
        with runtime_process(
            mlp_model, "--device", "cpu", "--async-result-ttl-s", "0.5", log_dir=tmp_path
        ) as server:
            job_id = submit(server, json_body(rows(2, 1))).json()["id"]
            assert fetch(server, job_id, wait_s=10).status == 200
            wait_until(
                lambda: fetch(server, job_id).status == 404, timeout=10, what="the result to expire"
            )
            assert metric(server, "batchpilot_async_jobs_expired_total") == 1
            assert metric(server, "batchpilot_async_jobs") == 0

    def test_a_full_store_answers_429_at_once(self, mlp_model: Path, tmp_path: Path) -> None:
        hold = ("--async-drain-hold-s", "0")  # results left unfetched at the end: no hold
        with runtime_process(
            mlp_model, "--device", "cpu", "--async-capacity", "2", *hold, log_dir=tmp_path
        ) as server:
            ids = [submit(server, json_body(rows(1, i))).json()["id"] for i in range(2)]
            full = submit(server, json_body(rows(1, 9)))
            assert full.status == 429
            assert "async job store is full" in full.json()["error"]
            assert int(full.headers["retry-after"]) >= 1
            assert metric(server, "batchpilot_requests_total", outcome="rejected") == 1
            # the two accepted jobs are untouched; deleting one makes room again
            assert all(fetch(server, job_id, wait_s=10).status == 200 for job_id in ids)
            assert send(server, "DELETE", f"/v2/models/mlp/infer/async/{ids[0]}").status == 200
            assert submit(server, json_body(rows(1, 9))).status == 202

    def test_pending_jobs_long_poll_cancel_and_fail_with_their_own_status(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        # The simulated device takes 1 s a batch of one row: a job is pending while it runs, and
        # the jobs behind it wait in the background lane.
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=1000,beta_ms=0",
            "--max-batch-size",
            "1",
            log_dir=tmp_path,
        ) as server:
            job_id = submit(server, json_body(rows(1, 0))).json()["id"]
            pending = fetch(server, job_id)
            assert pending.status == 202
            assert pending.json() == {"id": job_id, "model_name": "mlp", "status": "pending"}
            assert metric(server, "batchpilot_async_jobs", state="pending") == 1
            cancelled = send(server, "DELETE", f"/v2/models/mlp/infer/async/{job_id}")
            assert cancelled.json()["status"] == "cancelled"
            assert fetch(server, job_id).status == 404
            wait_until(
                lambda: metric(server, "batchpilot_requests_total", outcome="cancelled") == 1,
                timeout=10,
                what="the cancelled job to be counted",
            )

            # a long poll returns as soon as the job is done
            job_id = submit(server, json_body(rows(1, 0))).json()["id"]
            assert fetch(server, job_id, wait_s=0.05).status == 202  # not done in 50 ms
            assert fetch(server, job_id, wait_s=10).status == 200

            # a deadline shorter than any batch (1 s, just measured) is refused at submission,
            # for good, as infer refuses it
            late = orjson.loads(json_body(rows(1, 0)))
            late["parameters"] = {"timeout": 500_000}  # microseconds, as Triton's clients send
            refused = submit(server, orjson.dumps(late))
            assert refused.status == 400, refused.body
            assert "shorter than any batch this server has run" in refused.json()["error"]
            # a job that fails keeps its error: two jobs ahead take 2 s, and a job whose own
            # deadline is 1.5 s expires in the lane
            ahead = [submit(server, json_body(rows(1, i))).json()["id"] for i in (1, 2)]
            short = orjson.loads(json_body(rows(1, 3)))
            short["parameters"] = {"timeout": 1_500_000}
            job_id = submit(server, orjson.dumps(short)).json()["id"]
            failed = fetch(server, job_id, wait_s=10)
            assert failed.status == 504, failed.body
            assert failed.headers["async-job-status"] == "failed"
            assert all(fetch(server, one, wait_s=10).status == 200 for one in ahead)
            # a job's time is not the SLA's: its own histogram
            assert metric(server, "batchpilot_async_job_duration_seconds_count") == 4
            assert metric(server, "batchpilot_request_duration_seconds_count") == 0

    def test_sigterm_finishes_queued_async_jobs(self, mlp_model: Path, tmp_path: Path) -> None:
        # Two instances: the drain must wait for both workers, and lose nothing.
        with runtime_process(
            mlp_model,
            "--instances",
            "2",
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=20,beta_ms=1",
            "--max-queue-delay-ms",
            "5000",
            "--max-batch-size",
            "4",
            log_dir=tmp_path,
        ) as server:
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                replies = list(pool.map(lambda i: submit(server, json_body(rows(1, i))), range(6)))
            assert all(r.status == 202 for r in replies)
            assert metric(server, "batchpilot_async_jobs", state="pending") == 6
            server.process.send_signal(signal.SIGTERM)
            # Computed during the drain, and the port held open until they are fetched.
            for reply in replies:
                assert fetch(server, reply.json()["id"], wait_s=10).status == 200
            assert server.process.wait(timeout=30) == 0
            assert "never fetched" not in server.log()
        # the drain ran all six jobs instead of failing them
        assert "success=6" in server.log()
        assert "rejected=0" in server.log()
        assert "error=0" in server.log()


def test_a_failed_job_keeps_its_error_not_the_inputs_its_frames_held() -> None:
    """The stored exception's traceback held the frames that ran the job, and their locals the
    request's decoded inputs, for the result's TTL."""
    store: JobStore[str] = JobStore(capacity=4, ttl_s=300)
    job = store.submit()
    inputs = np.zeros((512, 4096), np.float32)
    held = weakref.ref(inputs)

    def run(arrays: np.ndarray[Any, Any]) -> None:
        raise RefusedByModel(f"the model failed on this request's inputs ({arrays.shape})")

    try:
        run(inputs)
    except RefusedByModel as exc:
        store.fail(job, exc)
    del inputs
    gc.collect()
    assert held() is None
    kept = store.get(job.id)
    assert kept is not None
    assert str(kept.error) == "the model failed on this request's inputs ((512, 4096))"


def test_the_store_is_bounded_in_bytes_too() -> None:
    """Results of 1.2 MiB each (an output the size of a vocabulary) filled 1.2 GiB at the
    default capacity, within one key's share: a bound in bytes refuses the next submit (429)
    and drops no job; a DELETE makes room."""
    store: JobStore[bytes] = JobStore(capacity=100, ttl_s=300, max_bytes=10_000, size_of=len)
    jobs = [store.submit() for _ in range(10)]
    for job in jobs:
        store.succeed(job, b"x" * 1_000)
    assert store.bytes_held == 10_000
    with pytest.raises(StoreFull, match="holds 0 MiB of results, its bound"):
        store.submit()
    assert len(store) == 10
    store.discard(jobs[0].id)
    assert store.bytes_held == 9_000
    store.submit()  # room again


def simulated_server(tmp_path: Path) -> ModelServer:
    """A model server in this process: a small MLP on the simulated accelerator, batches of 4."""
    return model_server(onnx_models.mlp(tmp_path / "mlp.onnx", features=4, hidden=8, classes=3))


async def test_a_job_given_its_202_before_a_drain_is_computed_though_not_yet_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain began after the submit's 202 and before its job reached the queue (its body
    decoded, its inputs preprocessed): the queue closed under it, and the client fetched a
    stored 503 for a job its 202 promised to compute. Owed an answer, it is let in first."""
    server = simulated_server(tmp_path)
    app = create_app(server)
    await server.learn_known_good()
    server.start()
    held = asyncio.Event()
    infer = ModelServer._infer

    async def preprocessed_slowly(self: ModelServer, *args: Any, **kwargs: Any) -> Any:
        await held.wait()  # its inputs still on their way to the queue
        return await infer(self, *args, **kwargs)

    monkeypatch.setattr(ModelServer, "_infer", preprocessed_slowly)
    transport = httpx.ASGITransport(app=app)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            submitted = await client.post("/v2/models/mlp/infer/async", json=body)
            assert submitted.status_code == 202
            server.refuse_new()  # SIGTERM, as the draining server handles it
            draining = asyncio.ensure_future(server.drain(grace_s=5.0))
            for _ in range(3):
                await asyncio.sleep(0)  # the drain has begun
            held.set()
            job_id = submitted.json()["id"]
            fetched = await client.get(f"/v2/models/mlp/infer/async/{job_id}?wait_s=5")
            assert fetched.status_code == 200
            assert await draining
    finally:
        await server.close()


async def test_a_failed_jobs_answer_says_so_and_asks_for_no_retry_of_the_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job refused by admission after its 202 (it would have finished late) is stored with
    the 503 it got; fetched, that 503 carried `Retry-After: 1`, and a client that obeyed it
    fetched the same answer again and again. The stored answer says the job failed."""
    server = simulated_server(tmp_path)
    app = create_app(server)
    await server.learn_known_good()
    server.start()

    async def refused(self: ModelServer, *args: Any, **kwargs: Any) -> Any:
        raise Overloaded("it would finish 54 ms too late", reason="predicted_late")

    monkeypatch.setattr(ModelServer, "_infer", refused)
    transport = httpx.ASGITransport(app=app)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            submitted = await client.post("/v2/models/mlp/infer/async", json=body)
            job_id = submitted.json()["id"]
            fetched = await client.get(f"/v2/models/mlp/infer/async/{job_id}?wait_s=5")
            assert fetched.status_code == 503
            assert "retry-after" not in fetched.headers
            assert fetched.headers["async-job-status"] == "failed"
            assert "54 ms too late" in fetched.json()["error"]
    finally:
        await server.close()
