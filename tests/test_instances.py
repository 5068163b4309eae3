"""Several model instances: N batches at once from one queue, and utilization that stays honest.

The batch loop is tested with a fake engine at our own boundary and a fake clock (looptime), so
overlap is exact: two 10 ms batches that overlap end at 0.010, in sequence at 0.020. The engines
are tested for real (onnxruntime sessions, the simulated device), and the server as a real
process with `--instances 2`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from pydantic import ValidationError

from batchpilot.runtime.admission import Predictor
from batchpilot.runtime.batching import Batcher, BatchQueue, BatchSettings, BusyTime
from batchpilot.runtime.batching.batcher import LoopDelay
from batchpilot.runtime.engine import EngineInfo, ModelSignature, Ran, TensorSpec
from batchpilot.runtime.errors import ShuttingDown
from batchpilot.runtime.instances import Instances as EngineInstances
from batchpilot.runtime.instances import running_on_threads
from batchpilot.runtime.onnx_engine import OnnxEngine, threads_per_instance
from batchpilot.runtime.outcomes import BatchDone
from batchpilot.runtime.settings import RuntimeSettings
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests.runtime_process import metric, runtime_process, send

SIGNATURE = ModelSignature(
    name="double",
    platform="test",
    inputs=(TensorSpec("x", "FP32", (-1, 1)),),
    outputs=(TensorSpec("y", "FP32", (-1, 1)),),
)


class OverlapEngine:
    """Doubles its input after `seconds_per_row * rows` of loop time; records when each batch
    ran and how many ran at once."""

    def __init__(self, *, seconds_per_row: float = 0.01) -> None:
        self.seconds_per_row = seconds_per_row
        self.ms_from_first_value = False
        """Take as many milliseconds as the batch's first value instead."""
        self.running = 0
        self.most_at_once = 0
        self.spans: list[tuple[float, float]] = []

    @property
    def signature(self) -> ModelSignature:
        return SIGNATURE

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(kind="fake", device="cpu", simulated=True)

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        x = inputs["x"]
        started = loop.time()
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            if self.ms_from_first_value:
                await asyncio.sleep(float(x[0, 0]) / 1e3)
            else:
                await asyncio.sleep(self.seconds_per_row * x.shape[0])
        finally:
            self.running -= 1
        self.spans.append((started, loop.time()))
        return {"y": x * 2}

    async def close(self) -> None:
        pass


class SelfTimed:
    """An engine that times its batches where they run: `seconds` each, while the event loop
    takes their outputs back `late_s[i]` after that, batch by batch."""

    def __init__(self, *, seconds: float, late_s: Sequence[float]) -> None:
        self.seconds = seconds
        self.late_s = list(late_s)

    @property
    def signature(self) -> ModelSignature:
        return SIGNATURE

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(kind="fake", device="cpu", simulated=True)

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        return (await self.run_timed(inputs)).outputs

    async def run_timed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Ran:
        await asyncio.sleep(self.seconds + self.late_s.pop(0))
        return Ran({"y": inputs["x"] * 2}, self.seconds)

    async def close(self) -> None:
        pass


class Computed:
    """Observer that sums what each batch reports."""

    def __init__(self) -> None:
        self.compute_s: list[float] = []

    def batch_done(self, done: BatchDone) -> None:
        self.compute_s.append(done.compute_s)

    def batch_failed(self, *, rows: int, requests: int, compute_s: float) -> None:
        self.compute_s.append(compute_s)


class Instances:
    def __init__(self, instances: int, *, max_batch_size: int = 2, delay_s: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        self.settings = BatchSettings(max_batch_size=max_batch_size, max_queue_delay_s=delay_s)
        self.queue = BatchQueue(settings=lambda: self.settings, capacity=1000, clock=loop.time)
        self.engine = OverlapEngine()
        self.observer = Computed()
        self.batcher = Batcher(
            self.queue, self.engine, self.observer, clock=loop.time, instances=instances
        )

    def put(self, *values: float) -> asyncio.Future[dict[str, np.ndarray[Any, Any]]]:
        x = np.array([[v] for v in values], dtype=np.float32)
        return self.queue.put({"x": x}, rows=len(values))

    def start(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.batcher.run())


def doubled(result: dict[str, np.ndarray[Any, Any]]) -> list[float]:
    return [float(v) for v in result["y"][:, 0]]


@pytest.mark.looptime
class TestBatchesOverlap:
    async def test_two_instances_run_two_batches_at_once(self) -> None:
        h = Instances(2, max_batch_size=1)
        task = h.start()
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(h.put(1), h.put(2))
        # two batches of one row, 10 ms each, side by side: both done at 10 ms
        assert loop.time() == pytest.approx(0.010)
        assert h.engine.most_at_once == 2
        assert [doubled(r) for r in results] == [[2.0], [4.0]]
        h.queue.close()
        await task

    async def test_one_instance_never_overlaps_batches(self) -> None:
        h = Instances(1, max_batch_size=1)
        task = h.start()
        loop = asyncio.get_running_loop()
        await asyncio.gather(h.put(1), h.put(2))
        # the same two batches in sequence: 10 ms + 10 ms
        assert loop.time() == pytest.approx(0.020)
        assert h.engine.most_at_once == 1
        h.queue.close()
        await task

    async def test_never_more_batches_at_once_than_instances(self) -> None:
        h = Instances(3, max_batch_size=1)
        task = h.start()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(h.put(v) for v in range(9)))
        # 9 one-row batches, 3 at a time, 10 ms each: 30 ms
        assert loop.time() == pytest.approx(0.030)
        assert h.engine.most_at_once == 3
        h.queue.close()
        await task

    async def test_each_request_gets_its_own_rows_when_batches_finish_out_of_order(self) -> None:
        h = Instances(3, max_batch_size=4, delay_s=0.0)
        h.engine.ms_from_first_value = True
        task = h.start()
        # A batch takes as many ms as its first value: the 50 ms batch started first finishes
        # after the short ones started behind it. Every request must still get its own rows.
        requests = [(50.0, 1.0), (2.0, 3.0, 4.0), (5.0,), (6.0, 7.0), (8.0,), (9.0, 1.5, 2.5)]
        requests += [
            tuple(float(1 + (i * 7 + j) % 13) for j in range(1 + i % 4)) for i in range(30)
        ]
        results = await asyncio.gather(*(h.put(*values) for values in requests))
        for values, result in zip(requests, results, strict=True):
            assert doubled(result) == [2 * v for v in values]
        starts_in_finish_order = [start for start, _ in h.engine.spans]
        assert starts_in_finish_order != sorted(starts_in_finish_order)
        first = h.engine.spans.index((0.0, pytest.approx(0.050)))
        assert first > 0  # the first batch started did not finish first
        h.queue.close()
        await task

    async def test_batches_still_form_by_size_and_delay(self) -> None:
        h = Instances(2, max_batch_size=4, delay_s=0.005)
        task = h.start()
        loop = asyncio.get_running_loop()
        lone = await h.put(1)
        # a lone request still waits the queue delay for company, then runs (10 ms)
        assert loop.time() == pytest.approx(0.015)
        assert doubled(lone) == [2.0]
        h.queue.close()
        await task


@pytest.mark.looptime
class TestDrainWithInstances:
    async def test_closing_the_queue_finishes_every_queued_request_on_every_worker(self) -> None:
        h = Instances(3, max_batch_size=2)
        queued = [h.put(v) for v in range(11)]
        task = h.start()
        h.queue.close()
        with pytest.raises(ShuttingDown):
            h.put(99)
        await asyncio.wait_for(task, 10)  # returns only once every worker is done
        assert [doubled(f.result()) for f in queued] == [[2.0 * v] for v in range(11)]
        assert len(h.queue) == 0
        assert h.engine.running == 0
        assert h.engine.most_at_once == 3

    async def test_a_batch_still_running_when_the_queue_closes_is_finished(self) -> None:
        h = Instances(2, max_batch_size=4)
        task = h.start()
        first = h.put(1, 2, 3, 4)  # 40 ms
        await asyncio.sleep(0.001)
        second = h.put(5)
        await asyncio.sleep(0.001)
        h.queue.close()
        await asyncio.wait_for(task, 10)
        assert doubled(first.result()) == [2.0, 4.0, 6.0, 8.0]
        assert doubled(second.result()) == [10.0]

    async def test_cancelling_the_batcher_stops_every_worker_and_fails_their_batches(self) -> None:
        h = Instances(2, max_batch_size=1)
        task = h.start()
        running = [h.put(1), h.put(2)]
        await asyncio.sleep(0.005)  # both batches are on the engine
        assert h.engine.running == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert all(isinstance(f.exception(), ShuttingDown) for f in running)
        assert h.engine.running == 0


class TestBusyTimeIsAUnion:
    def test_one_activity_counts_its_own_length(self) -> None:
        busy = BusyTime()
        busy.begin(1.0)
        busy.end(1.5)
        assert busy.total(2.0) == pytest.approx(0.5)

    def test_overlapping_activities_count_once(self) -> None:
        busy = BusyTime()
        busy.begin(0.0)  # A: 0 .. 1
        busy.begin(0.5)  # B: 0.5 .. 3
        busy.end(1.0)
        busy.begin(1.2)  # C: 1.2 .. 2 (inside B)
        busy.end(2.0)
        busy.end(3.0)
        # union [0, 3] = 3 s; the batches' own times add up to 1 + 2.5 + 0.8 = 4.3 s
        assert busy.total(10.0) == pytest.approx(3.0)

    def test_gaps_are_not_counted(self) -> None:
        busy = BusyTime()
        busy.begin(0.0)
        busy.end(1.0)
        busy.begin(2.0)  # idle from 1 to 2
        busy.end(2.5)
        assert busy.total(3.0) == pytest.approx(1.5)

    def test_a_running_activity_counts_up_to_now(self) -> None:
        busy = BusyTime()
        busy.begin(0.0)
        busy.begin(1.0)
        busy.end(2.0)  # one still running
        assert busy.total(2.0) == pytest.approx(2.0)
        assert busy.total(5.0) == pytest.approx(5.0)
        busy.end(6.0)
        assert busy.total(100.0) == pytest.approx(6.0)

    def test_the_rate_never_exceeds_one_however_many_overlap(self) -> None:
        busy = BusyTime()
        for i in range(16):
            busy.begin(i * 0.001)
        for i in range(16):
            busy.end(1.0 + i * 0.001)
        # 16 overlapping activities over [0, 1.015]: 1.015 s busy in 1.015 s of time
        assert busy.total(1.015) == pytest.approx(1.015)

    def test_an_end_without_a_begin_is_a_bug(self) -> None:
        with pytest.raises(RuntimeError, match="without a matching begin"):
            BusyTime().end(1.0)

    @pytest.mark.looptime
    async def test_the_batcher_reports_union_busy_time_and_per_batch_compute(self) -> None:
        h = Instances(2, max_batch_size=1)
        task = h.start()
        await asyncio.gather(h.put(1), h.put(2))  # two 10 ms batches side by side
        assert h.batcher.busy_seconds() == pytest.approx(0.010)
        assert sum(h.observer.compute_s) == pytest.approx(0.020)  # t(b) fits see each batch
        h.queue.close()
        await task

    @pytest.mark.looptime
    async def test_an_engine_that_times_itself_gives_compute_time_and_the_loop_busy_time(
        self,
    ) -> None:
        """Each batch computes 10 ms; the loop takes its outputs back 1 ms later as a rule, and
        30 ms later once (a burst kept it busy). t(b) is fit from 10 ms plus the usual 1 ms, the
        stall included in busy time only."""
        h = Instances(1, max_batch_size=1)
        predictor = Predictor()
        lates = [0.001, 0.001, 0.001, 0.030, 0.001]
        h.batcher = Batcher(
            h.queue,
            SelfTimed(seconds=0.010, late_s=lates),
            h.observer,
            clock=asyncio.get_running_loop().time,
            predictor=predictor,
        )
        task = h.start()
        for value in range(len(lates)):
            assert doubled(await h.put(value)) == [2.0 * value]
        assert h.observer.compute_s == pytest.approx([0.011] * 5)
        assert predictor.timing.seconds(1) == pytest.approx(0.011)
        assert h.batcher.busy_seconds() == pytest.approx(5 * 0.010 + sum(lates))
        h.queue.close()
        await task

    def test_a_stall_is_a_delay_far_past_the_usual_and_longer_than_the_batch(self) -> None:
        delays = LoopDelay()
        # with nothing measured yet, a delay longer than the batch is a stall
        assert delays.compute_s(timed_s=0.010, span_s=0.050) == pytest.approx(0.010)
        delays = LoopDelay()
        for _ in range(10):
            assert delays.compute_s(timed_s=0.010, span_s=0.012) == pytest.approx(0.012)
        # noise under load is the batch's own: up to four times the usual 2 ms...
        assert delays.compute_s(timed_s=0.010, span_s=0.018) == pytest.approx(0.018)
        # ...or, on a tiny model whose hand-off dwarfs it, up to the batch's own time
        assert delays.compute_s(timed_s=0.010, span_s=0.020) == pytest.approx(0.020)
        # past both, the batch is counted with the usual delay
        assert delays.compute_s(timed_s=0.010, span_s=0.200) == pytest.approx(0.012)
        tiny = LoopDelay()
        for _ in range(10):
            tiny.compute_s(timed_s=0.0001, span_s=0.0011)  # a 0.1 ms batch, 1 ms hand-off
        assert tiny.compute_s(timed_s=0.0001, span_s=0.0031) == pytest.approx(0.0031)
        assert tiny.compute_s(timed_s=0.0001, span_s=0.2301) == pytest.approx(0.0011)

    def test_the_batcher_needs_at_least_one_instance(self) -> None:
        async def make() -> None:
            queue = BatchQueue(
                settings=lambda: BatchSettings(max_batch_size=1, max_queue_delay_s=0.0),
                capacity=1,
            )
            Batcher(queue, OverlapEngine(), Computed(), instances=0)

        with pytest.raises(ValueError, match="instances must be at least 1"):
            asyncio.run(make())


class TestSimulatedDevice:
    @pytest.mark.looptime
    async def test_instances_share_one_device_so_batches_serialize_on_it(self) -> None:
        engine = SimulatedEngine(SIGNATURE, LatencyModel(alpha_s=0.010, beta_s=0.001), instances=2)
        loop = asyncio.get_running_loop()
        x = np.zeros((4, 1), np.float32)
        await asyncio.gather(engine.run({"x": x}), engine.run({"x": x}))
        # one device: 14 ms + 14 ms, never 14 ms for both
        assert loop.time() == pytest.approx(0.028)
        assert engine.info.instances == 2
        assert "2 instances sharing one device" in engine.info.detail


class TestOnnxInstances:
    def test_threads_are_split_between_instances(self) -> None:
        assert threads_per_instance(instances=2, cores=8) == 4
        assert threads_per_instance(instances=3, cores=8) == 2
        assert threads_per_instance(instances=4, cores=2) == 1  # never 0
        assert threads_per_instance(instances=2, cores=1.5) == 1

    async def test_each_instance_is_its_own_session_and_all_answer_correctly(
        self, mlp_model: Path
    ) -> None:
        engine = OnnxEngine.load(mlp_model, name="mlp", device="cpu", instances=3)
        try:
            assert engine.instances == 3
            assert engine.info.instances == 3
            assert "3 instances" in engine.info.detail
            reference = ort.InferenceSession(str(mlp_model), providers=["CPUExecutionProvider"])
            rng = np.random.default_rng(3)
            batches = [rng.standard_normal((n, 64)).astype(np.float32) for n in (1, 5, 2, 8, 3)]
            outputs = await asyncio.gather(*(engine.run({"x": x}) for x in batches))
            for x, out in zip(batches, outputs, strict=True):
                want = reference.run(["logits"], {"x": x})[0]
                np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-5)
        finally:
            await engine.close()

    def test_zero_instances_is_refused(self, mlp_model: Path) -> None:
        with pytest.raises(ValueError, match="instances must be at least 1"):
            OnnxEngine.load(mlp_model, name="mlp", device="cpu", instances=0)


class TestSettings:
    def test_instances_come_from_the_environment_and_flags_win(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("BATCHPILOT_INSTANCES", "3")
        assert RuntimeSettings(model_path=Path("m.onnx")).instances == 3
        assert RuntimeSettings(model_path=Path("m.onnx"), instances=2).instances == 2

    @pytest.mark.parametrize("bad", [0, 17])
    def test_out_of_range_instances_are_refused_with_the_range(self, bad: int) -> None:
        with pytest.raises(ValidationError, match="instances") as error:
            RuntimeSettings(model_path=Path("m.onnx"), instances=bad)
        assert ("greater than or equal to 1" if bad < 1 else "less than or equal to 16") in str(
            error.value
        )


# --- The real server --------------------------------------------------------------------------


def infer_body(x: np.ndarray[Any, Any]) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel()}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


@pytest.mark.slow
class TestServerWithInstances:
    def test_two_onnx_instances_answer_correctly_and_keep_utilization_below_one(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        reference = ort.InferenceSession(str(mlp_model), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(11)
        inputs = [rng.standard_normal((1 + i % 3, 64)).astype(np.float32) for i in range(48)]
        with runtime_process(
            mlp_model,
            "--device",
            "cpu",
            "--instances",
            "2",
            "--max-batch-size",
            "2",
            "--max-queue-delay-ms",
            "0",
            log_dir=tmp_path,
        ) as server:
            meta = send(server, "GET", "/v2/models/mlp").json()
            assert meta["parameters"]["instances"] == 2
            assert "2 instances" in meta["parameters"]["detail"]
            assert metric(server, "batchpilot_engine_instances") == 2

            started = time.monotonic()

            def call(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
                reply = send(server, "POST", "/v2/models/mlp/infer", infer_body(x))
                assert reply.status == 200, reply.body
                out = reply.json()["outputs"][0]
                return np.asarray(out["data"], np.float32).reshape(out["shape"])

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(call, inputs, timeout=60))
            elapsed = time.monotonic() - started
            for x, got in zip(inputs, answers, strict=True):
                want = reference.run(["logits"], {"x": x})[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

            busy = metric(server, "batchpilot_device_busy_seconds_total")
            compute = metric(server, "batchpilot_batch_compute_seconds_total")
            # Each batch computes within its span: the sum of the batches' compute times is at
            # most two instances' union of spans, which never exceeds the time that passed.
            assert 0 < compute <= 2 * busy + 1e-9
            assert busy <= elapsed  # a rate of at most 1
        assert "2 instances" in server.log()


async def test_closing_does_not_wait_for_a_run_that_never_ends() -> None:
    """A GPU that hangs holds its run's thread for ever: closing waited for it on the event
    loop, and the process never exited on SIGTERM. Closing now lets the thread go; the count of
    runs on threads tells the process it must not wait at exit."""
    release = threading.Event()
    instances = EngineInstances(["session"], thread_name="hung")
    running = asyncio.ensure_future(instances.run(lambda handle: release.wait(5.0)))
    deadline = time.monotonic() + 5
    while running_on_threads() == 0:
        assert time.monotonic() < deadline, "the run never started"
        await asyncio.sleep(0.01)
    began = time.monotonic()
    instances.close()
    assert time.monotonic() - began < 1.0
    assert running_on_threads() == 1
    release.set()
    assert await running is True
    assert running_on_threads() == 0
