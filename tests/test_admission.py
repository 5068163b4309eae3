"""Deadline-aware admission: the t(b) fit, the finish-time prediction, and the queue that refuses
at arrival what cannot finish in time and sizes batches to the deadline.

The queue tests run on looptime's fake clock with an engine whose batch takes exactly
α + β·b of loop time, so every wait and every refusal asserted here is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from batchpilot.runtime.admission import (
    LATENESS_WINDOW_S,
    SIZE_MEMORY_BATCHES,
    UNMEASURED_LATENESS_SHARE,
    BatchTiming,
    DeviceLedger,
    Lateness,
    Predictor,
    predicted_finish,
)
from batchpilot.runtime.batching import Batcher, BatchQueue, BatchSettings
from batchpilot.runtime.engine import EngineInfo
from batchpilot.runtime.errors import DeadlineExceeded, Overloaded, TooLargeForDeadline
from tests.test_batching import SIGNATURE, RecordingObserver


def exact_timing(alpha_s: float, beta_s: float, sizes: tuple[int, ...] = (1, 8)) -> BatchTiming:
    timing = BatchTiming()
    for _ in range(3):
        for rows in sizes:
            timing.observe(rows, alpha_s + beta_s * rows)
    return timing


class TestBatchTiming:
    def test_nothing_measured_predicts_nothing(self) -> None:
        timing = BatchTiming()
        assert timing.fit is None
        assert timing.seconds(4) is None
        assert timing.upper(4) is None

    def test_two_sizes_recover_alpha_and_beta(self) -> None:
        timing = exact_timing(0.020, 0.001)
        fit = timing.fit
        assert fit is not None
        assert fit.alpha_s == pytest.approx(0.020)
        assert fit.beta_s == pytest.approx(0.001)
        assert timing.seconds(32) == pytest.approx(0.052)  # 20 + 1 * 32 ms
        assert fit.spread == pytest.approx(0.0, abs=1e-9)  # exact data: no prediction error
        assert timing.upper(32) == pytest.approx(0.052)

    def test_one_size_is_read_conservatively_both_ways(self) -> None:
        timing = BatchTiming()
        for _ in range(5):
            timing.observe(4, 0.024)  # truly 20 ms + 1 ms x 4
        # larger: proportional through the one point, 24 / 4 x 8 = 48 ms (truly 28)
        assert timing.seconds(8) == pytest.approx(0.048)
        # smaller: that point's time, 24 ms (truly 21)
        assert timing.seconds(1) == pytest.approx(0.024)

    def test_a_slope_is_not_forgotten_while_traffic_runs_one_size(self) -> None:
        timing = exact_timing(0.020, 0.001)
        for _ in range(10 * SIZE_MEMORY_BATCHES):
            timing.observe(1, 0.021)
        assert timing.seconds(64) == pytest.approx(0.084)  # 20 + 64 ms

    def test_a_size_follows_its_recent_batches(self) -> None:
        timing = exact_timing(0.020, 0.001)
        for _ in range(10 * SIZE_MEMORY_BATCHES):  # the device slowed down: batches of 8 take 2x
            timing.observe(8, 0.056)
        assert timing.seconds(8) == pytest.approx(0.056, rel=0.01)

    def test_noise_widens_the_high_estimate(self) -> None:
        timing = exact_timing(0.010, 0.001)
        rng = np.random.default_rng(7)
        for _ in range(400):
            rows = int(rng.choice([1, 8]))
            timing.observe(rows, (0.010 + 0.001 * rows) * float(rng.uniform(0.8, 1.2)))
        fit = timing.fit
        assert fit is not None
        # uniform ±20 %: standard deviation 0.4 / √12 ≈ 0.115 of the mean
        assert fit.spread == pytest.approx(0.115, rel=0.3)
        expected = timing.seconds(8)
        upper = timing.upper(8)
        assert expected is not None
        assert upper is not None
        assert upper == pytest.approx(expected * (1 + 2 * fit.spread))
        # four batches in a row: the sum's deviation grows as √4 = 2, not 4
        assert timing.upper(8, batches=4) == pytest.approx(4 * expected * (1 + fit.spread))

    def test_how_much_batches_vary_is_said_once_ten_were_predicted(self) -> None:
        timing = BatchTiming()
        assert timing.cv is None
        rng = np.random.default_rng(8)
        sigma = math.sqrt(math.log1p(0.3**2))
        for n in range(400):
            rows = int(rng.choice([1, 8]))
            factor = float(rng.lognormal(-sigma * sigma / 2, sigma))
            timing.observe(rows, (0.010 + 0.001 * rows) * factor)
            if n < 10:
                assert timing.cv is None  # the first batches fit, they are not predicted
        # Batches of ±30 % (log-normal): the last ~50 batches' root mean square error.
        assert timing.cv == pytest.approx(0.3, rel=0.35)
        steady = exact_timing(0.010, 0.001)
        for _ in range(20):
            steady.observe(8, 0.018)
        assert steady.cv == pytest.approx(0.0, abs=1e-9)

    def test_one_stall_is_no_measure_of_the_device(self) -> None:
        """A 4 s batch against 12 ms predicted (the device stopped: a size tuned at its first
        batch, a neighbour's burst). Counted in full it multiplied every prediction a hundred
        times, and the refusals that followed let too few batches through to correct it."""
        timing = exact_timing(0.010, 0.002)
        noisy = [0.012 * f for f in (1.05, 0.95) * 10]
        for seconds in noisy:
            timing.observe(1, seconds)
        before = timing.upper(1)
        timing.observe(1, 4.0)
        assert timing.stalls == 1
        assert timing.seconds(1) == pytest.approx(0.012, rel=0.05)  # the mean is untouched
        after = timing.upper(1)
        assert before is not None
        assert after is not None
        assert after < 3 * before  # the spread counts it as an outlier (ERROR_CAP), no more
        for seconds in noisy:
            timing.observe(1, seconds)
        assert timing.upper(1) < 2 * before

    def test_a_device_slower_for_good_is_its_pace_from_the_second_slow_batch(self) -> None:
        timing = exact_timing(0.010, 0.002)
        for _ in range(5 * SIZE_MEMORY_BATCHES):  # 20 times slower from now on
            for rows in (1, 8):
                timing.observe(rows, 20 * (0.010 + 0.002 * rows))
        assert timing.stalls == 1
        assert timing.seconds(1) == pytest.approx(0.240, rel=0.05)
        assert timing.seconds(8) == pytest.approx(0.520, rel=0.05)

    def test_a_fit_never_says_a_bigger_batch_is_faster(self) -> None:
        timing = BatchTiming()
        for _ in range(3):
            timing.observe(1, 0.030)
            timing.observe(8, 0.020)
        fit = timing.fit
        assert fit is not None
        assert fit.beta_s == 0.0
        assert timing.seconds(64) == pytest.approx(timing.seconds(1) or 0)


class TestPredictedFinish:
    def test_a_batch_past_its_time_counts_as_long_again_as_it_is_late(self) -> None:
        """A run that does not end (a GPU that hangs) is no run about to end: counted as
        ending now, every request was admitted behind it to wait for its deadline."""
        timing = exact_timing(0.020, 0.001)
        ledger = DeviceLedger(instances=1)
        ledger.started(8, now=0.0)  # predicted 28 ms
        assert ledger.busy_s(timing, 0.010) == pytest.approx(0.018)
        assert ledger.busy_s(timing, 0.028) == pytest.approx(0.0)
        assert ledger.busy_s(timing, 2.028) == pytest.approx(2.0)
        finish = predicted_finish(
            timing=timing, ledger=ledger, queued_rows=0, rows=1, max_batch_size=8, now=2.028
        )
        assert finish is not None
        assert finish - 2.028 > 1.0  # refused at a 1 s deadline, not queued to expire

    def test_idle_device_one_request_takes_one_batch(self) -> None:
        timing = exact_timing(0.020, 0.001)
        ledger = DeviceLedger(instances=1)
        finish = predicted_finish(
            timing=timing, ledger=ledger, queued_rows=0, rows=1, max_batch_size=8, now=10.0
        )
        assert finish == pytest.approx(10.021)

    def test_backlog_and_running_batch_come_first(self) -> None:
        timing = exact_timing(0.020, 0.001)
        ledger = DeviceLedger(instances=1)
        ledger.started(8, now=9.990)  # 28 ms batch, 18 ms left at 10.0
        finish = predicted_finish(
            timing=timing, ledger=ledger, queued_rows=19, rows=1, max_batch_size=8, now=10.0
        )
        # 20 rows: two full batches of 8 ahead (2 x 28 ms), then its own, filled to 8 by the
        # rows arriving meanwhile (28 ms)
        assert finish == pytest.approx(10.0 + 0.018 + 0.056 + 0.028)

    def test_instances_share_the_work_ahead_but_not_its_own_batch(self) -> None:
        timing = exact_timing(0.020, 0.001)
        ledger = DeviceLedger(instances=2)
        finish = predicted_finish(
            timing=timing, ledger=ledger, queued_rows=16, rows=8, max_batch_size=8, now=0.0
        )
        assert finish == pytest.approx((2 * 0.028) / 2 + 0.028)

    def test_a_request_larger_than_a_batch_runs_alone_after_the_rows_ahead(self) -> None:
        timing = exact_timing(0.020, 0.001)
        ledger = DeviceLedger(instances=1)
        finish = predicted_finish(
            timing=timing, ledger=ledger, queued_rows=10, rows=20, max_batch_size=8, now=0.0
        )
        # the 10 rows ahead in two batches (2 x 28 ms), then its 20 rows in one (40 ms), as the
        # batcher runs them: not 30 rows in four batches of 8 (112 ms)
        assert finish == pytest.approx(0.056 + 0.040)

    def test_other_shapes_run_in_batches_of_their_own(self) -> None:
        timing = exact_timing(0.020, 0.001)
        ledger = DeviceLedger(instances=1)
        finish = predicted_finish(
            timing=timing,
            ledger=ledger,
            queued_rows=0,
            rows=1,
            max_batch_size=8,
            now=0.0,
            others=[3, 1, 10],
        )
        # 3 rows (23 ms), 1 row (21 ms), 10 rows as 8 and 2 (28 + 22 ms), then its own (21 ms):
        # not 15 rows as two batches shared with it
        assert finish == pytest.approx(0.023 + 0.021 + 0.028 + 0.022 + 0.021)

    def test_unmeasured_predicts_nothing(self) -> None:
        finish = predicted_finish(
            timing=BatchTiming(),
            ledger=DeviceLedger(instances=1),
            queued_rows=100,
            rows=1,
            max_batch_size=8,
            now=0.0,
        )
        assert finish is None


class LinearEngine:
    """A batch of b rows takes exactly α + β·b of loop time; records every batch it ran."""

    def __init__(self, *, alpha_s: float, beta_s: float) -> None:
        self.alpha_s = alpha_s
        self.beta_s = beta_s
        self.batches: list[int] = []

    @property
    def signature(self) -> Any:
        return SIGNATURE

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(kind="fake", device="gpu", simulated=True)

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        x = inputs["x"]
        self.batches.append(x.shape[0])
        await asyncio.sleep(self.alpha_s + self.beta_s * x.shape[0])
        return {"y": x * 2}

    async def close(self) -> None:
        pass


class Served:
    """A queue with a predictor, its batcher and engine on the fake clock."""

    def __init__(
        self,
        *,
        alpha_s: float = 0.020,
        beta_s: float = 0.001,
        max_batch_size: int = 8,
        delay_s: float = 0.0,
        deadline: bool = True,
        burst: int | None = None,
        instances: int = 1,
        answered: bool = True,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.settings = BatchSettings(
            max_batch_size=max_batch_size, max_queue_delay_s=delay_s, burst_batch_size=burst
        )
        self.predictor = Predictor(instances=instances, timing=exact_timing(alpha_s, beta_s))
        if answered:
            # A server that answered on time just now: its predictions are trusted as they are
            # (with no answer at all, the work queued ahead is also kept in reserve).
            self.predictor.lateness.observe(0.0, now=loop.time())
        self.queue = BatchQueue(
            settings=lambda: self.settings,
            capacity=10_000,
            clock=loop.time,
            predictor=self.predictor if deadline else None,
        )
        self.engine = LinearEngine(alpha_s=alpha_s, beta_s=beta_s)
        self.batcher = Batcher(
            self.queue,
            self.engine,
            RecordingObserver(),
            clock=loop.time,
            instances=instances,
            predictor=self.predictor,
        )

    def put(self, timeout_s: float | None, rows: int = 1) -> asyncio.Future[Any]:
        x = np.ones((rows, 1), dtype=np.float32)
        return self.queue.put({"x": x}, rows=rows, timeout_s=timeout_s)

    async def __aenter__(self) -> Served:
        self.task = asyncio.get_running_loop().create_task(self.batcher.run())
        return self

    async def __aexit__(self, *_: object) -> None:
        self.queue.close()
        await asyncio.wait_for(self.task, 60)


@pytest.mark.looptime
class TestAdmission:
    async def test_a_request_that_would_finish_late_is_refused_at_once(self) -> None:
        async with Served() as s:
            # 40 rows ahead: 5 batches of 8 at 28 ms = 140 ms before a 100 ms deadline
            ahead = [s.put(timeout_s=1.0) for _ in range(40)]
            with pytest.raises(Overloaded) as refused:
                s.put(timeout_s=0.100)
            assert refused.value.reason == "predicted_late"
            assert "40 rows queued ahead" in str(refused.value)
            assert refused.value.retry_after_s > 0
            assert len(s.queue) == 40  # nothing of it was queued
            await asyncio.gather(*ahead)

    async def test_a_request_that_fits_is_admitted(self) -> None:
        async with Served() as s:
            ahead = [s.put(timeout_s=1.0) for _ in range(16)]
            # 17 rows: 2 batches of 8 (56 ms) then its own of 1 (21 ms) = 77 ms < 100 ms
            mine = s.put(timeout_s=0.100)
            await asyncio.gather(*ahead, mine)
            assert asyncio.get_running_loop().time() <= 0.100

    async def test_a_request_larger_than_the_limit_ahead_counts_as_the_one_batch_it_runs(
        self,
    ) -> None:
        # t(b) = 20 + 0.5·b ms, limit 8: a 32-row request queued runs alone, in 36 ms — not
        # as four batches of 8 paying the 20 ms again (96 ms), which refused the one-row
        # request behind it with 100 ms to go.
        async with Served(alpha_s=0.020, beta_s=0.0005, max_batch_size=8) as s:
            running = s.put(timeout_s=1.0)
            await asyncio.sleep(0)  # its batch starts: 20.5 ms
            large = s.put(timeout_s=1.0, rows=32)
            mine = s.put(timeout_s=0.100)  # 20.5 + 36 + 20.5 = 77 ms
            await asyncio.gather(running, large, mine)
            assert asyncio.get_running_loop().time() <= 0.100

    async def test_what_a_request_put_now_would_take_is_told_before_it_is_put(self) -> None:
        # (a pipeline's gate keeps that much for the batch after its preprocess)
        async with Served() as s:
            assert s.queue.predicted_s(1) == pytest.approx(0.021)  # alone: t(1)
            ahead = [s.put(timeout_s=1.0) for _ in range(16)]
            # two batches of 8 (28 ms each) ahead, then its own, full by then
            assert s.queue.predicted_s(1) == pytest.approx(3 * 0.028)
            await asyncio.gather(*ahead)

    async def test_requests_of_other_shapes_are_batches_ahead_not_rows(self) -> None:
        """A model whose inputs vary in length: eight one-row requests of eight lengths queued
        are eight batches (8 x 21 ms), not one of eight rows (28 ms)."""
        async with Served() as s:
            ahead = [
                s.queue.put({"x": np.ones((1, 2 + i), np.float32)}, rows=1, timeout_s=1.0)
                for i in range(8)
            ]
            with pytest.raises(Overloaded) as refused:
                s.put(timeout_s=0.150)  # 168 ms ahead, 189 ms with its own
            assert refused.value.reason == "predicted_late"
            mine = s.put(timeout_s=0.250)
            results = await asyncio.gather(*ahead, mine, return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)]
            assert s.engine.batches == [1] * 9
            assert asyncio.get_running_loop().time() <= 0.250

    async def test_without_a_deadline_nothing_is_refused(self) -> None:
        async with Served() as s:
            waiting = [s.put(timeout_s=None) for _ in range(200)]
            await asyncio.gather(*waiting)

    async def test_queue_mode_admits_everything_and_they_expire(self) -> None:
        async with Served(deadline=False) as s:
            waiting = [s.put(timeout_s=0.100) for _ in range(80)]
            results = await asyncio.gather(*waiting, return_exceptions=True)
            expired = [r for r in results if isinstance(r, DeadlineExceeded)]
            assert expired  # 10 batches of 28 ms cannot all finish in 100 ms

    async def test_overload_twice_the_capacity_keeps_every_admitted_deadline(self) -> None:
        # Capacity at batch 8: 8 / 28 ms = 286 rps; offered: 572 rps for 2 s, evenly spaced.
        async with Served() as s:
            loop = asyncio.get_running_loop()
            finished: list[float] = []
            refused = 0
            admitted: list[asyncio.Future[Any]] = []

            def record(started: float) -> Any:
                return lambda _: finished.append(loop.time() - started)

            for i in range(1144):
                await asyncio.sleep(max(0.0, i / 572 - loop.time()))
                try:
                    future = s.put(timeout_s=0.100)
                except Overloaded:
                    refused += 1
                    continue
                future.add_done_callback(record(loop.time()))
                admitted.append(future)
            results = await asyncio.gather(*admitted, return_exceptions=True)
            late = [r for r in results if isinstance(r, BaseException)]
            assert late == []  # every admitted request was answered, none expired
            assert max(finished) <= 0.100
            served = len(admitted)
            # about half is refused: what the device can carry is served
            assert 0.85 * 286 * 2 <= served <= 1.05 * 286 * 2, (served, refused)
            # no batch ever ran a request past its deadline
            assert sum(s.engine.batches) == served


@pytest.mark.looptime
class TestBatchesFitTheDeadline:
    async def test_a_batch_holds_no_more_than_its_oldest_request_allows(self) -> None:
        # t(b) = 20 + 10·b ms; one request with 50 ms left and 8 behind it with plenty:
        # a batch of 3 takes 50 ms, of 2 takes 40 ms — the oldest can go with one more only.
        async with Served(alpha_s=0.020, beta_s=0.010, max_batch_size=8) as s:
            loop = asyncio.get_running_loop()
            urgent = s.put(timeout_s=0.045)
            others = [s.put(timeout_s=5.0) for _ in range(8)]
            await urgent
            assert loop.time() <= 0.045
            await asyncio.gather(*others)
            assert s.engine.batches[0] == 2

    async def test_a_request_that_cannot_finish_even_alone_never_reaches_the_device(
        self,
    ) -> None:
        async with Served(alpha_s=0.020, beta_s=0.001) as s:
            blocker = s.put(timeout_s=1.0, rows=8)
            # admitted: 28 ms for the blocker, then 21 ms alone, inside 60 ms
            late = s.put(timeout_s=0.060)
            s.engine.alpha_s = 0.040  # the device slows down: the blocker takes 48 ms
            with pytest.raises(DeadlineExceeded, match="could no longer finish"):
                await late  # at 48 ms, 12 ms are left and a batch takes 21
            await blocker
            assert s.engine.batches == [8]

    async def test_the_fill_wait_ends_when_the_deadline_needs_the_batch_to_start(
        self,
    ) -> None:
        # A 50 ms queue delay, but a 40 ms deadline and a 21 ms batch: it starts at
        # 40 - 21 - 2 (the start margin) = 17 ms and is answered at 38 ms.
        async with Served(alpha_s=0.020, beta_s=0.001, delay_s=0.050) as s:
            loop = asyncio.get_running_loop()
            await s.put(timeout_s=0.040)
            assert loop.time() == pytest.approx(0.038)
            assert s.engine.batches == [1]

    async def test_a_request_filling_the_room_keeps_the_batch_in_time(self) -> None:
        # t(b) = 20 + 1·b ms. A (1 row) has 23 ms; B (8) does not fit beside it and waits;
        # behind B, C (3 rows) would make A's batch 24 ms, late, and waits too; D (1) makes it
        # 22 ms and joins. Then B, the oldest left, alone, and C.
        async with Served(alpha_s=0.020, beta_s=0.001, max_batch_size=8) as s:
            loop = asyncio.get_running_loop()
            a = s.put(timeout_s=0.023)
            rest = [s.put(timeout_s=1.0, rows=rows) for rows in (8, 3, 1)]
            await a
            assert loop.time() == pytest.approx(0.022)
            await asyncio.gather(*rest)
            assert s.engine.batches == [2, 8, 3]

    async def test_queue_mode_forms_full_batches_whatever_the_deadline(self) -> None:
        async with Served(alpha_s=0.020, beta_s=0.010, deadline=False) as s:
            loop = asyncio.get_running_loop()
            urgent = s.put(timeout_s=0.045)
            others = [s.put(timeout_s=5.0) for _ in range(8)]
            await urgent
            assert loop.time() == pytest.approx(0.100)  # 20 + 10 x 8 ms: late
            await asyncio.gather(*others)
            assert s.engine.batches[0] == 8


@pytest.mark.looptime
class TestBurstBatches:
    """A backlog of more rows than the limit runs in one batch, up to the burst size; t(b) =
    20 + 1·b ms and a batch limit of 4 (24 ms a batch) throughout."""

    async def test_a_backlog_runs_in_one_batch(self) -> None:
        # 24 requests with 100 ms: six batches of 4 take 144 ms; one of 24 takes 44 ms.
        async with Served(max_batch_size=4, burst=32) as s:
            loop = asyncio.get_running_loop()
            waiting = [s.put(timeout_s=0.100) for _ in range(24)]
            await asyncio.gather(*waiting)
            assert s.engine.batches == [24]
            assert loop.time() == pytest.approx(0.044)

    async def test_without_a_burst_size_the_same_backlog_is_refused_in_part(self) -> None:
        async with Served(max_batch_size=4) as s:
            admitted = []
            for _ in range(24):
                with contextlib.suppress(Overloaded):
                    admitted.append(s.put(timeout_s=0.100))
            await asyncio.gather(*admitted)
            assert len(admitted) < 24
            assert max(s.engine.batches) == 4

    async def test_what_comes_while_a_batch_runs_is_the_next_backlog(self) -> None:
        # One request alone at 0 (21 ms); 6 arrive meanwhile and run together at 21 ms (26 ms),
        # where the limit would run 4 (24 ms) and then 2 (22 ms): 47 ms for the last, not 67.
        async with Served(max_batch_size=4, burst=32) as s:
            loop = asyncio.get_running_loop()
            first = s.put(timeout_s=1.0)
            await asyncio.sleep(0.010)
            await asyncio.gather(first, *(s.put(timeout_s=1.0) for _ in range(6)))
            assert s.engine.batches == [1, 6]
            assert loop.time() == pytest.approx(0.047)

    async def test_the_oldest_request_bounds_the_larger_batch(self) -> None:
        # The first request has 30.5 ms: a batch of 10 (30 ms) is the most it allows; the 5
        # rows left at 30 ms run as one (55 ms).
        async with Served(max_batch_size=4, burst=32) as s:
            loop = asyncio.get_running_loop()
            urgent = s.put(timeout_s=0.0305)
            others = [s.put(timeout_s=0.100) for _ in range(14)]
            await urgent
            assert loop.time() <= 0.0305
            await asyncio.gather(*others)
            assert s.engine.batches == [10, 5]
            assert loop.time() == pytest.approx(0.055)

    async def test_a_request_joins_the_backlog_only_where_the_oldest_still_finishes(
        self,
    ) -> None:
        # Behind the same urgent request, batches of 4 serve 16 rows within 100 ms (96 ms);
        # a 17th would join the first batch only if the urgent one could wait for 37 rows'
        # worth of batch — it cannot, so from there on they are refused.
        async with Served(max_batch_size=4, burst=32) as s:
            admitted, refused = [s.put(timeout_s=0.0305)], 0
            for _ in range(20):
                try:
                    admitted.append(s.put(timeout_s=0.100))
                except Overloaded:
                    refused += 1
            assert (len(admitted), refused) == (16, 5)
            await asyncio.gather(*admitted)

    async def test_the_burst_size_is_the_most_a_batch_takes(self) -> None:
        async with Served(max_batch_size=4, burst=8) as s:
            waiting = [s.put(timeout_s=0.100) for _ in range(24)]
            await asyncio.gather(*waiting)
            assert s.engine.batches == [8, 8, 8]  # 84 ms; in batches of 4, 144 ms

    async def test_where_rows_cost_most_a_backlog_served_in_time_keeps_the_limit(self) -> None:
        # t(b) = 2 + 10·b ms: one batch of 8 would save 2 ms for the last four and cost the
        # first four 40 ms. Two batches of 4 end at 84 ms, in time: the limit stands.
        async with Served(alpha_s=0.002, beta_s=0.010, max_batch_size=4, burst=32) as s:
            await asyncio.gather(*(s.put(timeout_s=1.0) for _ in range(8)))
            assert s.engine.batches == [4, 4]

    async def test_where_rows_cost_most_a_backlog_the_limit_makes_late_runs_together(
        self,
    ) -> None:
        # 12 requests with 120 ms: batches of 4 end at 126 ms, one of 12 at 122 ms — neither in
        # time for the last, refused; 11 in one batch end at 112 ms.
        async with Served(alpha_s=0.002, beta_s=0.010, max_batch_size=4, burst=32) as s:
            admitted = []
            for _ in range(12):
                with contextlib.suppress(Overloaded):
                    admitted.append(s.put(timeout_s=0.120))
            assert len(admitted) == 11
            await asyncio.gather(*admitted)
            assert s.engine.batches == [11]

    async def test_a_request_of_another_shape_cannot_count_on_the_backlogs_batch(self) -> None:
        # 16 rows ahead end at 96 ms in batches of 4; a 17th would end at 120 ms. Of the same
        # shape it joins the backlog's batch (37 ms); of another it cannot share a batch.
        async with Served(max_batch_size=4, burst=32) as s:
            ahead = [s.put(timeout_s=0.100) for _ in range(16)]
            with pytest.raises(Overloaded):
                s.queue.put({"x": np.ones((1, 2), dtype=np.float32)}, rows=1, timeout_s=0.100)
            same = s.put(timeout_s=0.100)
            await asyncio.gather(*ahead, same)
            assert s.engine.batches == [17]

    async def test_free_instances_share_the_backlog(self) -> None:
        # t(b) = 9 + 2·b ms on two instances: 24 requests run as two batches of 12 side by
        # side (33 ms), not one of 24 (57 ms) nor six of 4 (three rounds of 17 ms, 51 ms).
        async with Served(
            alpha_s=0.009, beta_s=0.002, max_batch_size=4, burst=32, instances=2
        ) as s:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(s.put(timeout_s=1.0) for _ in range(24)))
            assert s.engine.batches == [12, 12]
            assert loop.time() == pytest.approx(0.033)

    async def test_queue_mode_never_grows_a_batch(self) -> None:
        async with Served(max_batch_size=4, burst=32, deadline=False) as s:
            await asyncio.gather(*(s.put(timeout_s=1.0) for _ in range(12)))
            assert s.engine.batches == [4, 4, 4]


class TestRecoveryFromAStall:
    def test_the_lateness_is_forgotten_without_answers(self) -> None:
        lateness = Lateness()
        for _ in range(50):
            lateness.observe(0.200, now=10.0)  # a stall: every answer 200 ms late
        assert lateness.margin_s(10.0) == pytest.approx(0.200)
        # no answer for a window: nothing of it is left
        assert lateness.margin_s(10.0 + LATENESS_WINDOW_S) == 0.0

    def test_answers_earlier_than_predicted_shrink_the_margin(self) -> None:
        lateness = Lateness()
        for _ in range(50):
            lateness.observe(0.200, now=10.0)
        before = lateness.margin_s(10.0)
        for _ in range(400):
            lateness.observe(-0.050, now=10.0)  # pessimistic predictions: early answers
        assert lateness.margin_s(10.0) < before / 2

    @pytest.mark.looptime
    async def test_spoilt_measurements_still_let_a_probe_through(self) -> None:
        # The measurements say a batch takes 500 ms (a stall spoilt them); the device is back to
        # 20 ms. Refusing everything would never measure it again.
        async with Served(alpha_s=0.020, beta_s=0.0) as s:
            s.predictor.timing = exact_timing(0.500, 0.0)
            loop = asyncio.get_running_loop()
            probe = s.put(timeout_s=0.100)  # nothing ran for a while: taken whatever predicted
            with pytest.raises(Overloaded):
                s.put(timeout_s=0.100)  # behind it, the prediction holds: refused
            await probe
            await asyncio.sleep(0.5)
            with pytest.raises(Overloaded):
                s.put(timeout_s=0.100)  # a batch ended 0.5 s ago: measurements fresh enough
            await asyncio.sleep(0.6)
            await s.put(timeout_s=0.100)  # a second without batches: the next probe
            assert loop.time() == pytest.approx(1.1 + 0.020 + 0.021, abs=0.01)
            assert s.engine.batches == [1, 1]
            # each probe moved the spoilt mean towards the truth
            recovered = s.predictor.timing.seconds(1)
            assert recovered is not None
            assert recovered < 0.5


class TestAnUnmeasuredServerKeepsAMargin:
    """With no answer in the lateness window (a fresh server, one idle for `LATENESS_WINDOW_S`),
    admission keeps `UNMEASURED_LATENESS_SHARE` of the device time queued ahead as its margin:
    the event loop's work under a burst may hold the device up as long, and no answer can say so
    in time."""

    def test_no_answer_keeps_the_work_ahead_as_margin_until_one_comes(self) -> None:
        assert UNMEASURED_LATENESS_SHARE == 1.0
        predictor = Predictor(timing=exact_timing(0.020, 0.001))

        def margin(queued_rows: int, now: float) -> float:
            predicted = predictor.finish_time(
                queued_rows=queued_rows, rows=1, max_batch_size=8, now=now
            )
            assert predicted is not None
            return predictor.margin_s(
                predicted=predicted, queued_rows=queued_rows, rows=1, max_batch_size=8, now=now
            )

        # 80 rows ahead: 10 batches of 8 (280 ms), then its own of 8 rows (28 ms) where alone
        # it would run in one of 1 (21 ms): 287 ms of the wait are the work ahead
        assert margin(80, now=10.0) == pytest.approx(0.287)
        assert margin(0, now=10.0) == 0.0  # a lone request on an idle server: nothing ahead
        predictor.lateness.observe(0.0, now=10.05)  # an answer on time
        assert margin(80, now=10.1) == 0.0
        predictor.lateness.observe(0.040, now=10.1)  # and one 40 ms late: the measured margin
        learned = predictor.lateness.margin_s(10.1)
        assert 0.040 < learned < 0.287
        assert margin(80, now=10.1) == learned
        # idle for the window: nothing measured says how late the next burst will run
        assert margin(80, now=10.1 + LATENESS_WINDOW_S + 0.2) == pytest.approx(0.287)

    @pytest.mark.looptime
    async def test_a_fresh_server_keeps_the_work_ahead_in_reserve_for_a_burst(self) -> None:
        # t(b) = 20 + 1·b ms, batches of 8 (28 ms), a 1 s deadline, 400 requests at once. With
        # n full batches ahead a request waits (n + 1) · 28 ms, 21 ms of it more than the work
        # ahead (alone, its batch is 1 row): a fresh server admits while 2 · (n + 1) · 28 - 21
        # <= 1000 ms, n + 1 <= 18 (144 requests); one that answered on time lately while
        # (n + 1) · 28 <= 1000 ms, n + 1 <= 35 (280 requests).
        for answered, admitted_count in ((False, 144), (True, 280)):
            async with Served(answered=answered) as s:
                admitted: list[asyncio.Future[Any]] = []
                for _ in range(400):
                    with contextlib.suppress(Overloaded):
                        admitted.append(s.put(timeout_s=1.0))
                assert len(admitted) == admitted_count, answered
                await asyncio.gather(*admitted)

    @pytest.mark.looptime
    async def test_the_first_answers_replace_the_margin_with_the_measured_one(self) -> None:
        async with Served(answered=False) as s:
            loop = asyncio.get_running_loop()
            await s.put(timeout_s=1.0)  # a probe: its answer teaches nothing
            await s.put(timeout_s=1.0)  # answered on time
            started = loop.time()
            admitted: list[asyncio.Future[Any]] = []
            for _ in range(400):
                with contextlib.suppress(Overloaded):
                    admitted.append(s.put(timeout_s=1.0))
            assert len(admitted) == 280  # as a server that answered lately: no margin left
            await asyncio.gather(*admitted)
            assert loop.time() - started <= 1.0


class TestTheLatenessFollowsThePresent:
    """The margin is the lateness of the answers of the last `LATENESS_WINDOW_S`: a burst's
    lateness does not outlive it, a sustained one holds."""

    def test_after_a_burst_a_trickle_of_answers_on_time_brings_the_margin_back(self) -> None:
        lateness = Lateness()
        # a burst: 400 answers in 1.2 s, each 100 ms later than predicted (an event loop busy
        # with a thousand arrivals starts the batches late)
        for i in range(400):
            lateness.observe(0.100, now=10.0 + i * 0.003)
        assert lateness.margin_s(11.2) == pytest.approx(0.100)
        # then an idle server: one answer every 0.4 s, on time
        at = 11.2
        while at < 11.2 + 3 * LATENESS_WINDOW_S:
            at += 0.4
            lateness.observe(0.0, now=at)
            if at >= 11.197 + LATENESS_WINDOW_S:  # the burst's last answer is a window old
                assert lateness.margin_s(at) == 0.0, at

    def test_a_sustained_lateness_keeps_its_margin(self) -> None:
        lateness = Lateness()
        # 10 s of overload, 300 answers a second, 4 and 6 ms late in turn: 5 ms ± 1 ms
        for i in range(3000):
            at = 10.0 + i / 300
            lateness.observe(0.004 if i % 2 else 0.006, now=at)
            if i % 300 == 299:
                assert lateness.margin_s(at) == pytest.approx(0.007, abs=1e-5), at  # 5 + 2 x 1 ms


@pytest.mark.looptime
class TestOneRequestCannotHoldTheDevice:
    """A request of more rows than the largest batch the server forms (the ceiling: the limit,
    or the burst size) runs alone. It is taken only where admission predicts it in time, never
    as a probe, and one that no idle device could serve in time is refused for good (400).
    t(b) = 20 + 1·b ms and a batch limit of 8 throughout."""

    async def test_a_request_larger_than_the_ceiling_is_never_taken_as_a_probe(self) -> None:
        # 4000 rows alone take 4.02 s; nothing ran for a second, which makes the next request
        # a probe, taken whatever the prediction. Not this one: it would hold the device for
        # 4 s, every request behind it refused, for an answer 3 s past its deadline.
        async with Served() as s:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(1.0)
            with pytest.raises(Overloaded) as refused:
                s.put(timeout_s=1.0, rows=4000)
            assert refused.value.reason == "predicted_late"
            assert s.engine.batches == []
            # the device is free: the next small request is served at once
            await s.put(timeout_s=0.100)
            assert loop.time() == pytest.approx(1.021)
            assert s.engine.batches == [1]

    async def test_a_request_no_idle_device_could_serve_in_time_is_refused_for_good(
        self,
    ) -> None:
        async with Served() as s:
            with pytest.raises(TooLargeForDeadline) as too_large:
                s.queue.check_servable(4000, timeout_s=0.5005)
            message = str(too_large.value)
            # 4000 rows: 20 + 4000 ms alone; (500.5 - 20) / 1 ms -> 480 rows fit
            assert "4000 rows would take 4.02 s alone" in message
            assert "at most 480 rows a request fit" in message
            s.queue.check_servable(480, timeout_s=0.5005)  # 500 ms: it fits
            # within the ceiling, a deadline the fastest batch meets is admission's to refuse,
            # for now (503) ...
            s.queue.check_servable(8, timeout_s=0.025)
            s.queue.check_servable(4000, timeout_s=None)  # no deadline: no bound
            # ... but one shorter than any batch the server has run, for good (400): every
            # replica would refuse it, and a 503 would read as load to add replicas for
            with pytest.raises(TooLargeForDeadline) as too_short:
                s.queue.check_servable(1, timeout_s=0.001, declared_s=0.001)
            # what is left of an RPC's deadline is no declaration: a call that waited under
            # load is load (admission refuses it for now), not a request to change
            s.queue.check_servable(1, timeout_s=0.001)
            s.queue.check_servable(1, timeout_s=0.001, declared_s=1.0)
            assert str(too_short.value).startswith(
                "the request's 1 ms deadline is shorter than any batch this server has run (the "
                "fastest took 21 ms)"
            )

    async def test_without_deadline_admission_nothing_is_refused_for_its_size(self) -> None:
        async with Served(deadline=False) as s:
            s.queue.check_servable(4000, timeout_s=0.5)

    async def test_a_moderately_larger_request_still_runs_alone(self) -> None:
        # 16 rows run alone in one batch: 36 ms
        async with Served() as s:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(1.0)
            s.queue.check_servable(16, timeout_s=0.100)
            await s.put(timeout_s=0.100, rows=16)
            assert loop.time() == pytest.approx(1.036)
            assert s.engine.batches == [16]

    async def test_spoilt_measurements_refuse_a_larger_request_for_now_not_for_good(
        self,
    ) -> None:
        # A stall made every batch take 500 ms; the device is back to 20 + 1·b ms. The means
        # say 500 ms, the fastest batches measured still say 21 and 28 ms.
        async with Served() as s:
            for _ in range(2 * SIZE_MEMORY_BATCHES):
                s.predictor.timing.observe(1, 0.500)
                s.predictor.timing.observe(8, 0.500)
            await asyncio.sleep(1.0)
            # at the device's best 16 rows take 36 ms: servable, not refused for good ...
            s.queue.check_servable(16, timeout_s=0.100)
            # ... but not now, and not as a probe: the spoilt means say 1 s
            with pytest.raises(Overloaded):
                s.put(timeout_s=0.100, rows=16)
            # a request within the ceiling is the probe that measures the device again
            await s.put(timeout_s=0.100)
            assert s.engine.batches == [1]
