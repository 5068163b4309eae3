"""The service model: fitting t(b) ≈ α + β·b and predicting the operating point."""

from __future__ import annotations

import math

import pytest

from batchpilot.operator.autopilot.observation import ComputePoint
from batchpilot.operator.autopilot.service_model import LatencyFit, fit, predict


class TestFit:
    def test_two_batch_sizes_give_alpha_and_beta_exactly(self) -> None:
        # t(1) = 2 + 1·1 = 3 ms, t(8) = 2 + 1·8 = 10 ms  →  β = 7/7 = 1 ms, α = 2 ms
        model = fit([ComputePoint(1, 0.003, 100), ComputePoint(8, 0.010, 100)], None)
        assert model is not None
        assert model.alpha_s == pytest.approx(0.002)
        assert model.beta_s == pytest.approx(0.001)
        assert model.confident

    def test_one_batch_size_splits_the_time_and_says_it_is_rough(self) -> None:
        model = fit([ComputePoint(1, 0.004, 500)], None)
        assert model == LatencyFit(alpha_s=0.002, beta_s=0.002, confident=False)

    def test_one_batch_size_keeps_a_confident_prior_slope(self) -> None:
        prior = LatencyFit(alpha_s=0.002, beta_s=0.001, confident=True)
        # t(4) observed 7 ms: keep β = 1 ms, re-anchor α = 7 - 4 = 3 ms; smoothed 50/50 → 2.5 ms
        model = fit([ComputePoint(4, 0.007, 500)], prior)
        assert model is not None
        assert model.alpha_s == pytest.approx(0.0025)
        assert model.beta_s == pytest.approx(0.001)

    def test_the_first_confident_fit_replaces_a_rough_prior(self) -> None:
        # Batch 1 alone at 22 ms: the rough split is α = β = 11 ms (the truth: 20 + 2·b ms).
        rough = fit([ComputePoint(1, 0.022, 100)], None)
        assert rough == LatencyFit(alpha_s=0.011, beta_s=0.011, confident=False)
        # The next window holds batches of 1, 2 and 3.5 rows on t(b) = 20 + 2·b ms: least squares
        # gives α = 20 ms, β = 2 ms exactly. Averaged with the guess it would say 15.5 + 6.5·b,
        # and a batch of 16 would look 119.5 ms long instead of 52 ms.
        points = [
            ComputePoint(1, 0.022, 60),
            ComputePoint(2, 0.024, 40),
            ComputePoint(3.5, 0.027, 30),
        ]
        model = fit(points, rough)
        assert model is not None
        assert model.alpha_s == pytest.approx(0.020)
        assert model.beta_s == pytest.approx(0.002)
        assert model.confident
        # From then on, fits are measurements and are smoothed: t(b) = 22 + 2·b ms next window
        # moves α halfway, to 21 ms.
        shifted = [ComputePoint(p.mean_batch, p.mean_seconds + 0.002, p.batches) for p in points]
        again = fit(shifted, model)
        assert again is not None
        assert again.alpha_s == pytest.approx(0.021)
        assert again.beta_s == pytest.approx(0.002)

    def test_sparse_buckets_are_ignored(self) -> None:
        prior = LatencyFit(0.001, 0.001, True)
        assert fit([ComputePoint(16, 0.5, 3)], prior) is prior
        assert fit([], None) is None

    def test_nonsense_slopes_are_clipped_to_physics(self) -> None:
        # Bigger batches measured faster (noise): β must stay positive.
        model = fit([ComputePoint(1, 0.010, 100), ComputePoint(8, 0.009, 100)], None)
        assert model is not None
        assert model.beta_s > 0
        assert model.alpha_s >= 0


class TestPredict:
    MODEL = LatencyFit(alpha_s=0.002, beta_s=0.001, confident=True)

    def test_overload_is_infinite_latency(self) -> None:
        # capacity at batch 1: 1 / 3 ms = 333 rps < 400 rps
        p = predict(self.MODEL, rate=400, replicas=1, max_batch=1, delay_s=0.0)
        assert math.isinf(p.p99_s)
        assert p.load == pytest.approx(400 * 0.003)

    def test_batching_raises_capacity(self) -> None:
        # capacity at batch 16: 16 / 18 ms = 889 rps
        p = predict(self.MODEL, rate=400, replicas=1, max_batch=16, delay_s=0.002)
        assert math.isfinite(p.p99_s)
        assert 1 < p.batch < 16

    def test_more_replicas_lower_latency(self) -> None:
        one = predict(self.MODEL, rate=600, replicas=1, max_batch=8, delay_s=0.002)
        two = predict(self.MODEL, rate=600, replicas=2, max_batch=8, delay_s=0.002)
        assert two.p99_s < one.p99_s
        assert two.utilization < one.utilization

    def test_no_traffic(self) -> None:
        p = predict(self.MODEL, rate=0, replicas=2, max_batch=8, delay_s=0.005)
        assert p.utilization == 0
        assert p.p99_s == pytest.approx(0.005 + 0.003)
