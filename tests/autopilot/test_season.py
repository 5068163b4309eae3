"""The seasonal forecast: a rise every past period showed at this time is planned for in advance."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import PastPeriod
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.operator.autopilot.season import MAX_LEVEL_SCALE, seasonal_forecast
from batchpilot.operator.autopilot.state import State
from tests.autopilot.test_decide import MODEL, POLICY, TICK, seen


class TestForecast:
    def test_no_level_or_no_past_is_no_forecast(self) -> None:
        assert (
            seasonal_forecast(None, [PastPeriod(ahead_qps=600, level_qps=100, then_qps=100)])
            is None
        )
        assert seasonal_forecast(100.0, []) is None

    def test_the_rise_every_period_showed_scaled_to_today(self) -> None:
        past = [
            PastPeriod(ahead_qps=600, level_qps=100, then_qps=100),
            PastPeriod(ahead_qps=800, level_qps=100, then_qps=100),
        ]
        forecast = seasonal_forecast(120.0, past)
        assert forecast is not None
        # The lowest of the two look-ahead peaks, × 1.2 for today's level.
        assert forecast.rate == pytest.approx(720.0)
        assert forecast.scale == pytest.approx(1.2)
        assert forecast.periods == 2

    def test_a_rise_only_one_period_had_is_not_a_pattern(self) -> None:
        past = [
            PastPeriod(ahead_qps=600, level_qps=100, then_qps=100),
            PastPeriod(ahead_qps=105, level_qps=100, then_qps=100),
        ]
        assert seasonal_forecast(100.0, past) is None

    def test_a_burst_already_under_way_then_is_not_a_rise(self) -> None:
        # Both days were inside a burst at this time: it came earlier, not in the next minutes.
        past = [PastPeriod(ahead_qps=600, level_qps=100, then_qps=580)] * 2
        assert seasonal_forecast(100.0, past) is None

    def test_a_quieter_day_forecasts_a_quieter_peak(self) -> None:
        past = [PastPeriod(ahead_qps=600, level_qps=200, then_qps=200)] * 2
        forecast = seasonal_forecast(100.0, past)
        assert forecast is not None
        assert forecast.rate == pytest.approx(300.0)

    def test_a_jump_in_level_is_not_scaled_without_bound(self) -> None:
        past = [PastPeriod(ahead_qps=600, level_qps=10, then_qps=10)] * 2
        forecast = seasonal_forecast(1000.0, past)
        assert forecast is not None
        assert forecast.rate == pytest.approx(600 * MAX_LEVEL_SCALE)

    def test_idle_hours_before_a_daily_burst_still_forecast_it(self) -> None:
        # Idle before the burst today and on every past day: levels below the floor are equal.
        past = [PastPeriod(ahead_qps=900, level_qps=0.0, then_qps=0.0)] * 2
        forecast = seasonal_forecast(0.0, past)
        assert forecast is not None
        assert forecast.rate == pytest.approx(900.0)


class TestDecision:
    def test_the_floor_adds_replicas_before_the_rise(self) -> None:
        daily = (PastPeriod(ahead_qps=900, level_qps=150, then_qps=150),) * 2
        obs = seen(at=TICK, qps=150, p99_ms=30, ready=1, batch=8)
        obs = replace(obs, arrival_qps=150, level_qps=150, past=daily)
        decision, _ = decide(obs, POLICY, InForce(1, 8, 0.005), State(fit=MODEL), now=TICK)
        # 900 rps at ≤ 471 rps a replica (batch 32): two replicas, while the load is still 150.
        assert decision.replicas >= 2
        assert "at this time in each of the last 2 periods" in decision.reason

    def test_without_a_pattern_nothing_changes(self) -> None:
        flat = (PastPeriod(ahead_qps=150, level_qps=150, then_qps=150),) * 2
        obs = seen(at=TICK, qps=150, p99_ms=30, ready=1, batch=8)
        plain = replace(obs, arrival_qps=150)
        with_past = replace(plain, level_qps=150, past=flat)
        current, state = InForce(1, 8, 0.005), State(fit=MODEL)
        assert (
            decide(with_past, POLICY, current, state, now=TICK)[0]
            == (decide(plain, POLICY, current, state, now=TICK)[0])
        )

    def test_an_idle_service_keeps_replicas_for_the_daily_burst(self) -> None:
        daily = (PastPeriod(ahead_qps=900, level_qps=0.0, then_qps=0.0),) * 2
        obs = seen(at=TICK, qps=0, p99_ms=None, ready=2, batch=8)
        obs = replace(obs, arrival_qps=0.0, mean_batch=None, level_qps=0.0, past=daily)
        decision, _ = decide(obs, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=TICK)
        assert decision.replicas >= 2
