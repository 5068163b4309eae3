"""The arrival rate of the last seconds: what the gauge reads at a scrape, on a fake clock."""

from __future__ import annotations

import pytest

from batchpilot.runtime.arrival_rate import RecentArrivals


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def arrive(recent: RecentArrivals, clock: Clock, *, rate: float, seconds: float) -> None:
    """Arrivals evenly spaced at `rate` per second for `seconds`."""
    for _ in range(round(rate * seconds)):
        clock.now += 1 / rate
        recent.arrived()


class TestRecentArrivals:
    def test_a_steady_rate_reads_as_itself(self) -> None:
        clock = Clock()
        recent = RecentArrivals(span_s=5, clock=clock)
        arrive(recent, clock, rate=100, seconds=20)
        assert recent.rate() == pytest.approx(100, rel=0.03)

    def test_a_step_shows_whole_once_it_is_as_old_as_the_span(self) -> None:
        clock = Clock()
        recent = RecentArrivals(span_s=5, clock=clock)
        arrive(recent, clock, rate=50, seconds=30)
        arrive(recent, clock, rate=400, seconds=2)
        assert 150 < recent.rate() < 250  # two of the five seconds at the new rate
        arrive(recent, clock, rate=400, seconds=4)
        assert recent.rate() == pytest.approx(400, rel=0.03)

    def test_silence_reads_zero_and_old_arrivals_leave(self) -> None:
        clock = Clock()
        recent = RecentArrivals(span_s=5, clock=clock)
        assert recent.rate() == 0.0
        arrive(recent, clock, rate=100, seconds=3)
        clock.now += 6  # the ring's slots still hold them: they are too old to count
        assert recent.rate() == 0.0

    def test_before_the_span_has_passed_the_time_since_the_start_counts(self) -> None:
        clock = Clock()
        recent = RecentArrivals(span_s=5, clock=clock)
        arrive(recent, clock, rate=100, seconds=1)
        assert recent.rate() == pytest.approx(100, rel=0.03)

    def test_a_bucket_must_be_shorter_than_the_span(self) -> None:
        with pytest.raises(ValueError, match="bucket_s < span_s"):
            RecentArrivals(span_s=1, bucket_s=1)
