"""The batch queue and the batch loop, with a fake engine and a fake clock (looptime).

Loop time starts at 0 and only moves when every task is waiting, so the waits asserted here are
exact: a batch that should form after 5 ms forms at 0.005, not "about then".
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from batchpilot.runtime.batching import Batch, Batcher, BatchQueue, BatchSettings
from batchpilot.runtime.batching.batcher import SYSTEMATIC_FAILURES
from batchpilot.runtime.engine import EngineInfo, ModelSignature, TensorSpec
from batchpilot.runtime.errors import (
    DeadlineExceeded,
    EngineFailure,
    Overloaded,
    RefusedByModel,
    ShuttingDown,
)
from batchpilot.runtime.outcomes import BatchDone, RequestOutcome, status_of

pytestmark = pytest.mark.looptime

SIGNATURE = ModelSignature(
    name="double",
    platform="test",
    inputs=(TensorSpec("x", "FP32", (-1, -1)),),
    outputs=(TensorSpec("y", "FP32", (-1, -1)),),
)


class FakeEngine:
    """Doubles its input after `compute_s` of loop time; records every batch it ran."""

    def __init__(self, *, compute_s: float = 0.0) -> None:
        self.compute_s = compute_s
        self.batches: list[int] = []
        self.fail_with: Exception | None = None
        self.drop_row = False
        self.refuse_negative = False
        """Fail any batch holding a negative value, as a model fails on one bad row."""

    @property
    def signature(self) -> ModelSignature:
        return SIGNATURE

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(kind="fake", device="cpu", simulated=True)

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        x = inputs["x"]
        self.batches.append(x.shape[0])
        await asyncio.sleep(self.compute_s)
        if self.fail_with is not None:
            raise self.fail_with
        if self.refuse_negative and (x < 0).any():
            raise RuntimeError(f"INVALID_ARGUMENT : indices element out of bounds, idx={x.min()}")
        y = x * 2
        return {"y": y[:-1] if self.drop_row else y}

    async def close(self) -> None:
        pass


class RecordingObserver:
    def __init__(self) -> None:
        self.done: list[tuple[int, int]] = []
        self.failed: list[tuple[int, int]] = []
        self.waits: list[float] = []

    def batch_done(self, done: BatchDone) -> None:
        self.done.append((done.rows, done.requests))
        self.waits.extend(done.queue_waits_s)

    def batch_failed(self, *, rows: int, requests: int, compute_s: float) -> None:
        self.failed.append((rows, requests))


class Harness:
    def __init__(
        self,
        *,
        max_batch_size: int = 4,
        delay_s: float = 0.005,
        capacity: int = 100,
        early_start: bool = True,
    ):
        self.settings = BatchSettings(max_batch_size=max_batch_size, max_queue_delay_s=delay_s)
        loop = asyncio.get_running_loop()
        self.queue = BatchQueue(
            settings=lambda: self.settings,
            capacity=capacity,
            clock=loop.time,
            early_start=early_start,
        )
        self.engine = FakeEngine()
        self.observer = RecordingObserver()
        self.batcher = Batcher(self.queue, self.engine, self.observer, clock=loop.time)

    def put(self, *values: float, width: int = 1, timeout_s: float | None = None) -> Any:
        x = np.array([[v] * width for v in values], dtype=np.float32)
        return self.queue.put({"x": x}, rows=len(values), timeout_s=timeout_s)

    async def __aenter__(self) -> Harness:
        self.task = asyncio.get_running_loop().create_task(self.batcher.run())
        return self

    async def __aexit__(self, *_: object) -> None:
        self.queue.close()
        await asyncio.wait_for(self.task, 60)


def rows_of(result: dict[str, np.ndarray[Any, Any]]) -> list[float]:
    return [float(v) for v in result["y"][:, 0]]


class TestBatchFormation:
    async def test_a_lone_request_waits_the_queue_delay_then_runs_alone(self) -> None:
        async with Harness(max_batch_size=4, delay_s=0.005) as h:
            loop = asyncio.get_running_loop()
            result = await h.put(1.0)
            assert loop.time() == pytest.approx(0.005)
            assert rows_of(result) == [2.0]
            assert h.engine.batches == [1]

    async def test_a_full_batch_runs_at_once_without_waiting(self) -> None:
        async with Harness(max_batch_size=4, delay_s=1.0) as h:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(*(h.put(v) for v in (1, 2, 3, 4)))
            assert loop.time() == pytest.approx(0.0)
            assert h.engine.batches == [4]
            assert [rows_of(r) for r in results] == [[2.0], [4.0], [6.0], [8.0]]

    async def test_requests_are_served_in_arrival_order_in_batches_of_max_size(self) -> None:
        async with Harness(max_batch_size=3, delay_s=0.01) as h:
            results = await asyncio.gather(*(h.put(v) for v in range(7)))
            # 7 requests, at most 3 rows a batch: 3 + 3 + 1 (the last one waits the delay).
            assert h.engine.batches == [3, 3, 1]
            assert [rows_of(r) for r in results] == [[2.0 * v] for v in range(7)]

    async def test_multi_row_requests_are_never_split_and_each_gets_its_own_rows(self) -> None:
        async with Harness(max_batch_size=4, delay_s=0.01) as h:
            a, b, c = await asyncio.gather(h.put(1, 2), h.put(3, 4, 5), h.put(6, 7))
            # a (2) + b (3) = 5 > 4: b waits, and c (2), behind it, fills a's batch; b, still
            # the oldest waiting, runs next, after waiting the queue delay for company.
            assert h.engine.batches == [4, 3]
            assert rows_of(a) == [2.0, 4.0]
            assert rows_of(b) == [6.0, 8.0, 10.0]
            assert rows_of(c) == [12.0, 14.0]

    async def test_the_room_a_request_that_does_not_fit_leaves_is_filled_from_behind(
        self,
    ) -> None:
        async with Harness(max_batch_size=8, delay_s=0.01) as h:
            sizes = (3, 6, 4, 1, 2, 5)
            results = await asyncio.gather(*(h.put(*range(n)) for n in sizes))
            # 3 + 6 > 8: 6 waits; behind it 4 fits (7), 1 fits (8), the batch is full. Then
            # the 6, the oldest left, with the 2 (8); the 5 last, after the queue delay.
            assert h.engine.batches == [8, 8, 5]
            assert [len(rows_of(r)) for r in results] == list(sizes)
            assert [rows_of(r)[-1] for r in results] == [2.0 * (n - 1) for n in sizes]

    async def test_a_request_larger_than_the_batch_limit_runs_alone(self) -> None:
        async with Harness(max_batch_size=2, delay_s=0.01) as h:
            big, small = await asyncio.gather(h.put(1, 2, 3, 4, 5), h.put(6))
            assert h.engine.batches == [5, 1]
            assert rows_of(big) == [2.0, 4.0, 6.0, 8.0, 10.0]
            assert rows_of(small) == [12.0]

    async def test_requests_with_different_shapes_never_share_a_batch(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.01) as h:
            narrow1, wide, narrow2 = await asyncio.gather(
                h.put(1, width=2), h.put(2, width=3), h.put(3, width=2)
            )
            # The oldest request's shape goes first and takes its like; the other waits.
            assert h.engine.batches == [2, 1]
            assert narrow1["y"].shape == (1, 2)
            assert narrow2["y"].shape == (1, 2)
            assert wide["y"].shape == (1, 3)

    async def test_the_delay_counts_from_the_oldest_request_not_the_newest(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.010) as h:
            loop = asyncio.get_running_loop()
            first = h.put(1)
            await asyncio.sleep(0.004)
            second = h.put(2)
            await asyncio.gather(first, second)
            assert loop.time() == pytest.approx(0.010)
            assert h.engine.batches == [2]
            assert h.observer.waits == pytest.approx([0.010, 0.006])


class TestNobodyElseComing:
    """A batch stops waiting to fill once the requests outstanding are as many as the most the
    queue has held at once, seen before (`batching.population`): a closed loop's clients are
    all queued and none will send again before it is answered."""

    @staticmethod
    async def closed_loop(h: Harness, *, clients: int, rounds: int) -> list[float]:
        """`clients` that each send their next request once the last is answered; when the
        answers came."""
        loop = asyncio.get_running_loop()
        answered: list[float] = []

        async def client(value: float) -> None:
            for _ in range(rounds):
                await h.put(value)
                answered.append(loop.time())

        await asyncio.gather(*(client(float(index)) for index in range(clients)))
        return answered

    async def test_a_closed_loop_waits_the_delay_once_then_never_again(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.050) as h:
            h.engine.compute_s = 0.001
            answered = await self.closed_loop(h, clients=2, rounds=10)
            # The first batch of two waits out the delay (two at once was never seen before);
            # every later one starts as soon as both are back, and runs its 1 ms.
            assert h.engine.batches == [2] * 10
            assert answered[:2] == pytest.approx([0.051, 0.051])
            assert answered[-1] == pytest.approx(0.051 + 9 * 0.001)
            assert h.observer.waits[2:] == pytest.approx([0.0] * 18)

    async def test_without_early_start_every_batch_waits_out_the_delay(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.050, early_start=False) as h:
            h.engine.compute_s = 0.001
            answered = await self.closed_loop(h, clients=2, rounds=10)
            assert h.engine.batches == [2] * 10
            assert answered[-1] == pytest.approx(10 * 0.051)

    async def test_a_client_more_than_ever_seen_at_once_still_waits_the_delay(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.050) as h:
            loop = asyncio.get_running_loop()
            for _ in range(3):  # one at a time: the most ever held is 1, seen often
                await h.put(1.0)
            started = loop.time()
            # One at a time, they wait for nobody; then two come at once, a count never seen:
            assert started == pytest.approx(0.050)  # (the very first waited the delay)
            await asyncio.gather(h.put(1.0), h.put(2.0))
            assert h.engine.batches == [1, 1, 1, 2]
            assert loop.time() - started == pytest.approx(0.050)

    async def test_requests_arriving_on_their_own_clock_fill_their_batches_as_before(
        self,
    ) -> None:
        async with Harness(max_batch_size=8, delay_s=0.010) as h:
            # Open-loop arrivals every 4 ms: each batch holds the three that come within its
            # delay. The first waits the delay out (at 10 ms); the next ones start with their
            # third request (at 20 and 32 ms), three at once being the most ever seen: the
            # fourth would come after the delay anyway.
            pending = []
            for index in range(9):
                pending.append(h.put(float(index)))
                await asyncio.sleep(0.004)
            await asyncio.gather(*pending)
            assert h.engine.batches == [3, 3, 3]
            assert h.observer.waits == pytest.approx(
                [0.010, 0.006, 0.002] + [0.008, 0.004, 0.0] * 2
            )

    async def test_a_closed_loop_after_a_burst_waits_a_few_rounds_not_the_horizon(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.050) as h:
            h.engine.compute_s = 0.001
            for _ in range(2):  # a burst: six at once, twice (the second starts at once)
                await asyncio.gather(*(h.put(float(index)) for index in range(6)))
            answered = await self.closed_loop(h, clients=2, rounds=12)
            # Two at once is not the most held: rounds wait out the delay until two has come
            # back eight times with nothing above it — four rounds here, where the first client
            # answered is back before the second's answer is counted (two reaches a round) —
            # 0.2 s after the burst, not the 5 s it is otherwise remembered.
            assert h.engine.batches == [6, 6] + [2] * 12
            assert h.observer.waits[12:] == pytest.approx([0.050] * 8 + [0.0] * 16)
            assert answered[-1] == pytest.approx(0.052 + 4 * 0.051 + 8 * 0.001)


class TestSettingsChangeWhileServing:
    async def test_each_batch_reads_the_settings_in_force_when_it_forms(self) -> None:
        async with Harness(max_batch_size=2, delay_s=0.01) as h:
            await asyncio.gather(*(h.put(v) for v in range(4)))
            h.settings = BatchSettings(max_batch_size=4, max_queue_delay_s=0.01)
            await asyncio.gather(*(h.put(v) for v in range(4)))
            h.settings = BatchSettings(max_batch_size=1, max_queue_delay_s=0.0)
            await asyncio.gather(*(h.put(v) for v in range(2)))
            assert h.engine.batches == [2, 2, 4, 1, 1]

    async def test_zero_delay_runs_what_is_there_immediately(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.0) as h:
            loop = asyncio.get_running_loop()
            await h.put(1)
            assert loop.time() == 0.0
            assert h.engine.batches == [1]

    def test_settings_are_validated(self) -> None:
        with pytest.raises(ValueError, match="max_batch_size must be at least 1"):
            BatchSettings(max_batch_size=0, max_queue_delay_s=0.0)
        with pytest.raises(ValueError, match="max_queue_delay"):
            BatchSettings(max_batch_size=1, max_queue_delay_s=-1)


class TestFailures:
    async def test_an_engine_error_reaches_every_request_in_the_batch(self) -> None:
        async with Harness(max_batch_size=3, delay_s=0.01) as h:
            h.engine.fail_with = RuntimeError("device lost")
            results = await asyncio.gather(*(h.put(v) for v in range(3)), return_exceptions=True)
            assert all(isinstance(r, EngineFailure) for r in results)
            assert not any(isinstance(r, RefusedByModel) for r in results)  # nothing ran: 500
            assert "device lost" in str(results[0])
            # Run again in halves, then alone, to find whose inputs it fails on: every run fails.
            assert h.observer.failed == [(3, 3), (1, 1), (2, 2), (1, 1), (1, 1)]
            h.engine.fail_with = None
            assert rows_of(await h.put(5)) == [10.0]  # the loop survives

    async def test_a_wrong_number_of_output_rows_fails_every_request(self) -> None:
        async with Harness(max_batch_size=2, delay_s=0.01) as h:
            h.engine.drop_row = True
            results = await asyncio.gather(h.put(1), h.put(2), return_exceptions=True)
            assert all(isinstance(r, EngineFailure) for r in results)
            assert "returned 0 rows of output 'y' for a batch of 1 rows" in str(results[0])

    async def test_a_request_the_model_fails_on_is_refused_and_the_rest_of_its_batch_answered(
        self,
    ) -> None:
        async with Harness(max_batch_size=8, delay_s=0.01) as h:
            h.engine.refuse_negative = True
            values = [1.0, 2.0, 3.0, -4.0, 5.0, 6.0, 7.0, 8.0]
            results = await asyncio.gather(*(h.put(v) for v in values), return_exceptions=True)
            refused = results.pop(3)
            assert [rows_of(r) for r in results] == [[2 * v] for v in values if v > 0]
            assert isinstance(refused, RefusedByModel)
            assert status_of(refused) == (400, RequestOutcome.INVALID)
            assert str(refused) == (
                "the model failed on this request's inputs, while 7 of the 7 requests batched "
                "with it ran: INVALID_ARGUMENT : indices element out of bounds, idx=-4.0"
            )
            # The batch, then the half holding it at each halving (its other half ran): 4, 2, 1.
            assert h.observer.failed == [(8, 8), (4, 4), (2, 2), (1, 1)]
            assert sorted(h.observer.done) == [(1, 1), (2, 2), (4, 4)]

    async def test_two_bad_requests_in_one_batch_are_both_found(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.01) as h:
            h.engine.refuse_negative = True
            values = [-1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0]
            results = await asyncio.gather(*(h.put(v) for v in values), return_exceptions=True)
            assert [type(r) for r in results] == [RefusedByModel] + [dict] * 6 + [RefusedByModel]
            assert "while 6 of the 7 requests batched with it ran" in str(results[0])

    async def test_a_request_alone_in_its_batch_is_refused_where_the_engine_runs_others(
        self,
    ) -> None:
        async with Harness(max_batch_size=8, delay_s=0.0) as h:
            h.engine.refuse_negative = True
            first = await asyncio.gather(h.put(-1.0), return_exceptions=True)
            # The engine's first run: nothing says the engine can run at all.
            assert type(first[0]) is EngineFailure
            assert rows_of(await h.put(2.0)) == [4.0]
            for n in range(SYSTEMATIC_FAILURES - 1):  # one after another, each alone
                refused = await asyncio.gather(h.put(-3.0 - n), return_exceptions=True)
                assert isinstance(refused[0], RefusedByModel)
                assert str(refused[0]).startswith(
                    "the model failed on this request's inputs, while the engine runs others: "
                )
            # Eight failed runs in a row, none between that ran: the engine is what fails.
            failed = await asyncio.gather(h.put(-20.0), return_exceptions=True)
            assert type(failed[0]) is EngineFailure
            assert rows_of(await h.put(2.0)) == [4.0]
            refused = await asyncio.gather(h.put(-21.0), return_exceptions=True)
            assert isinstance(refused[0], RefusedByModel)

    async def test_an_engine_that_fails_everything_is_not_split_again_and_again(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.01) as h:
            h.engine.fail_with = RuntimeError("device lost")
            for _ in range(3):
                results = await asyncio.gather(
                    *(h.put(float(v)) for v in range(8)), return_exceptions=True
                )
                assert all(type(r) is EngineFailure for r in results)
            # The first batch is run in parts until SYSTEMATIC_FAILURES runs have failed in a
            # row (8 rows, 4, 4, four of 2, one alone); the parts left, and every batch after
            # it, fail at once.
            assert [rows for rows, _ in h.observer.failed] == [8, 4, 4, 2, 2, 2, 2, 1, 8, 8]
            assert SYSTEMATIC_FAILURES == 8
            h.engine.fail_with = None
            assert rows_of(await h.put(5)) == [10.0]
            h.engine.refuse_negative = True  # one that ran: parts are tried again
            results = await asyncio.gather(h.put(1.0), h.put(-2.0), return_exceptions=True)
            assert rows_of(results[0]) == [2.0]
            assert isinstance(results[1], RefusedByModel)

    async def test_several_bad_requests_in_a_batch_cost_the_good_ones_nothing(self) -> None:
        """Four bad requests spread over a batch of 32: their halves fail in a row, past
        `SYSTEMATIC_FAILURES`. The known-good batch runs, so the search goes on: before, the 28
        good requests were answered 500 by an engine that ran."""
        async with Harness(max_batch_size=32, delay_s=0.01) as h:
            h.batcher.known_good(KNOWN_GOOD)
            h.engine.refuse_negative = True
            values = [-float(v) if v in (3, 11, 19, 27) else float(v) for v in range(32)]
            results = await asyncio.gather(*(h.put(v) for v in values), return_exceptions=True)
            refused = [r for r in results if isinstance(r, Exception)]
            assert len(refused) == 4
            assert all(isinstance(r, RefusedByModel) for r in refused)
            assert sum(1 for r in results if isinstance(r, dict)) == 28

    async def test_a_part_whose_requests_have_all_expired_is_not_run(self) -> None:
        """A split runs its parts one after another: those whose requests were answered at
        their deadline (504) meanwhile, or whose deadlines passed, do not reach the device."""
        async with Harness(max_batch_size=8, delay_s=0.0) as h:
            h.engine.compute_s = 0.040
            h.engine.refuse_negative = True
            values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0]
            results = await asyncio.gather(
                *(h.put(v, timeout_s=0.1) for v in values), return_exceptions=True
            )
            # 8 rows fail (40 ms), 4 rows ran (80 ms), the 4 holding the bad one fail (120 ms):
            # every deadline has passed, and nothing more runs.
            assert h.engine.batches == [8, 4, 4]
            assert all(isinstance(r, DeadlineExceeded) for r in results[4:])

    async def test_a_full_queue_refuses_at_once(self) -> None:
        h = Harness(max_batch_size=1, delay_s=0.0, capacity=2)
        h.put(1)
        h.put(2)
        with pytest.raises(Overloaded, match="queue is full"):
            h.put(3)
        assert len(h.queue) == 2


KNOWN_GOOD = {"x": np.zeros((1, 1), dtype=np.float32)}
"""What the server's warm-up would run on the fake engine's model."""


class TestAKnownGoodBatch:
    """With the batch the engine ran at start (the server's warm-up inputs), a request the model
    fails on with nothing else running is told from an engine that fails everything."""

    async def test_a_bad_request_alone_is_refused_from_the_first_run(self) -> None:
        async with Harness(max_batch_size=8, delay_s=0.0) as h:
            h.batcher.known_good(KNOWN_GOOD)
            h.engine.refuse_negative = True
            refused = await asyncio.gather(h.put(-1.0), return_exceptions=True)
            assert isinstance(refused[0], RefusedByModel)
            assert str(refused[0]).startswith(
                "the model failed on this request's inputs, while the model runs a known-good "
                "batch: INVALID_ARGUMENT"
            )
            assert h.engine.batches == [1, 1]  # the request, then the known-good batch
            assert h.batcher.broken is None

    async def test_a_batch_of_bad_requests_only_is_refused(self) -> None:
        async with Harness(max_batch_size=2, delay_s=0.01) as h:
            h.batcher.known_good(KNOWN_GOOD)
            h.engine.refuse_negative = True
            results = await asyncio.gather(h.put(-1.0), h.put(-2.0), return_exceptions=True)
            assert [type(r) for r in results] == [RefusedByModel, RefusedByModel]
            assert h.engine.batches == [2, 1, 1, 1]  # the batch, each alone, the check once

    async def test_an_engine_that_answers_the_wrong_rows_is_no_client_s_fault(self) -> None:
        """The known-good batch's rows are checked too: it "ran", and the request alone that
        got the wrong rows was refused with 400 for its inputs, the replica staying ready."""
        async with Harness(max_batch_size=2, delay_s=0.0) as h:
            h.batcher.known_good(KNOWN_GOOD)
            h.engine.drop_row = True
            results = await asyncio.gather(h.put(1.0), return_exceptions=True)
            assert type(results[0]) is EngineFailure
            assert h.batcher.broken is not None
            assert "returned 0 rows of output 'y' for a batch of 1 rows" in h.batcher.broken

    async def test_an_engine_that_fails_the_known_good_batch_is_broken_until_one_runs(
        self,
    ) -> None:
        async with Harness(max_batch_size=4, delay_s=0.01) as h:
            h.batcher.known_good(KNOWN_GOOD)
            assert rows_of(await h.put(1.0)) == [2.0]
            h.engine.fail_with = RuntimeError("CUDA error: an illegal memory access")
            failed = await asyncio.gather(h.put(2.0), return_exceptions=True)
            assert type(failed[0]) is EngineFailure
            assert h.batcher.broken == (
                "the engine fails the batch it ran at start: CUDA error: an illegal memory access"
            )
            h.engine.batches.clear()
            results = await asyncio.gather(*(h.put(v) for v in range(4)), return_exceptions=True)
            assert all(type(r) is EngineFailure for r in results)
            assert h.engine.batches == [4]  # at once: no parts, no check
            assert not await h.batcher.check_engine()
            h.engine.fail_with = None
            assert await h.batcher.check_engine()
            assert h.batcher.broken is None
            assert rows_of(await h.put(3.0)) == [6.0]


class TestCallersThatGoAway:
    async def test_a_cancelled_request_leaves_the_queue_and_is_never_computed(self) -> None:
        async with Harness(max_batch_size=4, delay_s=0.01) as h:
            gone = h.put(99)
            kept = h.put(1)
            gone.cancel()
            await asyncio.sleep(0)
            assert len(h.queue) == 1
            assert rows_of(await kept) == [2.0]
            assert h.engine.batches == [1]

    async def test_when_every_request_of_a_forming_batch_goes_away_nothing_runs(self) -> None:
        async with Harness(max_batch_size=4, delay_s=0.01) as h:
            gone = h.put(1)
            await asyncio.sleep(0.005)
            gone.cancel()
            await asyncio.sleep(0.02)
            assert h.engine.batches == []
            assert rows_of(await h.put(2)) == [4.0]

    async def test_a_request_past_its_deadline_fails_instead_of_running(self) -> None:
        async with Harness(max_batch_size=1, delay_s=0.0) as h:
            h.engine.compute_s = 0.05
            first = h.put(1)
            late = h.put(2, timeout_s=0.01)
            assert rows_of(await first) == [2.0]
            with pytest.raises(DeadlineExceeded):
                await late
            assert h.engine.batches == [1]


class TestShutdown:
    async def test_closing_refuses_new_requests_and_serves_the_queued_ones(self) -> None:
        h = Harness(max_batch_size=2, delay_s=0.01)
        queued = [h.put(v) for v in range(3)]
        h.queue.close()
        with pytest.raises(ShuttingDown):
            h.put(9)
        await asyncio.wait_for(h.batcher.run(), 1)  # returns once drained
        assert [rows_of(f.result()) for f in queued] == [[0.0], [2.0], [4.0]]

    async def test_abandoning_fails_every_queued_request(self) -> None:
        h = Harness()
        queued = [h.put(v) for v in range(3)]
        assert h.queue.abandon(ShuttingDown("stop")) == 3
        assert all(isinstance(f.exception(), ShuttingDown) for f in queued)
        assert len(h.queue) == 0

    async def test_an_empty_closed_queue_ends_the_batch_loop(self) -> None:
        h = Harness()
        h.queue.close()
        assert await h.queue.next_batch() is None


def test_batch_rows_add_up() -> None:
    settings = BatchSettings(max_batch_size=4, max_queue_delay_s=0.0)
    assert Batch(items=(), settings=settings, formed_at=0.0).rows == 0
