"""What the autopilot sees: Prometheus' histogram_quantile over the runtime's buckets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchpilot.operator.autopilot.observation import ComputePoint
from batchpilot.operator.autopilot.prometheus import Seasonality
from batchpilot.runtime.metrics import LATENCY_BUCKETS
from batchpilot.simulation.cluster import startup_timing
from batchpilot.simulation.observe import (
    Telemetry,
    exact_quantile,
    histogram_quantile,
)
from batchpilot.simulation.replica import Served
from batchpilot.simulation.service import ServiceTruth

T_2_1 = ServiceTruth(alpha_s=0.002, beta_s=0.001)
"""t(b) = 2 + 1·b ms."""


class TestHistogramQuantile:
    def test_interpolates_linearly_inside_the_bucket_that_holds_the_rank(self) -> None:
        # 100 observations: 50 in (0, 0.1], 40 in (0.1, 0.2], 10 in (0.2, 0.4].
        # P90: rank 90 is the last of the second bucket → 0.2.
        # P95: rank 95 is 5 of the 10 in (0.2, 0.4] → 0.2 + 0.2 · 5/10 = 0.3.
        bounds, counts = [0.1, 0.2, 0.4], [50, 40, 10, 0]
        assert histogram_quantile(0.90, bounds, counts) == pytest.approx(0.2)
        assert histogram_quantile(0.95, bounds, counts) == pytest.approx(0.3)
        # P25: rank 25 of 50 in the first bucket, which starts at 0 → 0.05.
        assert histogram_quantile(0.25, bounds, counts) == pytest.approx(0.05)

    def test_a_rank_in_the_inf_bucket_is_the_highest_finite_bound(self) -> None:
        assert histogram_quantile(0.99, [0.1, 0.2], [10, 10, 80]) == 0.2

    def test_no_observations_is_nan(self) -> None:
        assert math.isnan(histogram_quantile(0.99, [0.1], [0, 0]))

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_agrees_with_the_exact_p99_within_bucket_resolution(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        latency = 0.040 + rng.gamma(2.0, 0.012, size=20_000)  # 40 ms fixed + a queueing tail
        bounds = np.array(LATENCY_BUCKETS)
        counts = np.bincount(
            np.searchsorted(bounds, latency, side="left"), minlength=len(bounds) + 1
        )
        estimate = histogram_quantile(0.99, bounds.tolist(), counts.tolist())
        exact = exact_quantile(0.99, latency)
        assert estimate == pytest.approx(exact, rel=0.15)  # buckets are 15 % apart


def test_exact_quantile_counts_shed_requests_as_infinitely_slow() -> None:
    values = np.linspace(0.001, 0.1, 99)
    assert exact_quantile(0.99, values, infinite=0) == pytest.approx(0.1)
    assert math.isinf(exact_quantile(0.99, values, infinite=2))  # 2 of 101 are over 1 %


class TestTelemetry:
    def test_an_observation_is_the_window_seen_through_the_runtime_metrics(self) -> None:
        telemetry = Telemetry(
            intervals=8, interval_s=15, sla_s=0.1, overhead_s=0.0, window_s=60, recent_window_s=15
        )
        # Batches of 1 and of 3 rows, t(b) = 2 + 1·b ms, in the first 60 s.
        dispatched = np.arange(0.0, 60.0, 0.5)
        sizes = np.where(np.arange(len(dispatched)) % 2 == 0, 1, 3)
        arrivals = np.repeat(dispatched, sizes) - 0.004  # every request waited 4 ms
        took = T_2_1.batch_seconds(sizes)
        telemetry.record([(0, Served(dispatched, sizes, arrivals, took))], truth=T_2_1)
        nothing = np.empty(0)
        refused = Served(
            nothing, np.empty(0, dtype=np.int64), nothing, nothing, shed_at=np.full(6, 30.0)
        )
        telemetry.record([(0, refused)], truth=T_2_1)
        telemetry.record_arrivals(0, np.concatenate([arrivals, np.full(6, 30.0)]))
        telemetry.record_unreached(4, at=50.0)  # no runtime counts these
        obs = telemetry.observe(4, ready=2, reporting=2)
        assert obs.at == 60.0
        assert obs.qps == pytest.approx(240 / 60)  # 60 batches of 1 + 60 of 3
        assert obs.rejected_qps == pytest.approx(6 / 60)
        assert obs.arrival_qps == pytest.approx(246 / 60)
        # The last 15 s: 15 batches of 1 and 15 of 3, but the first of them (1 row, at 45 s)
        # arrived 4 ms earlier: 59 arrivals (the 6 refused arrived at 30 s).
        assert obs.recent_qps == pytest.approx(59 / 15)
        assert obs.recent_window_s == 15
        assert obs.mean_batch == pytest.approx(2.0)
        assert obs.rows_per_request == pytest.approx(1.0)
        # Busy: 60 · 3 ms + 60 · 5 ms = 0.48 s over 60 s, shared by 2 replicas → 0.4 %.
        assert obs.utilization == pytest.approx(0.48 / 60 / 2)
        one, four = obs.compute  # batch buckets "1" and "4"
        assert (one.mean_batch, one.batches, four.mean_batch, four.batches) == (1, 60, 3, 60)
        assert one.mean_seconds == pytest.approx(0.003)  # t(1) = 2 + 1 ms
        assert four.mean_seconds == pytest.approx(0.005)  # t(3) = 2 + 3 ms
        # Latencies are 4 + 3 = 7 ms or 4 + 5 = 9 ms; their P99 is read from 15 %-wide buckets.
        assert obs.p99_s == pytest.approx(0.009, rel=0.15)
        assert obs.queue_p99_s == pytest.approx(0.004, rel=0.15)
        assert obs.ready_replicas == 2

    @staticmethod
    def two_minutes(
        scrape_s: float, truth: ServiceTruth, *, larger: int, overhead_s: float = 0.0
    ) -> Telemetry:
        """One replica (scraped every `scrape_s`, or exactly), two minutes of batches of 1 and
        `larger` requests in turn, one every 0.5 s, each request queued 4 ms."""
        telemetry = Telemetry(
            intervals=8,
            interval_s=15,
            sla_s=0.1,
            overhead_s=overhead_s,
            window_s=60,
            recent_window_s=15,
            scrape_interval_s=scrape_s,
        )
        telemetry.add_target(0, since=-30.0, batch_limit=8)
        assert telemetry.observe(2, ready=1, reporting=1).outside_s is None  # nothing answered
        dispatched = np.arange(0.0, 120.0, 0.5)
        sizes = np.where(np.arange(len(dispatched)) % 2 == 0, 1, larger)
        arrivals = np.repeat(dispatched, sizes) - 0.004
        telemetry.record_arrivals(0, arrivals)
        took = truth.alpha_s + truth.request_beta_s * sizes
        telemetry.record([(0, Served(dispatched, sizes, arrivals, took))], truth=truth)
        return telemetry

    @pytest.mark.parametrize("scrape_s", [0.0, 5.0])
    def test_requests_of_several_rows_count_rows_in_the_batches(self, scrape_s: float) -> None:
        # 4 rows a request: batches of 1 and of 2 requests run 4 and 8 rows, t = 6 and 10 ms.
        truth = ServiceTruth(alpha_s=0.002, beta_s=0.001, rows_per_request=4)
        obs = self.two_minutes(scrape_s, truth, larger=2).observe(6, ready=1, reporting=1)
        assert obs.qps == pytest.approx(3 / 1.0, rel=0.02)  # 3 requests a second
        assert obs.rows_per_request == pytest.approx(4.0, rel=0.02)
        assert obs.mean_batch == pytest.approx(6.0, rel=0.02)
        four, eight = obs.compute  # batch buckets "4" and "8"
        assert (four.mean_batch, eight.mean_batch) == (pytest.approx(4), pytest.approx(8))
        assert four.mean_seconds == pytest.approx(0.006)
        assert eight.mean_seconds == pytest.approx(0.010)

    @pytest.mark.parametrize("scrape_s", [0.0, 5.0])
    def test_the_time_outside_the_batcher_is_the_overhead(self, scrape_s: float) -> None:
        telemetry = self.two_minutes(scrape_s, T_2_1, larger=3, overhead_s=0.040)
        obs = telemetry.observe(6, ready=1, reporting=1)
        # every request: 4 ms queued, 3 or 5 computing, then 40 ms outside the batcher
        assert obs.outside_s == pytest.approx(0.040)
        assert obs.p99_s == pytest.approx(0.049, rel=0.15)

    @pytest.mark.parametrize("scrape_s", [0.0, 5.0])
    def test_the_start_up_timing_shows_while_a_replica_reports(self, scrape_s: float) -> None:
        timed = (ComputePoint(1, 0.003, 0), ComputePoint(64, 0.066, 0))
        telemetry = Telemetry(
            intervals=8, interval_s=15, sla_s=0.1, overhead_s=0.0, scrape_interval_s=scrape_s,
            startup=timed,
        )  # fmt: skip
        assert telemetry.observe(2, ready=0, reporting=0).startup == ()  # no replica yet
        telemetry.add_target(0, since=0.0, batch_limit=8)
        assert telemetry.observe(4, ready=1, reporting=1).startup == timed

    def test_the_runtimes_gauge_shows_a_step_whole_at_the_next_scrape(self) -> None:
        # 10 rps, then 100 rps from 100 s: the last scrape before 120 s is at least 5 s after
        # the step, so the gauge of the last 5 s reads the new rate whole.
        telemetry = Telemetry(
            intervals=10, interval_s=15, sla_s=0.1, overhead_s=0.0, scrape_interval_s=15
        )
        telemetry.add_target(0, since=-30.0, batch_limit=8)
        telemetry.record_arrivals(
            0, np.concatenate([np.arange(0, 100, 0.1), np.arange(100, 150, 0.01)])
        )
        obs = telemetry.observe(8, ready=1, reporting=1)
        assert obs.now_qps == pytest.approx(100, rel=0.03)
        assert obs.recent_qps is not None
        assert obs.recent_qps <= obs.now_qps + 1
        # exactly observed (no scrapes), the simulator has no gauge to read
        exact = Telemetry(intervals=10, interval_s=15, sla_s=0.1, overhead_s=0.0)
        exact.add_target(0, since=-30.0, batch_limit=8)
        assert exact.observe(8, ready=1, reporting=1).now_qps is None

    def test_a_scenario_times_up_to_its_largest_batch_limit(self) -> None:
        truth = ServiceTruth(alpha_s=0.002, beta_s=0.001)
        rows = [p.mean_batch for p in startup_timing(truth, 200, admission="deadline")]
        assert rows == [1, 64]  # the runtime's cap
        (one, sixteen) = startup_timing(truth, 16, admission="deadline")
        assert (one.mean_seconds, sixteen.mean_seconds) == (0.003, pytest.approx(0.018))
        assert startup_timing(truth, 16, admission="queue") == ()  # timed only for deadlines
        assert startup_timing(truth, None, admission="deadline") == ()


class TestSeasonal:
    """The seasonal signals, as the autopilot's queries would read them a period later."""

    @staticmethod
    def telemetry(periods: int) -> Telemetry:
        # 15 s intervals; a 40-minute period; 10 rps, stepping to 60 rps 2 minutes after t = 0
        # of every period for 10 minutes.
        season = Seasonality(period_s=2400, periods=periods, lookahead_s=300, level_s=600)
        telemetry = Telemetry(
            intervals=500, interval_s=15.0, sla_s=0.1, overhead_s=0.0, seasonality=season
        )
        for second in range(500 * 15):
            rate = 60 if 120 <= second % 2400 < 720 else 10
            telemetry.record_offered(second + np.arange(rate) / rate)
        return telemetry

    def test_each_period_s_level_and_look_ahead_peak(self) -> None:
        # A minute into the third period: the first period began a minute after t = 0 too.
        level, past = self.telemetry(periods=2).seasonal(2 * 2400 // 15 + 4)
        assert level == pytest.approx(10.0)
        assert len(past) == 2
        for period in past:
            assert period.level_qps == pytest.approx(10.0)
            assert period.ahead_qps == pytest.approx(60.0)

    def test_a_period_not_simulated_yet_means_no_past(self) -> None:
        level, past = self.telemetry(periods=3).seasonal(2 * 2400 // 15)
        assert level == pytest.approx(10.0)
        assert past == ()
