"""Prometheus' side of the simulation: rate() as Prometheus computes it, scrape lag, staleness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchpilot.simulation.observe import Telemetry
from batchpilot.simulation.scrape import Target, extrapolated_increase, sum_rate


def increase(times: list[float], values: list[float], *, start: float, end: float) -> float:
    return float(
        extrapolated_increase(
            first=np.array([values[0]]),
            last=np.array([values[-1]]),
            first_t=times[0],
            last_t=times[-1],
            samples=len(times),
            start=start,
            end=end,
        )[0]
    )


class TestExtrapolatedIncrease:
    """Each case by hand, as Prometheus' extrapolatedRate computes it, over the range (0, 60]."""

    def test_samples_near_both_edges_extrapolate_to_them(self) -> None:
        # Samples 5, 20, 35, 50 s: 15 s apart, so edges closer than 16.5 s are reached. 90 over
        # the 45 s sampled, stretched by 5 s at the start and 10 s at the end: 90 · 60/45 = 120.
        # The zero point (45 · 100/90 = 50 s before the first sample) is farther than the edge.
        got = increase([5, 20, 35, 50], [100, 130, 160, 190], start=0, end=60)
        assert got == pytest.approx(120)

    def test_a_counter_that_starts_inside_the_range_goes_back_to_zero_only(self) -> None:
        # Samples at 35 and 50 s only: the start is 35 s away (≥ 16.5), so half an interval
        # (7.5 s) at most; the counter, 10 at 35 s and rising 30 per 15 s, was 0 at 30 s: 5 s.
        # The end is 10 s away: all of it. 30 · (15 + 5 + 10)/15 = 60.
        got = increase([35, 50], [10, 40], start=0, end=60)
        assert got == pytest.approx(60)

    def test_a_gap_at_the_end_extrapolates_half_an_interval(self) -> None:
        # A replica gone after its scrape at 20 s: the end is 40 s away, so 7.5 s; the counter
        # was 0 at the first sample, so nothing before it. 30 · (15 + 0 + 7.5)/15 = 45.
        got = increase([5, 20], [0, 30], start=0, end=60)
        assert got == pytest.approx(45)

    def test_a_flat_counter_increases_by_nothing(self) -> None:
        assert increase([5, 20, 35], [7, 7, 7], start=0, end=60) == 0.0

    def test_one_sample_is_no_rate(self) -> None:
        assert math.isnan(increase([20], [30], start=0, end=60))


def uniform(rate: float, start: float, end: float) -> np.ndarray:
    """Arrivals evenly spaced at `rate` per second over [start, end)."""
    return start + np.arange(round((end - start) * rate)) / rate


class TestTarget:
    def make(self) -> Target:
        # Scrapes at 5, 20, 35, 50, 65, … s.
        return Target(phase_s=5.0, interval_s=15.0, since=0.0, until=300.0, columns=1)

    def add(self, target: Target, times: np.ndarray) -> None:
        target.add(
            target.rows(times), np.zeros(times.shape[0], dtype=np.int64), np.ones(len(times))
        )

    def test_a_query_sees_only_the_scrapes_before_it(self) -> None:
        target = self.make()
        self.add(target, uniform(2.0, 0.0, 62.0))  # 2 per second, and nothing after 62 s
        # At 64.9 s the scrape at 65 s has not happened: the samples at 5, 20, 35, 50 s hold
        # 11, 41, 71, 101 (events at a scrape's instant count in it). Gaps of 0.1 s (start) and
        # 14.9 s (end) are both extrapolated to: 90 · (45 + 0.1 + 14.9)/45 = 120.
        before = target.increase(64.9, 60.0, slice(0, 1))[0]
        assert before == pytest.approx(120)
        # At 65.1 s the scrape at 65 s (124, the traffic stopped at 62 s) is in, 5 s is out:
        # 83 over 45 s, stretched by 14.9 s and 0.1 s: 83 · 60/45.
        after = target.increase(65.1, 60.0, slice(0, 1))[0]
        assert after == pytest.approx(83 * 60 / 45)

    def test_irate_is_the_rate_between_the_last_two_scrapes_in_the_range(self) -> None:
        target = self.make()
        self.add(target, np.concatenate([uniform(2.0, 0.0, 35.0), uniform(6.0, 35.0, 62.0)]))
        # At 64.9 s the last two scrapes are at 35 and 50 s: 15 s at 6 per second.
        assert target.last_rate(64.9, 30.0, slice(0, 1))[0] == pytest.approx(6.0)
        # A range of 10 s holds one scrape: no value.
        assert math.isnan(target.last_rate(64.9, 10.0, slice(0, 1))[0])

    def test_a_lazy_series_starts_at_its_first_non_zero_sample(self) -> None:
        lazy = np.array([True])
        target = Target(phase_s=5.0, interval_s=15.0, since=0.0, until=300.0, columns=1, lazy=lazy)
        self.add(target, uniform(2.0, 30.25, 62.0))  # the series appears at the scrape at 35 s
        # Samples 35, 50 s hold 10, 40: as in the by-hand case above, 30 · 30/15 = 60.
        assert target.increase(60.0, 60.0, slice(0, 1))[0] == pytest.approx(60)

    def test_an_exported_series_is_seen_at_zero_from_the_next_scrape(self) -> None:
        # The runtime exports a batch bucket's series at zero when a batch limit that reaches
        # it comes into force, before its first batch.
        lazy = np.array([True])
        target = Target(phase_s=5.0, interval_s=15.0, since=0.0, until=300.0, columns=1, lazy=lazy)
        target.export(np.array([0]), 12.0)  # seen from the scrape at 20 s
        self.add(target, uniform(2.0, 30.25, 62.0))
        # Samples 20, 35, 50 s hold 0, 10, 40: nothing extrapolated back past the zero, 10 s
        # forward to the range's end at the average rate: 40 · 40/30.
        assert target.increase(60.0, 60.0, slice(0, 1))[0] == pytest.approx(40 * 40 / 30)


def scraped(intervals: int) -> Telemetry:
    """Decisions every second, scrapes every 15 s, a 60 s window."""
    return Telemetry(
        intervals=intervals, interval_s=1.0, sla_s=0.1, overhead_s=0.0, scrape_interval_s=15.0
    )


def between_scrapes(target: Target, after: float) -> float:
    """The midpoint between the first two scrapes of `target` after `after`."""
    return target.origin + math.ceil((after - target.origin) / 15) * 15 + 7.5


class TestScrapeLag:
    def test_a_step_in_traffic_shows_only_after_the_next_scrape(self) -> None:
        telemetry = scraped(200)
        telemetry.add_target(0, since=0.0, batch_limit=1)
        step = between_scrapes(telemetry.targets[0], 100.0)  # 100 → 300 rps
        telemetry.record_arrivals(
            0, np.concatenate([uniform(100, 0, step), uniform(300, step, 200)])
        )
        scrape = step + 7.5  # the first that sees the step
        for k in range(math.ceil(step), 160):
            seen = telemetry.observe(k, ready=1, reporting=1).arrival_qps
            assert seen is not None
            if k < scrape:
                # A straight counter and samples 15 s apart: the rate is exact, and old.
                assert seen == pytest.approx(100, rel=0.01), k
            else:
                # 7.5 s at 300 rps in the last sample: 1500 more over the 45 s sampled,
                # stretched to the 60 s window: at least 100 + 1500 · 60/45/60 ≈ 133.
                assert seen > 130, k

    def test_the_exact_view_shows_it_at_the_next_decision(self) -> None:
        telemetry = Telemetry(intervals=200, interval_s=1.0, sla_s=0.1, overhead_s=0.0)
        telemetry.record_arrivals(0, np.concatenate([uniform(100, 0, 100), uniform(300, 100, 200)]))
        assert telemetry.observe(100, ready=1, reporting=1).arrival_qps == pytest.approx(100)
        assert telemetry.observe(101, ready=1, reporting=1).arrival_qps == pytest.approx(
            (59 * 100 + 300) / 60
        )


class TestStaleness:
    def setup(self) -> tuple[Telemetry, float]:
        """Two replicas at 100 rps each; the second goes away between two of its scrapes."""
        telemetry = scraped(400)
        telemetry.add_target(0, since=0.0, batch_limit=1)
        telemetry.add_target(1, since=0.0, batch_limit=1)
        gone = between_scrapes(telemetry.targets[1], 120.0)
        telemetry.record_arrivals(0, uniform(100, 0, 400))
        telemetry.record_arrivals(1, uniform(100, 0, gone))
        telemetry.remove_target(1, at=gone)
        return telemetry, gone

    def test_a_removed_replica_counts_until_its_last_sample_leaves_the_window(self) -> None:
        telemetry, gone = self.setup()
        last = gone - 7.5  # its last scrape
        for k in range(math.ceil(gone), 220):
            seen = telemetry.observe(k, ready=1, reporting=1).arrival_qps
            assert seen is not None
            if k < last + 45:
                # Two samples of it or more in the window: its rate, extrapolated half an
                # interval past its last sample at least (≥ 100 · 22.5/60), still adds.
                assert seen > 135, k
            else:
                # One sample of it at most: only the replica that stayed.
                assert seen == pytest.approx(100, rel=0.01), k

    def test_its_series_leave_instant_vectors_when_marked_stale(self) -> None:
        telemetry, gone = self.setup()
        # Prometheus marks the series stale with the scrape that would have come after it went,
        # writing the marker one interval (+10 %) later; until then its last sample is current.
        missed = gone + 7.5
        assert telemetry.targets[1].present(missed + 16.4)
        assert not telemetry.targets[1].present(missed + 16.6)
        assert telemetry.targets[0].present(missed + 16.6)

    def test_a_range_without_two_samples_of_any_target_is_no_value(self) -> None:
        telemetry, gone = self.setup()
        removed = [telemetry.targets[1]]
        assert np.isnan(sum_rate(removed, gone + 120.0, 60.0, slice(0, 1))).all()
        assert not np.isnan(sum_rate(removed, gone + 10.0, 60.0, slice(0, 1))).any()
