"""`decide` over readings no service should produce, and policies the CRD would refuse: whatever
an observation holds (NaN, infinities, negative or absurdly large numbers, absent signals) and
however the decisions chain, a decision comes back — never an exception, which would leave the
service without one every interval — inside the policy's bounds, without a number that cannot
be in its reason, and with a memory the status's JSON can carry. A window it cannot read is a
hold, never fewer replicas.

Generated (hypothesis, derandomized: the same cases every run)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import ComputePoint, Observation, PodCompute
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.state import State

ODD = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-12, 1e12])


def reading(low: float, high: float) -> st.SearchStrategy[float | None]:
    """A signal: mostly plausible, sometimes absent or a value no signal can have."""
    plausible = st.floats(min_value=low, max_value=high, allow_nan=False)
    return st.one_of(plausible, plausible, plausible, st.none(), ODD)


@st.composite
def observations(draw: Any, *, at: float, ready: int) -> Observation | None:
    if draw(st.integers(0, 19)) == 0:
        return None  # Prometheus did not answer
    sizes = draw(st.lists(st.integers(1, 64), max_size=4, unique=True))
    compute = tuple(
        ComputePoint(b, draw(reading(1e-4, 0.5)) or 0.01, draw(reading(0, 1e4)) or 0.0)
        for b in sorted(sizes)
    )
    pods = tuple(
        PodCompute(f"pod-{i}", draw(reading(1, 64)) or 1.0, draw(reading(1e-4, 0.5)) or 0.01, 50)
        for i in range(draw(st.integers(0, 4)))
    )
    return Observation(
        at=at - draw(st.floats(0, 20)),
        window_s=draw(st.sampled_from([15.0, 60.0, 300.0])),
        p99_s=draw(reading(1e-3, 3)),
        p95_s=draw(reading(1e-3, 2)),
        qps=draw(reading(0, 3000)),
        rejected_qps=draw(reading(0, 1000)),
        queue_p99_s=draw(reading(0, 2)),
        utilization=draw(reading(0, 1)),
        mean_batch=draw(reading(1, 64)),
        compute=compute,
        rows_per_request=draw(st.one_of(st.none(), reading(1, 8))),
        outside_s=draw(st.one_of(st.none(), reading(0, 0.05))),
        ready_replicas=draw(st.one_of(st.just(ready), st.none(), st.just(-1))),
        covered_s=draw(st.one_of(st.none(), reading(1, 300))),
        reporting_replicas=draw(st.one_of(st.none(), st.integers(0, ready))),
        arrival_qps=draw(st.one_of(st.none(), reading(0, 4000))),
        arrival_dispersion=draw(st.one_of(st.none(), reading(0.1, 5))),
        batch_time_cv=draw(st.one_of(st.none(), reading(0, 1))),
        retried_qps=draw(st.one_of(st.none(), reading(0, 100))),
        withdrawn_qps=draw(st.one_of(st.none(), reading(0, 100))),
        recent_qps=draw(st.one_of(st.none(), reading(0, 5000))),
        recent_window_s=draw(st.sampled_from([None, 5.0, 15.0])),
        pods=pods,
    )


@st.composite
def policies(draw: Any) -> Policy:
    low = draw(st.integers(0, 3))  # 0: below the CRD's minimum
    return Policy(
        sla_p99_s=draw(st.sampled_from([0.01, 0.1, 0.5, 2.0])),
        min_utilization=draw(st.floats(0, 0.9)),
        min_replicas=low,
        max_replicas=draw(st.integers(max(low, 1), 40)),
        max_batch_size=draw(st.sampled_from([1, 4, 32, 64])),
        scale_down_delay_s=draw(st.sampled_from([0.0, 60.0, 300.0])),
        max_queue_delay_s=draw(st.sampled_from([0.0, 0.005, 0.05])),
    )


NUMBER_THAT_CANNOT_BE = ("nan", "inf")


@settings(
    derandomize=True,
    database=None,  # the same cases every run, none replayed from an earlier one
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(policy=policies(), data=st.data())
def test_any_reading_gets_a_decision_within_bounds_and_a_memory_json_carries(
    policy: Policy, data: st.DataObject
) -> None:
    high = max(policy.max_replicas, 1)
    current = InForce(
        replicas=data.draw(st.integers(policy.min_replicas, high)),
        batch_size=data.draw(st.integers(1, policy.max_batch_size)),
        max_queue_delay_s=policy.max_queue_delay_s,
    )
    state, now = State(), 1.7e9
    for _ in range(data.draw(st.integers(1, 8))):
        now += 15
        seen = data.draw(observations(at=now, ready=current.replicas))
        decision, state = decide(seen, policy, current, state, now)

        assert max(policy.min_replicas, 1) <= decision.replicas <= high, decision.reason
        assert 1 <= decision.batch_size <= max(policy.max_batch_size, current.batch_size)
        assert math.isfinite(decision.max_queue_delay_s)
        assert decision.max_queue_delay_s >= 0
        assert decision.reason
        words = decision.reason.lower().replace("%", " ").split()
        assert not [w for w in words if w in NUMBER_THAT_CANNOT_BE], decision.reason
        if not decision.metrics_available:
            assert decision.replicas >= current.replicas, decision.reason
        memory = json.dumps(state.to_dict(), allow_nan=False)  # raises on NaN or infinity
        assert State.from_dict(json.loads(memory)).to_dict() == state.to_dict()

        current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)


def test_a_reading_that_cannot_be_is_missing() -> None:
    seen = Observation(
        at=0, window_s=60, p99_s=math.nan, p95_s=0.05, qps=-3.0, rejected_qps=math.inf,
        queue_p99_s=0.01, utilization=math.nan, mean_batch=4.0, ready_replicas=-1,
        compute=(ComputePoint(4, math.nan, 10), ComputePoint(8, 0.02, 10)),
        pods=(PodCompute("a", 4, 0.01, -5), PodCompute("b", 4, 0.01, 5)),
    )  # fmt: skip
    assert (seen.p99_s, seen.qps, seen.rejected_qps, seen.utilization) == (None,) * 4
    assert seen.ready_replicas is None
    assert (seen.p95_s, seen.mean_batch) == (0.05, 4.0)
    assert seen.compute == (ComputePoint(8, 0.02, 10),)
    assert [pod.pod for pod in seen.pods] == ["b"]
    assert seen.missing() == ["request rate", "P99 latency", "ready replicas"]


def test_a_policy_below_one_replica_keeps_one() -> None:
    policy = Policy(
        sla_p99_s=0.1, min_utilization=0.5, min_replicas=0, max_replicas=0, max_batch_size=8,
        scale_down_delay_s=0, max_queue_delay_s=0.005,
    )  # fmt: skip
    assert (policy.min_replicas, policy.max_replicas) == (1, 1)


def test_a_window_without_a_ready_count_is_read_with_the_replicas_in_force() -> None:
    """A caller that counts no ready replicas (the operator always has the Deployment's) gets a
    decision on the replicas in force, not a hold for ever."""
    policy = Policy(
        sla_p99_s=0.1, min_utilization=0.5, min_replicas=1, max_replicas=8, max_batch_size=8,
        scale_down_delay_s=0, max_queue_delay_s=0.005,
    )  # fmt: skip
    overloaded = Observation(
        at=0, window_s=60, p99_s=0.5, p95_s=0.4, qps=200.0, rejected_qps=100.0,
        queue_p99_s=0.45, utilization=1.0, mean_batch=8.0,
    )  # fmt: skip
    decision, _ = decide(overloaded, policy, InForce(2, 8, 0.005), State(), 0.0)
    assert decision.metrics_available, decision.reason
    assert decision.replicas > 2, decision.reason
