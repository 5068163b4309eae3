"""Prometheus' side of the simulation: rate() as Prometheus computes it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchpilot.operator.simulation.scrape import Target, extrapolated_increase


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

    def test_a_lazy_series_starts_at_its_first_non_zero_sample(self) -> None:
        lazy = np.array([True])
        target = Target(phase_s=5.0, interval_s=15.0, since=0.0, until=300.0, columns=1, lazy=lazy)
        self.add(target, uniform(2.0, 30.25, 62.0))  # the series appears at the scrape at 35 s
        # Samples 35, 50 s hold 10, 40: as in the by-hand case above, 30 · 30/15 = 60.
        assert target.increase(60.0, 60.0, slice(0, 1))[0] == pytest.approx(60)
