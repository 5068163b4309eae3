"""Headroom from the traffic's own variability: rises within the reaction horizon, by quantile."""

from __future__ import annotations

import pytest

from batchpilot.operator.autopilot.headroom import (
    BUCKET_S,
    BUCKETS,
    GROWTH_MARGIN,
    UNSEEN,
    RateHistory,
    affordable,
    episodes,
    plan_rate,
)
from batchpilot.operator.autopilot.slo import Objective, SloReport

HORIZON = 75.0  # one 15 s interval to notice, a 60 s cold start


def history_of(rates: list[float]) -> RateHistory:
    history = RateHistory()
    for k, rate in enumerate(rates):
        history = history.add(k * BUCKET_S, rate)
    return history


def on_off(cycles: int, *, quiet: int, burst: int, low: float, high: float) -> list[float]:
    return ([low] * quiet + [high] * burst) * cycles


class TestRateHistory:
    def test_the_highest_rate_of_a_bucket_is_kept(self) -> None:
        history = RateHistory().add(0, 100).add(10, 300).add(20, 200)
        assert history.rates == (300,)

    def test_an_hour_at_most_and_unseen_buckets_marked(self) -> None:
        history = history_of([100.0] * (BUCKETS + 10)).add((BUCKETS + 12) * BUCKET_S, 50)
        assert len(history.rates) == BUCKETS
        assert history.rates[-3:] == (UNSEEN, UNSEEN, 50)

    def test_a_long_gap_forgets_everything_before_it(self) -> None:
        history = history_of([100.0] * 10).add(10_000 * BUCKET_S, 7)
        assert history.rates[-1] == 7
        assert set(history.rates[:-1]) == {UNSEEN}

    def test_rises_look_one_horizon_ahead(self) -> None:
        rises = history_of([100, 100, 100, 100, 300, 300, 300]).rises(HORIZON)  # 3 buckets
        # (the first bucket starts none: nothing was seen before it)
        assert rises == [(3.0, 300, 100), (3.0, 300, 100), (3.0, 300, 100)]

    def test_the_first_bucket_seen_starts_no_rise(self) -> None:
        """A new service's first decision reads a window its traffic began inside; the rise
        from it to the load is no episode, nor is one from the first bucket after a gap."""
        assert history_of([70, 800, 800, 800, 800, 800]).rises(HORIZON) == [
            (1.0, 800, 800),
            (1.0, 800, 800),
        ]
        gap = history_of([800.0] * 5).add(7 * BUCKET_S, 70)
        for k in range(8, 12):
            gap = gap.add(k * BUCKET_S, 800)
        assert all(rise <= 1.0 for rise, _, _ in gap.rises(HORIZON))

    def test_a_start_and_one_later_burst_are_no_pattern(self) -> None:
        rates = [70.0] + [800.0] * 20 + [200.0] * 12 + [800.0] * 2 + [200.0] * 20
        plan = plan_rate(200, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(200 * GROWTH_MARGIN)

    def test_rises_from_idle_are_measured_from_a_floor_of_the_peak(self) -> None:
        rises = history_of([0, 0, 0, 0, 200, 200, 200, 200]).rises(HORIZON)
        assert max(rise for rise, _, _ in rises) == pytest.approx(200 / 10)  # 5 % of the peak

    def test_survives_the_status(self) -> None:
        history = history_of([1.25, 2.5, 3.75])
        assert RateHistory.from_dict(history.to_dict()) == RateHistory(
            history.last, (1.2, 2.5, 3.8)
        )
        assert RateHistory.from_dict({"rps": "x"}) == RateHistory()


class TestPlanRate:
    def test_without_history_the_growth_margin_alone(self) -> None:
        plan = plan_rate(100, RateHistory(), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(100 * GROWTH_MARGIN)
        assert plan.note == ""

    def test_smooth_traffic_gets_no_more_than_the_growth_margin(self) -> None:
        smooth = [300 + (k % 3) for k in range(100)]
        plan = plan_rate(300, history_of(smooth), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(300 * GROWTH_MARGIN)

    def test_recurring_bursts_the_budget_cannot_pay_for_keep_their_capacity(self) -> None:
        # 4-minute quiet, 2-minute bursts of 10x: ten episodes in 2 hours' worth of buckets;
        # uncovered, each costs a 75 s horizon: ~10 % of the time, far beyond a 1 % budget.
        rates = on_off(10, quiet=8, burst=4, low=50, high=500)
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.01)
        assert plan.rate == pytest.approx(500)
        assert plan.coverage == pytest.approx(10)
        assert "rose 10 times in the last hour within 75 s" in plan.note
        assert "10 of them to 500 rps or more" in plan.note

    def test_a_budget_that_can_pay_for_them_lets_them_go(self) -> None:
        rates = on_off(10, quiet=8, burst=4, low=50, high=500)
        # ten 75 s horizons in the ~58 minutes of samples: 21 % of the time
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.25)
        assert plan.rate == pytest.approx(50 * GROWTH_MARGIN)

    def test_the_smallest_coverage_the_budget_affords(self) -> None:
        # eight 2x episodes and two 6x ones: covering 2x leaves the two 6x ones uncovered, which
        # a budget of just over two horizons in the span pays for
        rates = on_off(8, quiet=6, burst=2, low=100, high=200) + on_off(
            2, quiet=6, burst=2, low=100, high=600
        )
        history = history_of(rates)
        span = len(history.rises(HORIZON)) * BUCKET_S
        # the next of the ten goes beyond 2x with a chance of 3/11 (two of ten did, and it may
        # be the highest yet): ten rises' worth at that chance
        two_left = 10 * (3 / 11) * HORIZON / span
        plan = plan_rate(100, history, horizon_s=HORIZON, affordable=two_left * 1.01)
        assert plan.coverage == pytest.approx(2.0)
        assert plan.rate == pytest.approx(200)
        everything = plan_rate(100, history, horizon_s=HORIZON, affordable=0.0)
        assert everything.coverage == pytest.approx(6.0)  # the highest rise that recurred

    def test_the_rises_seen_beyond_a_level_undercount_those_to_come(self) -> None:
        # the same ten: a budget for just over two of them uncovered does not cover the chance
        # that the next one is the highest yet
        rates = on_off(8, quiet=6, burst=2, low=100, high=200) + on_off(
            2, quiet=6, burst=2, low=100, high=600
        )
        history = history_of(rates)
        span = len(history.rises(HORIZON)) * BUCKET_S
        plan = plan_rate(100, history, horizon_s=HORIZON, affordable=2.01 * HORIZON / span)
        assert plan.coverage == pytest.approx(6.0)

    def test_one_past_step_does_not_multiply_the_new_level(self) -> None:
        rates = [100.0] * 50 + [600.0] * 50
        plan = plan_rate(600, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(600 * GROWTH_MARGIN)

    def test_the_latency_headroom_absorbs_part_of_a_rise(self) -> None:
        rates = on_off(10, quiet=8, burst=4, low=300, high=450)
        plain = plan_rate(300, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        absorbing = plan_rate(
            300, history_of(rates), horizon_s=HORIZON, affordable=0.0, absorbed=lambda: 1.25
        )
        assert plain.rate == pytest.approx(450)
        assert absorbing.rate == pytest.approx(360)

    def test_rises_the_latency_headroom_absorbs_entirely_need_nothing(self) -> None:
        rates = on_off(10, quiet=8, burst=4, low=300, high=360)
        plan = plan_rate(
            300, history_of(rates), horizon_s=HORIZON, affordable=0.0, absorbed=lambda: 1.25
        )
        assert plan.rate == pytest.approx(300 * GROWTH_MARGIN)


class TestRecurrence:
    def test_one_burst_in_the_hour_is_an_event_not_a_pattern(self) -> None:
        rates = [50.0] * 40 + [500.0] * 8 + [50.0] * 40
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(50 * GROWTH_MARGIN)

    def test_a_second_burst_makes_it_a_pattern(self) -> None:
        rates = [50.0] * 30 + [500.0] * 8 + [50.0] * 30 + [500.0] * 8 + [50.0] * 10
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(500)

    def test_a_rise_beyond_twice_every_other_is_an_event(self) -> None:
        rates = [50.0] * 30 + [500.0] * 8 + [50.0] * 30 + [200.0] * 8 + [50.0] * 10
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(200)  # the smaller one is what recurred

    def test_bursts_that_recur_at_varying_heights_are_planned_for_at_their_highest(
        self,
    ) -> None:
        # on/off bursts of 300 and of 500: one pattern; covering 300 alone costs the next
        # burst higher than it a cold start
        rates = [50.0] * 30 + [500.0] * 8 + [50.0] * 30 + [300.0] * 8 + [50.0] * 10
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(500)
        # what decided it: planned for 300, the next rise goes beyond it with a chance of 2/3
        span = len(history_of(rates).rises(HORIZON)) * BUCKET_S
        short = 2 * (2 / 3) * HORIZON / span
        assert (
            f"rose 2 times in the last hour within 75 s (the time to notice and start a "
            f"replica), 1 of them to 500 rps or more; planned for less, the rises to come "
            f"would keep ~{short:.1%} of the time outside the SLA"
        ) in plan.note

    def test_a_rise_just_beyond_twice_the_one_below_is_an_event(self) -> None:
        rates = [50.0] * 30 + [601.0] * 8 + [50.0] * 30 + [300.0] * 8 + [50.0] * 10
        plan = plan_rate(50, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(300)

    def test_episodes_are_runs_of_rising_samples(self) -> None:
        # (rise, reach, rate): up from 10 to 30, back down to 10, up to 45
        rises = [(2.0, 20, 10), (3.0, 30, 10), (1.0, 30, 30), (1.0, 10, 10), (4.5, 45, 10)]
        assert episodes(rises) == [(10, 30), (10, 45)]

    def test_a_ramp_whose_rise_pauses_is_one_episode(self) -> None:
        # up from 10 to 30, a pause at 28 (above halfway), on up to 45
        rises = [(3.0, 30, 10), (1.0, 30, 28), (1.6, 45, 28)]
        assert episodes(rises) == [(10, 45)]

    def test_on_the_way_down_the_rises_near_the_peak_do_not_count(self) -> None:
        # bursts from 800 to 1000 and back, twice, then the load falls to 300: those rises
        # started far above where the load is now, and say nothing about 300
        rates = [800.0] * 20 + [1000.0] * 6 + [800.0] * 10 + [1000.0] * 6 + [300.0] * 30
        plan = plan_rate(300, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(300 * GROWTH_MARGIN)
        at_the_base = plan_rate(800, history_of(rates[:50]), horizon_s=HORIZON, affordable=0.0)
        assert at_the_base.rate == pytest.approx(1000)

    def test_a_long_ramp_up_and_down_is_no_pattern(self) -> None:
        ramp = [100.0 + 10 * k for k in range(60)]
        rates = ramp + ramp[::-1]
        plan = plan_rate(150, history_of(rates), horizon_s=HORIZON, affordable=0.0)
        assert plan.rate == pytest.approx(150 * GROWTH_MARGIN)


class TestAffordable:
    HOUR = Objective(0.99, 3600)

    def report(self, *, remaining: float | None, fast: float = 0.0) -> SloReport:
        return SloReport(
            attainment=None, budget_remaining=remaining, burn_rates={"fast": fast}, at_risk=None
        )

    def test_an_untouched_budget_affords_its_share_less_the_reserve(self) -> None:
        # less the reserve: half of it is never planned to be spent
        assert affordable(self.HOUR, self.report(remaining=None)) == pytest.approx(0.005)
        assert affordable(self.HOUR, self.report(remaining=1.0)) == pytest.approx(0.005)

    def test_what_is_left_of_it(self) -> None:
        assert affordable(self.HOUR, self.report(remaining=0.3)) == pytest.approx(0.0015)

    def test_nothing_while_it_burns_or_once_spent(self) -> None:
        assert affordable(self.HOUR, self.report(remaining=0.9, fast=3)) == 0.0
        assert affordable(self.HOUR, self.report(remaining=-0.5)) == 0.0
