"""The arrival rate of the last seconds, how its arrivals clump, and the rate they met in their
second: what the gauges and counters read at a scrape, on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from batchpilot.runtime.arrival_rate import ArrivalDispersion, ArrivalSeconds, RecentArrivals


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


class TestArrivalDispersion:
    """Clock at 1000.005 s: slots of 10 ms start on whole hundredths."""

    @staticmethod
    def fresh() -> tuple[ArrivalDispersion, Clock]:
        clock = Clock()
        clock.now = 1000.005
        return ArrivalDispersion(span_s=10, slot_s=0.01, clock=clock), clock

    def test_nothing_arrived_reads_as_poisson(self) -> None:
        dispersion, clock = self.fresh()
        assert dispersion.dispersion() == 1.0
        clock.now += 5
        assert dispersion.dispersion() == 1.0

    def test_clumps_read_as_their_variance_over_their_mean(self) -> None:
        dispersion, clock = self.fresh()
        for _ in range(200):  # 5 at once, every fourth slot: counts 5, 0, 0, 0, …
            clock.now += 0.01
            for _ in range(5):
                dispersion.arrived()
            clock.now += 0.03
        # mean 1.25, mean square 6.25: variance 4.6875, over the mean 3.75
        assert dispersion.dispersion() == pytest.approx(3.75, rel=0.02)

    def test_one_arrival_every_slot_is_more_regular_than_poisson(self) -> None:
        dispersion, clock = self.fresh()
        for _ in range(500):
            clock.now += 0.01
            dispersion.arrived()
        assert dispersion.dispersion() == pytest.approx(0.0, abs=0.01)

    def test_poisson_arrivals_read_about_one(self) -> None:
        dispersion, clock = self.fresh()
        gaps = np.random.default_rng(7).exponential(1 / 300, size=3000)  # 300 rps, 10 s
        for gap in gaps:
            clock.now += float(gap)
            dispersion.arrived()
        assert dispersion.dispersion() == pytest.approx(1.0, abs=0.1)

    def test_only_the_last_span_counts(self) -> None:
        dispersion, clock = self.fresh()
        for _ in range(100):  # clumps of 10, then 20 s of one a slot
            clock.now += 0.05
            for _ in range(10):
                dispersion.arrived()
        for _ in range(2000):
            clock.now += 0.01
            dispersion.arrived()
        assert dispersion.dispersion() == pytest.approx(0.0, abs=0.01)


class TestArrivalSeconds:
    def test_each_ended_second_adds_its_count_squared(self) -> None:
        clock = Clock()  # 1000.0: a second begins
        seconds = ArrivalSeconds(clock=clock)
        for count in (3, 0, 5):
            for _ in range(count):
                seconds.arrived()
            clock.now += 1.0
        assert seconds.squares() == 3 * 3 + 0 + 5 * 5
        assert seconds.seconds() == 3.0

    def test_the_running_second_joins_once_it_has_ended(self) -> None:
        clock = Clock()
        seconds = ArrivalSeconds(clock=clock)
        for _ in range(4):
            seconds.arrived()
        clock.now += 0.5
        assert (seconds.squares(), seconds.seconds()) == (0, 0.0)
        clock.now += 0.5
        assert (seconds.squares(), seconds.seconds()) == (16, 1.0)

    def test_idle_seconds_count_as_seconds_and_add_nothing(self) -> None:
        clock = Clock()
        seconds = ArrivalSeconds(clock=clock)
        seconds.arrived()
        clock.now += 10.0
        seconds.arrived()
        clock.now += 1.0
        assert seconds.squares() == 2
        assert seconds.seconds() == 11.0

    def test_seconds_the_server_took_no_requests_are_not_counted(self) -> None:
        # warming up, draining: no request is sent to it, and counted those seconds would read
        # as a replica idle beside busy ones
        clock, ready = Clock(), [False]
        seconds = ArrivalSeconds(clock=clock, ready=lambda: ready[0])
        clock.now += 30.0
        assert seconds.seconds() == 0.0
        ready[0] = True
        for _ in range(5):
            seconds.arrived()
            clock.now += 1.0
        assert seconds.seconds() == 5.0
        ready[0] = False
        clock.now += 10.0
        assert seconds.seconds() == 5.0
        assert seconds.squares() == 5

    @pytest.mark.parametrize(("busy", "quiet", "factor"), [(100, 100, 1.0), (200, 20, 1.67)])
    def test_over_the_arrivals_the_rate_they_met(
        self, busy: int, quiet: int, factor: float
    ) -> None:
        # Half the seconds at `busy` arrivals, half at `quiet`, Poisson within each: the
        # squares over the count, less Poisson's 1, is Σλ²/Σλ; over the mean, the unevenness.
        clock = Clock()
        seconds = ArrivalSeconds(clock=clock)
        rng = np.random.default_rng(5)
        arrived = 0
        for second in range(600):
            count = int(rng.poisson(busy if second % 20 < 10 else quiet))
            for _ in range(count):
                seconds.arrived()
            arrived += count
            clock.now += 1.0
        met = seconds.squares() / arrived - 1
        assert met / (arrived / seconds.seconds()) == pytest.approx(factor, rel=0.02)

    def test_a_slot_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="slot_s > 0"):
            ArrivalSeconds(slot_s=0)
