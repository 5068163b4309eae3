"""The guard and the steps without a model (`autopilot.feedback`), on their own."""

from __future__ import annotations

from batchpilot.operator.autopilot.feedback import feedback_only, overruled
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce
from tests.autopilot.test_decide import MODEL, POLICY, seen

CURRENT = InForce(replicas=2, batch_size=8, max_queue_delay_s=0.005)


class TestTheGuard:
    def test_p99_over_the_sla_when_the_plan_adds_nothing_adds_a_quarter(self) -> None:
        # The plan keeps 2 replicas at batch 8: no capacity added, yet P99 is 140 ms > 100 ms.
        over = seen(at=0, qps=300, p99_ms=140, ready=2)
        replicas, why = overruled(
            over,
            POLICY,
            CURRENT,
            MODEL,
            settled=True,
            want_replicas=2,
            want_batch=8,
            predicted=0.06,
        ) or (None, "")
        assert replicas == 3  # 2 + max(1, ceil(0.25 · 2)) = 3
        assert why.startswith("P99 over the SLA although the model predicts 60 ms")

    def test_a_plan_adding_less_than_the_step_gets_the_step(self) -> None:
        # 8 replicas over the SLA: the guard adds 2; a plan from the same (wrong) model that adds
        # one replica, or one with a smaller batch limit, would give more load fewer replicas
        eight = InForce(replicas=8, batch_size=16, max_queue_delay_s=0.005)
        over = seen(at=0, qps=2800, p99_ms=150, ready=8)
        for want_replicas, want_batch in ((9, 16), (9, 12)):
            replicas, _ = overruled(
                over, POLICY, eight, MODEL, settled=True, want_replicas=want_replicas,
                want_batch=want_batch, predicted=0.08,
            ) or (None, "")  # fmt: skip
            assert replicas == 10
        # …but a plan that raises the batch limit stands: it is measured within a window
        assert overruled(
            over, POLICY, eight, MODEL, settled=True, want_replicas=9, want_batch=32,
            predicted=0.08,
        ) is None  # fmt: skip

    def test_refusals_over_the_feedback_share_count_as_a_miss(self) -> None:
        # 20 of 300 offered refused: 6.7 % > 5 %.
        shedding = seen(at=0, qps=280, p99_ms=90, ready=2, rejected=20)
        replicas, why = overruled(
            shedding, POLICY, CURRENT, MODEL, settled=True, want_replicas=2, want_batch=8,
            predicted=0.06,
        ) or (None, "")  # fmt: skip
        assert replicas == 3
        assert why.startswith("7% of the requests refused or expired")

    def test_the_plan_stands_when_it_adds_capacity_or_the_window_is_not_the_present(self) -> None:
        over = seen(at=0, qps=300, p99_ms=140, ready=2)

        def guard(observation: Observation, *, settled: bool = True, want: int = 2) -> object:
            return overruled(
                observation, POLICY, CURRENT, MODEL, settled=settled, want_replicas=want,
                want_batch=8, predicted=0.06,
            )  # fmt: skip

        assert guard(over) is not None
        assert guard(over, settled=False) is None  # the window still holds the old settings
        assert guard(seen(at=0, qps=300, p99_ms=140, ready=1)) is None  # a replica is starting
        assert guard(over, want=3) is None  # the plan adds a replica: it is followed
        assert guard(seen(at=0, qps=300, p99_ms=90, ready=2)) is None  # inside the SLA


class TestWithoutAModel:
    def test_over_the_sla_the_batch_limit_doubles_first(self) -> None:
        assert feedback_only(seen(at=0, qps=300, p99_ms=140, ready=2), POLICY, CURRENT) == (
            2,
            16,
            "feedback: doubling the batch limit",
        )

    def test_at_the_batch_ceiling_replicas_grow_with_the_overshoot(self) -> None:
        ceiling = InForce(replicas=2, batch_size=POLICY.max_batch_size, max_queue_delay_s=0.005)
        # 150 ms against 100: a 50 % overshoot adds ceil(2 · 0.5) = 1 replica.
        replicas, batch, why = feedback_only(
            seen(at=0, qps=300, p99_ms=150, ready=2), POLICY, ceiling
        )
        assert (replicas, batch) == (3, POLICY.max_batch_size)
        assert why == "feedback: adding 1 replicas"

    def test_an_idle_device_with_headroom_gives_a_replica_back(self) -> None:
        quiet = seen(at=0, qps=20, p99_ms=30, ready=2, utilization=0.2)
        assert feedback_only(quiet, POLICY, CURRENT)[0] == 1
