"""The objective in status: `status.slo`, the SLOAtRisk condition and its Events, per tick."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.pilot import Autopilot
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.reporting import slo_text
from batchpilot.operator.autopilot.slo import Objective, SloLedger
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.kinds import CONFIGMAP
from batchpilot.operator.spec import InferenceServiceSpec
from tests.autopilot.test_pilot import NOW, T, World, overloaded
from tests.operator.test_reconciler import isvc


def healthy(scope: Scope, *, ready_replicas: int | None) -> Observation:
    # 20 rps, P99 15 ms against the 100 ms SLA, nothing shed.
    return Observation(
        at=T,
        window_s=60,
        p99_s=0.015,
        p95_s=0.012,
        qps=20,
        rejected_qps=0,
        queue_p99_s=0.005,
        utilization=0.05,
        mean_batch=1.0,
        compute=(ComputePoint(1, 0.006, 1000), ComputePoint(2, 0.008, 100)),
        ready_replicas=ready_replicas,
    )


def ledger(*, bad_from: float, bad_until: float, objective: Objective | None = None) -> SloLedger:
    """An hour of verdicts 15 s apart up to T, outside the SLA in [bad_from, bad_until)."""
    book = SloLedger(objective or Objective())
    for step in range(241):
        now = T - 3600 + 15 * step
        book = book.record(now, not bad_from <= now < bad_until, covers_s=60)
    return book


def world_with(book: SloLedger | None, observe: Any, *, conditions: Any = None) -> World:
    world = World(observe=observe)
    if book is not None:
        world.body["status"]["autopilot"] = State(slo=book).to_dict()
    if conditions is not None:
        world.body["status"]["conditions"] = conditions
    return world


class TestStatus:
    def test_a_fresh_service_has_no_verdict_yet(self) -> None:
        world = World(observe=healthy)
        result = world.tick()
        assert world.body["status"]["slo"] == {
            "objectivePercent": 99,
            "window": "1h",
            "text": "-/99%",
        }
        condition = world.condition("SLOAtRisk")
        assert (condition["status"], condition["reason"]) == ("Unknown", "NoData")
        assert condition["message"] == "no verdict on the SLA yet in the 1h window"
        assert not any(e.reason.startswith("SLO") for e in result.events)

    def test_attainment_budget_and_burn_rates_from_the_ledger(self) -> None:
        # Two verdicts outside the SLA 45 minutes ago, 15 s each: 30 s of the 36 s budget.
        world = world_with(ledger(bad_from=T - 2700, bad_until=T - 2670), healthy)
        world.tick()
        slo = world.body["status"]["slo"]
        report = SloLedger.from_dict(world.body["status"]["autopilot"]["slo"]).report(T)
        assert report.attainment is not None
        assert report.budget_remaining is not None
        assert slo == {
            "objectivePercent": 99,
            "window": "1h",
            "attainmentPercent": round(report.attainment * 100, 4),
            "errorBudgetRemainingPercent": round(report.budget_remaining * 100, 1),
            "burnRate": {"fast": 0.0, "slow": 0.0},  # nothing bad in the last 30 min
            "text": "99.1%/99%",
        }
        # judged: the 59 whole minutes the window's buckets keep + the tick's 15 s = 3555 s
        # 1 - 30 / 3555 = 99.16 %; budget left 1 - 30 / (1 % of 3555) = 15.6 %
        assert slo["attainmentPercent"] == pytest.approx(99.156, abs=0.001)
        assert slo["errorBudgetRemainingPercent"] == 15.6
        condition = world.condition("SLOAtRisk")
        assert (condition["status"], condition["reason"]) == ("False", "WithinBudget")
        assert condition["message"] == (
            "99.1% of the 1h window inside the SLA against an objective of 99%; "
            "16% of the error budget left"
        )

    def test_the_objective_and_window_come_from_the_spec(self) -> None:
        world = World(observe=healthy)
        world.body["spec"]["sla"] |= {"objectivePercent": 99.9, "window": "6h"}
        world.tick()
        assert world.body["status"]["slo"]["objectivePercent"] == 99.9
        assert world.body["status"]["slo"]["window"] == "6h"
        assert world.body["status"]["slo"]["text"] == "-/99.9%"
        kept = world.body["status"]["autopilot"]["slo"]
        assert (kept["target"], kept["windowS"]) == (0.999, 21_600)

    def test_values_no_longer_known_are_removed_from_the_status(self) -> None:
        # The window changes from 1 h to 6 h: the ledger regroups and starts afresh, so the
        # old attainment must not stay beside the new window (status is a merge patch).
        world = world_with(ledger(bad_from=T - 600, bad_until=T - 300), healthy)
        world.tick()
        assert "attainmentPercent" in world.body["status"]["slo"]
        world.body["spec"]["sla"]["window"] = "6h"
        result = world.tick()
        assert result.status["slo"] == {
            "objectivePercent": 99,
            "window": "6h",
            "text": "-/99%",
            "attainmentPercent": None,
            "errorBudgetRemainingPercent": None,
            "burnRate": None,
        }


class TestSLOAtRisk:
    def test_a_burning_budget_sets_the_condition_and_warns_once(self) -> None:
        # The last 10 minutes outside the SLA, and the present window too.
        world = world_with(ledger(bad_from=T - 600, bad_until=T + 1), overloaded)
        first = world.tick()
        condition = world.condition("SLOAtRisk")
        assert (condition["status"], condition["reason"]) == ("True", "ErrorBudgetBurning")
        assert condition["message"].startswith("the error budget burns")
        assert "as fast as the objective allows over 5 min" in condition["message"]
        (warning,) = [e for e in first.events if e.reason == "SLOAtRisk"]
        assert warning.type == "Warning"
        assert warning.message == condition["message"]
        slo = world.body["status"]["slo"]
        assert slo["burnRate"]["fast"] > 1
        assert slo["burnRate"]["slow"] > 1
        assert slo["errorBudgetRemainingPercent"] < 0  # 10 min bad: 16× the 36 s budget
        assert slo["attainmentPercent"] < 99
        assert slo["text"] == slo_text(slo["attainmentPercent"] / 100, 99)
        second = world.tick()
        assert not any(e.reason.startswith("SLO") for e in second.events)
        assert world.condition("SLOAtRisk")["lastTransitionTime"] == condition["lastTransitionTime"]

    def test_the_condition_clears_with_a_normal_event_when_the_burning_stops(self) -> None:
        # Outside the SLA 50 to 40 minutes ago: beyond both alert lookbacks (5 and 30 min).
        at_risk = [
            {
                "type": "SLOAtRisk",
                "status": "True",
                "reason": "ErrorBudgetBurning",
                "message": "the error budget burns …",
                "lastTransitionTime": "2026-11-30T11:20:00Z",
            }
        ]
        world = world_with(
            ledger(bad_from=T - 3000, bad_until=T - 2400), healthy, conditions=at_risk
        )
        result = world.tick()
        condition = world.condition("SLOAtRisk")
        assert (condition["status"], condition["reason"]) == ("False", "WithinBudget")
        assert condition["lastTransitionTime"] == "2026-11-30T12:00:00Z"
        (cleared,) = [e for e in result.events if e.reason.startswith("SLO")]
        assert (cleared.type, cleared.reason) == ("Normal", "SLOWithinBudget")
        assert cleared.message == condition["message"]
        assert "0% of the error budget left" in cleared.message  # overspent: shown as 0 %

    def test_the_pushed_batch_settings_carry_the_sla_objective_and_burst_size(self) -> None:
        # The runtime exports the SLA and objective as gauges: the chart's burn-rate alerts
        # judge against them. The burst size is the largest batch the spec allows.
        world = World(observe=overloaded)
        world.body["spec"]["sla"] |= {"objectivePercent": 99.5}
        world.tick()
        ((_, _, document),) = world.pushed
        assert json.loads(document)["slaMs"] == 100
        assert json.loads(document)["objectivePercent"] == 99.5
        assert (
            json.loads(document)["burstBatchSize"] == world.body["spec"]["scaling"]["maxBatchSize"]
        )
        stored = world.kube.of(CONFIGMAP, "vision", "resnet50-batching")
        assert stored["data"]["batching.json"] == document

    def test_recommend_mode_keeps_the_books_too(self) -> None:
        world = world_with(ledger(bad_from=T - 600, bad_until=T + 1), overloaded)
        world.body["spec"]["scaling"]["mode"] = "recommend"
        result = world.tick()
        assert world.condition("SLOAtRisk")["status"] == "True"
        assert "SLOAtRisk" in [e.reason for e in result.events]

    def test_a_restarted_operator_keeps_the_verdict(self) -> None:
        world = world_with(ledger(bad_from=T - 600, bad_until=T + 1), overloaded)
        world.tick()
        world.autopilot = Autopilot(
            world.kube,
            observe=overloaded,
            pods=world,
            push=world.push,
            clock=lambda: NOW,
            seconds=lambda: T + 15,
        )
        result = world.tick()
        assert world.condition("SLOAtRisk")["status"] == "True"
        assert not any(e.reason.startswith("SLO") for e in result.events)


class TestText:
    @pytest.mark.parametrize(
        ("attainment", "objective", "text"),
        [
            (0.996, 99, "99.6%/99%"),
            (0.9896, 99, "98.9%/99%"),  # cut, not rounded up to a met 99.0 %
            (0.99, 99, "99.0%/99%"),
            (0.99995, 99.9, "99.99%/99.9%"),
            (0.9989, 99.9, "99.89%/99.9%"),
            (0.5, 99.99, "50.000%/99.99%"),
            (1.0, 99, "100%/99%"),
            (None, 99.5, "-/99.5%"),
        ],
    )
    def test_attainment_against_the_objective(
        self, attainment: float | None, objective: float, text: str
    ) -> None:
        assert slo_text(attainment, objective) == text


def test_the_policy_carries_the_objective() -> None:
    from batchpilot.operator.autopilot.pilot import policy_of

    spec = isvc(sla={"objectivePercent": 99.5, "window": "30m"})["spec"]
    policy = policy_of(InferenceServiceSpec.model_validate(spec))
    assert policy.objective == Objective(target=0.995, window_s=1800)
    assert policy_of(InferenceServiceSpec.model_validate(isvc()["spec"])).objective == Objective()
