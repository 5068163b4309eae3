"""The fit t(b) where the window has no batch times by size — a runtime or exporter that does
not count them, a simulator that reports only P99, rates, the busy share and the mean batch —
and where every window runs one batch size: the busy share gives each window's point
(`learn.busy_compute`), and the anchor (`learn.anchored`) gives the slope across windows, so
the fit turns confident and the autopilot gives back replicas it no longer needs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.learn import anchored, busy_compute
from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.service_model import LatencyFit, predict
from batchpilot.operator.autopilot.state import State

TRUTH = LatencyFit(alpha_s=0.004, beta_s=0.002, confident=True)
"""The service: t(b) = 4 + 2·b ms."""
POLICY = Policy(
    sla_p99_s=0.1,
    min_utilization=0.3,
    min_replicas=1,
    max_replicas=20,
    max_batch_size=32,
    scale_down_delay_s=60,
    max_queue_delay_s=0.005,
)


def basic(*, at: float, qps: float, replicas: int, batch_limit: int) -> Observation:
    """Only the basic signals of a window of `qps` over `replicas` at `batch_limit`, as the
    service's steady state has them: P99, rates, the busy share, the mean batch."""
    state = predict(TRUTH, rate=qps, replicas=replicas, max_batch=batch_limit, delay_s=0.005)
    return Observation(
        at=at,
        window_s=60,
        p99_s=state.p99_s,
        p95_s=None,
        qps=qps,
        rejected_qps=0.0,
        queue_p99_s=None,
        utilization=state.utilization,
        mean_batch=state.batch,
        ready_replicas=replicas,
    )


class TestBusyCompute:
    def test_the_busy_share_gives_the_windows_batch_time(self) -> None:
        # 2 replicas half busy, 100 requests/s in batches of 4: 25 batches/s, 40 ms each.
        window = Observation(
            at=0, window_s=60, p99_s=0.05, p95_s=None, qps=100.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.5, mean_batch=4.0, ready_replicas=2,
        )  # fmt: skip
        (point,) = busy_compute(window)
        assert point.mean_batch == 4.0
        assert point.mean_seconds == pytest.approx(0.04)
        assert point.batches == pytest.approx(25 * 60)

    def test_a_batch_time_longer_than_p99_is_no_reading(self) -> None:
        # 8 rows a request the window does not say: 100 requests/s in batches of 8 rows read as
        # 12.5 batches/s, 80 ms each, where P99 is 50 ms — and no request waits less than its
        # batch. (As a batch time, the fit is 8x too slow: a replica carrying a few requests a
        # second, every replica maxReplicas allows.)
        window = Observation(
            at=0, window_s=60, p99_s=0.05, p95_s=None, qps=100.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.5, mean_batch=8.0, ready_replicas=2,
        )  # fmt: skip
        assert busy_compute(window) == ()
        # Told the rows a request, the same window reads 100 batches/s of 10 ms.
        (point,) = busy_compute(replace(window, rows_per_request=8.0))
        assert point.mean_seconds == pytest.approx(0.01)

    @pytest.mark.parametrize("missing", ["utilization", "qps", "mean_batch", "ready_replicas"])
    def test_nothing_where_a_signal_is_missing(self, missing: str) -> None:
        values = dict(utilization=0.5, qps=100.0, mean_batch=4.0, ready_replicas=2)
        values[missing] = None
        window = Observation(
            at=0, window_s=60, p99_s=0.05, p95_s=None, rejected_qps=0.0, queue_p99_s=None,
            **values,  # type: ignore[arg-type]
        )  # fmt: skip
        assert busy_compute(window) == ()


class TestAnchor:
    def test_one_size_is_kept_and_a_size_apart_gives_the_slope(self) -> None:
        at_2 = (ComputePoint(2, TRUTH.batch_seconds(2), 500),)
        points, anchor = anchored(at_2, State())
        assert (points, anchor) == (at_2, ComputePoint(2, TRUTH.batch_seconds(2), 500))
        rough = State(fit=LatencyFit(0.004, 0.002, confident=False), anchor=anchor)
        at_6 = (ComputePoint(6, TRUTH.batch_seconds(6), 500),)
        points, _ = anchored(at_6, rough)
        assert points == (*at_6, anchor)

    def test_the_same_size_again_moves_the_anchor(self) -> None:
        kept = ComputePoint(2, 0.008, 100)
        rough = State(fit=LatencyFit(0.004, 0.002, confident=False), anchor=kept)
        points, anchor = anchored((ComputePoint(2.5, 0.009, 300),), rough)
        assert points == (ComputePoint(2.5, 0.009, 300),)
        assert anchor is not None
        assert anchor.mean_batch == pytest.approx((2 * 100 + 2.5 * 300) / 400)
        assert anchor.batches == 400

    def test_a_window_of_its_own_slope_needs_none(self) -> None:
        both = (ComputePoint(2, 0.008, 500), ComputePoint(8, 0.02, 500))
        assert anchored(both, State(anchor=ComputePoint(4, 0.012, 50))) == (both, None)

    def test_it_survives_the_status(self) -> None:
        state = State(anchor=ComputePoint(3.25, 0.0105, 1234.5))
        assert State.from_dict(state.to_dict()).anchor == state.anchor
        assert State.from_dict({"anchor": {"batch": 0, "ms": 1, "batches": 1}}).anchor is None


def test_basic_signals_at_two_loads_teach_a_confident_fit_and_replicas_go_back() -> None:
    """A load that rises eightfold and falls back, seen through the basic signals alone: each
    window runs one batch size, and a rough fit gives nothing back. The rise runs batches of
    another size: the fit turns confident, near the truth, and the replicas the rise asked for
    go once it is over."""
    current, state, now = InForce(2, 8, 0.005), State(), 0.0
    loads = [60.0] * 4 + [500.0] * 8 + [60.0] * 16
    replicas = []
    for qps in loads:
        now += 15
        window = basic(at=now, qps=qps, replicas=current.replicas, batch_limit=current.batch_size)
        decision, state = decide(window, POLICY, current, state, now)
        current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
        replicas.append(current.replicas)
    assert state.fit is not None
    assert state.fit.confident
    assert state.fit.beta_s == pytest.approx(TRUTH.beta_s, rel=0.3)
    assert state.anchor is None
    assert replicas[-1] < max(replicas), replicas
    assert replicas[-1] <= 2, replicas
    assert decision.sla_met, decision.reason
