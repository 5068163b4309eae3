"""The batch queue's background lane (async jobs), on the fake clock: a burst of jobs is served
whole behind the SLA's requests, which neither wait for it nor count it ahead; jobs fill the room
the SLA's batches leave, only while those stay in time and without teaching admission a
lateness; a job's own deadline is all that fails it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import (
    DeadlineExceeded,
    Overloaded,
    ShuttingDown,
    TooLargeForDeadline,
)
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.protocol.server_codec import decode_request
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models
from tests.test_admission import Served

pytestmark = pytest.mark.looptime


def job(s: Served, timeout_s: float | None = 300.0, rows: int = 1) -> asyncio.Future[Any]:
    x = np.ones((rows, 1), dtype=np.float32)
    return s.queue.put({"x": x}, rows=rows, timeout_s=timeout_s, background=True)


def now() -> float:
    return asyncio.get_running_loop().time()


async def answered_at(future: asyncio.Future[Any]) -> float:
    await future
    return now()


class TestABurstOfJobs:
    async def test_is_served_whole_and_the_sla_s_requests_go_first(self) -> None:
        # t(b) = 50 + 2·b ms, batches of 8: 150 jobs are about 1.3 s of work. Each request of
        # the SLA (200 ms deadline) sent meanwhile is admitted and answered in time: the jobs
        # queued are not ahead of it, only the batch running is.
        async with Served(alpha_s=0.050, beta_s=0.002, max_batch_size=8) as s:
            jobs = [job(s) for _ in range(150)]
            assert len(s.queue) == 0
            assert s.queue.background_queued == 150
            finished: list[tuple[float, float]] = []
            for _ in range(5):
                await asyncio.sleep(0.2)
                sent = now()
                finished.append((sent, await answered_at(s.put(timeout_s=0.200))))
            await asyncio.gather(*jobs)  # every job answered: none refused, none expired
            assert all(done - sent <= 0.200 for sent, done in finished), finished
            assert max(s.engine.batches) == 8

    async def test_runs_at_once_on_an_idle_device_without_waiting_to_fill(self) -> None:
        async with Served(delay_s=1.0) as s:
            assert await answered_at(asyncio.gather(*(job(s) for _ in range(3)))) == (
                pytest.approx(0.020 + 0.001 * 3)
            )
            assert s.engine.batches == [3]

    async def test_is_never_refused_by_the_sla_s_admission(self) -> None:
        # The same burst as requests of the SLA is refused nearly whole.
        async with Served(alpha_s=0.050, beta_s=0.002, max_batch_size=8) as s:
            refused = 0
            sync = []
            for _ in range(150):
                try:
                    sync.append(s.put(timeout_s=0.500))
                except Overloaded:
                    refused += 1
            assert refused >= 90  # 94 of 150
            await asyncio.gather(*sync)
            await asyncio.gather(*(job(s) for _ in range(150)))


class TestTheRoomABatchLeaves:
    async def test_is_filled_with_jobs_only_while_the_batch_stays_in_time(self) -> None:
        # t(b) = 20 + 10·b ms; a request of the SLA with 50 ms left: its batch may take
        # two rows (40 ms, within the deadline less the start margin), not three.
        async with Served(alpha_s=0.020, beta_s=0.010, max_batch_size=8) as s:
            await asyncio.sleep(0)  # the batcher waits for a request
            jobs = [job(s) for _ in range(5)]
            mine = s.put(timeout_s=0.050)
            await mine
            await asyncio.gather(*jobs)
            # the worker woke to the jobs; the request, put at the same moment, goes first
            assert s.engine.batches == [2, 4]

    async def test_teaches_admission_no_lateness(self) -> None:
        async with Served(alpha_s=0.020, beta_s=0.010, max_batch_size=8, delay_s=0.0) as s:
            margin = s.predictor.lateness.margin_s(now())
            mine = s.put(timeout_s=0.200)  # queued first: the batcher wakes to it
            jobs = [job(s) for _ in range(7)]
            await mine
            await asyncio.gather(*jobs)
            assert s.engine.batches == [8]  # mine and the seven jobs
            # 100 ms where 30 were predicted: the 70 the jobs added are no error of the
            # prediction
            assert s.predictor.lateness.margin_s(now()) == pytest.approx(margin, abs=1e-9)

    async def test_holds_no_job_while_a_request_of_the_sla_waits_behind(self) -> None:
        # Two requests of 8 rows and a job: the first batch is the first request alone (the
        # second waits behind it), then the second; the job runs last.
        async with Served(alpha_s=0.020, beta_s=0.001, max_batch_size=8) as s:
            await asyncio.sleep(0)
            first = s.put(timeout_s=1.0, rows=8)
            second = s.put(timeout_s=1.0, rows=8)
            later = job(s)
            await asyncio.gather(first, second, later)
            assert s.engine.batches == [8, 8, 1]


class TestAJob:
    async def test_fails_only_at_its_own_deadline(self) -> None:
        async with Served(alpha_s=0.500, beta_s=0.0, max_batch_size=1) as s:
            ahead = job(s)
            await asyncio.sleep(0)
            late = job(s, timeout_s=0.300)
            with pytest.raises(DeadlineExceeded):
                await late
            await ahead

    async def test_that_is_cancelled_leaves_the_lane(self) -> None:
        async with Served(alpha_s=0.500, beta_s=0.0, max_batch_size=1) as s:
            ahead = job(s)
            await asyncio.sleep(0.1)
            withdrawn = job(s)
            assert s.queue.background_queued == 1
            withdrawn.cancel()
            await asyncio.sleep(0)
            assert s.queue.background_queued == 0
            await ahead
            assert s.engine.batches == [1]


class TestShutdown:
    async def test_a_closed_queue_still_serves_the_lane_then_ends(self) -> None:
        async with Served(alpha_s=0.010, beta_s=0.0, max_batch_size=2) as s:
            jobs = [job(s) for _ in range(5)]
            s.queue.close()
            with pytest.raises(ShuttingDown):
                job(s)
            await asyncio.gather(*jobs)
            await asyncio.wait_for(s.task, 1)

    async def test_abandoning_fails_the_lane_too(self) -> None:
        async with Served(alpha_s=0.500, beta_s=0.0, max_batch_size=1) as s:
            first = job(s)
            await asyncio.sleep(0)
            rest = [job(s) for _ in range(3)]
            assert s.queue.abandon(ShuttingDown("stopped")) == 3
            assert s.queue.background_queued == 0
            for future in rest:
                with pytest.raises(ShuttingDown):
                    await future
            await first


def test_a_job_too_large_for_the_sla_s_deadline_is_refused_at_submit(tmp_path: Path) -> None:
    # A job larger than the largest batch runs alone, in one batch nothing interrupts: one that
    # fits its own 300 s would hold the device from the SLA's requests for seconds. It is held
    # to the deadline a request of the SLA would have (100 ms here), as before the lane.
    model = onnx_models.mlp(tmp_path / "mlp.onnx")
    engine = SimulatedEngine.load(model, name="mlp", latency=LatencyModel(0.0, 0.0))
    metrics = RuntimeMetrics(model="mlp", service="", namespace="", engine=engine.info, nvml=None)
    server = ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=8, max_queue_delay_s=0.0, deadline_s=0.100),
        queue_capacity=16,
        metrics=metrics,
    )
    for _ in range(3):  # t(b) = 20 + 1·b ms, measured
        for rows in (1, 8):
            server.predictor.timing.observe(rows, 0.020 + 0.001 * rows)
    x = np.zeros((4000, 64), dtype=np.float32).tolist()
    body = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4000, 64], "data": x}]}
    )
    with pytest.raises(TooLargeForDeadline):
        server.validate(decode_request(body), background=True)
    small = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8, 64], "data": x[:8]}]}
    )
    assert server.validate(decode_request(small), background=True) == 8
