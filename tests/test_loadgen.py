"""The load generator: its pure parts (schedules, arrivals, statistics, the search) on their own,
and its HTTP part against a small but honest v2 server.

The server decodes every request with the runtime's own codec and answers with its encoder; its
behaviour (delay, a single-server queue with a known capacity, shed load, dropped connections) is
set per test. It runs on its own event loop in a thread, so the client under test does not share
a loop with it and the synchronous CLI entry point can be tested against it too.

Whether a run is valid (its client kept the schedule) is checked by hand-made outcomes and by
runs that are made invalid on purpose (a stalled client loop, a tiny outstanding cap); tests of
other things pass PATIENT_LAG_MS, since the machine running them is shared and a scheduler pause
there is not what they are about.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web

from batchpilot.api.request_rows import RowMix
from batchpilot.runtime import loadgen
from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.loadgen import (
    DROPPED_CLIENT,
    EXIT_INVALID,
    LoadConfig,
    LoadReport,
    ModelMetadata,
    RateSchedule,
    RateSearch,
    Retries,
    SearchConfig,
    Target,
    TargetError,
    TensorSpec,
    arrival_times,
    find_max_rate,
    format_report,
    latency_stats,
    loops,
    probe_passes,
    random_inputs,
    run_load,
)
from batchpilot.runtime.loadgen.client import retry_after_s
from batchpilot.runtime.loadgen.config import MAX_RETRY_WAIT_S
from batchpilot.runtime.protocol.server_codec import decode_request, encode_response
from batchpilot.runtime.protocol.tensors import HEADER_LENGTH, Tensor
from batchpilot.sandbox.background import in_thread

MODEL = "toy"
PATIENT_LAG_MS = 1000.0
"""A send lag limit for tests about something else than the client's punctuality."""
METADATA: dict[str, Any] = {
    "name": MODEL,
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}


# --- The test server ---------------------------------------------------------------------------


@dataclass
class Behaviour:
    delay_s: float = 0.0
    """Every request waits this long before it is answered."""
    service_s: float | None = None
    """A single-server FIFO queue with this service time: capacity exactly 1/service_s rps.
    Kept as a virtual finish time, so timer jitter does not change the capacity."""
    status_every: tuple[int, int] | None = None
    """(n, status): every n-th request is answered with this status instead."""
    retry_after: str | None = None
    """The `Retry-After` those answers carry, if any."""
    drop_connection: bool = False
    wrong_output: bool = False


@dataclass
class FakeV2Server:
    url: str = ""
    behaviour: Behaviour = field(default_factory=Behaviour)
    infer_count: int = 0
    shapes_seen: set[tuple[int, ...]] = field(default_factory=set)
    rows_seen: list[int] = field(default_factory=list)
    """Each answered infer's rows (its first input's batch axis)."""
    attempts_seen: list[str | None] = field(default_factory=list)
    """Each infer's `x-envoy-attempt-count`, None where it had none."""
    _free_at: float = 0.0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/models/{name}", self.metadata)
        app.router.add_post("/v2/models/{name}/infer", self.infer)
        return app

    async def metadata(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != MODEL:
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response(METADATA)

    async def infer(self, request: web.Request) -> web.StreamResponse:
        self.infer_count += 1
        n = self.infer_count
        self.attempts_seen.append(request.headers.get("x-envoy-attempt-count"))
        body = await request.read()
        length = request.headers.get(HEADER_LENGTH)
        try:
            decoded = decode_request(body, header_length=int(length) if length else None)
        except InvalidRequest as exc:
            return web.json_response({"error": str(exc)}, status=400)
        b = self.behaviour
        if b.drop_connection:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never reaches the client
        if b.status_every is not None and n % b.status_every[0] == 0:
            retry = {} if b.retry_after is None else {"Retry-After": b.retry_after}
            return web.json_response({"error": "shed"}, status=b.status_every[1], headers=retry)
        loop = asyncio.get_running_loop()
        if b.service_s is not None:
            self._free_at = max(loop.time(), self._free_at) + b.service_s
            await asyncio.sleep(self._free_at - loop.time())
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        x = decoded.inputs[0].data
        self.shapes_seen.add(tuple(x.shape))
        self.rows_seen.append(int(x.shape[0]))
        name = "z" if b.wrong_output else "y"
        out, header_length = encode_response(
            model_name=MODEL,
            model_version=None,
            request_id=decoded.id,
            outputs=[Tensor(name, "FP32", x * 2)],
            binary={name} if decoded.binary_default else (),
        )
        headers = {} if header_length is None else {HEADER_LENGTH: str(header_length)}
        return web.Response(body=out, headers=headers, content_type="application/octet-stream")


@pytest.fixture
def server() -> Iterator[FakeV2Server]:
    with in_thread(serving, name="fake-v2-server") as fake:
        yield fake


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[FakeV2Server]:
    fake = FakeV2Server()
    runner = web.AppRunner(fake.app(), handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        fake.url = f"http://127.0.0.1:{port}"
        yield fake
    finally:
        await runner.cleanup()


def target(server: FakeV2Server, **kwargs: Any) -> Target:
    return Target(url=server.url, model=MODEL, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# --- Schedules and arrivals ------------------------------------------------------------------


class TestSchedule:
    def test_parse_pairs(self) -> None:
        schedule = RateSchedule.parse("0:50, 20:400,40:100")
        assert schedule.points == ((0.0, 50.0), (20.0, 400.0), (40.0, 100.0))
        assert [schedule.rate_at(t) for t in (0, 19.9, 20, 39, 40, 1e6)] == [
            50,
            50,
            400,
            400,
            100,
            100,
        ]

    def test_integral_is_piecewise(self) -> None:
        schedule = RateSchedule.parse("0:50,20:400,40:100")
        # 50·20 + 400·20 + 100·20 = 11000
        assert schedule.expected_arrivals(60) == pytest.approx(11000)
        # 50·20 + 400·5 = 3000: the duration cuts the schedule
        assert schedule.expected_arrivals(25) == pytest.approx(3000)

    def test_rate_before_first_point_is_zero(self) -> None:
        schedule = RateSchedule.parse("10:100")
        assert schedule.rate_at(5) == 0
        assert schedule.expected_arrivals(20) == pytest.approx(1000)

    @pytest.mark.parametrize(
        "text", ["", "0:50,0:60", "10:5,5:5", "0:-1", "abc", "0:50:3", "0:nan", "-1:5"]
    )
    def test_bad_text_is_refused(self, text: str) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - each message is checked by the CLI test
            RateSchedule.parse(text)

    def test_csv_trace(self, tmp_path: Path) -> None:
        path = tmp_path / "trace.csv"
        path.write_text("# a diurnal ramp\nt_seconds,rate_rps,note\n0,10,night\n\n30,200,day\n")
        assert RateSchedule.from_csv(path).points == ((0.0, 10.0), (30.0, 200.0))

    def test_csv_from_a_spreadsheet(self, tmp_path: Path) -> None:
        # a byte-order mark, CRLF line ends and spaces around the names
        path = tmp_path / "trace.csv"
        path.write_bytes("\ufeff t_seconds , rate_rps \r\n0,10\r\n30,2e2\r\n".encode())
        assert RateSchedule.from_csv(path).points == ((0.0, 10.0), (30.0, 200.0))

    def test_csv_without_header_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "trace.csv"
        path.write_text("0,10\n30,200\n")
        with pytest.raises(ValueError, match="t_seconds and rate_rps"):
            RateSchedule.from_csv(path)


class TestArrivals:
    def test_poisson_counts_follow_the_integral_of_the_rate(self) -> None:
        schedule = RateSchedule.parse("0:50,20:400,40:100")
        times = arrival_times(schedule, duration_s=60, rng=np.random.default_rng(7))
        assert np.all(np.diff(times) >= 0)
        assert times.min() >= 0
        assert times.max() < 60
        # Each segment's count is Poisson(integral); 5 σ leaves no room for flakes.
        for lo, hi, expected in ((0, 20, 1000), (20, 40, 8000), (40, 60, 2000)):
            count = int(np.sum((times >= lo) & (times < hi)))
            assert abs(count - expected) < 5 * math.sqrt(expected), (lo, hi, count)

    def test_seeded_arrivals_repeat(self) -> None:
        schedule = RateSchedule.constant(100)
        first = arrival_times(schedule, duration_s=5, rng=np.random.default_rng(3))
        second = arrival_times(schedule, duration_s=5, rng=np.random.default_rng(3))
        np.testing.assert_array_equal(first, second)

    def test_poisson_gaps_are_exponential(self) -> None:
        times = arrival_times(
            RateSchedule.constant(1000), duration_s=20, rng=np.random.default_rng(1)
        )
        gaps = np.diff(times)
        assert np.mean(gaps) == pytest.approx(1e-3, rel=0.03)
        assert np.std(gaps) == pytest.approx(1e-3, rel=0.05)  # exponential: sd == mean

    def test_uniform_arrivals_are_evenly_spaced_per_segment(self) -> None:
        schedule = RateSchedule.parse("0:10,2:100,3:0,4:20")
        times = arrival_times(
            schedule, duration_s=5, rng=np.random.default_rng(0), process="uniform"
        )
        counts = [int(np.sum((times >= t) & (times < t + 1))) for t in range(5)]
        assert counts == [10, 10, 100, 0, 20]
        np.testing.assert_allclose(np.diff(times[:10]), 0.1)

    def test_a_zero_rate_gives_no_arrivals(self) -> None:
        times = arrival_times(RateSchedule.constant(0), duration_s=10, rng=np.random.default_rng())
        assert len(times) == 0

    def test_too_many_arrivals_are_refused(self) -> None:
        with pytest.raises(ValueError, match="at most"):
            arrival_times(RateSchedule.constant(1e6), duration_s=3600, rng=np.random.default_rng())


# --- Statistics and the search ----------------------------------------------------------------


class TestStatistics:
    def test_nearest_rank_percentiles(self) -> None:
        samples = np.random.default_rng(0).permutation(np.arange(1, 101)) / 1000.0  # 1..100 ms
        stats = latency_stats(samples)
        assert stats is not None
        percentiles = [stats.p50_ms, stats.p95_ms, stats.p99_ms, stats.max_ms]
        assert stats.count == 100
        assert percentiles == pytest.approx([50, 95, 99, 100])
        assert stats.mean_ms == pytest.approx(50.5)

    def test_p99_of_fewer_than_100_samples_is_the_max(self) -> None:
        stats = latency_stats([0.001] * 49 + [0.5])
        assert stats is not None
        assert stats.p50_ms == pytest.approx(1)
        assert stats.p99_ms == pytest.approx(500)

    def test_no_samples_no_stats(self) -> None:
        assert latency_stats([]) is None

    def test_windows_split_offered_and_served(self) -> None:
        # Three requests: two succeed in window 0 (10 ms, 30 ms), one fails in window 1.
        outcomes = loadgen.Outcomes(
            scheduled=np.array([0.1, 0.2, 0.9]),
            sent=np.array([0.1, 0.2, 0.9]),
            done=np.array([0.11, 0.23, 1.2]),
            kind=np.array(["", "", "503"]),
        )
        numbers = loadgen.summarize(
            outcomes, measure_start_s=0.0, duration_s=2.0, window_s=1.0, open_loop=True
        )
        assert numbers["errors"] == {"503": 1}
        assert (numbers["shed"], numbers["failed"], numbers["succeeded"]) == (1, 0, 2)
        assert numbers["achieved_qps"] == pytest.approx(1.0)  # 2 successes / 2 s
        w0, w1 = numbers["windows"]
        assert (w0.start_s, w0.end_s, w1.start_s, w1.end_s) == (0, 1, 1, 2)
        assert (w0.offered_rps, w0.served_rps, w0.errors) == (3, 2, 0)
        assert w0.p99_ms == pytest.approx(30)
        assert (w1.offered_rps, w1.served_rps, w1.errors, w1.p99_ms) == (0, 0, 1, None)

    def test_warmup_requests_are_not_counted(self) -> None:
        outcomes = loadgen.Outcomes(
            scheduled=np.array([0.5, 1.5]),
            sent=np.array([0.5, 1.5]),
            done=np.array([0.6, 1.52]),
            kind=np.array(["timeout", ""]),
        )
        numbers = loadgen.summarize(
            outcomes, measure_start_s=1.0, duration_s=1.0, window_s=1.0, open_loop=True
        )
        assert (numbers["scheduled"], numbers["succeeded"], numbers["errors"]) == (1, 1, {})
        latency = numbers["latency_ms"]
        assert latency is not None
        assert latency.p99_ms == pytest.approx(20)


def outcomes_of(rows: list[tuple[float, float, float, str]]) -> loadgen.Outcomes:
    """Outcomes from (scheduled, sent, done, kind) rows, in seconds."""
    scheduled, sent, done, kind = zip(*rows, strict=True)
    return loadgen.Outcomes(
        scheduled=np.array(scheduled),
        sent=np.array(sent),
        done=np.array(done),
        kind=np.array(kind),
    )


def summary(rows: list[tuple[float, float, float, str]], **kwargs: Any) -> loadgen.Summary:
    options: dict[str, Any] = {
        "measure_start_s": 0.0,
        "duration_s": 2.0,
        "window_s": 1.0,
        "open_loop": True,
    }
    return loadgen.summarize(outcomes_of(rows), **(options | kwargs))


def report_of(numbers: loadgen.Summary) -> LoadReport:
    return LoadReport(
        mode="open",
        url="http://127.0.0.1:1",
        model=MODEL,
        inputs={"x": (1, 4)},
        request_bytes=0,
        duration_s=2.0,
        warmup_s=0.0,
        target_rps=2.0,
        concurrency=None,
        window_s=1.0,
        **numbers,
    )


class TestSendLagAndValidity:
    def test_send_lag_counts_measured_sends_only(self) -> None:
        numbers = summary(
            [
                (0.5, 0.6, 0.61, ""),  # warm-up: 100 ms late, not counted
                (1.0, 1.001, 1.011, ""),  # 1 ms late
                (1.1, 1.103, 1.12, ""),  # 3 ms late
                (1.2, 1.22, 1.25, ""),  # 20 ms late
                (1.3, math.nan, 1.3, DROPPED_CLIENT),  # never sent: no lag
            ],
            measure_start_s=1.0,
            duration_s=1.0,
        )
        lag = numbers["send_lag_ms"]
        assert lag is not None
        # Lags 1, 3, 20 ms: nearest-rank P50 is the 2nd, P99 the 3rd; 1 of 3 is over 10 ms.
        assert (lag.count, lag.p50_ms, lag.p99_ms, lag.max_ms) == pytest.approx((3, 3, 20, 20))
        assert numbers["late_send_fraction"] == pytest.approx(1 / 3)
        assert numbers["scheduled"] == 4
        assert numbers["sent"] == 3

    def test_an_arrival_dropped_by_the_client_makes_the_run_invalid(self) -> None:
        numbers = summary(
            [
                (0.0, 0.001, 0.01, ""),
                (0.1, 0.101, 0.11, ""),
                (0.2, math.nan, 0.2, DROPPED_CLIENT),
            ]
        )
        assert numbers["valid"] is False
        reason = numbers["invalid_reason"]
        assert reason is not None
        assert reason.startswith("the client dropped 1 of 3 arrivals")
        assert "--max-outstanding" in reason
        assert "fell behind" not in reason  # the lag itself was fine

    def test_send_lag_over_the_limit_makes_the_run_invalid(self) -> None:
        rows = [(0.0, 0.001, 0.01, ""), (0.5, 0.5372, 0.55, "")]  # lags 1 ms and 37.2 ms
        numbers = summary(rows)
        assert numbers["valid"] is False
        assert numbers["invalid_reason"] == (
            "the client fell behind its schedule: send lag P99 37.2 ms > 10 ms (the offered load "
            "was lower than asked; use a faster client or a lower rate)"
        )
        assert numbers["late_send_fraction"] == pytest.approx(0.5)
        relaxed = summary(rows, max_send_lag_ms=50)
        assert (relaxed["valid"], relaxed["invalid_reason"]) == (True, None)

    def test_a_closed_loop_has_no_schedule_to_fall_behind(self) -> None:
        numbers = summary(
            [(0.0, 0.05, 0.06, ""), (0.1, math.nan, 0.1, DROPPED_CLIENT)], open_loop=False
        )
        assert (numbers["valid"], numbers["invalid_reason"]) == (True, None)
        assert numbers["send_lag_ms"] is None
        assert (numbers["late_send_fraction"], numbers["max_send_lag_ms"]) == (None, None)

    def test_refusals_are_misses_of_the_sla_within_the_one_percent(self) -> None:
        # 200 requests: nearest-rank P99 allows 2 misses; answered in 10 ms each
        fast = [(i * 0.01, i * 0.01, i * 0.01 + 0.01, "") for i in range(200)]
        two_refused = [*fast[:198], *((t, s, d + 0.001, "503") for t, s, d, _ in fast[198:])]
        numbers = summary(two_refused, sla_ms=100, max_send_lag_ms=50)
        assert numbers["sla_misses"] == 2
        assert probe_passes(report_of(numbers), sla_ms=100)
        # a third miss, late this time: 3 > 2
        late = [*fast[:197], (1.97, 1.97, 2.2, ""), *two_refused[198:]]
        assert not probe_passes(
            report_of(summary(late, sla_ms=100, max_send_lag_ms=50)), sla_ms=100
        )
        # any other error fails the probe: a timeout is not a refusal
        timed_out = [*fast[:199], (1.99, 1.99, 12.0, "timeout")]
        numbers = summary(timed_out, sla_ms=100, max_send_lag_ms=50)
        assert not probe_passes(report_of(numbers), sla_ms=100)

    def test_the_breach_watch_counts_refusals_as_late(self) -> None:
        stopped: list[bool] = []
        watch = loops.breach_watch(
            sla_s=0.1, measure_start_s=0.0, planned=200, stop=lambda: stopped.append(True)
        )
        watch(0.0, 0.001, "503")
        watch(0.1, 0.3, "")  # late
        assert stopped == []  # 2 misses of 200: still possible
        watch(0.2, 0.201, "429")
        assert stopped == [True]
        watch2 = loops.breach_watch(
            sla_s=0.1, measure_start_s=0.0, planned=200, stop=lambda: stopped.append(False)
        )
        watch2(0.0, 0.5, "connection")
        assert stopped[-1] is False  # any other error stops at once

    def test_an_invalid_report_is_no_pass(self) -> None:
        rows = [(0.0, 0.001, 0.01, ""), (0.5, 0.5372, 0.55, "")]
        assert probe_passes(report_of(summary(rows, max_send_lag_ms=50)), sla_ms=100)
        invalid = report_of(summary(rows))
        assert not invalid.valid
        assert not probe_passes(invalid, sla_ms=100)
        assert "INVALID RUN: the client fell behind" in loadgen.format_report(invalid)
        doc = invalid.to_dict()
        assert (doc["valid"], doc["max_send_lag_ms"]) == (False, 10)
        assert doc["send_lag_ms"]["p99_ms"] == pytest.approx(37.2)


class TestRefusalsAndGoodput:
    def test_refusals_are_timed_from_their_actual_send(self) -> None:
        numbers = summary(
            [
                (0.0, 0.05, 0.052, "503"),  # sent 50 ms late, refused 2 ms after the send
                (0.1, 0.1, 0.104, "429"),  # refused in 4 ms
                (0.2, 0.2, 0.9, "500"),  # a failure, not a refusal
                (0.3, 0.3, 0.31, ""),
            ]
        )
        shed = numbers["shed_latency_ms"]
        assert shed is not None
        assert (shed.count, shed.p50_ms, shed.p99_ms, shed.max_ms) == pytest.approx((2, 2, 4, 4))
        assert (numbers["shed"], numbers["failed"]) == (2, 1)

    def test_no_refusals_no_refusal_latency(self) -> None:
        assert summary([(0.0, 0.0, 0.01, "")])["shed_latency_ms"] is None

    def test_goodput_counts_successes_within_the_sla_from_the_scheduled_time(self) -> None:
        rows = [
            (0.0, 0.0, 0.010, ""),  # 10 ms
            (0.1, 0.1, 0.150, ""),  # 50 ms
            (0.2, 0.29, 0.299, ""),  # 99 ms from the schedule (9 ms service)
            (0.3, 0.39, 0.401, ""),  # 101 ms from the schedule (11 ms service): late
            (0.4, 0.4, 0.402, "503"),  # fast, but refused
        ]
        numbers = summary(rows, sla_ms=100)
        # 3 answers within 100 ms over the 2 s measured (elapsed = max(last done, duration)):
        # 3 / 2 s = 1.5 rps, while 4 successes / 2 s = 2 rps achieved.
        assert numbers["elapsed_s"] == 2.0
        assert numbers["goodput_rps"] == pytest.approx(1.5)
        assert numbers["achieved_qps"] == pytest.approx(2.0)
        assert summary(rows)["goodput_rps"] is None  # no SLA, no goodput

    def test_goodput_arithmetic(self) -> None:
        latency = np.array([0.01, 0.2, 0.05])
        assert loadgen.goodput(latency, sla_ms=100, over_s=4.0) == 0.5  # 2 within / 4 s
        assert loadgen.goodput(latency, sla_ms=100, over_s=0.0) == 0.0


class TestRateSearch:
    def test_ramps_then_bisects_to_the_precision(self) -> None:
        capacity = 100.0
        search = RateSearch(10, precision=0.05)
        probed = []
        while (rate := search.next_rate()) is not None:
            probed.append(rate)
            search.record(rate, passed=rate <= capacity)
            assert len(probed) < 20
        assert probed[:5] == [10, 20, 40, 80, 160]  # ramp until 160 fails
        assert 80 < probed[5] < 160  # then bisect between 80 and 160
        assert search.failed_rps is not None
        assert search.failed_rps / search.passed_rps - 1 <= 0.05
        assert capacity / 1.05 <= search.passed_rps <= capacity

    def test_stops_at_the_highest_rate_it_may_offer(self) -> None:
        search = RateSearch(10, max_rps=50)
        probed = []
        while (rate := search.next_rate()) is not None:
            probed.append(rate)
            search.record(rate, passed=True)
        assert probed == [10, 20, 40, 50]

    def test_ramps_down_when_the_first_probe_fails(self) -> None:
        search = RateSearch(10, min_rps=1)
        probed = []
        while (rate := search.next_rate()) is not None:
            probed.append(rate)
            search.record(rate, passed=False)
        assert probed == [10, 5, 2.5, 1.25]
        assert search.passed_rps == 0


# --- Building the request ---------------------------------------------------------------------


class TestRequest:
    metadata = ModelMetadata(
        name="m",
        platform="onnxruntime_onnx",
        inputs=(
            TensorSpec("image", "FP32", (-1, 3, -1, 8)),
            TensorSpec("ids", "INT64", (-1,)),
            TensorSpec("mask", "BOOL", (2,)),
        ),
        outputs=(),
    )

    def test_dynamic_axes_become_rows_on_the_batch_axis_and_one_elsewhere(self) -> None:
        image, ids, mask = random_inputs(self.metadata, rows=4, shapes={}, seed=0)
        assert (image.data.shape, image.data.dtype) == ((4, 3, 1, 8), np.float32)
        assert (ids.data.shape, ids.data.dtype) == ((4,), np.int64)
        assert ids.data.min() >= 0
        assert (mask.data.shape, mask.data.dtype) == ((2,), np.bool_)

    def test_explicit_shapes_win(self) -> None:
        (image, *_) = random_inputs(self.metadata, rows=4, shapes={"image": (1, 3, 5, 8)}, seed=0)
        assert image.data.shape == (1, 3, 5, 8)

    def test_data_is_seeded(self) -> None:
        first = random_inputs(self.metadata, rows=2, shapes={}, seed=5)[0].data
        again = random_inputs(self.metadata, rows=2, shapes={}, seed=5)[0].data
        other = random_inputs(self.metadata, rows=2, shapes={}, seed=6)[0].data
        np.testing.assert_array_equal(first, again)
        assert not np.array_equal(first, other)

    def test_unknown_shape_name_and_fixed_batch_are_refused(self) -> None:
        with pytest.raises(TargetError, match="nope"):
            random_inputs(self.metadata, rows=1, shapes={"nope": (1,)}, seed=0)
        fixed = ModelMetadata("m", "", (TensorSpec("x", "FP32", (1, 4)),), ())
        with pytest.raises(TargetError, match="no input of 'm' has a dynamic batch axis"):
            random_inputs(fixed, rows=4, shapes={}, seed=0)


# --- Runs against the server ---------------------------------------------------------------


async def test_closed_loop_sends_the_capped_number_of_requests(server: FakeV2Server) -> None:
    report = await run_load(
        LoadConfig(target=target(server, rows=3), duration_s=10, concurrency=4, max_requests=50)
    )
    assert (report.mode, report.sent, report.succeeded, report.errors) == ("closed", 50, 50, {})
    assert server.infer_count == 50
    assert server.shapes_seen == {(3, 4)}
    assert report.inputs == {"x": (3, 4)}
    assert report.latency_ms is not None
    assert report.latency_ms.p50_ms <= report.latency_ms.p99_ms <= report.latency_ms.max_ms
    assert report.elapsed_s < 5  # the cap, not the duration, ended it


async def test_closed_loop_keeps_concurrency_requests_in_flight(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(delay_s=0.1)
    report = await run_load(LoadConfig(target=target(server), duration_s=0.5, concurrency=5))
    # 5 workers × ~0.5 s / 0.1 s each ≈ 25 requests; the last round may end after 0.5 s.
    assert 15 <= report.succeeded <= 35
    assert report.latency_ms is not None
    assert report.latency_ms.p50_ms >= 100


async def test_open_loop_achieves_the_offered_rate(server: FakeV2Server) -> None:
    report = await run_load(
        LoadConfig(
            target=target(server),
            duration_s=2,
            schedule=RateSchedule.constant(200),
            seed=11,
        )
    )
    assert report.mode == "open"
    assert report.target_rps == pytest.approx(200)
    assert report.offered_rps is not None
    assert report.offered_rps == pytest.approx(200, rel=0.2)
    assert report.errors == {}
    assert report.achieved_qps == pytest.approx(report.offered_rps, rel=0.2)
    assert report.sent == report.scheduled == server.infer_count
    assert [(w.start_s, w.end_s) for w in report.windows] == [(0, 1), (1, 2)]
    assert sum(w.offered_rps for w in report.windows) == report.scheduled
    assert sum(w.served_rps for w in report.windows) == report.succeeded


async def test_open_loop_latency_counts_from_the_scheduled_time(server: FakeV2Server) -> None:
    # The client's own loop stalls for 0.3 s: arrivals due meanwhile go out late. Their latency
    # counts from when they were due (no coordinated omission); the service latency does not.
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, time.sleep, 0.3)
    report = await run_load(
        LoadConfig(
            target=target(server),
            duration_s=1,
            schedule=RateSchedule.constant(40),
            arrivals="uniform",
        )
    )
    assert report.errors == {}
    assert report.latency_ms is not None
    assert report.service_latency_ms is not None
    assert report.latency_ms.max_ms >= 250
    assert report.service_latency_ms.p99_ms < 100
    # And the run says so: the arrivals due during the stall went out up to 0.3 s late.
    assert report.send_lag_ms is not None
    assert report.send_lag_ms.max_ms >= 250
    assert report.late_send_fraction is not None
    assert report.late_send_fraction >= 0.1  # ~12 of the 40 arrivals were due in the stall
    assert not report.valid
    assert report.invalid_reason is not None
    assert report.invalid_reason.startswith("the client fell behind its schedule: send lag P99")


async def test_shed_load_is_counted_apart_from_failures(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(status_every=(2, 503))
    report = await run_load(
        LoadConfig(target=target(server), duration_s=10, concurrency=2, max_requests=40)
    )
    assert report.errors == {"503": 20}
    assert (report.shed, report.failed, report.succeeded) == (20, 0, 20)


class TestRetryingClients:
    async def test_a_refused_request_is_sent_again_and_counted_once(
        self, server: FakeV2Server
    ) -> None:
        # Every second send is refused; one client at a time: request 1 is answered, request 2
        # refused and its repeat answered, and so on.
        server.behaviour = Behaviour(status_every=(2, 503))
        report = await run_load(
            LoadConfig(
                target=target(server),
                duration_s=10,
                concurrency=1,
                max_requests=10,
                retries=Retries(2, delay_s=0.0),
            )
        )
        assert (report.succeeded, report.shed, report.sent) == (10, 0, 10)
        assert report.retries == 9
        assert server.infer_count == 19  # what the server counts as arrivals
        assert "9 refused sends repeated: 19 arrivals at the server for 10 requests" in (
            format_report(report)
        )

    async def test_the_servers_retry_after_is_waited_and_the_last_answer_counts(
        self, server: FakeV2Server
    ) -> None:
        server.behaviour = Behaviour(status_every=(1, 503), retry_after="1")
        report = await run_load(
            LoadConfig(
                target=target(server),
                duration_s=5,
                concurrency=1,
                max_requests=1,
                retries=Retries(1),
            )
        )
        assert (report.shed, report.retries, server.infer_count) == (1, 1, 2)
        assert report.shed_latency_ms is not None
        assert report.shed_latency_ms.p50_ms >= 1000  # the wait the server asked for

    async def test_marked_retries_number_every_try_as_envoy_does(
        self, server: FakeV2Server
    ) -> None:
        server.behaviour = Behaviour(status_every=(1, 503))  # every send refused
        report = await run_load(
            LoadConfig(
                target=target(server),
                duration_s=10,
                concurrency=1,
                max_requests=2,
                retries=Retries(2, delay_s=0.0, marked=True),
            )
        )
        assert (report.shed, report.retries) == (2, 4)
        assert server.attempts_seen == ["1", "2", "3"] * 2

    async def test_unmarked_retries_carry_no_attempt_count(self, server: FakeV2Server) -> None:
        server.behaviour = Behaviour(status_every=(1, 503))
        config = LoadConfig(
            target=target(server),
            duration_s=10,
            concurrency=1,
            max_requests=1,
            retries=Retries(1, delay_s=0.0),
        )
        assert (await run_load(config)).retries == 1
        assert server.attempts_seen == [None, None]

    def test_retry_after_is_read_in_seconds(self) -> None:
        assert retry_after_s("2") == 2.0
        assert retry_after_s(" 0.5 ") == 0.5
        assert retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") is None
        assert retry_after_s("-1") is None
        assert retry_after_s(None) is None
        assert Retries(3).wait_s(None) == 1.0
        assert Retries(3).wait_s(600) == MAX_RETRY_WAIT_S
        assert Retries(3, delay_s=0.05).wait_s(5) == 0.05

    @pytest.mark.parametrize(
        ("attempts", "delay_s", "says"),
        [(-1, None, "retries must be at least 0"), (1, 11.0, "retry delay must be in")],
    )
    def test_nonsense_is_refused(self, attempts: int, delay_s: float | None, says: str) -> None:
        with pytest.raises(ValueError, match=says):
            Retries(attempts, delay_s)


class TestHedgingClients:
    async def test_a_slow_answer_is_hedged_and_the_first_success_wins(
        self, server: FakeV2Server
    ) -> None:
        # Every answer takes 0.3 s; the clients send again after 50 ms, marked as Envoy does.
        server.behaviour = Behaviour(delay_s=0.3)
        report = await run_load(
            LoadConfig(
                target=target(server),
                duration_s=10,
                concurrency=1,
                max_requests=3,
                hedge_s=0.05,
                retries=Retries(0, marked=True),
            )
        )
        assert (report.succeeded, report.sent, report.hedges) == (3, 3, 3)
        assert server.attempts_seen == [None, "2"] * 3
        assert report.latency_ms is not None
        # the first send's answer, not the copy's 50 ms later
        assert report.latency_ms.max_ms < 345
        assert "3 requests sent twice, the slower send cancelled: 6 arrivals" in (
            format_report(report)
        )

    def test_each_send_out_has_a_connection_of_its_own(self, server: FakeV2Server) -> None:
        # two sends of a hedged request at once: a pool of one per client would hold the copy
        # back until the first send's answer came, and then it is no use
        plain = LoadConfig(target=target(server), duration_s=1, concurrency=3)
        assert plain.pool_size == 3
        assert replace(plain, hedge_s=0.1).pool_size == 6
        assert replace(plain, hedge_s=0.1, connections=4).pool_size == 4

    async def test_a_quick_answer_is_not_hedged(self, server: FakeV2Server) -> None:
        report = await run_load(
            LoadConfig(
                target=target(server), duration_s=10, concurrency=1, max_requests=3, hedge_s=1.0
            )
        )
        assert (report.succeeded, report.hedges, server.infer_count) == (3, 0, 3)

    async def test_a_refused_send_waits_for_the_other(self, server: FakeV2Server) -> None:
        # the copy (sent at 50 ms) is refused at once, the first send answered at 0.2 s
        server.behaviour = Behaviour(delay_s=0.2, status_every=(2, 503))
        report = await run_load(
            LoadConfig(
                target=target(server), duration_s=10, concurrency=1, max_requests=1, hedge_s=0.05
            )
        )
        assert (report.succeeded, report.shed, report.hedges) == (1, 0, 1)

    @pytest.mark.parametrize(
        ("hedge_s", "attempts", "says"),
        [(0.0, 0, "hedging delay must be positive"), (0.1, 1, "a hedged request is not retried")],
    )
    def test_nonsense_is_refused(
        self, server: FakeV2Server, hedge_s: float, attempts: int, says: str
    ) -> None:
        with pytest.raises(ValueError, match=says):
            LoadConfig(
                target=target(server),
                duration_s=1,
                concurrency=1,
                hedge_s=hedge_s,
                retries=Retries(attempts),
            )


async def test_other_statuses_are_failures_by_code(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(status_every=(4, 500))
    report = await run_load(
        LoadConfig(target=target(server), duration_s=10, concurrency=2, max_requests=40)
    )
    assert report.errors == {"500": 10}
    assert (report.shed, report.failed) == (0, 10)


async def test_slow_responses_time_out(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(delay_s=0.5)
    report = await run_load(
        LoadConfig(
            target=target(server, timeout_s=0.2), duration_s=0.3, concurrency=2, max_requests=2
        )
    )
    assert report.errors == {"timeout": 2}
    assert report.latency_ms is None


async def test_dropped_connections_are_connection_errors(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(drop_connection=True)
    report = await run_load(
        LoadConfig(target=target(server), duration_s=5, concurrency=1, max_requests=3)
    )
    assert report.errors == {"connection": 3}
    assert report.failed == 3


async def test_arrivals_beyond_max_outstanding_are_dropped_by_the_client(
    server: FakeV2Server,
) -> None:
    server.behaviour = Behaviour(delay_s=0.5)
    report = await run_load(
        LoadConfig(
            target=target(server),
            duration_s=0.3,
            schedule=RateSchedule.constant(100),
            arrivals="uniform",
            max_outstanding=5,
        )
    )
    # 30 arrivals in 0.3 s, none answered before 0.5 s: 5 go out, 25 are dropped.
    assert report.errors == {"dropped_client": 25}
    assert (report.sent, report.succeeded, report.scheduled) == (5, 5, 30)
    assert not report.valid
    assert report.invalid_reason is not None
    assert report.invalid_reason.startswith("the client dropped 25 of 30 arrivals")
    assert report.send_lag_ms is not None
    assert report.send_lag_ms.count == 5  # the dropped ones were never sent: no lag


async def test_refusals_are_timed_and_goodput_counts_answers_within_the_sla(
    server: FakeV2Server,
) -> None:
    server.behaviour = Behaviour(status_every=(2, 503))
    report = await run_load(
        LoadConfig(
            target=target(server),
            duration_s=0.4,
            schedule=RateSchedule.constant(50),
            arrivals="uniform",
            sla_ms=1000,
            max_send_lag_ms=PATIENT_LAG_MS,
        )
    )
    # 20 arrivals, every 2nd refused at once: 10 refusals answered in far less than a timeout.
    assert (report.scheduled, report.shed, report.succeeded) == (20, 10, 10)
    assert report.shed_latency_ms is not None
    assert report.shed_latency_ms.count == 10
    assert report.shed_latency_ms.max_ms < 1000
    # Every success of this instant server is within 1 s: goodput is the achieved rate.
    assert report.sla_ms == 1000
    assert report.goodput_rps == pytest.approx(report.achieved_qps)
    text = loadgen.format_report(report)
    assert "refused in" in text
    assert "goodput" in text


async def test_find_max_stops_at_an_invalid_probe(server: FakeV2Server) -> None:
    # Two requests may be outstanding and none is answered for 0.5 s: the probe's third arrival
    # is dropped by the client, so the probe measured less than 100 rps and says nothing.
    server.behaviour = Behaviour(delay_s=0.5)
    result = await find_max_rate(
        SearchConfig(
            target=target(server, timeout_s=2),
            sla_ms=1000,
            start_rps=100,
            probe_duration_s=0.3,
            arrivals="uniform",
            max_outstanding=2,
            settle_s=0,
        )
    )
    assert (result.stopped_because, result.best_rps, len(result.probes)) == (
        "invalid_probe",
        None,
        1,
    )
    (probe,) = result.probes
    assert not probe.passed
    assert not probe.report.valid
    assert result.invalid_reason == probe.report.invalid_reason
    assert result.invalid_reason is not None
    assert result.invalid_reason.startswith("the client dropped")
    assert result.to_dict()["invalid_reason"] == result.invalid_reason
    assert "INVALID PROBE, search stopped: the client dropped" in loadgen.format_search(result)


async def test_warmup_is_sent_but_not_counted(server: FakeV2Server) -> None:
    report = await run_load(
        LoadConfig(
            target=target(server),
            duration_s=0.5,
            warmup_s=0.5,
            schedule=RateSchedule.constant(40),
            arrivals="uniform",
        )
    )
    assert report.scheduled == 20
    assert server.infer_count == 40


async def test_json_tensors_and_verify(server: FakeV2Server) -> None:
    report = await run_load(
        LoadConfig(
            target=target(server, json_tensors=True, verify=True, rows=2),
            duration_s=5,
            concurrency=2,
            max_requests=10,
        )
    )
    assert (report.succeeded, report.errors) == (10, {})


async def test_verify_catches_a_wrong_response(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(wrong_output=True)
    report = await run_load(
        LoadConfig(target=target(server, verify=True), duration_s=5, concurrency=1, max_requests=3)
    )
    assert report.errors == {"invalid_response": 3}


async def test_unreachable_target_and_unknown_model_are_target_errors(
    server: FakeV2Server,
) -> None:
    nowhere = Target(url=f"http://127.0.0.1:{free_port()}", model=MODEL, timeout_s=2)
    with pytest.raises(TargetError, match="cannot reach"):
        await run_load(LoadConfig(target=nowhere, duration_s=1, concurrency=1))
    unknown = Target(url=server.url, model="nope")
    with pytest.raises(TargetError, match="404"):
        await run_load(LoadConfig(target=unknown, duration_s=1, concurrency=1))


# --- Finding the maximum rate -----------------------------------------------------------------


async def test_find_max_converges_below_the_saturation_rate(server: FakeV2Server) -> None:
    # A single-server queue with a 10 ms service time serves at most 100 rps. With evenly spaced
    # arrivals it never queues below that rate (P99 ≈ 10 ms) and queues without bound above it
    # (at 1.2x the backlog grows 0.2 s per second), so P99 <= 50 ms holds up to ~100 rps.
    server.behaviour = Behaviour(service_s=0.010)
    result = await find_max_rate(
        SearchConfig(
            target=target(server, timeout_s=2),
            sla_ms=50,
            start_rps=25,
            probe_duration_s=0.6,
            precision=0.1,
            arrivals="uniform",
            settle_s=0.2,
            max_total_s=30,
            max_send_lag_ms=PATIENT_LAG_MS,
        )
    )
    assert result.stopped_because == "converged"
    assert result.best_rps is not None
    assert 60 <= result.best_rps <= 130
    rates = [p.rate_rps for p in result.probes]
    assert rates[:3] == [25, 50, 100] or rates[:2] == [25, 50]
    failed = [p for p in result.probes if not p.passed]
    assert failed
    assert all(p.rate_rps > result.best_rps for p in failed)
    assert any(p.report.aborted for p in failed)  # overloaded probes stop early
    assert len(result.probes) <= 10


async def test_find_max_counts_shed_load_as_failure(server: FakeV2Server) -> None:
    server.behaviour = Behaviour(status_every=(1, 503))
    result = await find_max_rate(
        SearchConfig(
            target=target(server),
            sla_ms=100,
            start_rps=20,
            probe_duration_s=0.3,
            settle_s=0,
            min_rps=5,
            max_send_lag_ms=PATIENT_LAG_MS,
        )
    )
    assert result.best_rps is None
    assert result.stopped_because == "nothing_passes"
    assert [p.rate_rps for p in result.probes] == [20, 10, 5]


async def test_find_max_stops_at_the_probe_budget(server: FakeV2Server) -> None:
    result = await find_max_rate(
        SearchConfig(
            target=target(server),
            sla_ms=1000,
            start_rps=5,
            probe_duration_s=0.2,
            settle_s=0,
            max_probes=2,
            max_send_lag_ms=PATIENT_LAG_MS,
        )
    )
    assert (result.stopped_because, len(result.probes), result.best_rps) == ("max_probes", 2, 10)


# --- Command line ---------------------------------------------------------------------------


def test_cli_run_writes_a_json_report(
    server: FakeV2Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    argv = ["--url", server.url, "--model", MODEL, "--rate", "50", "--duration", "0.5"]
    patient = ["--max-send-lag-ms", str(PATIENT_LAG_MS)]
    code = loadgen.run_cli([*argv, *patient, "--arrivals", "uniform", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "open"
    assert doc["scheduled"] == 25
    assert doc["succeeded"] == 25
    assert doc["errors"] == {}
    assert set(doc["latency_ms"]) == {"count", "mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms"}
    assert doc["windows"] == [
        {
            "start_s": 0,
            "end_s": 0.5,
            "offered_rps": 50,
            "served_rps": 50,
            "errors": 0,
            "p99_ms": doc["windows"][0]["p99_ms"],
        }
    ]
    assert (doc["valid"], doc["invalid_reason"]) == (True, None)
    assert doc["send_lag_ms"]["count"] == 25
    assert (doc["shed_latency_ms"], doc["sla_ms"], doc["goodput_rps"]) == (None, None, None)
    out_text = capsys.readouterr().out
    assert "achieved" in out_text
    assert "send lag" in out_text
    assert "INVALID" not in out_text
    assert doc["retries"] == 0


def test_cli_retries_refused_requests(
    server: FakeV2Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.behaviour = Behaviour(status_every=(2, 503))
    out = tmp_path / "report.json"
    argv = ["--url", server.url, "--model", MODEL, "--concurrency", "1", "--duration", "10"]
    retrying = ["--requests", "4", "--retries", "1", "--retry-delay-s", "0", "--mark-retries"]
    assert loadgen.run_cli([*argv, *retrying, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["succeeded"], doc["retries"]) == (4, 3)
    assert "3 refused sends repeated" in capsys.readouterr().out
    assert server.attempts_seen.count("2") == 3


def test_cli_hedges_slow_requests(
    server: FakeV2Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.behaviour = Behaviour(delay_s=0.2)
    out = tmp_path / "report.json"
    argv = ["--url", server.url, "--model", MODEL, "--concurrency", "1", "--duration", "10"]
    assert loadgen.run_cli([*argv, "--requests", "2", "--hedge-ms", "30", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["hedges"] == 2
    assert "2 requests sent twice" in capsys.readouterr().out
    assert server.attempts_seen == [None] * 4


def test_cli_sends_a_mix_of_rows_a_request(
    server: FakeV2Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    argv = ["--url", server.url, "--model", MODEL, "--concurrency", "4", "--duration", "30"]
    mix = ["--rows", "1:3,8:1", "--requests", "400", "--verify", "--json", str(out)]
    assert loadgen.run_cli([*argv, *mix]) == 0
    # every answer verified against its own request's rows; about one in four of 8 rows
    assert json.loads(out.read_text())["succeeded"] == 400
    assert set(server.rows_seen) == {1, 8}
    assert 60 <= server.rows_seen.count(8) <= 140
    assert "rows         rows a request: 1 (75%), 8 (25%); mean 2.75, cv 1.10" in (
        capsys.readouterr().out
    )


def test_a_mix_of_rows_is_drawn_from_the_seed(server: FakeV2Server) -> None:
    def rows_sent(seed: int) -> list[int]:
        server.rows_seen.clear()
        target = Target(url=server.url, model=MODEL, row_mix=RowMix.parse("1:1,2:1,4:1"), seed=seed)
        config = LoadConfig(target=target, duration_s=30, concurrency=1, max_requests=30)
        asyncio.run(run_load(config))
        return list(server.rows_seen)

    first = rows_sent(7)
    assert rows_sent(7) == first
    assert rows_sent(8) != first
    with pytest.raises(ValueError, match="explicit shapes"):
        Target(url=server.url, model=MODEL, row_mix=RowMix.parse("1:1,2:1"), shapes={"x": (2, 4)})


def test_cli_json_to_stdout_stays_parseable(
    server: FakeV2Server, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", server.url, "--model", MODEL, "--concurrency", "2", "--duration", "5"]
    assert loadgen.run_cli([*argv, "--requests", "6", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert orjson.loads(captured.out)["succeeded"] == 6
    assert "closed loop" in captured.err


def test_cli_find_max(server: FakeV2Server, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--url", server.url, "--model", MODEL, "--find-max", "--sla-ms", "1000"]
    search = ["--start-rps", "5", "--probe-duration-s", "0.2", "--max-probes", "2"]
    patient = ["--max-send-lag-ms", str(PATIENT_LAG_MS)]
    code = loadgen.run_cli([*argv, *search, *patient, "--settle-s", "0", "--json", "-"])
    assert code == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert (doc["best_rps"], doc["stopped_because"], len(doc["probes"])) == (10, "max_probes", 2)


def test_cli_invalid_run_exits_3_with_its_report(
    server: FakeV2Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 12 arrivals in 0.3 s, 2 may be outstanding, none answered for 0.5 s: 10 are dropped.
    server.behaviour = Behaviour(delay_s=0.5)
    out = tmp_path / "report.json"
    argv = ["--url", server.url, "--model", MODEL, "--rate", "40", "--duration", "0.3"]
    load = ["--arrivals", "uniform", "--max-outstanding", "2", "--sla-ms", "100"]
    assert loadgen.run_cli([*argv, *load, "--json", str(out)]) == EXIT_INVALID == 3
    doc = json.loads(out.read_text())
    assert doc["valid"] is False
    assert doc["invalid_reason"].startswith("the client dropped 10 of 12 arrivals")
    assert doc["send_lag_ms"]["count"] == 2
    # Both answers took ~0.5 s, beyond the 100 ms SLA: nothing good was put out.
    assert (doc["sla_ms"], doc["goodput_rps"]) == (100, 0)
    text = capsys.readouterr().out
    assert "INVALID RUN: the client dropped 10 of 12 arrivals" in text
    assert "goodput      0.0 rps" in text


def test_cli_help_documents_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadgen.run_cli(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "3 the run completed but is INVALID" in help_text
    assert "--max-send-lag-ms" in help_text


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(["--rate", "10"], id="no-duration"),
        pytest.param(["--duration", "1"], id="no-mode"),
        pytest.param(["--duration", "1", "--rate", "10", "--concurrency", "2"], id="two-modes"),
        pytest.param(["--duration", "1", "--schedule", "0:10,0:20"], id="bad-schedule"),
        pytest.param(["--duration", "1", "--schedule-file", "/nonexistent.csv"], id="no-file"),
        pytest.param(["--duration", "1", "--rate", "-5"], id="negative-rate"),
        pytest.param(["--duration", "0", "--rate", "5"], id="zero-duration"),
        pytest.param(["--duration", "1e9", "--rate", "5"], id="endless"),
        pytest.param(["--duration", "1", "--concurrency", "0"], id="no-workers"),
        pytest.param(["--duration", "1", "--rate", "5", "--shape", "x"], id="bad-shape"),
        pytest.param(["--duration", "1", "--rate", "5", "--rows", "0"], id="no-rows"),
        pytest.param(["--duration", "1", "--rate", "5", "--rows", "1:9,16"], id="half-a-mix"),
        pytest.param(["--duration", "1", "--rate", "5", "--rows", "0:1,4:1"], id="empty-size"),
        pytest.param(["--find-max"], id="find-max-without-sla"),
        pytest.param(["--duration", "x", "--rate", "5"], id="not-a-number"),
        pytest.param(["--duration", "1", "--rate", "5", "--max-send-lag-ms", "0"], id="no-lag"),
        pytest.param(["--duration", "1", "--rate", "5", "--sla-ms", "-1"], id="negative-sla"),
        pytest.param(["--duration", "1", "--rate", "5", "--retries", "-1"], id="negative-retries"),
        pytest.param(["--find-max", "--sla-ms", "100", "--retries", "1"], id="find-max-retrying"),
        pytest.param(["--duration", "1", "--rate", "5", "--mark-retries"], id="marking-no-retries"),
        pytest.param(["--duration", "1", "--rate", "5", "--hedge-ms", "0"], id="hedge-at-once"),
        pytest.param(
            ["--duration", "1", "--rate", "5", "--hedge-ms", "20", "--retries", "1"],
            id="hedge-and-retry",
        ),
        pytest.param(["--find-max", "--sla-ms", "100", "--hedge-ms", "20"], id="find-max-hedging"),
    ],
)
def test_cli_bad_arguments_exit_2(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens there: a bad argument must be refused before anything is sent.
    url = f"http://127.0.0.1:{free_port()}"
    assert loadgen.run_cli(["--url", url, "--model", MODEL, *extra]) == 2
    assert capsys.readouterr().err


def test_cli_unreachable_target_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--url", url, "--model", MODEL, "--rate", "5", "--duration", "1", "--timeout-s", "2"]
    assert loadgen.run_cli(argv) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_main_takes_the_dispatchers_namespace() -> None:
    parser = argparse.ArgumentParser()
    loadgen.add_arguments(parser)
    args = parser.parse_args(["--url", "http://127.0.0.1:1", "--model", MODEL, "--rate", "1"])
    assert loadgen.main(args) == 2  # no --duration


class TestHeaders:
    def target(self, *extra: str) -> Target:
        parser = argparse.ArgumentParser()
        loadgen.add_arguments(parser)
        argv = ["--url", "http://127.0.0.1:1", "--model", MODEL, "--rate", "1", "--duration", "1"]
        config = loadgen.config_from_args(parser.parse_args([*argv, *extra]))
        return config.target

    def test_an_api_key_and_headers_go_with_every_request(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("BATCHPILOT_API_KEY", raising=False)
        target = self.target("--api-key", "k-123", "--header", "x-team: vision")
        assert target.headers == {"Authorization": "Bearer k-123", "x-team": "vision"}
        assert "k-123" not in repr(target)
        monkeypatch.setenv("BATCHPILOT_API_KEY", "from-env")
        assert self.target().headers == {"Authorization": "Bearer from-env"}

    def test_a_header_without_a_colon_is_a_usage_error(self) -> None:
        with pytest.raises(ValueError, match="is not 'NAME: VALUE'"):
            self.target("--header", "x-team")
