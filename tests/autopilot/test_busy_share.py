"""Replicas from the busy share where the windows say nothing of the batches (`busy`,
`feedback.busy_plan`): an exporter of P99, the request rates, the device's utilization and the
ready replicas, no mean batch and no batch times. A request's device time is read from the busy
share, replicas are planned to a busy share learned from the windows, and the batch limit moves
on what the windows show: larger where the devices are saturated and over the SLA, or
comfortably inside it; smaller where they are over it with the devices not saturated."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from batchpilot.operator.autopilot.busy import (
    DEFAULT_TARGET,
    LINEAR,
    MAX_ELASTIC_TARGET,
    MAX_TARGET,
    MIN_TARGET,
    PROVEN_MARGIN,
    STRETCH,
    STRETCH_MARGIN,
    TOO_LARGE_S,
    BusyShare,
    learned_target,
    measured_cost,
)
from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.service_model import LatencyFit, predict
from batchpilot.operator.autopilot.state import State

TRUTH = LatencyFit(alpha_s=0.002, beta_s=0.006, confident=True)
"""The service: t(b) = 2 + 6·b ms, mostly per row."""
POLICY = Policy(
    sla_p99_s=0.1,
    min_utilization=0.3,
    min_replicas=1,
    max_replicas=40,
    max_batch_size=32,
    scale_down_delay_s=60,
    max_queue_delay_s=0.005,
)


def window(
    *, at: float, qps: float, replicas: int, batch_limit: int, p99_s: float | None = None
) -> Observation:
    """A steady window of `qps` over `replicas` at `batch_limit` as an exporter without batch
    counters has it: P99, the rates, the busy share and the ready replicas. (15 s long, as the
    decisions' interval: a load that steps between two decisions fills the next window.)"""
    state = predict(TRUTH, rate=qps, replicas=replicas, max_batch=batch_limit, delay_s=0.005)
    served, busy, p99 = qps, state.utilization, state.p99_s
    if state.load >= 1:
        # Overloaded: full batches all the time, the rest refused, P99 at the deadline.
        served = replicas * batch_limit / TRUTH.batch_seconds(batch_limit)
        busy, p99 = 1.0, POLICY.sla_p99_s
    return Observation(
        at=at,
        window_s=15,
        p99_s=p99 if p99_s is None else p99_s,
        p95_s=None,
        qps=served,
        rejected_qps=max(0.0, qps - served),
        queue_p99_s=None,
        utilization=busy,
        mean_batch=None,
        ready_replicas=replicas,
    )


class TestTheReadings:
    def test_a_request_costs_the_busy_time_over_the_requests(self) -> None:
        # 4 replicas half busy serving 200 requests/s: 2 device-seconds a second for 200.
        assert measured_cost(busy=0.5, served_qps=200.0, replicas=4, window_s=60) == (
            pytest.approx(0.01)
        )
        # (a busy share read above 1 is a saturated device: 1)
        assert measured_cost(busy=1.2, served_qps=100.0, replicas=1, window_s=60) == (
            pytest.approx(0.01)
        )

    @pytest.mark.parametrize(
        ("busy", "served", "replicas"), [(None, 100.0, 1), (0.5, None, 1), (0.5, 100.0, None)]
    )
    def test_nothing_where_a_signal_is_missing(
        self, busy: float | None, served: float | None, replicas: int | None
    ) -> None:
        assert measured_cost(busy=busy, served_qps=served, replicas=replicas, window_s=60) is None

    def test_nothing_from_a_handful_of_requests(self) -> None:
        # 0.5 requests/s over a minute: 30 requests, their batches' noise.
        assert measured_cost(busy=0.01, served_qps=0.5, replicas=1, window_s=60) is None

    def test_nothing_from_a_busy_share_that_rounds_to_nothing(self) -> None:
        assert measured_cost(busy=1e-7, served_qps=1000.0, replicas=1, window_s=60) is None

    def test_replicas_keep_each_at_the_target(self) -> None:
        busy = BusyShare(cost_s=0.01, batch=4, target=0.5)
        # 1000 requests/s × 10 ms = 10 device-seconds a second, at 50 % each: 20 replicas.
        assert busy.replicas_for(1000.0) == 20
        assert busy.carries() == pytest.approx(50.0)
        assert BusyShare().replicas_for(1000.0) is None

    def test_replicas_go_back_only_where_the_rest_stay_below_the_target(self) -> None:
        busy = BusyShare(cost_s=0.01, batch=4, target=0.5)
        # 900 requests/s at 10 ms each: 18 replicas at the target; given back from more, no
        # fewer than 20 (each below 90 % of it), and at 850 requests/s no fewer than 19.
        assert busy.replicas_for(900.0) == 18
        assert busy.replicas_for(900.0, share=0.9) == 20
        assert busy.replicas_for(850.0, share=0.9) == 19

    def test_a_larger_batch_is_tried_where_even_at_the_present_cost_it_fits(self) -> None:
        busy = BusyShare(cost_s=0.008, batch=4, target=0.6)
        assert busy.batch_allowed(4, budget_s=0.05)  # at most 32 ms
        assert not busy.batch_allowed(8, budget_s=0.05)  # up to 64 ms
        assert not replace(busy, too_large=4).batch_allowed(4, budget_s=0.05)


class TestTheTarget:
    def test_a_miss_puts_it_below_the_busy_share_it_missed_at(self) -> None:
        assert learned_target(0.6, busy=0.62, over=True, comfortable=False) == pytest.approx(
            0.62 * 0.85
        )

    def test_one_window_lowers_it_by_a_fifth_at_most(self) -> None:
        # A window over the SLA at a fifth of the target missed for something else as well.
        assert learned_target(0.6, busy=0.12, over=True, comfortable=False) == pytest.approx(0.48)
        assert learned_target(MIN_TARGET, busy=0.01, over=True, comfortable=False) == MIN_TARGET

    def test_a_miss_above_the_target_leaves_it(self) -> None:
        # Busier than planned: the load outran the plan, not the target.
        assert learned_target(0.6, busy=0.95, over=True, comfortable=False) == 0.6

    def test_a_comfortable_window_near_it_raises_it_a_little(self) -> None:
        assert learned_target(0.6, busy=0.55, over=False, comfortable=True) == pytest.approx(0.62)
        assert learned_target(MAX_TARGET, busy=0.9, over=False, comfortable=True) == MAX_TARGET

    def test_a_comfortable_window_far_below_it_says_nothing(self) -> None:
        assert learned_target(0.6, busy=0.2, over=False, comfortable=True) == 0.6
        assert learned_target(0.6, busy=None, over=True, comfortable=False) == 0.6


def reading(known: BusyShare, *, rps: float, busy: float, batch: int = 4) -> BusyShare:
    """`known` after a window where a replica carried `rps` requests/s `busy` of the time."""
    return known.read(cost_s=busy / rps, busy=busy, batch=batch, room=True)


class TestTheElasticity:
    def test_a_busy_share_in_proportion_to_the_load_reads_linear(self) -> None:
        # 20 → 40 requests/s a replica, 30 → 60 % busy: all per row.
        known = reading(reading(BusyShare(), rps=20, busy=0.3), rps=40, busy=0.6)
        assert known.elasticity == pytest.approx(1.0)
        assert known.anchor == pytest.approx((40.0, 0.6))

    def test_a_busy_share_that_barely_grows_is_believed_a_third_each_pair(self) -> None:
        # Twice the load, 60 → 66 % busy: e = ln 1.1 / ln 2 ≈ 0.14; from 1, a third of the way
        # (still linear: one noisy pair stretches nothing)…
        measured = math.log(1.1) / math.log(2)
        first = reading(reading(BusyShare(), rps=20, busy=0.6), rps=40, busy=0.66)
        assert first.elasticity == pytest.approx((2 + measured) / 3)
        assert first.elasticity >= LINEAR
        # …below it after a second pair.
        second = reading(first, rps=80, busy=0.726)
        assert second.elasticity == pytest.approx((2 * first.elasticity + measured) / 3)
        assert second.elasticity < LINEAR
        # …and one nearer to linear at once.
        assert reading(second, rps=160, busy=1.0).elasticity > 0.4

    def test_readings_closer_than_the_spread_keep_the_anchor(self) -> None:
        known = reading(reading(BusyShare(), rps=20, busy=0.6), rps=24, busy=0.6)
        assert known.elasticity == 1.0
        assert known.anchor == pytest.approx((20.0, 0.6))
        assert known.busy == 0.6
        assert known.cost_s == pytest.approx(0.6 / 24)

    def test_a_new_batch_limit_starts_a_new_anchor(self) -> None:
        known = reading(reading(BusyShare(), rps=20, busy=0.6), rps=40, busy=0.6, batch=8)
        assert known.elasticity == 1.0
        assert known.anchor == pytest.approx((40.0, 0.6))

    def test_a_linear_service_is_planned_from_the_cost_alone(self) -> None:
        known = BusyShare(cost_s=0.01, batch=4, target=0.5, busy=0.3, room=True, elasticity=0.8)
        assert known.carries() == pytest.approx(50.0)
        assert known.replicas_for(1000.0) == 20

    def test_a_service_whose_busy_share_barely_grows_is_stretched_a_step(self) -> None:
        # 30 requests/s a replica at 80 % busy, e = 0.3, target 90 %: the busy share would
        # reach the target at 30·1.125^(1/0.3) ≈ 44 requests/s (the linear plan: 33.75); a
        # step is at most 4/3 of what a replica was seen carry.
        known = BusyShare(cost_s=0.8 / 30, batch=4, target=0.9, busy=0.8, room=True, elasticity=0.3)
        assert known.carries() == pytest.approx(30 * STRETCH)
        assert known.replicas_for(400.0) == 10
        assert replace(known, elasticity=1.0).replicas_for(400.0) == 12
        # Near the target, the rest of the way: (0.9/0.85)^(1/0.3) ≈ 1.21.
        near = replace(known, busy=0.85, cost_s=0.85 / 30)
        assert near.carries() == pytest.approx(30 * (0.9 / 0.85) ** (1 / 0.3))

    def test_replicas_go_back_only_where_the_rest_carry_less_than_a_replica_carries(
        self,
    ) -> None:
        # Stretched to 40 requests/s a replica: 10 for 400, given back to no fewer than 12
        # (each 90 % of 40); the give-back's margin is a share of the load, stretched or not.
        known = BusyShare(cost_s=0.8 / 30, batch=4, target=0.9, busy=0.8, room=True, elasticity=0.3)
        assert known.replicas_for(400.0) == 10
        assert known.replicas_for(400.0, share=0.9) == 12
        # (near the target, where the share would once have cut the stretch away entirely)
        near = replace(known, busy=0.85, cost_s=0.85 / 30)
        assert near.replicas_for(400.0, share=0.9) == math.ceil(400 / (0.9 * near.carries()))

    def test_a_busy_share_read_near_nothing_stretches_a_step_and_no_more(self) -> None:
        # An edited status: 1e-40 busy at an elasticity of 0 overflowed the power.
        known = BusyShare(cost_s=1e-3, batch=4, target=0.9, busy=1e-40, room=True, elasticity=0.0)
        assert known.carries() == pytest.approx(0.9 / 1e-3)
        assert known.replicas_for(1000.0) == 2

    def test_no_stretch_without_room_or_above_the_target(self) -> None:
        known = BusyShare(cost_s=0.8 / 30, batch=4, target=0.9, busy=0.8, room=True, elasticity=0.3)
        linear = 0.9 / (0.8 / 30)
        assert replace(known, room=False).carries() == pytest.approx(linear)
        assert replace(known, busy=0.95, cost_s=0.95 / 30).carries() == pytest.approx(
            0.9 / (0.95 / 30)
        )

    def test_a_stretch_stays_below_the_load_a_replica_missed_at(self) -> None:
        known = BusyShare(
            cost_s=0.8 / 30, batch=4, target=0.9, busy=0.8, room=True, elasticity=0.3,
            ceiling_rps=45.0, ceiling_at=100.0,
        )  # fmt: skip
        # 0.8 · 45 = 36 requests/s a replica, though a step would allow 40…
        assert known.carries() == pytest.approx(STRETCH_MARGIN * 45)
        # …and never below the linear plan (a stretch only ever adds).
        assert replace(known, ceiling_rps=10.0).carries() == pytest.approx(0.9 / (0.8 / 30))
        assert known.current(100 + TOO_LARGE_S).ceiling_rps == 45.0
        assert known.current(100 + TOO_LARGE_S + 1).ceiling_rps is None

    def test_a_replica_is_planned_to_most_of_what_it_was_proven_to_carry(self) -> None:
        # Busy 90 % carrying 30 requests/s at the target: 30 a replica by the cost, but 120
        # were carried comfortably inside the SLA at this batch limit: 96 a replica.
        known = BusyShare(cost_s=0.03, batch=4, target=0.9, busy=0.9)
        proven = known.proving(120.0, batch=4, now=10.0)
        assert proven.carries() == pytest.approx(PROVEN_MARGIN * 120)
        assert proven.replicas_for(960.0) == 10
        assert "120 rps a replica carried comfortably inside the SLA" in proven.basis()
        # Less seen later proves nothing new; within the margin it is seen again.
        assert proven.proving(50.0, batch=4, now=20.0) == proven
        assert proven.proving(60.0, batch=4, now=20.0).proven_at == 20.0
        assert proven.proving(150.0, batch=4, now=20.0).proven_rps == 150.0
        # A smaller batch limit in force than it was proven at: it does not stand…
        assert replace(proven, batch=2).carries() == pytest.approx(30.0)
        # …and what a smaller limit carries replaces it.
        assert proven.proving(50.0, batch=2, now=20.0).proven_rps == 50.0
        # An hour unseen, or a steady miss, and it is gone.
        assert proven.current(10 + TOO_LARGE_S + 1).proven_rps is None
        assert proven.current(10 + TOO_LARGE_S).proven_rps == 120.0
        # More than the service's whole offered load (an edited status), or proven at a larger
        # batch limit than the one planned: it does not stand.
        assert proven.within(peak=500.0, batch=4) == proven
        assert proven.within(peak=100.0, batch=4).proven_rps is None
        assert proven.within(peak=500.0, batch=2).proven_rps is None
        missed = proven.missed(80.0, now=30.0)
        assert (missed.proven_rps, missed.ceiling_rps, missed.ceiling_at) == (None, 80.0, 30.0)

    def test_the_target_may_rise_higher_where_the_busy_share_barely_grows(self) -> None:
        assert learned_target(
            MAX_TARGET, busy=0.9, over=False, comfortable=True, highest=MAX_ELASTIC_TARGET
        ) == pytest.approx(MAX_TARGET + 0.02)
        # (a target raised so, once the busy share grows with the load again, falls back)
        assert learned_target(0.96, busy=0.5, over=False, comfortable=False) == MAX_TARGET


class TestTheDecision:
    def test_replicas_are_planned_from_the_busy_share(self) -> None:
        # 2 replicas at batch ≤ 4 serving 150 requests/s: the window's cost a request, and at
        # 400 requests/s the replicas that keep each busy the default share.
        seen = window(at=15, qps=150, replicas=2, batch_limit=4)
        decision, state = decide(seen, POLICY, InForce(2, 4, 0.005), State(), 15)
        assert state.fit is None
        assert seen.utilization is not None
        assert state.busy.cost_s == pytest.approx(seen.utilization * 2 / 150)
        assert state.busy.batch == 4
        assert "busy share" in decision.reason
        # (the planned rate is at least the present one)
        assert decision.replicas >= (state.busy.replicas_for(150.0) or 0) > 0
        more = window(at=30, qps=400, replicas=2, batch_limit=4, p99_s=0.04)
        decision, state = decide(more, POLICY, InForce(2, 4, 0.005), state, 30)
        assert state.busy.cost_s is not None
        assert decision.replicas >= 400 * state.busy.cost_s / state.busy.target

    def test_the_learned_share_survives_a_restart(self) -> None:
        seen = window(at=15, qps=150, replicas=2, batch_limit=4)
        _, state = decide(seen, POLICY, InForce(2, 4, 0.005), State(), 15)
        again = State.from_dict(state.to_dict())
        assert again.busy.cost_s == pytest.approx(state.busy.cost_s, rel=1e-3)
        assert (again.busy.batch, again.busy.target) == (state.busy.batch, state.busy.target)

    @pytest.mark.parametrize(
        ("edited", "kept"),
        [
            ({"target": 0.7, "costMs": 4.0, "batch": 8, "tooLarge": 16, "tooLargeAt": 10.0},
             BusyShare(cost_s=0.004, batch=8, target=0.7, too_large=16, too_large_at=10.0)),
            ({"target": 0.7}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": -4.0, "batch": 8}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": "NaN", "batch": 8}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": 1e300, "batch": 8}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": 4.0, "batch": 3.9}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": 4.0, "batch": True}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": 4.0, "batch": 8, "tooLarge": 16},
             BusyShare(cost_s=0.004, batch=8, target=0.7)),
            ({"target": 0.7, "costMs": 4.0, "batch": 8, "tooLarge": 0, "tooLargeAt": 10.0},
             BusyShare(cost_s=0.004, batch=8, target=0.7)),
            ({"target": 0.7, "tooLarge": 16, "tooLargeAt": 1e400}, BusyShare(target=0.7)),
            ({"target": 0.7, "costMs": 4.0, "batch": 8, "busyShare": 0.5, "room": True,
              "elasticity": 0.3, "anchor": {"rps": 100.0, "busyShare": 0.4},
              "ceilingRps": 150.0, "ceilingAt": 20.0},
             BusyShare(cost_s=0.004, batch=8, target=0.7, busy=0.5, room=True, elasticity=0.3,
                       anchor=(100.0, 0.4), ceiling_rps=150.0, ceiling_at=20.0)),
            ({"target": 0.7, "proven": {"rps": 120.0, "batch": 4, "at": 30.0}},
             BusyShare(target=0.7, proven_rps=120.0, proven_batch=4, proven_at=30.0)),
            ({"target": 0.7, "proven": {"rps": 120.0, "batch": 0, "at": 30.0}},
             BusyShare(target=0.7)),
            ({"target": 0.7, "proven": {"rps": "inf", "batch": 4, "at": 30.0}},
             BusyShare(target=0.7)),
            ({"target": 0.7, "proven": {"rps": 120.0, "batch": 4}}, BusyShare(target=0.7)),
            ({"target": 0.7, "proven": [120.0, 4, 30.0]}, BusyShare(target=0.7)),
            ({"target": 0.96, "busyShare": 0.5, "room": True, "elasticity": 1.5,
              "anchor": {"rps": -1.0, "busyShare": 0.4}, "ceilingRps": 150.0},
             BusyShare(target=MAX_TARGET)),
            ({"target": 0.96, "elasticity": 0.3}, BusyShare(target=0.96, elasticity=0.3)),
            ({"target": 0.7, "costMs": 4.0, "batch": 8, "busyShare": 1.2, "room": "yes",
              "elasticity": "NaN", "anchor": [100.0, 0.4], "ceilingRps": 0.0,
              "ceilingAt": 20.0},
             BusyShare(cost_s=0.004, batch=8, target=0.7)),
            ({"target": 0.7, "costMs": 4.0, "batch": 8, "busyShare": 0.5, "room": "yes"},
             BusyShare(cost_s=0.004, batch=8, target=0.7, busy=0.5)),
            ({"target": 1.5, "costMs": 4.0, "batch": 8}, BusyShare()),
            ({"costMs": 4.0, "batch": 8}, BusyShare()),
            ("busy", BusyShare()),
        ],
    )  # fmt: skip
    def test_an_edited_busy_share_costs_what_it_holds_and_no_more(
        self, edited: object, kept: BusyShare
    ) -> None:
        state = State.from_dict({"busy": edited, "overheadMs": 12.0}, now=100.0)
        assert state.busy == kept
        assert state.overhead_s == pytest.approx(0.012)

    def test_what_the_readings_taught_survives_a_restart(self) -> None:
        taught = State(
            busy=BusyShare(
                cost_s=0.004, batch=8, target=0.94, busy=0.5, room=True, elasticity=0.3,
                anchor=(100.0, 0.4), ceiling_rps=150.0, ceiling_at=20.0, proven_rps=90.0,
                proven_batch=4, proven_at=0.0,
            )
        )  # fmt: skip
        assert State.from_dict(taught.to_dict(), now=100.0).busy == taught.busy

    def test_a_steady_miss_sets_a_ceiling_under_the_load_a_replica_carried(self) -> None:
        missed = Observation(
            at=15, window_s=60, p99_s=0.14, p95_s=None, qps=300.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.6, mean_batch=None, ready_replicas=3,
        )  # fmt: skip
        _, state = decide(missed, POLICY, InForce(3, 4, 0.005), State(), 15)
        assert state.busy.ceiling_rps == pytest.approx(100.0)
        assert state.busy.ceiling_at == 15
        assert not state.busy.room

    def test_a_steady_window_comfortably_inside_proves_what_a_replica_carried(self) -> None:
        calm = Observation(
            at=15, window_s=60, p99_s=0.03, p95_s=None, qps=300.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.6, mean_batch=None, ready_replicas=3,
        )  # fmt: skip
        _, state = decide(calm, POLICY, InForce(3, 4, 0.005), State(), 15)
        assert (state.busy.proven_rps, state.busy.proven_batch) == (pytest.approx(100.0), 4)
        assert state.busy.room
        # Near the SLA, nothing is proven.
        edge = replace(calm, p99_s=0.095)
        _, state = decide(edge, POLICY, InForce(3, 4, 0.005), State(), 15)
        assert state.busy.proven_rps is None

    def test_a_saturated_window_over_the_sla_raises_the_batch_and_the_replicas(self) -> None:
        # 2 replicas 98 % busy serving 300 of 400 requests/s: 6.5 ms a request, so a batch of
        # 4 takes at most 26 ms.
        saturated = Observation(
            at=15, window_s=60, p99_s=0.09, p95_s=None, qps=300.0, rejected_qps=100.0,
            queue_p99_s=None, utilization=0.98, mean_batch=None, ready_replicas=2,
        )  # fmt: skip
        decision, state = decide(saturated, POLICY, InForce(2, 2, 0.005), State(), 15)
        assert decision.batch_size == 4
        assert state.busy.cost_s == pytest.approx(0.98 * 2 / 300)
        # Busier than the target: the load outran the plan, and the target stands; the plan
        # carries all that was offered.
        assert state.busy.target == DEFAULT_TARGET
        assert decision.replicas >= 400 * 0.98 * 2 / 300 / DEFAULT_TARGET

    def test_a_saturated_miss_doubles_no_batch_past_what_fits(self) -> None:
        # 19.6 ms a request: a batch of 4 might take 78 ms, over half the SLA.
        saturated = Observation(
            at=15, window_s=60, p99_s=0.14, p95_s=None, qps=100.0, rejected_qps=40.0,
            queue_p99_s=None, utilization=0.98, mean_batch=None, ready_replicas=2,
        )  # fmt: skip
        decision, _ = decide(saturated, POLICY, InForce(2, 2, 0.005), State(), 15)
        assert decision.batch_size == 2
        assert decision.replicas > 2
        # Nor to a limit found too large.
        fast = replace(saturated, qps=300.0, rejected_qps=100.0, p99_s=0.09)
        found = State(busy=BusyShare(target=0.6, too_large=4, too_large_at=10.0))
        decision, _ = decide(fast, POLICY, InForce(2, 2, 0.005), found, 15)
        assert decision.batch_size == 2

    def test_a_window_over_the_sla_with_idle_devices_halves_the_batch_and_adds(self) -> None:
        # Over the SLA at 30 % busy: its batches may have run too long, and the cost read is
        # not all of the miss: a smaller limit, not tried again for an hour, a lower target and
        # the guard's step of replicas.
        slow = Observation(
            at=15, window_s=60, p99_s=0.13, p95_s=None, qps=60.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.3, mean_batch=None, ready_replicas=2,
        )  # fmt: skip
        decision, state = decide(slow, POLICY, InForce(2, 16, 0.005), State(), 15)
        assert decision.batch_size == 8
        assert (state.busy.too_large, state.busy.too_large_at) == (16, 15)
        assert state.busy.target == pytest.approx(DEFAULT_TARGET * 0.8)
        assert decision.replicas == 3
        assert state.busy.current(15 + 3600).too_large == 16
        assert state.busy.current(15 + 3601).too_large is None

    def test_misses_at_batch_one_with_idle_devices_keep_adding_replicas(self) -> None:
        # P99 over the SLA at a third busy whatever the replicas (a tight SLA): each window
        # that describes the replicas in force (a window and an interval after they changed)
        # adds the guard's step, and the target falls by a fifth each.
        current, state, now = InForce(6, 1, 0.005), State(), 0.0
        replicas, targets = [], []
        for _ in range(16):
            now += 150
            missed = Observation(
                at=now, window_s=60, p99_s=0.2, p95_s=None, qps=200.0, rejected_qps=0.0,
                queue_p99_s=None, utilization=min(1.0, 200 * 0.015 / current.replicas),
                mean_batch=None, ready_replicas=current.replicas,
            )  # fmt: skip
            decision, state = decide(missed, POLICY, current, state, now)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            replicas.append(current.replicas)
            targets.append(state.busy.target)
        assert replicas == sorted(replicas), replicas
        assert replicas[-1] >= 17, replicas
        assert targets == sorted(targets, reverse=True), targets
        assert targets[-1] < 0.3, targets

    def test_a_miss_while_the_load_rises_teaches_no_target(self) -> None:
        # The window's mean rose from 100 to 200 in the 15 s since the decision before: the
        # rise, not the target, missed.
        calm = window(at=15, qps=100, replicas=4, batch_limit=4)
        _, state = decide(calm, POLICY, InForce(4, 4, 0.005), State(), 15)
        risen = Observation(
            at=30, window_s=60, p99_s=0.13, p95_s=None, qps=200.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.4, mean_batch=None, ready_replicas=4,
        )  # fmt: skip
        decision, after = decide(risen, POLICY, InForce(4, 4, 0.005), state, 30)
        assert "rising" in decision.reason
        assert after.busy.target == state.busy.target

    def test_a_window_refusing_much_with_idle_devices_teaches_no_target(self) -> None:
        # 40 % refused at 40 % busy: traffic that began inside the window.
        began = Observation(
            at=15, window_s=60, p99_s=0.1, p95_s=None, qps=60.0, rejected_qps=40.0,
            queue_p99_s=None, utilization=0.4, mean_batch=None, ready_replicas=1,
        )  # fmt: skip
        _, state = decide(began, POLICY, InForce(1, 4, 0.005), State(), 15)
        assert state.busy.target == DEFAULT_TARGET

    def test_a_window_without_the_busy_share_is_steered_by_p99_whatever_was_learned(
        self,
    ) -> None:
        learned = State(busy=BusyShare(cost_s=0.005, batch=4, target=0.6))
        blind = Observation(
            at=15, window_s=60, p99_s=0.3, p95_s=None, qps=100.0, rejected_qps=15.0,
            queue_p99_s=None, utilization=None, mean_batch=None, ready_replicas=4,
        )  # fmt: skip
        decision, state = decide(blind, POLICY, InForce(4, 32, 0.005), learned, 15)
        assert "feedback: adding" in decision.reason
        assert decision.replicas > 4
        assert state.busy == learned.busy

    def test_a_service_with_batch_times_is_planned_by_its_model(self) -> None:
        timed = replace(
            window(at=15, qps=150, replicas=2, batch_limit=4),
            mean_batch=2.0,
            compute=(ComputePoint(1.0, 0.008, 500), ComputePoint(4.0, 0.026, 500)),
        )
        decision, state = decide(timed, POLICY, InForce(2, 4, 0.005), State(), 15)
        assert "model t(b) =" in decision.reason
        assert "busy share" not in decision.reason
        assert state.busy == BusyShare()

    def test_a_comfortable_window_tries_a_larger_batch_only_where_it_fits(self) -> None:
        # 8 ms a request: a batch of 4 takes at most 32 ms, of 8 at most 64 ms (over half the
        # SLA). From 2 the limit doubles; from 4 it stays.
        calm = Observation(
            at=15, window_s=60, p99_s=0.03, p95_s=None, qps=100.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.4, mean_batch=None, ready_replicas=2,
        )  # fmt: skip
        decision, _ = decide(calm, POLICY, InForce(2, 2, 0.005), State(), 15)
        assert decision.batch_size == 4
        decision, _ = decide(calm, POLICY, InForce(2, 4, 0.005), State(), 15)
        assert decision.batch_size == 4

    @pytest.mark.parametrize("utilization", [0.4, None])
    def test_a_limit_above_what_the_device_has_memory_for_comes_down(
        self, utilization: float | None
    ) -> None:
        # The runtime says a batch of more than 8 rows does not fit: the limit in force, 32,
        # comes down to 8 on the busy share and on P99 alone.
        calm = Observation(
            at=15, window_s=60, p99_s=0.03, p95_s=None, qps=100.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=utilization, mean_batch=None, ready_replicas=2,
            memory_rows=8,
        )  # fmt: skip
        decision, _ = decide(calm, POLICY, InForce(2, 32, 0.005), State(), 15)
        assert decision.batch_size == 8
        # …near the SLA's edge too (where a larger limit in force otherwise stays a while).
        edge = replace(calm, p99_s=0.095)
        decision, _ = decide(edge, POLICY, InForce(2, 32, 0.005), State(), 15)
        assert decision.batch_size == 8

    def test_without_a_busy_share_p99_alone_steers(self) -> None:
        blind = Observation(
            at=15, window_s=60, p99_s=0.13, p95_s=None, qps=60.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=None, mean_batch=None, ready_replicas=2,
        )  # fmt: skip
        decision, state = decide(blind, POLICY, InForce(2, 4, 0.005), State(), 15)
        assert "feedback: doubling the batch limit" in decision.reason
        assert state.busy == BusyShare()


def test_a_rise_and_fall_seen_through_the_busy_share_alone() -> None:
    """A load that rises sixfold and falls back: the replicas follow it up inside the SLA, and
    go back down once it has fallen and the scale-down delay has passed."""
    current, state, now = InForce(2, 4, 0.005), State(), 0.0
    loads = [100.0] * 6 + [600.0] * 10 + [100.0] * 16
    replicas, inside = [], []
    for qps in loads:
        now += 15
        seen = window(at=now, qps=qps, replicas=current.replicas, batch_limit=current.batch_size)
        decision, state = decide(seen, POLICY, current, state, now)
        current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
        replicas.append(current.replicas)
        inside.append(decision.sla_met)
    peak = max(replicas)
    # 600 requests/s at about 8 ms each: 4.8 device-seconds a second
    assert peak >= 6, replicas
    assert peak <= 600 * 0.008 / MIN_TARGET, replicas
    assert replicas[-1] < peak, replicas
    assert all(inside[-10:]), inside
