"""The decision function, tick by tick. Each tick is one control interval of 15 s."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchpilot.operator.autopilot.capacity import (
    Carried,
    batch_candidates,
    burst_batch,
    limits,
    replica_capacity,
    saturated_batch,
)
from batchpilot.operator.autopilot.ceiling import Ceiling
from batchpilot.operator.autopilot.decide import BEYOND, decide, pending_since
from batchpilot.operator.autopilot.explain import p99_over
from batchpilot.operator.autopilot.headroom import RateHistory
from batchpilot.operator.autopilot.learn import (
    DEFAULT_COLD_START_S,
    DEFAULT_INTERVAL_S,
    MAX_COLD_START_S,
    MIN_BUSY,
    learn,
    present_load,
    reaction_horizon,
    refused_lately,
    saturated_load,
    unlearned,
)
from batchpilot.operator.autopilot.lost import Loss
from batchpilot.operator.autopilot.observation import ComputePoint, Observation, PodCompute
from batchpilot.operator.autopilot.pacing import pace, verified
from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.autopilot.policy import LOAD_HEADROOM, Decision, InForce, Policy
from batchpilot.operator.autopilot.service_model import LatencyFit, predict, sla_capacity
from batchpilot.operator.autopilot.slo import Objective, SloLedger
from batchpilot.operator.autopilot.state import CLOCK_SKEW_S, State
from batchpilot.operator.children.configmap import batching_document, batching_in
from batchpilot.operator.children.deadline import default_deadline_ms

TICK = 15.0
POLICY = Policy(
    sla_p99_s=0.100,
    min_utilization=0.70,
    min_replicas=1,
    max_replicas=4,
    max_batch_size=32,
    scale_down_delay_s=60,
    max_queue_delay_s=0.005,
)
# The service: t(b) = 4 + 2·b ms. Capacity of a replica: batch 1 → 167 rps, batch 32 → 471 rps.
MODEL = LatencyFit(alpha_s=0.004, beta_s=0.002, confident=True)


def seen(
    *,
    at: float,
    qps: float,
    p99_ms: float | None,
    ready: int,
    batch: float = 1.0,
    rejected: float = 0.0,
    utilization: float | None = 0.5,
) -> Observation:
    return Observation(
        at=at,
        window_s=30,
        p99_s=None if p99_ms is None else p99_ms / 1e3,
        p95_s=None,
        qps=qps,
        rejected_qps=rejected,
        queue_p99_s=None,
        utilization=utilization,
        mean_batch=batch,
        compute=(ComputePoint(batch, MODEL.batch_seconds(batch), 1000),),
        ready_replicas=ready,
    )


def step(
    observation: Observation | None,
    current: InForce,
    state: State,
    now: float,
    policy: Policy = POLICY,
) -> tuple[Decision, InForce, State]:
    decision, state = decide(observation, policy, current, state, now)
    return (
        decision,
        InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s),
        state,
    )


class TestMissingMetrics:
    def test_no_prometheus_holds_everything(self) -> None:
        current = InForce(3, 8, 0.005)
        decision, _state = decide(None, POLICY, current, State(), now=0)
        assert (decision.replicas, decision.batch_size, decision.action) == (3, 8, "hold")
        assert not decision.metrics_available
        assert decision.sla_met is None

    def test_missing_latency_under_traffic_holds_and_names_it(self) -> None:
        obs = seen(at=0, qps=50, p99_ms=None, ready=3)
        decision, _ = decide(obs, POLICY, InForce(3, 8, 0.005), State(), now=0)
        assert decision.action == "hold"
        assert "P99 latency" in decision.reason

    def test_stale_metrics_hold(self) -> None:
        obs = seen(at=0, qps=1, p99_ms=10, ready=3)
        decision, _ = decide(obs, POLICY, InForce(3, 8, 0.005), State(), now=1000)
        assert decision.action == "hold"
        assert "old" in decision.reason

    def test_a_metrics_outage_never_scales_down_even_after_the_window(self) -> None:
        current, state = InForce(3, 8, 0.005), State(recommendations=((0.0, 1),))
        for tick in range(1, 20):
            decision, current, state = step(None, current, state, tick * TICK)
            assert decision.replicas == 3, tick


class TestPredictInsteadOfCreep:
    def test_an_overloaded_batch_1_service_gets_its_batch_raised_in_one_step(self) -> None:
        # 300 rps on one replica at batch 1: capacity 167 rps, so P99 explodes and 133 rps shed.
        obs = seen(at=0, qps=167, rejected=133, p99_ms=900, ready=1, utilization=1.0)
        decision, _ = decide(obs, POLICY, InForce(1, 1, 0.005), State(fit=MODEL), now=0)
        # 330 rps planned (10 % margin) fits one replica once batches reach 4 or more:
        # batch 4 → 4 / 12 ms = 333 rps, too close; the plan picks a limit well above that.
        assert decision.replicas == 1
        assert decision.batch_size >= 6
        assert decision.action == "retune"
        assert decision.predicted_p99_s is not None
        assert decision.predicted_p99_s <= 0.08
        assert "batch 1→" in decision.reason

    def test_load_beyond_one_replica_scales_out_at_once(self) -> None:
        # 1200 rps: even batch 32 (471 rps a replica) needs 3 replicas for 1320 planned rps.
        obs = seen(at=0, qps=470, rejected=730, p99_ms=2000, ready=1, batch=32, utilization=1.0)
        decision, _ = decide(obs, POLICY, InForce(1, 32, 0.005), State(fit=MODEL), now=0)
        assert decision.action == "scale-up"
        assert decision.replicas in (3, 4)

    def test_at_max_replicas_with_the_sla_broken_it_says_so(self) -> None:
        obs = seen(at=0, qps=1880, rejected=2000, p99_ms=3000, ready=4, batch=32, utilization=1.0)
        decision, _ = decide(obs, POLICY, InForce(4, 32, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas == 4
        assert decision.scaling_limited is not None
        assert "maxReplicas 4" in decision.scaling_limited
        assert decision.sla_met is False


class TestRefusalsAreMissesOfTheSla:
    """With deadline admission the runtime keeps the admitted requests' P99 inside the SLA
    however many it refuses: the refused ones are the misses, and the offered load is what the
    runtime counted at arrival."""

    def test_a_p99_inside_the_sla_with_many_refused_is_not_the_sla_met(self) -> None:
        # 300 rps arrive at one replica at batch 1 (167 rps): 133 refused, the rest in 60 ms.
        obs = replace(seen(at=0, qps=167, p99_ms=60, ready=1, utilization=1.0), arrival_qps=300)
        decision, _ = decide(obs, POLICY, InForce(1, 1, 0.005), State(fit=MODEL), now=0)
        assert decision.sla_met is False
        assert "44% unserved" in decision.reason  # 133 / 300
        # planned for the 300 that arrived, not the 167 served: the batch goes up
        assert decision.batch_size >= 6

    def test_a_few_refusals_within_the_tolerance_are_the_sla_met(self) -> None:
        # 0.5 % refused: inside the 1 % a P99 allows
        obs = replace(seen(at=0, qps=199, p99_ms=60, ready=1), arrival_qps=200)
        decision, _ = decide(obs, POLICY, InForce(1, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.sla_met is True

    def test_a_few_refusals_under_light_load_are_reported_not_scaled_for(self) -> None:
        # 100 rps on 2 replicas at batch 8 (plenty), 2 % refused in a burst
        obs = replace(seen(at=0, qps=98, p99_ms=40, ready=2, batch=8), arrival_qps=100)
        decision, _ = decide(obs, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.sla_met is False
        assert decision.replicas == 2
        assert "feedback" not in decision.reason

    def test_many_refusals_the_model_cannot_explain_add_replicas(self) -> None:
        # the model says 2 replicas at batch 8 carry 250 rps; 30 % are refused all the same
        obs = replace(seen(at=0, qps=175, p99_ms=40, ready=2, batch=8), arrival_qps=250)
        decision, _ = decide(obs, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas == 3
        assert "30% of the requests refused or expired although the model" in decision.reason

    def test_a_service_that_answers_nothing_is_not_idle(self) -> None:
        # 200 rps arrive and every request expires in the queue or fails (a stuck device): none
        # answered, none refused at arrival, P99 over the SLA. Not "no traffic": no scale-down,
        # the window is a miss, and replicas are added.
        policy = replace(POLICY, scale_down_delay_s=0)
        stuck = replace(seen(at=0, qps=0, p99_ms=5000, ready=4, utilization=1.0), arrival_qps=200)
        assert not stuck.idle
        for state in (State(), State(fit=MODEL)):
            current = InForce(4, 8, 0.005)
            for tick in range(3):
                obs = replace(stuck, at=tick * TICK, ready_replicas=current.replicas)
                decision, state = decide(obs, policy, current, state, tick * TICK)
                current = InForce(decision.replicas, decision.batch_size, 0.005)
                assert decision.replicas >= 4
                assert decision.sla_met is False
                assert "no traffic" not in decision.reason
            assert state.slo.report(2 * TICK).attainment == 0.0

    def test_arrivals_are_the_offered_load_when_the_runtime_counts_them(self) -> None:
        obs = replace(seen(at=0, qps=100, rejected=10, p99_ms=60, ready=1), arrival_qps=150)
        # 40 more arrived than were served or refused at arrival: they expired in the queue
        assert obs.offered_qps == 150
        assert obs.unserved_share == pytest.approx(1 / 3)
        older = seen(at=0, qps=100, rejected=10, p99_ms=60, ready=1)
        assert older.offered_qps == 110  # a runtime without the arrival counter

    def test_retries_counted_apart_are_no_demand_but_their_refusals_are_refusals(self) -> None:
        # 60 rps of demand, 60 rps of retries; 80 answered (some of them retries), 40 refused.
        storm = replace(
            seen(at=0, qps=80, rejected=40, p99_ms=60, ready=1), arrival_qps=60, retried_qps=60
        )
        assert storm.offered_qps == 80  # what was carried, at least
        assert storm.unserved_share == pytest.approx(1 / 3)  # of every attempt
        # Against the demand alone it would read as refusing nothing.
        assert replace(storm, retried_qps=None).unserved_share == 0.0


def measured(qps: float, **signals: float | None) -> Observation:
    """A window of two replicas at batch 8, inside the SLA, with these signals measured."""
    return replace(seen(at=0, qps=qps, p99_ms=60, ready=2, batch=8), arrival_qps=qps, **signals)


def kept_and_persisted(
    signal: str, field: str, key: str, value: float, nonsense: tuple[Any, ...], absent: float
) -> None:
    """A window without `signal` keeps the fit's `field` known, a restart reads it back from
    `key`, and a persisted value out of bounds reads as `absent` (what is not written)."""
    known = State(fit=replace(MODEL, **{field: value}))
    _, state = decide(measured(300, **{signal: None}), POLICY, InForce(2, 8, 0.005), known, 0)
    assert state.fit is not None
    assert getattr(state.fit, field) == value
    assert State.from_dict(state.to_dict()).fit == state.fit
    assert key not in State(fit=MODEL).to_dict()["fit"]
    for wrong in nonsense:
        fit = State.from_dict({"fit": {"alphaMs": 4, "betaMs": 2, "confident": True, key: wrong}})
        assert fit.fit is not None
        assert getattr(fit.fit, field) == absent


class TestClumpedArrivals:
    """Requests that arrive together (a client's fan-out) queue behind each other: the window's
    dispersion goes into the model, which plans more capacity for the same rate."""

    @staticmethod
    def window(qps: float, dispersion: float | None) -> Observation:
        return measured(qps, arrival_dispersion=dispersion)

    def test_clumps_are_planned_for_and_said(self) -> None:
        policy = replace(POLICY, max_replicas=20)
        current, fitted = InForce(2, 8, 0.005), State(fit=MODEL, overhead_s=0.01)
        poisson, _ = decide(self.window(1200, 1.0), policy, current, fitted, now=0)
        clumped, state = decide(self.window(1200, 6.3), policy, current, fitted, now=0)
        assert clumped.replicas > poisson.replicas
        assert state.fit is not None
        assert state.fit.dispersion == pytest.approx(1.1**19, rel=1e-3)  # 6.3, to a 10 % step
        assert "arrivals clumped 6.1× Poisson's variance" in clumped.reason
        assert "clumped" not in poisson.reason

    def test_a_window_whose_replicas_changed_lowers_it_never_raises_it(self) -> None:
        # Each replica's rate changes inside the runtime's 10 s blocks as its share of the
        # traffic does: Poisson arrivals read 1.9–2.4 for a few windows after a scale-up, and
        # the replica planned for it stayed for good (the scale-down's hysteresis).
        joined = State(fit=replace(MODEL, dispersion=1.331), ready=1, ready_changed_at=0.0)
        current = InForce(2, 8, 0.005)
        _, higher = decide(self.window(300, 2.2), POLICY, current, joined, 30.0)
        _, lower = decide(self.window(300, 1.0), POLICY, current, joined, 30.0)
        assert higher.fit is not None
        assert lower.fit is not None
        assert (higher.fit.dispersion, lower.fit.dispersion) == (1.331, 1.0)
        # the replicas settled: a reading stands as read
        settled = State(fit=MODEL, ready=2, ready_changed_at=-600.0, rate=(15.0, 300.0))
        _, later = decide(self.window(300, 2.2), POLICY, current, settled, 30.0)
        assert later.fit is not None
        assert later.fit.dispersion == pytest.approx(1.1**8, rel=1e-3)

    @pytest.mark.parametrize(("measured", "modelled"), [(0.3, 1.0), (1.0, 1.0), (1.19, 1.0)])
    def test_a_dispersion_near_poissons_is_poissons(self, measured: float, modelled: float) -> None:
        _, state = decide(self.window(300, measured), POLICY, InForce(2, 8, 0.005), State(), 0)
        assert state.fit is not None
        assert state.fit.dispersion == modelled

    def test_a_window_without_it_keeps_the_one_known_and_a_restart_too(self) -> None:
        kept_and_persisted(
            "arrival_dispersion", "dispersion", "dispersion", 3.1384, (0.2, -1, "nan"), 1.0
        )


class TestP99WithinABucketOfTheSla:
    """The runtime's latency buckets are 15 % apart: within one of the SLA the histogram's P99,
    interpolated inside the bucket, cannot tell which side of the SLA the true one is (a narrow
    tail at 52 ms reads 57 against a 55 ms SLA); the share of requests the runtime counted
    slower than the SLA can."""

    @staticmethod
    def window(p99_ms: float, late_share: float | None) -> Observation:
        return replace(
            seen(at=0, qps=250, p99_ms=p99_ms, ready=3, batch=2),
            arrival_qps=250,
            late_share=late_share,
            counted_sla_min_s=0.055,
            counted_sla_max_s=0.055,
        )

    def test_within_a_bucket_the_requests_over_it_decide(self) -> None:
        assert not p99_over(self.window(56.6, 0.002), 0.055)
        assert p99_over(self.window(56.6, 0.02), 0.055)
        assert p99_over(self.window(56.6, None), 0.055)  # not counted: the reading
        assert p99_over(self.window(53.0, 0.02), 0.055)  # reads inside, counted over

    def test_a_share_counted_against_another_sla_says_nothing(self) -> None:
        # The spec's SLA went from 100 to 55 ms; the pods counted against 100 for part of the
        # window: none was over that, which says nothing of 55.
        changed = replace(self.window(60.0, 0.0), counted_sla_max_s=0.1)
        assert p99_over(changed, 0.055)
        assert p99_over(replace(changed, counted_sla_min_s=None, counted_sla_max_s=None), 0.055)

    def test_beyond_a_bucket_the_reading_decides(self) -> None:
        # more than a bucket from the SLA the true P99 is on the reading's side (a runtime that
        # counts against an SLA since changed is overruled there)
        assert p99_over(self.window(70.0, 0.0), 0.055)
        assert not p99_over(self.window(45.0, 0.5), 0.055)

    def test_past_the_fine_buckets_the_requests_over_it_decide(self) -> None:
        # Above 2.2 s the buckets are 2.5, 5 and 10 s, and a P99 past 10 s reads 10 s: a 30 s
        # SLA with 3 % of requests at 45 s read "inside", as did 4.5 s with 1.5 % at 4.9 s.
        def coarse(p99_s: float, late_share: float, sla_s: float) -> Observation:
            return replace(
                self.window(p99_s * 1e3, late_share),
                counted_sla_min_s=sla_s,
                counted_sla_max_s=sla_s,
            )

        assert p99_over(coarse(10.0, 0.03, 30.0), 30.0)
        assert p99_over(coarse(3.333, 0.015, 4.5), 4.5)
        assert not p99_over(coarse(10.0, 0.002, 30.0), 30.0)
        assert not p99_over(coarse(1.0, 0.5, 30.0), 30.0)  # a fine reading still decides

    def test_the_guard_adds_nothing_on_a_reading_the_histogram_made(self) -> None:
        policy = replace(POLICY, sla_p99_s=0.055, max_replicas=8)
        current, state = InForce(3, 2, 0.005), State(fit=MODEL, overhead_s=0.035)
        read, _ = decide(self.window(56.6, None), policy, current, state, now=0)
        assert read.replicas > 3
        assert "P99 over the SLA although the model predicts" in read.reason
        counted, after = decide(self.window(56.6, 0.002), policy, current, state, now=0)
        assert counted.replicas == 3, counted.reason
        assert counted.sla_met is True
        assert after.ceiling is None


class TestAnSlaBelowWhatARequestTakesAlone:
    """An SLA below the time outside the batcher and a request's own batch: no replica meets it,
    and every replica bought for it served nothing (maxReplicas, window after window). The plan
    keeps P99 within `FLOOR_MARGIN` of that floor instead, and says so; the verdict stays the
    SLA's."""

    POLICY = replace(POLICY, sla_p99_s=0.042, max_replicas=8)

    @staticmethod
    def window(p99_ms: float, ready: int = 3) -> Observation:
        return replace(
            seen(at=0, qps=300, p99_ms=p99_ms, ready=ready, batch=2),
            arrival_qps=300,
            late_share=1.0,  # every request over the 42 ms
        )

    def test_the_plan_is_for_the_floor_and_says_so(self) -> None:
        # 40 ms outside the batcher and a 1-row batch of 6 ms: 46 ms at the least
        state = State(fit=MODEL, overhead_s=0.040)
        decision, after = decide(self.window(50.0), self.POLICY, InForce(3, 2, 0.005), state, 0)
        assert decision.replicas < self.POLICY.max_replicas
        assert decision.sla_met is False
        assert "the SLA is below what a request takes alone: 46 ms, 40 ms of it outside" in (
            decision.reason
        )
        assert "raise the SLA or cut the time outside the batcher" in decision.reason
        assert decision.below_floor is not None  # ScalingLimited: SLABelowLatencyFloor
        assert "feedback" not in decision.reason
        assert after.ceiling is None

    def test_no_guard_and_no_ceiling_buys_replicas_for_it(self) -> None:
        # P99 over the SLA in every window, and a ceiling from before the floor was known: the
        # replicas stay what the floor's plan needs
        state = State(fit=MODEL, overhead_s=0.040, ceiling=Ceiling(0.0, 3, 100.0))
        current = InForce(3, 2, 0.005)
        for tick in range(1, 30):
            now = tick * TICK
            decision, state = decide(
                replace(self.window(52.0), at=now), self.POLICY, current, state, now
            )
            current = InForce(decision.replicas, decision.batch_size, 0.005)
            assert decision.replicas <= 3, decision.reason

    def test_a_scale_up_absorbs_at_the_floors_batch_not_the_smallest(self) -> None:
        # While new replicas start, the ready ones run the batch limit that carries the most
        # inside the plan's SLA: under the real one every limit is too long, and batch 1 (the
        # least a replica carries) was the answer.
        state = State(fit=MODEL, overhead_s=0.040)
        busy = replace(self.window(60.0), qps=900, arrival_qps=900)
        decision, _ = decide(busy, self.POLICY, InForce(3, 8, 0.005), state, 0)
        assert decision.replicas > 3
        assert decision.batch_size > 1, decision.reason

    def test_a_reachable_sla_is_planned_as_ever(self) -> None:
        reachable = replace(self.POLICY, sla_p99_s=0.060)
        state = State(fit=MODEL, overhead_s=0.040)
        decision, _ = decide(self.window(50.0), reachable, InForce(3, 2, 0.005), state, 0)
        assert "below what a request takes alone" not in decision.reason
        assert decision.below_floor is None


class TestUnevenLoad:
    """Load that swings within the window (a square wave of seconds): most of its requests come
    in its busy seconds and meet more than the window's mean rate; the model keeps how much
    more, and the plan sizes for the rate they meet."""

    @staticmethod
    def window(
        qps: float, factor: float | None, *, replicas: float = 2.0, clumps: float = 1.0
    ) -> Observation:
        """Arrivals at `qps` over `replicas` whose requests met `factor` times a replica's
        mean in their second: Σn²/Σn is the rate met plus the clumps' dispersion."""
        squares = None if factor is None else qps * (factor * qps / replicas + clumps)
        return measured(
            qps,
            arrival_second_squares=squares,
            arrival_counted_seconds=replicas,
            arrival_dispersion=clumps,
        )

    def test_the_rate_met_is_planned_for_and_said(self) -> None:
        policy = replace(POLICY, max_replicas=20)
        current, fitted = InForce(2, 8, 0.005), State(fit=MODEL, overhead_s=0.01)
        even, _ = decide(self.window(1200, 1.0), policy, current, fitted, now=0)
        uneven, state = decide(self.window(1200, 1.67), policy, current, fitted, now=0)
        assert uneven.replicas > even.replicas
        assert state.fit is not None
        assert state.fit.unevenness == pytest.approx(1.1**5, rel=1e-3)  # 1.67, to a 10 % step
        assert "uneven: its requests met 1933 rps in their second, 1.61× the window's 1200" in (
            uneven.reason
        )
        assert "uneven" not in even.reason

    @pytest.mark.parametrize(
        ("factor", "modelled"), [(0.7, 1.0), (1.0, 1.0), (1.19, 1.0), (1.3, 1.331), (40, 9.8497)]
    )
    def test_near_even_is_even_and_a_wild_one_is_capped(
        self, factor: float, modelled: float
    ) -> None:
        _, state = decide(self.window(300, factor), POLICY, InForce(2, 8, 0.005), State(), 0)
        assert state.fit is not None
        assert state.fit.unevenness == modelled

    def test_a_window_of_a_second_or_two_says_nothing_of_it(self) -> None:
        # The pods' own metrics read over a second at start-up: a second's square is added when
        # the second ends, so such a window may hold a busy second's square beside part of its
        # arrivals. The last known stands (none yet: even).
        short = replace(self.window(300, 1.67), window_s=1.0)
        _, state = decide(short, POLICY, InForce(2, 8, 0.005), State(), 0)
        assert state.fit is not None
        assert state.fit.unevenness == 1.0

    def test_clumps_are_the_dispersions_not_unevenness(self) -> None:
        # Clumps of requests raise every second's count variance by the dispersion: taken off.
        _, state = decide(
            self.window(300, 1.0, clumps=8.0), POLICY, InForce(2, 8, 0.005), State(), 0
        )
        assert state.fit is not None
        assert state.fit.unevenness == 1.0

    def test_a_replica_that_came_inside_the_window_counts_for_its_part(self) -> None:
        # 1.5 replicas on average over the window: a replica's mean is the rate over 1.5.
        window = self.window(300, 1.0, replicas=1.5)
        _, state = decide(window, POLICY, InForce(2, 8, 0.005), State(), 0)
        assert state.fit is not None
        assert state.fit.unevenness == 1.0

    def test_a_window_whose_replicas_changed_lowers_it_never_raises_it(self) -> None:
        # Replicas that came or went inside the window change each one's rate: a reading above
        # what is known is theirs (19 of 23 removed at a steady load read 1.6), one below still
        # says the load came no more unevenly than that (kept, the reading of a window where the
        # traffic began held a step's replicas through every scale-up after it).
        changed = State(fit=replace(MODEL, unevenness=1.331), changed_at=20.0, ready=2)
        current = InForce(2, 8, 0.005)
        _, higher = decide(self.window(300, 1.67), POLICY, current, changed, 30.0)
        _, lower = decide(self.window(300, 1.0), POLICY, current, changed, 30.0)
        assert higher.fit is not None
        assert lower.fit is not None
        assert (higher.fit.unevenness, lower.fit.unevenness) == (1.331, 1.0)
        # and without a change a reading stands as read, a scale-down delay of 0 included: the
        # unevenness that sized the replicas is not forgotten in the window after they change
        _, settled = decide(self.window(300, 1.67), POLICY, current, State(), 30.0)
        assert settled.fit is not None
        assert settled.fit.unevenness == 1.6105

    def test_a_few_arrivals_a_second_say_nothing(self) -> None:
        # 4 a second a replica: a minute of Poisson arrivals reads 1.5 now and then.
        known = State(fit=replace(MODEL, unevenness=1.331))
        _, state = decide(self.window(8, 3.0), POLICY, InForce(2, 8, 0.005), known, 0)
        assert state.fit is not None
        assert state.fit.unevenness == 1.331

    def test_the_overhead_is_learned_at_the_rate_met(self) -> None:
        # A window inside the SLA whose P99 is what the model predicts at the rate its requests
        # met, plus the 40 ms outside the batcher: it teaches 40 ms, not what the busy seconds
        # added to the window's mean rate's prediction.
        met = 400 * 1.61
        expected = predict(MODEL, rate=met, replicas=2, max_batch=8, delay_s=0.005).p99_s
        window = replace(self.window(400, 1.61), p99_s=expected + 0.040, outside_s=0.04)
        seeded = State(fit=MODEL, overhead_s=0.04)
        _, state = decide(window, POLICY, InForce(2, 8, 0.005), seeded, now=0)
        assert state.overhead_s == pytest.approx(0.04, abs=1e-4)
        at_the_mean = replace(window, arrival_second_squares=None)
        _, blind = decide(at_the_mean, POLICY, InForce(2, 8, 0.005), seeded, now=0)
        assert blind.overhead_s is not None
        assert blind.overhead_s > 0.041

    def test_a_window_without_it_keeps_the_one_known_and_a_restart_too(self) -> None:
        kept_and_persisted(
            "arrival_second_squares",
            "unevenness",
            "unevenness",
            1.6105,
            (0.5, -1, "nan", 11),
            1.0,
        )


class TestBatchTimesThatVary:
    """A device whose batches vary around t(b) (contention, a descheduled launch thread): the
    window's variation goes into the model, which plans more capacity for the same rate."""

    @staticmethod
    def window(qps: float, cv: float | None) -> Observation:
        return measured(qps, batch_time_cv=cv)

    def test_variation_is_planned_for_and_said(self) -> None:
        policy = replace(POLICY, max_replicas=20)
        current, fitted = InForce(2, 8, 0.005), State(fit=MODEL, overhead_s=0.01)
        steady, _ = decide(self.window(1200, 0.01), policy, current, fitted, now=0)
        varying, state = decide(self.window(1200, 0.37), policy, current, fitted, now=0)
        assert varying.capacity_rps is not None
        assert steady.capacity_rps is not None
        assert varying.capacity_rps < 0.9 * steady.capacity_rps  # a replica carries less
        assert varying.replicas >= steady.replicas
        assert state.fit is not None
        assert state.fit.batch_cv == 0.35  # to a step of 0.05
        assert "·b ms ± 35%" in varying.reason
        assert "±" not in steady.reason

    @pytest.mark.parametrize(("measured", "modelled"), [(0.0, 0.0), (0.049, 0.0), (9.0, 2.0)])
    def test_little_variation_is_none_and_a_stalling_device_is_capped(
        self, measured: float, modelled: float
    ) -> None:
        _, state = decide(self.window(300, measured), POLICY, InForce(2, 8, 0.005), State(), 0)
        assert state.fit is not None
        assert state.fit.batch_cv == modelled

    def test_a_window_without_it_keeps_the_one_known_and_a_restart_too(self) -> None:
        kept_and_persisted("batch_time_cv", "batch_cv", "batchCv", 0.25, (-0.1, 3.0, "nan"), 0.0)


class TestRequestsOfVariedSizes:
    """Clients whose requests bring varied rows (one row mostly, sixteen now and then): the rows
    clump by the sizes' spread, which the window measures and the model plans for."""

    @staticmethod
    def window(qps: float, cv: float | None) -> Observation:
        return measured(qps, rows_per_request=2.5, request_rows_cv=cv)

    def test_the_spread_is_planned_for_and_said(self) -> None:
        policy = replace(POLICY, max_replicas=40)
        current, fitted = InForce(2, 32, 0.005), State(fit=MODEL, overhead_s=0.01)
        same, _ = decide(self.window(400, 0.0), policy, current, fitted, now=0)
        varied, state = decide(self.window(400, 1.83), policy, current, fitted, now=0)
        assert varied.capacity_rps is not None
        assert same.capacity_rps is not None
        assert varied.capacity_rps < 0.8 * same.capacity_rps  # a replica carries less
        assert varied.replicas > same.replicas
        assert state.fit is not None
        assert state.fit.rows_cv == 1.8  # to a step of 0.1
        assert "2.5 rows a request ± 180%" in varied.reason
        assert "±" not in same.reason

    @pytest.mark.parametrize(("measured", "modelled"), [(0.0, 0.0), (0.049, 0.0), (40.0, 10.0)])
    def test_little_spread_is_none_and_a_wild_one_is_capped(
        self, measured: float, modelled: float
    ) -> None:
        _, state = decide(self.window(300, measured), POLICY, InForce(2, 8, 0.005), State(), 0)
        assert state.fit is not None
        assert state.fit.rows_cv == modelled

    def test_a_window_without_it_keeps_the_one_known_and_a_restart_too(self) -> None:
        kept_and_persisted("request_rows_cv", "rows_cv", "rowsCv", 1.2, (-0.1, 11.0, "nan"), 0.0)


class TestASlowReplica:
    """One replica's batches take twice its peers': the decision names its pod for replacement
    once it stays so, remembers that through the resource, and never twice in a row."""

    @staticmethod
    def window(at: float, slow: str = "r-2") -> Observation:
        pods = tuple(
            PodCompute(name, 4.0, MODEL.batch_seconds(4) * (2 if name == slow else 1), 900)
            for name in ("r-0", "r-1", "r-2", "r-3")
        )
        return replace(measured(600), at=at, ready_replicas=4, pods=pods)

    def test_it_is_replaced_and_remembered(self) -> None:
        current, state = InForce(4, 8, 0.005), State(fit=MODEL, overhead_s=0.01)
        first, state = decide(self.window(0), POLICY, current, state, now=0)
        assert first.replace == ()
        assert "pod r-2's batches take 2.0× its peers'" in first.reason
        state = State.from_dict(state.to_dict())  # through status.autopilot
        second, state = decide(self.window(30), POLICY, current, state, now=30)
        assert second.replace == ("r-2",)
        assert "replacing pod r-2 (2.0× for 30 s)" in second.reason
        state = State.from_dict(state.to_dict())
        assert state.stragglers.replaced == (("r-2", 30.0),)
        # Draining, it is still in the next windows: not replaced again, not anyone's peer.
        third, _ = decide(self.window(45), POLICY, current, state, now=45)
        assert third.replace == ()
        assert "r-2" not in third.reason

    def test_not_while_a_rollout_runs_two_templates(self) -> None:
        policy = replace(POLICY, rolling=True)
        current, state = InForce(4, 8, 0.005), State(fit=MODEL, overhead_s=0.01)
        for now in (0, 30, 60):
            decision, state = decide(self.window(now), policy, current, state, now=now)
            assert decision.replace == ()
            assert "peers" not in decision.reason


class TestRequestsOfSeveralRows:
    """Clients that batch on their side send several rows a request: the rates count requests,
    the fit and the batch limits rows, and the window's rows per request converts."""

    @staticmethod
    def window(
        qps: float, rows: float | None, *, ready: int = 4, p99_ms: float = 50
    ) -> Observation:
        return replace(
            seen(at=0, qps=qps, p99_ms=p99_ms, ready=ready, batch=8),
            rows_per_request=rows,
            arrival_qps=qps,
        )

    def test_a_request_of_4_rows_is_planned_as_4_rows(self) -> None:
        policy = replace(POLICY, max_replicas=20)
        current, fitted = InForce(1, 8, 0.005), State(fit=MODEL, overhead_s=0.01)
        rows, _ = decide(self.window(600, None, ready=1), policy, current, fitted, now=0)
        requests, state = decide(self.window(150, 4.0, ready=1), policy, current, fitted, now=0)
        # 150 requests of 4 rows are the 600 rows a second the fit counts; they arrive 4 rows
        # at once, which fills batches less evenly than single rows: as many replicas or more
        assert rows.action == requests.action == "scale-up"
        assert requests.replicas >= rows.replicas > 1
        assert "4 rows a request" in requests.reason
        assert f"so {requests.replicas} for 158 rps" in requests.reason  # in requests
        assert state.fit is not None
        assert state.fit.rows_per_request == 4.0
        one_row, _ = decide(self.window(150, 1.0, ready=1), policy, current, fitted, now=0)
        assert one_row.replicas == 1
        assert "rows a request" not in one_row.reason

    def test_a_window_without_answers_keeps_the_rows_known(self) -> None:
        known = State(fit=replace(MODEL, rows_per_request=4.0))
        _, state = decide(self.window(150, None), POLICY, InForce(4, 8, 0.005), known, now=0)
        assert state.fit is not None
        assert state.fit.rows_per_request == 4.0

    def test_a_reading_just_above_one_row_is_one_row(self) -> None:
        # a batch is counted when it runs, its requests when they are answered: the window's
        # edges make one row read 1.004
        _, state = decide(self.window(150, 1.004), POLICY, InForce(4, 8, 0.005), State(), now=0)
        assert state.fit is not None
        assert state.fit.rows_per_request == 1.0

    def test_the_rows_a_request_brings_survive_a_restart(self) -> None:
        state = State(fit=replace(MODEL, rows_per_request=3.5))
        assert State.from_dict(state.to_dict()) == state
        assert "rowsPerRequest" not in State(fit=MODEL).to_dict()["fit"]
        for nonsense in (0.2, -1, "nan"):
            doc = {
                "fit": {"alphaMs": 4, "betaMs": 2, "confident": True, "rowsPerRequest": nonsense}
            }
            fit = State.from_dict(doc).fit
            assert fit is not None
            assert fit.rows_per_request == 1.0

    def test_feedback_doubles_from_the_rows_a_request_brings(self) -> None:
        # batch limit 1 with 4-row requests: each runs alone, 2 would change nothing. Neither
        # batch times nor a busy share: no fit to plan with.
        window = seen(at=0, qps=100, p99_ms=300, ready=1, batch=4.0, utilization=None)
        without_a_fit = replace(window, compute=())
        obs = replace(without_a_fit, rows_per_request=4.0)
        decision, _ = decide(obs, POLICY, InForce(1, 1, 0.005), State(), now=0)
        assert "feedback: doubling the batch limit" in decision.reason
        assert decision.batch_size == 8


class TestTheTimeOutsideTheBatcher:
    """The latency outside the batcher (decoding, pre- and post-processing) is learned from
    windows inside the SLA; until one comes, the mean the runtime measures stands in for it."""

    @staticmethod
    def overloaded(outside_s: float | None) -> Observation:
        # 1000 rps arrive at one replica at batch 8: 60 % refused, P99 the queue's
        window = seen(at=0, qps=400, p99_ms=150, ready=1, batch=8, utilization=1.0)
        return replace(window, arrival_qps=1000, outside_s=outside_s)

    def test_a_service_that_starts_overloaded_plans_with_the_measured_mean(self) -> None:
        policy = replace(POLICY, max_replicas=20)
        current = InForce(1, 8, 0.005)
        blind, unknown = decide(self.overloaded(None), policy, current, State(fit=MODEL), now=0)
        measured, state = decide(self.overloaded(0.04), policy, current, State(fit=MODEL), now=0)
        assert unknown.overhead_s is None
        assert state.overhead_s == 0.04
        assert "40 ms outside the batcher" in measured.reason
        # 40 of the 80 ms the plan keeps are spent outside: more replicas, not the same
        assert measured.replicas > blind.replicas

    def test_what_windows_taught_is_not_replaced_by_the_mean(self) -> None:
        taught = State(fit=MODEL, overhead_s=0.01)
        _, state = decide(self.overloaded(0.04), POLICY, InForce(1, 8, 0.005), taught, now=0)
        assert state.overhead_s == 0.01

    def test_a_mean_past_the_sla_counts_as_the_sla(self) -> None:
        _, state = decide(self.overloaded(5.0), POLICY, InForce(1, 8, 0.005), State(MODEL), now=0)
        assert state.overhead_s == POLICY.sla_p99_s

    def test_a_window_inside_the_sla_teaches_it_from_there(self) -> None:
        # the mean said 40 ms; a window inside the SLA shows P99 only 15 ms above the model's
        seeded = State(fit=MODEL, overhead_s=0.04)
        expected = predict(MODEL, rate=100, replicas=2, max_batch=8, delay_s=0.005).p99_s
        inside = replace(
            seen(at=0, qps=100, p99_ms=(expected + 0.015) * 1e3, ready=2, batch=2),
            outside_s=0.04,
        )
        _, state = decide(inside, POLICY, InForce(2, 8, 0.005), seeded, now=0)
        assert state.overhead_s is not None
        assert state.overhead_s == pytest.approx(0.5 * 0.015 + 0.5 * 0.04)


class TestShortWindowsDoNotCreep:
    """Short control windows (2 s ticks over a 10 s window, as in the full-loop test): the
    service is t(b) = 20 + 2·b ms, so one replica serves 45 rps at batch 1 and 276 rps inside
    the target at batch 16; 70 rps arrive."""

    POLICY = Policy(
        sla_p99_s=0.150,
        min_utilization=0.70,
        min_replicas=1,
        max_replicas=2,
        max_batch_size=16,
        scale_down_delay_s=60,
        max_queue_delay_s=0.002,
    )

    @staticmethod
    def window(
        at: float, qps: float, p99_ms: float, batches: list[tuple[float, int]]
    ) -> Observation:
        return Observation(
            at=at,
            window_s=10,
            p99_s=p99_ms / 1e3,
            p95_s=None,
            qps=qps,
            rejected_qps=0,
            queue_p99_s=None,
            utilization=0.6,
            mean_batch=None,
            compute=tuple(ComputePoint(b, 0.020 + 0.002 * b, n) for b, n in batches),
            ready_replicas=1,
        )

    def test_the_batch_limit_jumps_to_the_measured_operating_point(self) -> None:
        # The target is 0.8 × 150 = 120 ms (nothing learned outside the batcher while P99 is over
        # the SLA); a limit whose two full batches take longer is never chosen.
        # t=0: the window caught the start of the load: 10 rps, all at batch 1 (22 ms). The rough
        # fit splits 22 ms as α = β = 11 ms, so 2·t(4) = 110 ms fits and 2·t(6) = 154 ms does
        # not: batch 1→4, the largest limit it allows, which also measures other batch sizes.
        # t=2: batches of 1, 2 and 3.5 rows at 22, 24 and 27 ms fit α = 20 ms, β = 2 ms exactly;
        # 2·t(16) = 104 ms fits, so 4→16 at once. Averaging that fit with the rough guess
        # (15.5 + 6.5·b, then 17.75 + 4.25·b, 18.9 + 3.1·b, …) would allow 6, 8, 12, 12, 16:
        # one step a window towards a point the first window with two batch sizes had measured.
        loads = [
            (10.0, 2000.0, [(1.0, 100)]),
            (55.0, 2500.0, [(1.0, 60), (2.0, 40), (3.5, 30)]),
            (70.0, 2500.0, [(1.0, 60), (2.0, 40), (3.5, 30)]),
            (70.0, 900.0, [(1.0, 60), (2.0, 60), (3.5, 20)]),
            (70.0, 80.0, [(1.0, 60), (2.0, 60), (3.5, 20)]),
            (70.0, 75.0, [(1.0, 60), (2.0, 60), (3.5, 20)]),
        ]
        current, state = InForce(1, 1, 0.002), State()
        decisions = []
        for tick, (qps, p99_ms, points) in enumerate(loads):
            now = 2.0 * tick
            observation = self.window(now, qps, p99_ms, points)
            decision, state = decide(observation, self.POLICY, current, state, now)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            decisions.append(decision)
        assert [d.batch_size for d in decisions] == [4, 16, 16, 16, 16, 16]
        assert [d.replicas for d in decisions] == [1] * len(loads)
        assert "t(b) = 20.00 + 2.00·b ms" in decisions[1].reason
        assert "batch 4→16" in decisions[1].reason


class TestTheBatchTimesOfTheStartUp:
    """The runtime times batches of 1 row and of the largest batch limit allowed at start-up:
    the slope is measured before traffic has run two batch sizes, and the first plan needs no
    trial of the batch limit."""

    # The service of `TestARoughModelTriesTheBatchFirst`: t(b) = 20 + 2·b ms, at batch 1, 70 rps.
    TIMED = (ComputePoint(1, 0.022, 0), ComputePoint(64, 0.148, 0))

    def first(self, startup: tuple[ComputePoint, ...]) -> tuple[Decision, State]:
        window = TestARoughModelTriesTheBatchFirst.window(0, 45.0, 25.0, 2000.0, [(1.0, 450)])
        current = InForce(1, 1, 0.002)
        return decide(
            replace(window, startup=startup),
            TestARoughModelTriesTheBatchFirst.POLICY,
            current,
            State(),
            0,
        )

    def test_the_first_plan_has_the_slope_from_the_start_up(self) -> None:
        decision, state = self.first(self.TIMED)
        assert state.fit is not None
        assert state.fit.confident
        assert (state.fit.alpha_s, state.fit.beta_s) == (pytest.approx(0.020), pytest.approx(0.002))
        assert "t(b) = 20.00 + 2.00·b ms + " in decision.reason  # not "(rough)"
        assert "guess" not in decision.reason
        # the operating point at once: batch 16 on one replica (see the rough model's test)
        assert (decision.batch_size, decision.replicas) == (16, 1)

    def test_without_them_the_first_plan_is_a_guess(self) -> None:
        decision, state = self.first(())
        assert state.fit is not None
        assert not state.fit.confident
        assert "(rough)" in decision.reason

    def test_a_confident_fit_from_traffic_is_not_replaced(self) -> None:
        window = TestARoughModelTriesTheBatchFirst.window(0, 45.0, 25.0, 2000.0, [(1.0, 450)])
        learned = State(fit=LatencyFit(alpha_s=0.010, beta_s=0.004, confident=True))
        _, state = decide(
            replace(window, startup=self.TIMED),
            TestARoughModelTriesTheBatchFirst.POLICY,
            InForce(1, 1, 0.002),
            learned,
            0,
        )
        assert state.fit is not None
        assert state.fit.beta_s == pytest.approx(0.004)  # the traffic's slope, kept


class TestARoughModelTriesTheBatchFirst:
    """The service of the full-loop test, t(b) = 20 + 2·b ms, at batch 1 on one replica (45 rps
    at most, t(1) = 22 ms); 2 s ticks over a 10 s window; SLA 150 ms, so the target is
    0.8 × 150 = 120 ms (nothing is learned outside the batcher while P99 is over the SLA);
    scale-down delay 300 s, so a replica added by mistake stays five minutes."""

    POLICY = replace(TestShortWindowsDoNotCreep.POLICY, max_replicas=4, scale_down_delay_s=300)

    @staticmethod
    def window(
        at: float, qps: float, rejected: float, p99_ms: float, batches: list[tuple[float, int]]
    ) -> Observation:
        return Observation(
            at=at,
            window_s=10,
            p99_s=p99_ms / 1e3,
            p95_s=None,
            qps=qps,
            rejected_qps=rejected,
            queue_p99_s=None,
            utilization=1.0,
            mean_batch=None,
            compute=tuple(ComputePoint(b, 0.020 + 0.002 * b, n) for b, n in batches),
            ready_replicas=1,
        )

    def run(
        self, ticks: list[tuple[float, float, float, list[tuple[float, int]]]]
    ) -> list[Decision]:
        current, state = InForce(1, 1, 0.002), State()
        decisions = []
        for tick, (qps, rejected, p99_ms, points) in enumerate(ticks):
            now = 2.0 * tick
            observation = self.window(now, qps, rejected, p99_ms, points)
            decision, state = decide(observation, self.POLICY, current, state, now)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            decisions.append(decision)
        return decisions

    def test_the_batch_goes_up_first_and_one_replica_reaches_the_operating_point(self) -> None:
        # 70 rps offered: 45 served at batch 1, 25 shed; the plan is for 1.05 × 70 = 73.5 rps.
        # t=0: batch 1 alone: the rough fit splits 22 ms as α = β = 11 ms. It allows batch 4 at
        # most (2·t(4) = 110 ms ≤ 120 ms; 2·t(6) = 154 ms is not), where a replica runs full
        # batches at 4 / 55 ms = 72.7 rps < 73.5: two replicas by that guess. But if all 22 ms
        # were α, every batch would take 22 ms and batch 16 would carry 16 / 22 ms = 727 rps:
        # one replica may well do, so the replicas stay at 1; and since the window is over the
        # SLA whatever is tried, the batch goes to what that reading would run, 1→16.
        # t=2: 8 s of batch 1 and 2 s of batches of 4 (28 ms): α = 20 ms, β = 2 ms, exactly;
        # 2·t(16) = 104 ms fits, and a replica carries 16 / 52 ms = 308 rps at full batches
        # (276 inside the target): batch 16 on one replica, the operating point.
        # Then the backlog drains and P99 falls; nothing else moves.
        decisions = self.run(
            [
                (45.0, 25.0, 2000.0, [(1.0, 450)]),
                (55.0, 15.0, 900.0, [(1.0, 360), (4.0, 70)]),
                (70.0, 0.0, 300.0, [(1.0, 270), (4.0, 70), (6.0, 60)]),
                (70.0, 0.0, 80.0, [(1.0, 180), (4.0, 70), (6.0, 120)]),
                (70.0, 0.0, 70.0, [(1.0, 90), (4.0, 70), (6.0, 180)]),
            ]
        )
        assert [d.batch_size for d in decisions] == [16, 16, 16, 16, 16]
        assert [d.replicas for d in decisions] == [1] * 5
        assert decisions[0].action == "retune"
        assert "(rough)" in decisions[0].reason
        assert "if every batch took the measured 22 ms" in decisions[0].reason
        assert "raising the batch limit first and holding 1 replica until" in (decisions[0].reason)
        assert "that reading puts P99 at" in decisions[0].reason
        assert "t(b) = 20.00 + 2.00·b ms" in decisions[1].reason

    def test_inside_the_sla_the_guess_picks_the_batch_it_tries(self) -> None:
        # 44 rps at batch 1, P99 110 ms inside the SLA (150 ms); the plan (1.05 × 44 = 46 rps
        # and the headroom) adds a replica by the guess. The SLA holds: the limit tried is the
        # one the guess itself allows, not the optimistic reading's, which could break it.
        decisions = self.run([(44.0, 0.0, 110.0, [(1.0, 440)])])
        assert decisions[0].replicas == 1
        assert decisions[0].batch_size == 4
        assert "the guess puts P99 at" in decisions[0].reason

    def test_the_wait_lasts_until_the_new_limit_is_measured(self) -> None:
        # A batch size shows in rate() from the second scrape after its limit: the window right
        # after the raise still holds batch 1 only, and the guess would add a replica. It
        # waits; two intervals after the raise the guess is followed.
        decisions = self.run([(45.0, 25.0, 2000.0, [(1.0, 450)])] * 4)
        assert [d.replicas for d in decisions] == [1, 1, 2, 2]
        assert "the batch limit raised 2 s ago is not measured yet" in decisions[1].reason
        assert "holding 1 replica one more interval" in decisions[1].reason
        assert "still a guess 4 s after the batch limit was raised: following it" in (
            decisions[2].reason
        )

    def test_the_wait_lasts_two_scrapes_where_they_are_longer_than_the_intervals(self) -> None:
        # Scrapes every 5 s (the fast signal's span) and decisions every 2 s: the new batch
        # size may show only 10 s after the raise.
        policy, current, state = self.POLICY, InForce(1, 1, 0.002), State()
        replicas = []
        for tick in range(7):
            now = 2.0 * tick
            observation = replace(
                self.window(now, 45.0, 25.0, 2000.0, [(1.0, 450)]),
                recent_qps=70.0,
                recent_window_s=5.0,
            )
            decision, state = decide(observation, policy, current, state, now)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            replicas.append(decision.replicas)
        assert replicas == [1, 1, 1, 1, 1, 2, 2]

    def test_a_guess_that_sees_no_gain_in_batching_still_tries_the_batch_first(self) -> None:
        # A fixed cost much larger than the per-row one, t(b) = 30 + 0.5·b ms (a large model on
        # an accelerator), with a tight SLA: 100 ms, target 80 ms. One replica at limit 2 ran
        # batches of 1 only (30.5 ms); 210 rps offered, 33 served. The rough fit splits 30.5 ms
        # evenly (α = β = 15.25 ms), by which batch 2 (45.75 ms) no longer fits the target and a
        # replica carries some 10 rps at batch 1: its plan lowers the batch and asks for every
        # replica it may. But if all 30.5 ms were α, batch 64 would carry 2,000 rps a replica:
        # one may well do. So the batch limit goes up first — to what that reading would run —
        # and the replicas stay; the next window measures t(b) and one replica carries it.
        policy = replace(self.POLICY, sla_p99_s=0.100, max_replicas=32, max_batch_size=64)
        current, state = InForce(1, 2, 0.002), State()

        def window(
            at: float, qps: float, rejected: float, batches: list[tuple[float, int]]
        ) -> Observation:
            return replace(
                self.window(at, qps, rejected, 101.0, []),
                compute=tuple(ComputePoint(b, 0.030 + 0.0005 * b, n) for b, n in batches),
            )

        first, state = decide(window(0.0, 33.0, 177.0, [(1.0, 450)]), policy, current, state, 0.0)
        assert "(rough)" in first.reason
        assert "raising the batch limit first and holding 1 replica until" in first.reason
        assert first.replicas == 1
        assert first.batch_size > 2
        current = InForce(first.replicas, first.batch_size, first.max_queue_delay_s)
        second, _ = decide(
            window(2.0, 200.0, 10.0, [(1.0, 300), (7.0, 150)]), policy, current, state, 2.0
        )
        assert "t(b) = 30.00 + 0.50·b ms" in second.reason
        assert second.replicas == 1

    def test_without_batch_timings_over_the_sla_the_guess_is_followed_at_once(self) -> None:
        # The same window read from the busy share alone (no batch times by size): one replica
        # busy all window long, 45 batches of 1 a second, so 22 ms a batch. A new batch limit
        # would show only in the busy share of a window that began after it, 12 s from now
        # (window and interval), and the trial would refuse a third of the requests meanwhile
        # to measure nothing: the guess's replicas and batch limit now.
        basic = replace(self.window(0.0, 45.0, 25.0, 2000.0, []), mean_batch=1.0, utilization=1.0)
        decision, _ = decide(basic, self.POLICY, InForce(1, 1, 0.002), State(), 0.0)
        assert "(rough)" in decision.reason
        assert "the windows time no batch sizes" in decision.reason
        assert (decision.replicas, decision.batch_size) == (2, 4)
        # Inside the SLA there is no hurry: the batch limit still goes first.
        inside = replace(basic, p99_s=0.110, rejected_qps=0.0, qps=44.0)
        decision, _ = decide(inside, self.POLICY, InForce(1, 1, 0.002), State(), 0.0)
        assert "raising the batch limit first" in decision.reason
        assert decision.replicas == 1

    def test_load_no_batch_can_carry_adds_replicas_at_once(self) -> None:
        # 1600 rps offered, 45 served at batch 1; the plan is for 1.05 × 1600 = 1680 rps. Even if
        # every batch took the measured 22 ms, batch 16 would carry at most 16 / 22 ms = 727 rps
        # a replica (704 inside the target): one replica cannot carry 1680 rps whatever α and β
        # are, so waiting an interval would only delay the replicas. The rough guess (45 rps a
        # replica inside the target at batch 4) asks for 38; maxReplicas is 4: 1→4, batch 1→4.
        # t=2: the fit is confident, 20 + 2·b: 276 rps a replica inside the target at batch 16,
        # so 7 for 1680 rps; still maxReplicas, now at batch 16, and it says it is limited.
        decisions = self.run(
            [
                (45.0, 1555.0, 5000.0, [(1.0, 450)]),
                (500.0, 1100.0, 5000.0, [(1.0, 360), (4.0, 70)]),
            ]
        )
        assert [(d.replicas, d.batch_size) for d in decisions] == [(4, 4), (4, 16)]
        assert decisions[0].action == "scale-up"
        assert "no batch limit lets 1 carry 1680 rps" in decisions[0].reason
        assert decisions[1].scaling_limited is not None

    def test_a_rough_model_gives_back_only_what_its_slowest_reading_allows(self) -> None:
        # Four replicas, 60 rps at batch 1 for longer than the scale-down delay. The guess
        # (α = β = 11 ms) has a replica carry 45 rps at batch 4: 2 replicas. But from batch 1
        # alone, batch 4 may take 88 ms (all per row) and a batch of 1 no less than the 22 ms
        # measured: planned as if every batch up to 1 took 22 ms, at batch 1, three replicas
        # carry it. So 4 → 3, at batch 1 (a larger limit would let a backlog run batches of
        # unknown time: all per row, 4 take 88 ms), and no further.
        policy = replace(self.POLICY, scale_down_delay_s=10)
        current, state = InForce(4, 1, 0.002), State()
        decisions = []
        for tick in range(10):
            observation = replace(
                self.window(2.0 * tick, 60.0, 0.0, 40.0, [(1.0, 200)]),
                ready_replicas=current.replicas,
            )
            decision, state = decide(observation, policy, current, state, 2.0 * tick)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            decisions.append(decision)
        assert "so 2 for 63 rps" in decisions[-1].reason
        assert min(d.replicas for d in decisions) == 3
        down = next(d for d in decisions if d.replicas == 3)
        assert down.batch_size == 1
        assert decisions[-1].batch_size == 1
        assert (
            "a rough model gives back only what its slowest reading allows: if every batch up "
            "to the 1.0 measured took its 22 ms, 3 would carry 63 rps at batch ≤ 1"
        ) in down.reason
        assert (
            "not scaling down on a rough model: if every batch up to the 1.0 measured took its "
            "22 ms, 3 would carry 63 rps at batch ≤ 1"
        ) in decisions[-1].reason

    def test_where_the_slowest_reading_needs_more_the_limit_in_force_stays(self) -> None:
        # Three replicas at batch ≤ 4, 80 rps: the guess would give one back, the slowest
        # reading would want a fourth (at batch ≤ 1). The replicas stay, and so does the limit:
        # lowered to 1 it would carry less than it does.
        policy = replace(self.POLICY, scale_down_delay_s=10)
        current, state = InForce(3, 4, 0.002), State()
        for tick in range(8):
            observation = replace(
                self.window(2.0 * tick, 80.0, 0.0, 40.0, [(1.0, 200)]), ready_replicas=3
            )
            decision, state = decide(observation, policy, current, state, 2.0 * tick)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            assert (decision.replicas, decision.batch_size) == (3, 4), tick
        assert "so 2 for 84 rps" in decision.reason
        assert "4 would carry 84 rps at batch ≤ 1" in decision.reason

    def test_a_rough_model_without_its_measured_batch_never_scales_down(self) -> None:
        # A rough fit with no window's batch size kept beside it (one read back from a status
        # written before the anchor was): nothing says how slow a batch may be.
        policy = replace(self.POLICY, scale_down_delay_s=10)
        rough = LatencyFit(alpha_s=0.011, beta_s=0.011, confident=False)
        current, state = InForce(2, 1, 0.002), State(fit=rough)
        for tick in range(10):
            observation = replace(self.window(2.0 * tick, 20.0, 0.0, 40.0, []), ready_replicas=2)
            decision, state = decide(observation, policy, current, state, 2.0 * tick)
            current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            assert decision.replicas == 2, tick
        assert "not scaling down on a rough model" in decision.reason


class TestPacing:
    def test_scale_down_waits_for_the_stabilization_window(self) -> None:
        # Load fell to 50 rps on 3 replicas: one replica suffices, but only after 60 s of it.
        current, state = InForce(3, 8, 0.005), State(fit=MODEL, recommendations=((0.0, 3),))
        replicas = []
        for tick in range(1, 8):
            obs = seen(at=tick * TICK, qps=50, p99_ms=15, ready=current.replicas)
            decision, current, state = step(obs, current, state, tick * TICK)
            replicas.append(decision.replicas)
        # t=15,30,45: the window still holds the t=0 recommendation of 3 → stay at 3.
        # t=60: the t=0 entry is now the window's opening value (3) → still 3.
        # t=75: the window opens at t=15 (1) → every recommendation is 1 → down to 1.
        assert replicas == [3, 3, 3, 3, 1, 1, 1]

    def test_the_count_follows_the_windows_highest_recommendation_down(self) -> None:
        """As the HPA's: once the window's highest recommendation falls, the count follows at
        once, not a whole window after its last step. A load that fell from 3 replicas' worth
        to 1's read as 2's in its first window (the window still held some of the old load)."""
        current, state = InForce(3, 8, 0.005), State(fit=MODEL, recommendations=((0.0, 3),))
        replicas = []
        for tick, qps in enumerate([400, 50, 50, 50, 50, 50, 50, 50], start=1):
            obs = seen(at=tick * TICK, qps=qps, p99_ms=15, ready=current.replicas)
            decision, current, state = step(obs, current, state, tick * TICK)
            replicas.append(decision.replicas)
        # t=75: the window opens at t=15 (2) → down to 2; t=90: it opens at t=30 (1) → 1.
        # Started afresh at t=75, it would have waited until t=135 for the second step.
        assert replicas == [3, 3, 3, 3, 2, 1, 1, 1]

    @pytest.mark.parametrize(
        ("stepwise", "counts"),
        [(False, [3, 3, 3, 3, 2, 1, 1, 1]), (True, [3, 3, 3, 3, 2, 2, 2, 2])],
        ids=["budget-left", "budget-spent"],
    )
    def test_with_the_budget_spent_each_step_down_waits_a_window(
        self, stepwise: bool, counts: list[int]
    ) -> None:
        """The same fall as above, paced directly: where the error budget cannot pay for a
        miss, the replicas of each step stay a window more, for a load that comes back."""
        current, state = InForce(3, 8, 0.005), State(recommendations=((0.0, 3),))
        replicas = []
        for tick, want in enumerate([2, 1, 1, 1, 1, 1, 1, 1], start=1):
            paced = pace(
                want=want,
                current=current,
                ready=current.replicas,
                sla_met=True,
                policy=POLICY,
                state=state,
                now=tick * TICK,
                model=None,
                rate=50.0,
                batch=8,
                delay_s=0.005,
                overhead_s=0.0,
                stepwise=stepwise,
            )
            state = replace(state, recommendations=paced.recommendations)
            current = replace(current, replicas=paced.replicas)
            replicas.append(paced.replicas)
        assert replicas == counts

    def test_a_short_dip_does_not_scale_down(self) -> None:
        current, state = InForce(2, 8, 0.005), State(fit=MODEL)
        loads = [600, 600, 50, 50, 600, 600, 600, 600]
        for tick, qps in enumerate(loads):
            obs = seen(at=tick * TICK, qps=qps, p99_ms=30, ready=current.replicas, batch=8)
            decision, current, state = step(obs, current, state, tick * TICK)
            assert decision.replicas >= 2, tick

    def test_no_scale_down_while_ready_replicas_are_not_scraped(self) -> None:
        # 3 ready, 2 scraped: the rates miss a third of the load, so a plan from them would
        # remove a replica that carries it; scaling up still follows them
        policy = replace(POLICY, scale_down_delay_s=0)
        obs = replace(seen(at=0, qps=50, p99_ms=15, ready=3), reporting_replicas=2)
        decision, _ = decide(obs, policy, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas == 3
        assert "1 of 3 ready replicas not scraped" in decision.reason
        scraped = replace(obs, reporting_replicas=3)
        decision, _ = decide(scraped, policy, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas < 3
        busy = replace(seen(at=0, qps=1500, p99_ms=150, ready=3), reporting_replicas=2)
        decision, _ = decide(busy, policy, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas > 3

    def test_a_replica_scraped_twice_holds_everything_and_says_why(self) -> None:
        # Two scrape jobs on its pod: every rate counts its load twice, which would double the
        # replicas. Nothing is decided on it, and the status says what to fix.
        obs = replace(seen(at=0, qps=1500, p99_ms=150, ready=3), scrapes_per_replica=2)
        decision, _ = decide(obs, POLICY, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert (decision.replicas, decision.batch_size, decision.action) == (3, 8, "hold")
        assert decision.metrics_available is False
        assert "scrapes a replica 2 times" in decision.reason
        once = replace(obs, scrapes_per_replica=1)
        decision, _ = decide(once, POLICY, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas > 3

    def test_no_scale_down_while_prometheus_holds_part_of_the_window(self) -> None:
        # Prometheus restarted 20 s ago without its history: the 30 s window's rates are the
        # load of those 20 s (`answers`), the 10 s before them unseen, so no replica is removed
        # on them; more load than the replicas carry still scales up.
        policy = replace(POLICY, scale_down_delay_s=0)
        obs = replace(seen(at=0, qps=50, p99_ms=15, ready=3), covered_s=20)
        decision, _ = decide(obs, policy, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas == 3
        assert "Prometheus holds 20 s of the 30 s window" in decision.reason
        for covered in (27, 30, None):  # 27 s: 90 % of it, as good as whole
            whole = replace(obs, covered_s=covered)
            decision, _ = decide(whole, policy, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
            assert decision.replicas < 3, covered
        busy = replace(seen(at=0, qps=1500, p99_ms=150, ready=3), covered_s=20)
        decision, _ = decide(busy, policy, InForce(3, 8, 0.005), State(fit=MODEL), now=0)
        assert decision.replicas > 3

    def test_after_a_prometheus_restart_scale_down_waits_for_a_window_of_whole_windows(
        self,
    ) -> None:
        # 50 rps on 3 replicas, one carries it. Prometheus restarted at t=0 without its history:
        # it holds 15 s of the 30 s window at t=15, all of it from t=30. The window it held in
        # part recommends the 3 in force, so the 60 s of lower recommendations start at t=30.
        current = InForce(3, 8, 0.005)
        state = State(fit=MODEL, recommendations=((-600.0, 1),))
        replicas = []
        for tick, covered in enumerate((15.0, 30.0, 30.0, 30.0, 30.0, 30.0), start=1):
            obs = replace(seen(at=tick * TICK, qps=50, p99_ms=15, ready=3), covered_s=covered)
            decision, current, state = step(obs, current, state, tick * TICK)
            replicas.append(decision.replicas)
        assert replicas == [3, 3, 3, 3, 3, 1]

    def test_a_prometheus_outage_longer_than_the_delay_is_not_low_load(self) -> None:
        """Windows nobody saw recommend the replicas in force: after 6 blind minutes, one low
        window does not remove the replicas a low window before the outage asked to remove."""
        policy = replace(POLICY, scale_down_delay_s=300)
        current = InForce(3, 8, 0.005)
        state = State(fit=MODEL, recommendations=((-15.0, 3), (0.0, 1)))  # a dip at t=0
        replicas = []
        for tick in range(1, 25):  # t=15 … 360: Prometheus down
            decision, current, state = step(None, current, state, tick * TICK, policy)
            replicas.append(decision.replicas)
        assert set(replicas) == {3}
        assert max(t for t, _ in state.recommendations) == 360  # the blind windows are counted
        low = []
        for tick in range(25, 50):  # t=375 … 735: low load, seen
            obs = seen(at=tick * TICK, qps=50, p99_ms=15, ready=3)
            decision, current, state = step(obs, current, state, tick * TICK, policy)
            low.append(decision.replicas)
        # a whole delay of windows seen low, counted from the first of them (t=375)
        first_fewer = 25 + low.index(min(low))
        assert first_fewer * TICK >= 375 + 300, low
        assert min(low) < 3

    def test_a_window_missing_a_replicas_load_recommends_the_replicas_in_force(self) -> None:
        # 1 of 3 replicas unscraped for 6 minutes (the rates read two thirds of the load, a
        # count of 1), then one window scraped whole at low load: the count stays, where a
        # window of those partial recommendations would take it down to theirs.
        policy = replace(POLICY, scale_down_delay_s=300)
        current = InForce(3, 8, 0.005)
        state = State(fit=MODEL)
        for tick in range(1, 25):
            obs = replace(seen(at=tick * TICK, qps=50, p99_ms=15, ready=3), reporting_replicas=2)
            decision, current, state = step(obs, current, state, tick * TICK, policy)
            assert decision.replicas == 3
            assert "not scraped" in decision.reason
        obs = seen(at=25 * TICK, qps=50, p99_ms=15, ready=3)
        decision, current, state = step(obs, current, state, 25 * TICK, policy)
        assert decision.replicas == 3
        assert "waits for 300 s of low load" in decision.reason

    def test_no_scale_down_while_replicas_are_starting(self) -> None:
        state = State(fit=MODEL, recommendations=((0.0, 1),))
        obs = seen(at=120, qps=50, p99_ms=15, ready=2)
        decision, _ = decide(obs, POLICY, InForce(3, 8, 0.005), state, now=120)
        assert decision.replicas == 3
        assert "still starting" in decision.reason

    def test_never_below_min_or_above_max(self) -> None:
        obs = seen(at=0, qps=0, p99_ms=None, ready=1)
        decision, _ = decide(obs, POLICY, InForce(1, 8, 0.005), State(), now=0)
        assert decision.replicas == 1
        assert decision.sla_met is None  # no traffic: nothing to judge


class TestRetriedRefusals:
    """A storm refused on one replica: 470 rps served, 1,400 refused. Clients that retry send
    each refusal again, so part of what arrived was the same requests over again; the windows
    after the new replicas start show the demand itself."""

    POLICY = replace(POLICY, max_replicas=10)
    # (served, refused, ready: None for all in force) of each 15 s decision's window
    STORM = ((470, 1400, 1), (520, 900, 1), (560, 500, None), (600, 60, None))

    def replicas(self, then: float) -> list[int]:
        """The replicas decided, window by window, when `then` rps arrive after the storm with
        nothing refused."""
        return [replicas for replicas, _ in self.decisions(then)]

    def decisions(self, then: float) -> list[tuple[int, str]]:
        """(replicas, reason) of each decision."""
        current, state = InForce(1, 32, 0.005), State(fit=MODEL)
        windows = (*self.STORM, *((then, 0, None),) * 8)
        out = []
        for tick, (qps, refused, ready) in enumerate(windows):
            now = tick * TICK
            obs = seen(
                at=now,
                qps=qps,
                rejected=refused,
                p99_ms=95 if refused else 30,
                ready=ready or current.replicas,
                batch=16,
                utilization=0.9,
            )
            decision, current, state = step(obs, current, state, now, self.POLICY)
            out.append((decision.replicas, decision.reason))
            if tick == 0:
                assert state.refusing == ((0.0, 470),)  # the storm's recommendation, marked
        return out

    def test_once_the_demand_shows_what_the_storm_was_the_scale_down_goes_to_it(self) -> None:
        # 600 rps arrive with nothing refused: more than was served while refusing, so the
        # demand stayed and the rest of the storm was retries. The first scale-down goes to
        # what 600 rps need (2), not to what the storm's windows recommended (4).
        decisions = self.decisions(600)
        replicas = [r for r, _ in decisions]
        assert replicas[0] == 5  # the storm is planned for at once: a scale-up never waits
        assert replicas[5:] == [2] * 7
        said = [reason for _, reason in decisions if "rest of that load was retries" in reason]
        assert len(said) == 1
        assert "600 rps arrive with nothing refused, more than was served while refusing" in said[0]
        assert "recommendations made then count for no more than 2" in said[0]

    def test_where_the_traffic_fell_instead_the_storms_recommendations_stand(self) -> None:
        # 300 rps: less than was served while refusing. The traffic went away, which says
        # nothing of retries: the stabilization window keeps what was recommended then.
        replicas = self.replicas(300)
        assert replicas[5] == 4
        assert replicas[-1] == 1

    def test_a_window_not_clean_shows_nothing(self) -> None:
        history = [(0.0, 5), (15.0, 4)]
        marks = ((0.0, 470.0), (15.0, 520.0))
        assert verified(history, marks, want=2, clean_offered=None) == (history, marks)
        assert verified(history, marks, want=2, clean_offered=500) == (
            [(0.0, 2), (15.0, 4)],
            ((15.0, 520.0),),
        )
        assert verified(history, (), want=2, clean_offered=500) == (history, ())


class TestFeedbackWithoutAModel:
    def test_over_the_sla_without_compute_points_doubles_the_batch(self) -> None:
        obs = Observation(
            at=0,
            window_s=30,
            p99_s=0.3,
            p95_s=None,
            qps=100,
            rejected_qps=0,
            queue_p99_s=None,
            utilization=None,
            mean_batch=None,
            ready_replicas=1,
        )
        decision, _ = decide(obs, POLICY, InForce(1, 4, 0.005), State(), now=0)
        assert decision.batch_size == 8
        assert "feedback" in decision.reason


def test_state_survives_a_round_trip_through_the_resource() -> None:
    state = State(
        fit=MODEL,
        overhead_s=0.0125,
        recommendations=((10.0, 2), (25.0, 1)),
        changed_at=30.0,
        ready_changed_at=25.0,
        ready=2,
        rate=(30.0, 412.5),
        refused=35.0,
        estimates=((15.0, 400.0), (30.0, 450.0)),
        batch_first_at=28.0,
        refusing=((10.0, 470.0),),
    )
    assert State.from_dict(state.to_dict()) == state
    assert State.from_dict(state.to_dict(), now=30.0) == state
    assert State.from_dict({"fit": {"alphaMs": "x"}}) == State()
    assert State.from_dict(None) == State()


@pytest.mark.parametrize(
    "edit",
    [
        {"overheadMs": "NaN"},
        {"overheadMs": float("inf")},
        {"changedAt": "nan"},
        {"rate": [30.0, "inf"]},
        {"estimates": [[15.0, "nan"]]},
        {"refused": "nan"},
        {"coldStartS": float("nan")},
        {"recommendations": [[10.0, 2], ["nan", 4]]},
        {"recommendations": [[10.0, -3]]},
        {"ready": -1},
    ],
    ids=lambda edit: f"{next(iter(edit))}={next(iter(edit.values()))}",
)
def test_a_status_edited_to_numbers_no_decision_made_starts_afresh(edit: dict[str, Any]) -> None:
    """A NaN overhead was planned with (a replica carrying 0 rps: maxReplicas) and written back
    on every tick; an API server stores no NaN, but a status edited by hand may hold one, or a
    string `float` reads as one."""
    doc = {**State(fit=MODEL, overhead_s=0.01, changed_at=5.0).to_dict(), **edit}
    assert State.from_dict(doc, now=30.0) == State()


def test_times_written_ahead_of_the_clock_are_forgotten_beyond_the_skew() -> None:
    """A recommendation dated in the future held its replicas through every scale-down window
    until then; one a little ahead (another operator pod's clock) is kept."""
    ahead = 30.0 + CLOCK_SKEW_S
    state = State(
        fit=MODEL,
        recommendations=((10.0, 1), (ahead, 2), (9_999_999_999.0, 4)),
        refusing=((9_999_999_999.0, 400.0),),
        changed_at=9_999_999_999.0,
        pending_since=ahead + 1,
        rate=(9_999_999_999.0, 30.0),
        refused=12.0,  # the rate's window's: forgotten with it
        estimates=((9_999_999_999.0, 30.0), (15.0, 20.0)),
        batch_first_at=ahead,
        lost=Loss(2, 9_999_999_999.0),
    )
    read = State.from_dict(state.to_dict(), now=30.0)
    assert read == State(
        fit=MODEL,
        recommendations=((10.0, 1), (ahead, 2)),
        estimates=((15.0, 20.0),),
        batch_first_at=ahead,
    )


def test_a_history_or_ledger_edited_to_numbers_no_decision_made_is_forgotten() -> None:
    history = {"last": 3, "rps": [10.0, float("nan")]}
    assert RateHistory.from_dict(history) == RateHistory()
    ledger = SloLedger().record(0.0, True, covers_s=60).record(15.0, False, covers_s=60).to_dict()
    tier = ledger["fine"]
    ledger["fine"] = {**tier, "badS": [float("inf")] * len(tier["badS"])}
    assert SloLedger.from_dict(ledger) == SloLedger()


def test_batch_candidates() -> None:
    assert batch_candidates(32) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert batch_candidates(1) == [1]
    assert batch_candidates(10) == [1, 2, 3, 4, 6, 8, 10]
    # below the rows a request brings, every limit runs each request alone: left out
    four = replace(MODEL, rows_per_request=4.0)
    assert limits(four, 32) == [4, 6, 8, 12, 16, 24, 32]
    assert limits(replace(MODEL, rows_per_request=2.96), 8) == [3, 4, 6, 8]
    assert limits(four, 2) == [2]  # a ceiling below a request: the ceiling
    assert limits(MODEL, 32) == batch_candidates(32)


@pytest.mark.parametrize("qps", [50, 150, 300, 600, 900])
def test_the_plan_is_predicted_inside_the_sla(qps: float) -> None:
    obs = seen(at=0, qps=qps, p99_ms=50, ready=4, batch=4)
    decision, _ = decide(obs, POLICY, InForce(4, 4, 0.005), State(fit=MODEL), now=0)
    assert decision.predicted_p99_s is not None
    assert decision.predicted_p99_s <= 0.8 * POLICY.sla_p99_s


class TestDecisionsReadBackUnchanged:
    """A decision is written into the batching ConfigMap (milliseconds) and read back on the next
    tick: what comes back must be exactly what was decided, or every tick is a retune."""

    @given(
        sla_ms=st.integers(min_value=1, max_value=600_000),
        max_delay_ms=st.floats(min_value=0, max_value=10_000, allow_nan=False),
    )
    def test_the_queue_delay_survives_the_configmap(self, sla_ms: int, max_delay_ms: float) -> None:
        policy = replace(POLICY, sla_p99_s=sla_ms / 1e3, max_queue_delay_s=max_delay_ms / 1e3)
        obs = seen(at=0, qps=0, p99_ms=None, ready=1)  # idle: the plan keeps the batch
        decision, state = decide(obs, policy, InForce(1, 1, 0.005), State(fit=MODEL), now=0)
        document = batching_document(
            batch_size=decision.batch_size,
            max_queue_delay_ms=round(decision.max_queue_delay_s * 1e3, 3),
            deadline_ms=sla_ms,
        )
        recorded = batching_in({"data": {"batching.json": document}})
        assert recorded is not None
        in_force = InForce(
            decision.replicas, recorded.batch_size, recorded.max_queue_delay_ms / 1e3
        )
        assert in_force.max_queue_delay_s == decision.max_queue_delay_s
        again, _ = decide(replace(obs, at=TICK), policy, in_force, state, now=TICK)
        assert not again.changes(in_force), again.reason

    def test_a_100_ms_sla_no_longer_retunes_every_tick(self) -> None:
        # 0.1 x 0.1 s is 0.010000000000000002 s; read back from the ConfigMap it was 0.01 s
        decision, _ = decide(
            seen(at=0, qps=0, p99_ms=None, ready=1),
            replace(POLICY, max_queue_delay_s=0.05),
            InForce(1, 1, 0.005),
            State(fit=MODEL),
            now=0,
        )
        assert decision.max_queue_delay_s == 10.0 / 1e3


class TestFastSignal:
    def test_a_rise_the_short_window_sees_scales_out_before_the_window_shows_it(self) -> None:
        # 15 s into a step from 150 to 600 rps: the 30 s window shows 375, the last 10 s 600.
        state = State(fit=MODEL, rate=(0.0, 150.0))
        obs = replace(
            seen(at=TICK, qps=375, p99_ms=30, ready=1, batch=8),
            arrival_qps=375,
            recent_qps=600,
            recent_window_s=10,
        )
        decision, _ = decide(obs, POLICY, InForce(1, 8, 0.005), state, now=TICK)
        assert decision.replicas == 2  # 2 × 471 rps ≥ 600 × 1.05 at the best batch limit
        assert "rising: 600 rps over the last 10 s" in decision.reason

    def test_noise_in_the_short_window_is_not_a_rise(self) -> None:
        obs = replace(
            seen(at=TICK, qps=300, p99_ms=30, ready=1, batch=8),
            arrival_qps=300,
            recent_qps=315,  # 1.1 σ of Poisson noise over 10 s
            recent_window_s=10,
        )
        decision, _ = decide(obs, POLICY, InForce(1, 8, 0.005), State(fit=MODEL), now=TICK)
        assert "rising" not in decision.reason

    def test_a_fall_waits_for_the_window(self) -> None:
        obs = replace(
            seen(at=TICK, qps=600, p99_ms=30, ready=2, batch=8),
            arrival_qps=600,
            recent_qps=10,
            recent_window_s=10,
        )
        decision, _ = decide(obs, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=TICK)
        assert decision.replicas == 2


class TestTheRuntimesRateOfItsLastSeconds:
    """At the first scrape after a step the counter's rate between the last two scrapes
    averages the old rate with the new one; the runtime's gauge of its last 5 s has the new,
    and sizes the rise the counter shows."""

    def window(self, *, recent: float, now: float | None) -> Observation:
        # a step from 150 to 600 rps 5 s before the last scrape: the 15 s between the last
        # two scrapes read (10 × 150 + 5 × 600) / 15 = 300, the gauge 600
        return replace(
            seen(at=TICK, qps=175, p99_ms=30, ready=1, batch=8),
            arrival_qps=175,
            recent_qps=recent,
            recent_window_s=15,
            now_qps=now,
        )

    def test_a_step_the_gauge_sees_whole_plans_for_the_new_rate(self) -> None:
        obs = self.window(recent=300, now=600)
        assert present_load(obs, None) == (
            600,
            "; rising: 600 rps over the last 5 s",
        )
        decision, _ = decide(obs, POLICY, InForce(1, 8, 0.005), State(fit=MODEL), now=TICK)
        assert decision.replicas == 2
        # the counter's rate alone plans for the average
        alone, _ = decide(
            replace(obs, now_qps=None), POLICY, InForce(1, 8, 0.005), State(fit=MODEL), now=TICK
        )
        assert "rising: 300 rps over the last 15 s" in alone.reason
        assert alone.replicas == 1

    def test_its_noise_is_judged_over_its_own_span(self) -> None:
        # the counter shows a rise to 190; the gauge's 192 against 175 would be 5.0 σ of
        # Poisson noise over 15 s, over its 5 s it is 2.9 σ: the counter's rate stands
        obs = self.window(recent=190, now=192)
        assert present_load(obs, None) == (
            190,
            "; rising: 190 rps over the last 15 s",
        )

    def test_a_spike_the_counter_does_not_confirm_is_no_rise(self) -> None:
        # seconds of 600 rps inside a quarter-minute of the usual: gone before a replica comes
        obs = self.window(recent=176, now=600)
        assert present_load(obs, None) == (175, "")

    def test_a_fall_in_it_waits_for_the_window(self) -> None:
        obs = self.window(recent=175, now=20)
        assert present_load(obs, None) == (175, "")


class TestTrafficThatBeganInsideTheWindow:
    """Its rates average it with the silence before it; the devices' busy share does not."""

    CURRENT = InForce(1, 8, 0.005)  # a replica carries 8 / 20 ms = 400 rps at batch ≤ 8

    def window(
        self, *, served: float, arrived: float, busy: float, recent: float | None, ready: int = 1
    ) -> Observation:
        return replace(
            seen(at=TICK, qps=served, p99_ms=99, ready=ready, batch=8, utilization=busy),
            arrival_qps=arrived,
            recent_qps=recent,
            recent_window_s=None if recent is None else 15,
        )

    def test_the_busy_share_of_a_saturated_window_gives_the_load_since(self) -> None:
        # 1,000 rps for the last 15 s of the 60 s window: the replica served its 400 rps while
        # busy, a quarter of the window; 60 % refused. The window reads 250 rps arrived, 100
        # served; the last two scrapes straddle the start and read 600.
        obs = self.window(served=100, arrived=250, busy=0.25, recent=600)
        assert saturated_load(obs, settled=True) == pytest.approx(1000)
        decision, _ = decide(obs, POLICY, self.CURRENT, State(fit=MODEL), now=TICK)
        assert (
            "rising: 60% refused with the devices busy 25% of the window, about 1000 rps since"
            in decision.reason
        )
        assert decision.replicas == 3  # 395 rps each at batch ≤ 12, for 1,000 rps + 5 %
        # The rate between the scrapes alone plans fewer.
        straddled = replace(obs, arrival_qps=110)  # 9 % refused: under the busy share's bar
        decision, _ = decide(straddled, POLICY, self.CURRENT, State(fit=MODEL), now=TICK)
        assert "rising: 600 rps over the last 15 s" in decision.reason
        assert decision.replicas == 2

    def test_a_window_without_a_rise_is_its_own_rate(self) -> None:
        # Refusals the model cannot explain, the devices half busy all along: the guard's
        # business (`feedback`), not traffic that began inside the window.
        obs = self.window(served=175, arrived=250, busy=0.5, recent=None, ready=2)
        decision, _ = decide(obs, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=TICK)
        assert "rising" not in decision.reason

    def test_a_few_refusals_are_not_saturation(self) -> None:
        obs = self.window(served=240, arrived=250, busy=0.25, recent=600)  # 4 % refused
        assert saturated_load(obs, settled=True) is None

    def test_a_rise_across_decisions_reads_the_load_since_under_a_new_batch_limit(self) -> None:
        # Only the basic signals (no short window): the window's mean rose from 50 to 250 rps
        # since the decision before, which raised the batch limit 15 s ago and saw nothing
        # refused. The replica was ready all window long and the new limit refused too (150 rps
        # unserved now, so at least 600 a second of the last 15 s), so the devices were flat out
        # since the traffic began: the load since is 1,000 rps, where the trend (an unsettled
        # window's) and the window's mean would plan for 250.
        obs = self.window(served=100, arrived=250, busy=0.25, recent=None)
        before = State(fit=MODEL, rate=(0.0, 50.0), refused=0.0, ready=1, changed_at=0.0)
        decision, _ = decide(obs, POLICY, self.CURRENT, before, now=TICK)
        assert "about 1000 rps since" in decision.reason
        assert decision.replicas == 3
        # The same window with nothing before it to show a rise: its own rate.
        decision, _ = decide(obs, POLICY, self.CURRENT, replace(before, rate=None), now=TICK)
        assert "rising" not in decision.reason
        assert decision.replicas == 1
        # Its refusals all there a decision ago: the old limit's, and the new one may carry the
        # load with the devices idle part of the time — the busy share says nothing of it.
        decision, _ = decide(obs, POLICY, self.CURRENT, replace(before, refused=150.0), TICK)
        assert "about 1000 rps since" not in decision.reason

    def test_a_recent_rate_without_a_rise_overrules_the_mean(self) -> None:
        # The window's mean rose since the decision before (90 → 242 rps, 41 % refused, the
        # replica busy 35 %), but the rate between the last two scrapes is back at 90: a spike
        # since gone, not traffic that began and goes on.
        obs = self.window(served=142, arrived=242, busy=0.35, recent=90)
        decision, _ = decide(obs, POLICY, self.CURRENT, State(fit=MODEL, rate=(0.0, 90.0)), TICK)
        assert "rising" not in decision.reason
        assert decision.replicas == 1

    def test_a_decision_sooner_than_a_scrape_reads_a_scrape_of_growth(self) -> None:
        # 3 s after the decision that raised the limit, the window's unserved requests grew by
        # 2 a second: a scrape (15 s) of new samples, so the new limit refused some 8 a second
        # of 250 — not saturated. Over the 3 s gap they would read 40, over the 5 % bar.
        obs = self.window(served=100, arrived=250, busy=0.25, recent=None)
        before = State(fit=MODEL, rate=(0.0, 245.0), refused=148.0, ready=1, changed_at=0.0)
        assert not refused_lately(obs, before, 3.0)
        assert refused_lately(obs, replace(before, refused=140.0), 3.0)  # 10 a second: 40 of 250

    def test_a_window_of_other_replicas_says_nothing_of_the_present(self) -> None:
        # A second replica became ready since the last decision: it was idle before, which is
        # no silence of the traffic.
        obs = self.window(served=100, arrived=250, busy=0.25, recent=600, ready=2)
        decision, _ = decide(obs, POLICY, InForce(2, 8, 0.005), State(fit=MODEL, ready=1), TICK)
        assert "rising: 600 rps over the last 15 s" in decision.reason
        assert saturated_load(obs, settled=False) is None

    def test_the_busy_share_is_bounded_below(self) -> None:
        obs = self.window(served=1, arrived=10, busy=0.001, recent=600)
        assert saturated_load(obs, settled=True) == pytest.approx(10 / MIN_BUSY)


class TestLearnedColdStart:
    def test_the_time_new_replicas_take_is_learned_and_sets_the_horizon(self) -> None:
        current, state = InForce(1, 8, 0.005), State(fit=MODEL)
        loads = [600, 600, 600, 600, 600]
        readiness = [1, 1, 1, 2, 2]  # the second replica is ready at the fourth tick
        for tick, (qps, ready) in enumerate(zip(loads, readiness, strict=True)):
            obs = seen(at=tick * TICK, qps=qps, p99_ms=40, ready=ready, batch=8)
            _, current, state = step(obs, current, state, tick * TICK)
        assert current.replicas == 2
        assert state.pending_since is None
        # asked for at t = 0, seen ready at t = 45: 45 s less half an interval
        assert state.cold_start_s == pytest.approx(37.5)
        assert reaction_horizon(state, interval=TICK) == pytest.approx(2 * TICK + 37.5)

    def test_a_scale_up_blocked_for_an_hour_measures_nothing(self) -> None:
        # A GPU quota held the second replica back for an hour: that was no cold start, and the
        # horizon (hence the headroom) must not plan for an hour's rises once it cleared — nor
        # for the longest start, which counting it as that did.
        current = InForce(2, 8, 0.005)
        state = State(fit=MODEL, pending_since=0.0, ready=1, rate=(3600 - TICK, 600))
        obs = seen(at=3600, qps=600, p99_ms=40, ready=2, batch=8)
        _, _, state = step(obs, current, state, 3600)
        assert state.pending_since is None
        assert state.cold_start_s is None
        assert reaction_horizon(state, interval=TICK) < 2 * TICK + MAX_COLD_START_S

    def test_a_scale_down_before_the_new_replicas_start_measures_nothing(self) -> None:
        assert pending_since(None, asked=3, current=2, now=30) == 30
        assert pending_since(30, asked=4, current=3, now=45) == 30  # the first ask still waits
        assert pending_since(30, asked=3, current=3, now=60) == 30
        # The replicas removed may be the ones that never started: the ready count reaching the
        # lower number is no cold start.
        assert pending_since(30, asked=2, current=3, now=75) is None

    def test_until_measured_a_minute_is_assumed(self) -> None:
        horizon = reaction_horizon(State(), interval=0)
        assert horizon == 2 * DEFAULT_INTERVAL_S + DEFAULT_COLD_START_S

    def test_a_scale_up_seen_done_after_a_long_gap_measures_nothing(self) -> None:
        # Asked for, then the autopilot was off two hours (mode off, an operator down): the
        # replica became ready somewhere in the gap.
        current = InForce(2, 8, 0.005)
        state = State(fit=MODEL, pending_since=0.0, ready=1, cold_start_s=60.0, rate=(TICK, 600))
        obs = seen(at=7200, qps=600, p99_ms=40, ready=2, batch=8)
        _, _, state = step(obs, current, state, 7200)
        assert state.pending_since is None
        assert state.cold_start_s == 60.0

    def test_in_mode_recommend_nothing_asked_is_waited_for_and_the_windows_stay_settled(
        self,
    ) -> None:
        # More replicas and another batch limit recommended tick after tick, never applied: no
        # cold start of half an interval learned, no window taken for a change of settings.
        policy = replace(POLICY, acting=False)
        current = InForce(2, 8, 0.005)
        state = State(fit=MODEL, overhead_s=0.02, cold_start_s=120.0)
        for tick in range(12):
            now = 1000 + tick * TICK
            obs = seen(at=now, qps=1500, p99_ms=95, ready=2, batch=8, utilization=0.95)
            decision, state = decide(obs, policy, current, state, now)
            assert decision.replicas > 2
            assert state.pending_since is None
            assert state.changed_at is None
        assert state.cold_start_s == 120.0


class TestObjective:
    def test_every_window_judged_goes_into_the_books(self) -> None:
        current, state = InForce(2, 8, 0.005), State(fit=MODEL)
        p99s = [30, 30, 130, 130, 30]
        for tick, p99 in enumerate(p99s):
            obs = seen(at=tick * TICK, qps=300, p99_ms=p99, ready=2, batch=8)
            _, current, state = step(obs, current, state, tick * TICK)
        report = state.slo.report(4 * TICK)
        assert report.attainment == pytest.approx(0.5)  # two bad of four judged intervals

    def test_a_blind_tick_is_not_judged(self) -> None:
        state = State(fit=MODEL)
        _, state = decide(None, POLICY, InForce(1, 8, 0.005), state, now=0)
        assert state.slo.report(0).attainment is None
        assert state.slo.last_at == 0

    def test_a_window_prometheus_holds_part_of_is_judged_for_that_part(self) -> None:
        # Prometheus back 5 s ago without its history, after a blind tick: the verdict stands
        # for those 5 s, not for the 15 s since the last tick.
        _, state = decide(None, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=0)
        obs = replace(seen(at=TICK, qps=300, p99_ms=30, ready=2, batch=8), covered_s=5)
        _, state = decide(obs, POLICY, InForce(2, 8, 0.005), state, now=TICK)
        assert state.slo.fine is not None
        assert sum(state.slo.fine.judged) == 5

    def test_the_objective_comes_from_the_policy(self) -> None:
        policy = replace(POLICY, objective=Objective(0.95, 600))
        obs = seen(at=TICK, qps=300, p99_ms=30, ready=2, batch=8)
        _, state = decide(obs, policy, InForce(2, 8, 0.005), State(fit=MODEL), now=TICK)
        assert state.slo.objective == Objective(0.95, 600)


class TestHeadroomKeptTheCheaperWay:
    """A batch's time mostly fixed (30 + 0.5·b ms): P99 is near twice a batch's time at any load
    up to the knee, so keeping 20 % of the latency in reserve would halve the batch the SLA
    allows (32 → 16) and what a replica carries; keeping 20 % of the load costs 20 %."""

    FIXED = LatencyFit(alpha_s=0.030, beta_s=0.0005, confident=True)

    def carried(self, model: LatencyFit, batch: int) -> Carried | None:
        return replica_capacity(
            model, batch=batch, delay_s=0.005, overhead_s=0.0, target_s=0.080, sla_s=0.100
        )

    def test_a_fixed_cost_service_keeps_its_headroom_in_load(self) -> None:
        by_latency = self.carried(self.FIXED, 16)
        by_load = self.carried(self.FIXED, 32)
        assert by_latency is not None
        assert not by_latency.load_headroom
        assert by_load is not None
        assert by_load.load_headroom
        assert by_load.rate > 1.3 * by_latency.rate
        # What the load headroom promises: 25 % more still inside 95 ms, as the model sees it.
        loaded = predict(
            self.FIXED,
            rate=by_load.rate * LOAD_HEADROOM,
            replicas=1,
            max_batch=32,
            delay_s=0.005,
        )
        assert loaded.p99_s <= 0.095 + 1e-3
        policy = replace(POLICY, max_replicas=20, max_batch_size=64)
        window = replace(
            seen(at=0, qps=1000, p99_ms=80, ready=3, batch=16),
            compute=(ComputePoint(16, self.FIXED.batch_seconds(16), 1000),),
        )
        decision, _ = decide(
            window,
            policy,
            InForce(3, 16, 0.005),
            State(fit=self.FIXED, overhead_s=0.0),
            now=0,
        )
        assert decision.batch_size == 32
        assert "with 25% to spare inside 95 ms" in decision.reason

    def test_where_a_batch_grows_with_its_size_the_latency_headroom_stays(self) -> None:
        # t(b) = 4 + 2·b ms: the latency headroom costs a few per cent of the load.
        for batch in batch_candidates(32):
            carried = self.carried(MODEL, batch)
            assert carried is None or not carried.load_headroom
        decision, _ = decide(
            seen(at=0, qps=600, p99_ms=60, ready=2, batch=8),
            POLICY,
            InForce(2, 8, 0.005),
            State(fit=MODEL, overhead_s=0.0),
            now=0,
        )
        assert "inside 80 ms" in decision.reason

    def scale_down_to_2_of_3(self, rate: float) -> tuple[int, str | None]:
        """Pace a recommendation of 2 replicas, held all through the window, with 3 at batch 32
        in force, at `rate`."""
        policy = replace(POLICY, max_batch_size=64, max_replicas=20)
        paced = pace(
            want=2,
            current=InForce(3, 32, 0.005),
            ready=3,
            sla_met=True,
            policy=policy,
            state=State(fit=self.FIXED, recommendations=((0.0, 2),)),
            now=policy.scale_down_delay_s + TICK,
            model=self.FIXED,
            rate=rate,
            batch=32,
            delay_s=0.005,
            overhead_s=0.0,
        )
        return paced.replicas, paced.note

    def test_scale_down_keeps_the_headroom_the_plan_kept(self) -> None:
        # 900 rps on 2 replicas: each would carry 900 / 0.95 / 2 = 474 rps — over what batch 32
        # carries inside 80 ms (337), inside 95 ms with 25 % to spare (520).
        assert self.scale_down_to_2_of_3(900) == (2, None)
        # At 1,100 rps even the load headroom is gone: 3 stay.
        assert self.scale_down_to_2_of_3(1100) == (
            3,
            "fewer replicas would leave too little headroom",
        )

    def test_a_limit_whose_full_batches_break_the_sla_is_never_planned(self) -> None:
        # 2 · t(64) = 2 · 62 ms > 95 ms: only a backlog would fill such batches.
        assert self.carried(self.FIXED, 64) is None


class TestBurstAbsorber:
    def test_while_replicas_start_the_batch_limit_carries_the_most_then_relaxes(self) -> None:
        # 385 rps on one replica at batch 4: more are asked for (the plan keeps headroom: one
        # carries 395 rps inside 80 ms, and the plan is for 5 % more than the load); while they
        # start, the one that is ready runs the batch limit with the most capacity inside the
        # SLA, where it carries the load (12 rows: 398 rps).
        best = burst_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0)
        assert (
            sla_capacity(MODEL, max_batch=best, delay_s=0.005, overhead_s=0.0, target_s=0.1) > 385
        )
        obs = seen(at=TICK, qps=385, p99_ms=95, ready=1, batch=4)
        decision, current, state = step(obs, InForce(1, 4, 0.005), State(fit=MODEL), TICK)
        assert decision.replicas > 1
        assert decision.batch_size == best
        assert best > 4
        assert "(the most a replica carries inside the SLA) while" in decision.reason
        assert "replicas start" in decision.reason
        # they are ready: the plan's own choice again
        for tick in range(2, 10):
            obs = seen(at=tick * TICK, qps=385, p99_ms=40, ready=current.replicas, batch=8)
            decision, current, state = step(obs, current, state, tick * TICK)
        assert "replicas start" not in decision.reason

    def test_a_load_beyond_the_ready_replicas_runs_the_limit_full_batches_carry_most(
        self,
    ) -> None:
        # At maxReplicas (4), all ready, 4,000 rps offered and 1,200 of it refused: far beyond
        # what they carry inside the SLA at any limit. Their queues are never empty, the
        # runtime refuses what would finish late, and what they answer in time is what full
        # batches carry: t(b) = 10 + 1·b ms behind 5 ms, 32 rows (762 rps a replica at full
        # batches, 5 + 2 · 42 ms) where the plan and `burst_batch` keep the 24 in force (706).
        mid = LatencyFit(alpha_s=0.010, beta_s=0.001, confident=True)
        assert burst_batch(mid, POLICY, delay_s=0.005, overhead_s=0.005, in_force=24) == 24
        beyond, most = saturated_batch(mid, POLICY, delay_s=0.005, overhead_s=0.005, in_force=24)
        assert beyond == 32
        assert most == sla_capacity(
            mid, max_batch=32, delay_s=0.005, overhead_s=0.005, target_s=0.1
        )
        obs = replace(
            seen(at=TICK, qps=2800, rejected=1200, p99_ms=130, ready=4, batch=24),
            compute=(ComputePoint(24, mid.batch_seconds(24), 1000),),
        )
        state = State(fit=mid, overhead_s=0.005)
        decision, _ = decide(obs, POLICY, InForce(4, 24, 0.005), state, TICK)
        assert (decision.replicas, decision.batch_size) == (4, 32)
        assert "(the most full batches carry in time: 4000 rps is far beyond the" in decision.reason
        assert "4 replicas carry inside the SLA at any limit) while over the SLA" in decision.reason

    def test_near_the_ceiling_the_burst_limit_stays(self) -> None:
        # 1,800 rps on 4 replicas that carry 1,640 inside the SLA at any limit, 10 % refused:
        # beyond, but not by a quarter — a smaller limit's shorter batches still win windows.
        assert BEYOND * 4 * saturated_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0)[1] > 1800
        obs = seen(at=TICK, qps=1620, rejected=180, p99_ms=120, ready=4, batch=12)
        decision, _ = decide(obs, POLICY, InForce(4, 12, 0.005), State(fit=MODEL), TICK)
        assert decision.batch_size == 12
        assert "full batches" not in decision.reason

    def test_below_the_ceiling_replicas_on_the_way_keep_the_burst_limit(self) -> None:
        # 900 rps offered to one replica, 400 of it refused, two more asked for: they bring
        # the SLA back, and until then the ready one runs `burst_batch`'s limit.
        obs = seen(at=TICK, qps=500, rejected=400, p99_ms=95, ready=1, batch=4)
        decision, _, _ = step(obs, InForce(1, 4, 0.005), State(fit=MODEL), TICK)
        assert 1 < decision.replicas < POLICY.max_replicas
        assert decision.batch_size == burst_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0)

    def test_a_rough_model_keeps_the_burst_limit(self) -> None:
        rough = replace(MODEL, confident=False)
        obs = seen(at=TICK, qps=1700, rejected=800, p99_ms=130, ready=4, batch=12)
        decision, _ = decide(obs, POLICY, InForce(4, 12, 0.005), State(fit=rough), TICK)
        assert "full batches" not in decision.reason

    def test_beyond_only_where_the_window_refused(self) -> None:
        # The same load without refusals (a rate read high, arrivals uneven): not beyond; the
        # limit with the most capacity inside the SLA, kept where it is within a tenth of it.
        obs = seen(at=TICK, qps=2500, p99_ms=130, ready=4, batch=12)
        decision, _ = decide(obs, POLICY, InForce(4, 12, 0.005), State(fit=MODEL), TICK)
        assert decision.batch_size == 12
        assert "full batches" not in decision.reason
        # nor with a twentieth refused: a load truly a quarter beyond leaves a tenth or more
        # unanswered (t(b) = 10 + 1·b ms behind 5 ms at 24 rows, 4,000 rps offered)
        mid = LatencyFit(alpha_s=0.010, beta_s=0.001, confident=True)
        for refused, beyond in ((200, False), (480, True)):
            obs = replace(
                seen(at=TICK, qps=4000 - refused, rejected=refused, p99_ms=130, ready=4, batch=24),
                compute=(ComputePoint(24, mid.batch_seconds(24), 1000),),
            )
            state = State(fit=mid, overhead_s=0.005)
            decision, _ = decide(obs, POLICY, InForce(4, 24, 0.005), state, TICK)
            assert ("full batches" in decision.reason) is beyond, refused
            assert decision.batch_size == (32 if beyond else 24)

    def test_back_below_the_ceiling_the_saturated_limit_stays(self) -> None:
        # The load falls back under what the replicas carry: the limit taken beyond the ceiling
        # carries within 3 % of the most inside the SLA, so `burst_batch` keeps it (no retune).
        obs = seen(at=TICK, qps=1200, p99_ms=130, ready=4, batch=16)
        decision, _ = decide(obs, POLICY, InForce(4, 16, 0.005), State(fit=MODEL), TICK)
        assert decision.batch_size == 16

    def test_the_saturated_limit_leaves_out_batches_that_alone_break_the_sla(self) -> None:
        # t(b) = 30 + 0.5·b ms: 64 rows carry the most at full batches (1,032 rps) but take 62
        # ms — one in flight and then one's own is 124 ms; 32 rows (46 ms, 92 ms) fit.
        fixed = LatencyFit(alpha_s=0.030, beta_s=0.0005, confident=True)
        policy = replace(POLICY, max_batch_size=64)
        assert saturated_batch(fixed, policy, delay_s=0.005, overhead_s=0.0)[0] == 32
        # 40 ms outside the batcher leaves 60 ms for two batches: no limit above 1 fits
        assert saturated_batch(fixed, policy, delay_s=0.005, overhead_s=0.040)[0] == 1

    def test_limits_that_carry_less_inside_the_sla_are_not_taken_for_their_full_batches(
        self,
    ) -> None:
        # t(b) = 1 + 8·b ms behind 20 ms, batch times varying by 40 %: 4 rows carry the most at
        # full batches (121 rps), but a batch's tail breaks the SLA long before — 63 rps
        # inside it against 1 row's 75. Beyond the ceiling: 2 rows, 73 rps inside the SLA
        # (within 3 % of the most) and 118 at full batches.
        varied = LatencyFit(alpha_s=0.001, beta_s=0.008, confident=True, batch_cv=0.4)
        inside = {
            b: sla_capacity(varied, max_batch=b, delay_s=0.005, overhead_s=0.020, target_s=0.1)
            for b in (1, 2, 4)
        }
        assert inside[4] < 0.9 * inside[1]
        assert varied.capacity(4) > varied.capacity(2) > varied.capacity(1)
        assert saturated_batch(varied, POLICY, delay_s=0.005, overhead_s=0.020) == (2, inside[1])

    def test_a_limit_in_force_within_a_few_per_cent_of_the_best_stays(self) -> None:
        # 4 + 2·b ms: at full batches 16 rows carry 3.7 % more than 12 (both within 3 % of the
        # most inside the SLA), 11 % more than 8: 12 stays, 8 gives way
        assert saturated_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0, in_force=12)[0] == 12
        assert saturated_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0, in_force=8)[0] == 16
        # from a limit that carries a tenth less inside the SLA than the most: the best
        assert saturated_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0, in_force=4)[0] == 16


class TestRecurringBursts:
    def test_idle_minutes_between_recurring_bursts_keep_the_burst_replicas(self) -> None:
        # 10-minute cycles: 3 minutes at 900 rps, then 7 idle. After two bursts the pattern is
        # learned; long after the scale-down delay of the third quiet, replicas stay.
        current, state = InForce(1, 8, 0.005), State(fit=MODEL)
        replicas_in_quiet = []
        for tick in range(120):
            now = tick * TICK
            busy = (tick % 40) < 12
            qps = 900.0 if busy else 0.0
            obs = seen(at=now, qps=qps, p99_ms=40 if busy else None, ready=current.replicas)
            obs = replace(obs, arrival_qps=qps, mean_batch=8 if busy else None)
            decision, current, state = step(obs, current, state, now)
            if tick >= 80 and not busy:
                replicas_in_quiet.append(decision.replicas)
        assert min(replicas_in_quiet) >= 2
        assert "times in the last hour within" in decision.reason

    def test_a_single_burst_is_let_go_after_the_delay(self) -> None:
        current, state = InForce(1, 8, 0.005), State(fit=MODEL)
        for tick in range(60):
            now = tick * TICK
            busy = 4 <= tick < 16
            qps = 900.0 if busy else 0.0
            obs = seen(at=now, qps=qps, p99_ms=40 if busy else None, ready=current.replicas)
            obs = replace(obs, arrival_qps=qps, mean_batch=8 if busy else None)
            decision, current, state = step(obs, current, state, now)
        assert decision.replicas == 1

    def test_over_the_sla_the_batch_limit_is_not_lowered(self) -> None:
        # All replicas ready, but the window was over the SLA: the plan would relax the batch
        # limit to its own choice; over the SLA, the limit with the most capacity stays.
        best = burst_batch(MODEL, POLICY, delay_s=0.005, overhead_s=0.0)
        obs = seen(at=TICK, qps=900, p99_ms=130, ready=3, batch=best)
        decision, _ = decide(obs, POLICY, InForce(3, best, 0.005), State(fit=MODEL), TICK)
        assert decision.batch_size == best

    def test_just_back_inside_the_sla_a_raised_limit_stays_until_clearly_inside(self) -> None:
        # A replica at its edge: just inside the SLA (P99 near it, or a few requests still
        # refused), where the verdict flips from window to window. A batch limit above the plan's
        # (raised while over the SLA) is not lowered on such a window — each flip would push new
        # settings to every pod — but on a clear one.
        current = InForce(3, 32, 0.005)
        for p99_ms, rejected in ((96, 0.0), (60, 4.0)):
            obs = seen(at=TICK, qps=500, p99_ms=p99_ms, ready=3, batch=8, rejected=rejected)
            decision, _ = decide(obs, POLICY, current, State(fit=MODEL), TICK)
            assert decision.sla_met is True
            assert decision.batch_size == 32, (p99_ms, rejected)
            assert "clearly inside" in decision.reason
        clearly = seen(at=TICK, qps=500, p99_ms=50, ready=3, batch=8)
        decision, _ = decide(clearly, POLICY, current, State(fit=MODEL), TICK)
        assert decision.batch_size < 32


class TestInputsAtTheEdges:
    """Inputs no healthy loop produces, which must still give a decision, never an exception:
    one raised every tick leaves the service with none at all."""

    def test_a_clock_that_stepped_back_is_a_decision(self) -> None:
        # the window's rate was stored at t = 1000; the next tick's clock reads 995 (an NTP step,
        # a new leader whose clock lags): no trend to read, no error
        obs = seen(at=995, qps=100, p99_ms=50, ready=2, batch=4)
        state = State(fit=MODEL, rate=(1000.0, 100.0))
        decision, _ = decide(obs, POLICY, InForce(2, 4, 0.005), state, now=995)
        assert decision.replicas >= 1

    def test_requests_of_several_rows_with_no_limit_inside_the_sla_get_a_best_effort(
        self,
    ) -> None:
        # t(b) = 30 + 1·b ms, 4 rows a request, SLA 50 ms: the smallest limit a request fits in
        # (4 rows: 34 ms a batch, one in flight then one's own is 68 ms) already breaks the SLA
        policy = replace(POLICY, sla_p99_s=0.05, max_replicas=8, max_batch_size=8)
        obs = Observation(
            at=0.0,
            window_s=60.0,
            p99_s=0.120,
            p95_s=0.1,
            qps=50.0,
            rejected_qps=20.0,
            queue_p99_s=0.05,
            utilization=1.0,
            mean_batch=4.0,
            compute=(ComputePoint(4.0, 0.034, 3000), ComputePoint(8.0, 0.038, 300)),
            rows_per_request=4.0,
            ready_replicas=2,
        )
        decision, _ = decide(obs, policy, InForce(2, 4, 0.005), State(), now=0.0)
        assert decision.replicas == 8  # the best effort at maxReplicas
        assert decision.batch_size == 4  # a request alone, not "batch ≤ 1"
        assert decision.scaling_limited is not None

    def test_a_stored_fit_with_no_fixed_cost_is_planned_with(self) -> None:
        # a rough fit whose α rounded to 0 ms in the status: its optimistic reading is itself
        state = State.from_dict(State(fit=LatencyFit(4e-8, 2e-3, False)).to_dict())
        assert state.fit is not None
        assert state.fit.alpha_s == 0.0
        obs = replace(seen(at=0, qps=5000, p99_ms=50, ready=1), compute=(), mean_batch=None)
        decision, _ = decide(obs, replace(POLICY, max_replicas=8), InForce(1, 1, 0.005), state, 0)
        assert decision.action in ("scale-up", "retune")

    @pytest.mark.parametrize(
        "fit",
        [
            {"alphaMs": 0.0, "betaMs": 0.0, "confident": True},
            {"alphaMs": -1.0, "betaMs": 2.0, "confident": True},
            {"alphaMs": "nan", "betaMs": 2.0, "confident": True},
            {"alphaMs": 4.0, "betaMs": "inf", "confident": False},
        ],
    )
    def test_a_stored_fit_no_batch_time_comes_from_is_learned_again(
        self, fit: dict[str, object]
    ) -> None:
        doc = State(fit=MODEL).to_dict()
        assert State.from_dict(doc).fit == MODEL
        assert State.from_dict({**doc, "fit": fit}).fit is None


class TestADeviceOutOfMemory:
    """A replica whose device ran out of memory for a batch forms none as large again: the
    plan keeps to what runs."""

    def test_the_plan_keeps_the_batch_within_the_memory_and_adds_replicas_for_it(self) -> None:
        # 700 rps: batch 32 carries it on two replicas (471 rps each); batch 4 (333 rps each)
        # takes three.
        base = seen(at=0, qps=470, rejected=230, p99_ms=900, ready=1, batch=32, utilization=1.0)
        free, _ = decide(base, POLICY, InForce(1, 32, 0.005), State(fit=MODEL), now=0)
        short = replace(base, memory_rows=4)
        limited, _ = decide(short, POLICY, InForce(1, 32, 0.005), State(fit=MODEL), now=0)
        assert free.batch_size > 4
        assert limited.batch_size <= 4
        assert limited.replicas > free.replicas

    def test_memory_above_the_limit_changes_nothing(self) -> None:
        base = seen(at=0, qps=300, p99_ms=40, ready=2, batch=8)
        free, _ = decide(base, POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=0)
        roomy, _ = decide(
            replace(base, memory_rows=64), POLICY, InForce(2, 8, 0.005), State(fit=MODEL), now=0
        )
        assert (roomy.replicas, roomy.batch_size) == (free.replicas, free.batch_size)


class TestSpecEdits:
    """What an edit of the spec leaves of the memory: a new model's batch times are its own, and
    a looser SLA is not held to the misses of the tighter one."""

    NEW = LatencyFit(alpha_s=0.004, beta_s=0.008, confident=True)  # four times slower per row

    def new_model_window(self, at: float, batch: int) -> Observation:
        """Full batches of `batch` rows, timed by the new model, whose pods timed batches of 1
        and 32 rows at start-up."""
        startup = (
            ComputePoint(1, self.NEW.batch_seconds(1), 5),
            ComputePoint(32, self.NEW.batch_seconds(32), 5),
        )
        return replace(
            seen(at=at, qps=900, p99_ms=140, ready=4, batch=batch, utilization=0.9),
            compute=(ComputePoint(batch, self.NEW.batch_seconds(batch), 1000),),
            startup=startup,
        )

    def test_a_new_model_is_timed_afresh(self) -> None:
        policy = replace(POLICY, sla_p99_s=0.150, max_replicas=12, serving="v2")
        state = State(fit=MODEL, overhead_s=0.010, cold_start_s=60.0, serving="v1")
        decision, state = decide(
            self.new_model_window(1000, 16), policy, InForce(4, 16, 0.005), state, 1000
        )
        assert state.serving == "v2"
        assert state.fit is not None
        # the new pods' start-up timings, not the old model's slope
        assert state.fit.beta_s == pytest.approx(self.NEW.beta_s, rel=0.1)
        assert state.fit.alpha_s == pytest.approx(self.NEW.alpha_s, abs=0.002)
        assert "the model or what runs it changed" in decision.reason
        assert state.cold_start_s == 60.0  # the pods' start, not the model's batch times

    def test_the_same_model_keeps_what_was_learned(self) -> None:
        policy = replace(POLICY, sla_p99_s=0.150, max_replicas=12, serving="v1")
        state = State(fit=MODEL, overhead_s=0.010, cold_start_s=60.0, serving="v1")
        decision, state = decide(
            self.new_model_window(1000, 16), policy, InForce(4, 16, 0.005), state, 1000
        )
        # one batch size a window: the slope kept, the new time read into the fixed part
        assert state.fit is not None
        assert state.fit.beta_s == pytest.approx(MODEL.beta_s)
        assert "changed" not in decision.reason

    def loosened(self, ceiling: Ceiling | None, *, sla_s: float | None) -> tuple[Decision, State]:
        """30 ticks at 560 rps, P99 45 ms, under a 200 ms SLA; the memory's SLA `sla_s`."""
        policy = replace(POLICY, sla_p99_s=0.200)
        state = State(fit=MODEL, overhead_s=0.01, cold_start_s=60.0, ceiling=ceiling, sla_s=sla_s)
        current = InForce(4, 8, 0.005)
        for tick in range(30):
            now = 1000 + tick * TICK
            obs = seen(at=now, qps=560, p99_ms=45, ready=current.replicas, batch=8)
            decision, current, state = step(obs, current, state, now, policy)
        return decision, state

    def test_a_looser_sla_drops_the_ceiling_the_tighter_one_found(self) -> None:
        # The guard found, 5 minutes before, that 4 replicas at 150 rps each missed 40 ms.
        ceiling = Ceiling(at=700.0, replicas=4, rps_per_replica=150.0)
        free, _ = self.loosened(None, sla_s=None)
        decision, state = self.loosened(ceiling, sla_s=0.040)
        assert state.ceiling is None
        assert decision.replicas == free.replicas < 4
        # Not recorded (a status from before the SLA was): the ceiling stands, as it did.
        held, _ = self.loosened(ceiling, sla_s=None)
        assert held.replicas >= 4

    def test_a_tighter_sla_keeps_the_ceiling(self) -> None:
        ceiling = Ceiling(at=700.0, replicas=4, rps_per_replica=150.0)
        state, edited = unlearned(
            State(ceiling=ceiling, sla_s=0.200), replace(POLICY, sla_p99_s=0.040)
        )
        assert state.ceiling == ceiling
        assert state.sla_s == 0.040
        assert edited == ""

    def test_a_looser_sla_starts_the_objectives_books_afresh_a_tighter_keeps_them(self) -> None:
        missed = SloLedger().record(0.0, None, covers_s=60).record(60.0, False, covers_s=60)
        state = State(slo=missed, sla_s=0.040)
        looser, said = unlearned(state, replace(POLICY, sla_p99_s=0.200))
        assert looser.slo.report(60.0) != missed.report(60.0)
        assert looser.slo.last_at == missed.last_at
        assert "the objective's books start afresh" in said
        tighter, _ = unlearned(replace(state, sla_s=0.400), replace(POLICY, sla_p99_s=0.200))
        assert tighter.slo == missed

    def test_what_it_was_learned_for_is_kept_in_status(self) -> None:
        state = State(serving="ab12", sla_s=0.1)
        assert State.from_dict(state.to_dict()) == state


class TestEveryRequestRefused:
    """A window whose every request was refused measured no latency: it missed the SLA whole,
    not a window of missing metrics (held, it held for as long as the pods refused)."""

    def refused(self, *, ready: int) -> Observation:
        return replace(
            seen(at=0, qps=0.0, p99_ms=None, ready=ready, rejected=2.0),
            arrival_qps=2.0,
            compute=(),
        )

    def test_is_a_miss_and_asks_a_replica_more(self) -> None:
        decision, state = decide(self.refused(ready=1), POLICY, InForce(1, 8, 0.005), State(), 0)
        assert decision.metrics_available
        assert decision.sla_met is False
        assert decision.replicas == 2
        assert "every request refused" in decision.reason
        later = replace(self.refused(ready=2), at=TICK)
        _, state = decide(later, POLICY, InForce(2, 8, 0.005), state, TICK)
        assert state.slo.report(TICK).attainment == 0.0  # the books count them, as missed

    def test_waits_for_the_replicas_asked_for(self) -> None:
        decision, _ = decide(self.refused(ready=1), POLICY, InForce(2, 8, 0.005), State(), 0)
        assert decision.replicas == 2

    def test_at_max_replicas_says_so(self) -> None:
        decision, _ = decide(self.refused(ready=4), POLICY, InForce(4, 8, 0.005), State(), 0)
        assert decision.replicas == 4
        assert decision.scaling_limited is not None

    def test_where_the_ready_replicas_carry_the_load_it_adds_none(self) -> None:
        # 2 rps against replicas that carry hundreds: they refuse for a reason of their own,
        # which replicas up to maxReplicas would not change.
        decision, _ = decide(
            self.refused(ready=1),
            POLICY,
            InForce(1, 8, 0.005),
            State(fit=MODEL),
            0,
        )
        assert decision.replicas == 1
        assert decision.sla_met is False
        assert "a reason of their own" in decision.reason


class TestTheDeadlineCountsThePreprocessOnce:
    """The pods' deadline counts from a request's arrival, its preprocess inside: of the time
    outside the batcher the autopilot learns, only what lies outside that clock comes off the
    SLA (a 220 ms preprocess under a 400 ms SLA made a 200 ms deadline: every request refused,
    on an idle replica)."""

    def test_the_time_before_the_batcher_is_learned_and_left_on_the_deadline(self) -> None:
        window = replace(seen(at=0, qps=2, p99_ms=262, ready=1), outside_s=0.226, before_s=0.220)
        state = learn(window, POLICY, InForce(1, 8, 0.005), State(), 0.0).state
        assert state.before_s == pytest.approx(0.220)
        assert state.overhead_s is not None
        outside = state.outside_deadline_s
        assert outside is not None
        assert outside == pytest.approx(max(0.0, state.overhead_s - 0.220))
        assert default_deadline_ms(sla_ms=400, outside_s=outside) >= 390
        # it travels in the status, for the reconciler's deadline too
        again = State.from_dict(state.to_dict())
        assert again.before_s == pytest.approx(0.220)
        assert learned_outside_s({"autopilot": state.to_dict()}) == pytest.approx(outside)

    def test_runtimes_that_do_not_count_it_keep_the_whole_overhead(self) -> None:
        window = replace(seen(at=0, qps=2, p99_ms=262, ready=1), outside_s=0.226)
        state = learn(window, POLICY, InForce(1, 8, 0.005), State(), 0.0).state
        assert state.before_s is None
        assert state.outside_deadline_s == state.overhead_s
