"""What a tick reports: `status.metrics`, `status.slo`, the last decision or the recommendation,
the autopilot's four conditions (MetricsAvailable, SLAMet, ScalingLimited, SLOAtRisk), and the
Events that mark their changes.

Apart from the tick (`pilot`) because it is the part users read — `kubectl get` columns,
Events, alerts — and it is pure: the decision and what it was made from in, status and Events
out. `status.slo` shows the objective as SRE practice reads it (attainment, error budget left,
burn rates); the SLOAtRisk condition and its Events say when the budget burns fast enough to
fire an alert.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from batchpilot.operator import conditions, rollout
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import Decision, InForce
from batchpilot.operator.autopilot.slo import SloReport
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.events import Event
from batchpilot.operator.spec import InferenceServiceSpec, SLASpec

DECIDED = "AutopilotDecided"
RECOMMENDED = "AutopilotRecommends"
HOLDING = "MetricsUnavailable"
LIMITED = "ScalingLimited"
SLO_AT_RISK = "SLOAtRisk"
SLO_WITHIN_BUDGET = "SLOWithinBudget"


def report_tick(
    status: dict[str, Any],
    spec: InferenceServiceSpec,
    *,
    observation: Observation | None,
    decision: Decision,
    current: InForce,
    ready_replicas: int,
    state: State,
    report: SloReport,
    acting: bool,
    generation: int | None,
    now: datetime,
) -> tuple[dict[str, Any], list[Event]]:
    """The status a tick writes (to merge into `status`, the InferenceService's as read) and the
    Events it posts, for `decision` made from `observation` with `current` in force and
    `ready_replicas` of them ready; `state` is the memory after the decision, `report` the
    objective's books; `acting`: mode auto."""
    doc: dict[str, Any] = {}
    events: list[Event] = []
    conds = status.get("conditions")
    conds = conditions.set_condition(
        conds,
        type_=conditions.METRICS_AVAILABLE,
        status="True" if decision.metrics_available else "False",
        reason="MetricsRead" if decision.metrics_available else "MetricsMissing",
        message=decision.reason
        if not decision.metrics_available
        else "P99, request rate and utilization read from Prometheus",
        generation=generation,
        now=now,
    )
    sla_status = {True: "True", False: "False", None: "Unknown"}[decision.sla_met]
    conds = conditions.set_condition(
        conds,
        type_=conditions.SLA_MET,
        status=sla_status,  # type: ignore[arg-type]
        reason={"True": "WithinSLA", "False": "SLABroken", "Unknown": "NoData"}[sla_status],
        message=metrics_sentence(observation, spec),
        generation=generation,
        now=now,
    )
    limited, limited_reason, limited_message = scaling_limited(
        status, decision, current=current, ready_replicas=ready_replicas, acting=acting
    )
    conds = conditions.set_condition(
        conds,
        type_=conditions.SCALING_LIMITED,
        status=limited,
        reason=limited_reason,
        message=limited_message,
        generation=generation,
        now=now,
    )
    slo_state, slo_reason, slo_message = slo_condition(spec.sla, report)
    conds = conditions.set_condition(
        conds,
        type_=conditions.SLO_AT_RISK,
        status=slo_state,
        reason=slo_reason,
        message=slo_message,
        generation=generation,
        now=now,
    )
    was_at_risk = conditions.find(status.get("conditions"), conditions.SLO_AT_RISK)
    if (was_at_risk or {}).get("status") == "True" and slo_state != "True":
        events.append(Event("Normal", SLO_WITHIN_BUDGET, slo_message))
    elif slo_state == "True" and (was_at_risk or {}).get("status") != "True":
        events.append(Event("Warning", SLO_AT_RISK, slo_message))
    previous = conditions.find(status.get("conditions"), conditions.SCALING_LIMITED)
    if limited == "True" and (previous or {}).get("status") != "True":
        events.append(Event("Warning", LIMITED, limited_message))
    was_available = conditions.find(status.get("conditions"), conditions.METRICS_AVAILABLE)
    if not decision.metrics_available and (was_available or {}).get("status") != "False":
        events.append(Event("Warning", HOLDING, decision.reason))

    # Recommending, the settings in force stay as they are, so the decision differs from them
    # on every tick: an Event (and a lastDecision) only when the recommendation itself changes,
    # not one per tick (240 an hour at a 15 s interval).
    said = status.get("recommendation") or {}
    recommended_anew = acting or (said.get("replicas"), said.get("batchSize")) != (
        decision.replicas,
        decision.batch_size,
    )
    if decision.changes(current) and recommended_anew:
        reason = DECIDED if acting else RECOMMENDED
        verb = "" if acting else "recommends: "
        events.append(Event("Normal", reason, f"{verb}{decision.reason}"))
        doc["lastDecision"] = {
            "action": decision.action if acting else f"recommend-{decision.action}",
            "from": {"replicas": current.replicas, "batchSize": current.batch_size},
            "to": {"replicas": decision.replicas, "batchSize": decision.batch_size},
            "reason": decision.reason,
            "at": conditions.timestamp(now),
        }
    if acting and decision.changes(current):
        doc["batchSize"] = decision.batch_size
        doc["maxQueueDelayMs"] = round(decision.max_queue_delay_s * 1e3, 3)
    doc["metrics"] = metrics_status(observation, now=now)
    doc["slo"] = clearing(slo_status(spec.sla, report), status.get("slo"))
    doc["conditions"] = conds
    doc["autopilot"] = state.to_dict()
    if not acting:
        doc["recommendation"] = {
            "replicas": decision.replicas,
            "batchSize": decision.batch_size,
            "reason": decision.reason,
        }
    return doc, events


AT_MAX_REPLICAS = "AtMaxReplicas"
REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
BELOW_LATENCY_FLOOR = "SLABelowLatencyFloor"
WITHIN_LIMITS = "WithinLimits"


def scaling_limited(
    status: dict[str, Any],
    decision: Decision,
    *,
    current: InForce,
    ready_replicas: int,
    acting: bool,
) -> tuple[conditions.Status, str, str]:
    """(status, reason, message) of the ScalingLimited condition: True at maxReplicas with the SLA
    broken (the decision says so), where the SLA is below what a request takes alone (no replica
    meets it: the decision says so), or while replicas the autopilot asked for cannot come up —
    not created (a GPU quota), not scheduled (no free GPU), crashing, not pulled, a rollout past
    its deadline — as the reconciler's Ready condition in `status` names it (`rollout`).

    Missing replicas count only while both the replicas in force and the decision are above the
    ready ones: the trouble in Ready was found for replicas already asked for, and a decision
    that wants no more than run is not held back by it. Pods that are merely starting are not
    a limit (Ready says Progressing, or Available without a trouble)."""
    trouble = rollout.trouble_in(conditions.find(status.get("conditions"), conditions.READY))
    unavailable = None
    if trouble is not None and min(decision.replicas, current.replicas) > ready_replicas:
        unavailable = f"{ready_replicas} of {decision.replicas} replicas ready: {trouble}"
    if decision.scaling_limited:
        # maxReplicas binds the decision itself, and an alert keyed on AtMaxReplicas keeps
        # firing; replicas that also cannot come up are said after it, since raising
        # maxReplicas alone would not bring them.
        message = decision.scaling_limited
        if unavailable is not None:
            message = rollout.short(f"{message}; {unavailable}")
        return "True", AT_MAX_REPLICAS, message
    if decision.below_floor:
        # No replica count meets the SLA: what to change is the SLA or the time outside the
        # batcher, whatever replicas are missing besides.
        message = decision.below_floor
        if unavailable is not None:
            message = rollout.short(f"{message}; {unavailable}")
        return "True", BELOW_LATENCY_FLOOR, message
    if unavailable is not None:
        verb = "asks for" if acting else "recommends"
        return (
            "True",
            REPLICAS_UNAVAILABLE,
            rollout.short(
                f"the autopilot {verb} {decision.replicas} replicas, {ready_replicas} "
                f"{'is' if ready_replicas == 1 else 'are'} ready: {trouble}"
            ),
        )
    return "False", WITHIN_LIMITS, "the autopilot can reach what the SLA needs"


HEARTBEAT_S = 300.0
"""While a tick has nothing new to say to users, its status waits in the operator's memory for
at most this long (measured from the stored `status.metrics.observedAt`)."""

DRIFT_S = 60.0
"""A status that differs from the stored one only by drift (`DRIFT`; a condition's words, its
state unchanged) waits at most this long: a service with traffic writes about once a minute
rather than every interval, what it reports never more than this old or a tenth off."""

DRIFT = 0.1
"""Metrics within this share of the stored ones read the same to a user (a P99 of 56 ms where
58 is stored, 306 rps for 300): ±3 % of noise from window to window rewrote every service's
status every interval — 133 writes a second at 2,000 services, each a watch event for every
watcher of InferenceServices, the API server's load where it can least take it."""

HELD = ("metrics", "autopilot")
"""The parts of a tick's status that may wait: when it was observed, and the autopilot's memory."""


def may_wait(
    stored: dict[str, Any],
    doc: dict[str, Any],
    *,
    now: datetime,
    heartbeat_s: float = HEARTBEAT_S,
) -> bool:
    """Whether `doc` (the status a tick reports) may wait instead of being written: nothing a
    user reads changed against `stored` — no condition, decision, SLO figure or metric value;
    only when the metrics were observed and the autopilot's memory (the SLO ledger counting
    another quiet interval, the rate history) — and the stored observedAt is younger than
    `heartbeat_s`; or only drift (metrics within `DRIFT`, conditions' words), and it is
    younger than `DRIFT_S`.

    Why: a service without traffic still has a tick every interval whose memory moves (the
    ledger counts idle time as good), and writing it each time is a heartbeat in status, which
    Kubernetes' API conventions steer away from: 2,000 idle services at a 15 s interval would
    be 133 status writes a second to the API server and every watcher of InferenceServices.
    What waiting costs: an operator that restarts (or a new leader) resumes from memory up to
    `heartbeat_s` old — the ledger then counts at most one metrics window of the gap, as it
    does for any gap between verdicts."""
    stored_at = (stored.get("metrics") or {}).get("observedAt")
    if not isinstance(stored_at, str):
        return False
    try:
        then = datetime.strptime(stored_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return False
    age = (now - then).total_seconds()
    if not 0 <= age < heartbeat_s:
        return False
    drifted = False
    for key, value in doc.items():
        old = stored.get(key)
        if key == "autopilot" or old == value:
            continue
        if key == "metrics":
            if _untimed(value) == _untimed(old):
                continue
            if not _near(value, old):
                return False
        elif key == "conditions":
            if _states(value) != _states(old):
                return False
        else:
            return False
        drifted = True
    return not drifted or age < DRIFT_S


def _untimed(metrics: Any) -> Any:
    if not isinstance(metrics, dict):
        return metrics
    return {k: v for k, v in metrics.items() if k != "observedAt"}


def _near(metrics: Any, stored: Any) -> bool:
    """Whether `metrics` read as `stored` does: the same fields, every number within `DRIFT`
    of the stored one (the texts, which round them, and the time of observation apart)."""
    if not isinstance(metrics, dict) or not isinstance(stored, dict):
        return False
    if set(metrics) != set(stored):
        return False
    for key, value in metrics.items():
        if key == "observedAt" or key.endswith("Text"):
            continue
        was = stored[key]
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (value, was))
        if not numbers:
            if value != was:
                return False
        elif abs(value - was) > DRIFT * max(abs(value), abs(was)):
            return False
    return True


def _states(found: Any) -> Any:
    """The conditions without their words: what a condition says may drift (its numbers), its
    state (status, reason) may not."""
    if not isinstance(found, list):
        return found
    return [
        {k: v for k, v in c.items() if k != "message"} if isinstance(c, dict) else c for c in found
    ]


def _ms_text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}ms"


def metrics_status(observation: Observation | None, *, now: datetime) -> dict[str, Any]:
    if observation is None:
        return {
            "observedAt": conditions.timestamp(now),
            "p99Text": "-",
            "qpsText": "-",
            "gpuText": "-",
        }

    def rounded(value: float | None, digits: int, scale: float = 1.0) -> float | None:
        return None if value is None else round(value * scale, digits)

    def ms(value: float | None) -> float | None:
        return rounded(value, 2, 1e3)

    doc: dict[str, Any] = {
        "p99Ms": ms(observation.p99_s),
        "p95Ms": ms(observation.p95_s),
        "queueP99Ms": ms(observation.queue_p99_s),
        "qps": rounded(observation.qps, 1),
        "rejectedQps": rounded(observation.rejected_qps, 1),
        "offeredQps": rounded(observation.offered_qps, 1),
        "retriedQps": rounded(observation.retried_qps, 1),
        "withdrawnQps": rounded(observation.withdrawn_qps, 1),
        "arrivalDispersion": rounded(observation.arrival_dispersion, 2),
        "batchTimeCv": rounded(observation.batch_time_cv, 3),
        "gpuUtilization": rounded(observation.utilization, 1, 100),
        "meanBatchSize": rounded(observation.mean_batch, 2),
        "rowsPerRequest": rounded(observation.rows_per_request, 2),
        "requestRowsCv": rounded(observation.request_rows_cv, 2),
        "outsideMs": ms(observation.outside_s),
        "window": f"{observation.window_s:.0f}s",
        "observedAt": conditions.timestamp(now),
        "p99Text": _ms_text(observation.p99_s),
        "qpsText": "-" if observation.qps is None else f"{observation.qps:.0f}",
        "gpuText": "-" if observation.utilization is None else f"{observation.utilization:.0%}",
    }
    return {key: value for key, value in doc.items() if value is not None}


def _plain_number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def slo_text(attainment: float | None, objective_percent: float) -> str:
    """`99.6%/99%`: attainment against the objective, with one digit more than the objective
    has, cut rather than rounded (98.96 % must not read as a met 99.0 %)."""
    objective = f"{_plain_number(objective_percent):g}"
    if attainment is None:
        return f"-/{objective}%"
    if attainment >= 1:
        return f"100%/{objective}%"
    digits = len(objective.partition(".")[2]) + 1
    scale = 10**digits
    cut = math.floor(attainment * 100 * scale + 1e-6) / scale
    return f"{cut:.{digits}f}%/{objective}%"


def slo_status(sla: SLASpec, report: SloReport) -> dict[str, Any]:
    """`status.slo`: the objective and how it stands; what is not known yet is left out."""
    doc: dict[str, Any] = {
        "objectivePercent": _plain_number(sla.objective_percent),
        "window": sla.window,
        "text": slo_text(report.attainment, sla.objective_percent),
    }
    if report.attainment is not None:
        doc["attainmentPercent"] = round(report.attainment * 100, 4)
    if report.budget_remaining is not None:
        doc["errorBudgetRemainingPercent"] = round(report.budget_remaining * 100, 1)
    if report.burn_rates:
        doc["burnRate"] = {name: round(rate, 2) for name, rate in report.burn_rates.items()}
    return doc


def clearing(new: dict[str, Any], old: Any) -> dict[str, Any]:
    """`new`, with None for each key only `old` has (nested too): status is written as a merge
    patch, and a key left out would keep its stale value where null removes it."""
    if not isinstance(old, dict):
        return new
    merged = dict(new)
    for key, value in old.items():
        if key not in new and value is not None:
            merged[key] = None
        elif key in new and isinstance(new[key], dict):
            merged[key] = clearing(new[key], value)
    return merged


def slo_condition(sla: SLASpec, report: SloReport) -> tuple[conditions.Status, str, str]:
    """(status, reason, message) of the SLOAtRisk condition."""
    window = f"the {sla.window} window"
    objective = f"{_plain_number(sla.objective_percent):g}%"
    if report.attainment is None:
        return "Unknown", "NoData", f"no verdict on the SLA yet in {window}"
    if report.at_risk is not None:
        return "True", "ErrorBudgetBurning", report.at_risk
    attained = slo_text(report.attainment, sla.objective_percent).partition("/")[0]
    message = f"{attained} of {window} inside the SLA against an objective of {objective}"
    if report.budget_remaining is not None:
        message += f"; {max(0.0, report.budget_remaining):.0%} of the error budget left"
    return "False", "WithinBudget", message


def metrics_sentence(observation: Observation | None, spec: InferenceServiceSpec) -> str:
    sla = f"{spec.sla.latency_p99_ms} ms"
    if observation is None or observation.qps is None:
        return "no metrics to judge the SLA by"
    if observation.idle:
        return "no traffic in the window"
    sentence = (
        f"P99 {_ms_text(observation.p99_s)} against the {sla} SLA at {observation.qps:.0f} rps"
    )
    if unserved := observation.unserved_share:
        offered = observation.offered_qps or 0.0
        sentence += f" served of {offered:.0f} offered ({unserved:.1%} refused or expired)"
    return sentence
