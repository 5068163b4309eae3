"""One autopilot tick for one InferenceService: observe → decide → act → explain.

Free of kopf (the timer handler calls `tick` and writes what it returns), with its edges behind
small interfaces: `Kube` for the Deployment, ConfigMap, Secret and Pods, an `Observe` function
for Prometheus, and a `PushBatching` function that tells a ready pod its new batch settings.

Acting, in mode `auto` only:
- replicas: patch the Deployment's `spec.replicas` (the field reconcile leaves to the autopilot);
- batch settings: write them into the batching ConfigMap (what new pods start with, and what
  running pods re-read within a minute) and PUT them to every ready pod's admin endpoint, so
  they take effect within seconds. A pod that cannot be told is reported, not fatal: the
  ConfigMap reaches it anyway.
In mode `recommend` the decision is computed and reported, never applied.

The autopilot's memory (the t(b) fit, the latency outside the batcher, scale-down
recommendations, the verdicts the objective is kept with) is kept in `status.autopilot`, so an
operator restart resumes without a jump. `status.slo` shows the objective as SRE practice reads
it: attainment, error budget left, burn rates; the SLOAtRisk condition and its Events say when
the budget burns fast enough to fire an alert.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from batchpilot.operator import conditions, events
from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import Decision, InForce, Policy
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.slo import Objective, SloReport
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.children.common import ISVC_LABEL, Owner
from batchpilot.operator.children.configmap import batching_document, batching_in, service_level
from batchpilot.operator.children.deadline import default_deadline_ms
from batchpilot.operator.children.secret import token_in
from batchpilot.operator.events import Event
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, SECRET
from batchpilot.operator.kube import Kube, KubeError
from batchpilot.operator.spec import InferenceServiceSpec, SLASpec

log = logging.getLogger(__name__)

DECIDED = "AutopilotDecided"
RECOMMENDED = "AutopilotRecommends"
HOLDING = "MetricsUnavailable"
LIMITED = "ScalingLimited"
SLO_AT_RISK = "SLOAtRisk"
SLO_WITHIN_BUDGET = "SLOWithinBudget"


class Observe(Protocol):
    def __call__(self, scope: Scope, *, ready_replicas: int | None) -> Observation | None: ...


class PushBatching(Protocol):
    def __call__(self, endpoint: str, *, token: str, document: str) -> None:
        """PUT the batching document to one pod (`IP:PORT`); raises on failure."""
        ...


class Pods(Protocol):
    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]: ...


def learned_outside_s(status: dict[str, Any]) -> float | None:
    """The latency learned to be spent outside the batcher, from the autopilot's memory in
    `status.autopilot` (None: not learned yet, or the memory is unreadable and starts afresh):
    reconcile keeps the pods' default deadline where the autopilot puts it."""
    return State.from_dict(status.get("autopilot")).overhead_s


def policy_of(spec: InferenceServiceSpec) -> Policy:
    return Policy(
        sla_p99_s=spec.sla.latency_p99_ms / 1e3,
        min_utilization=spec.sla.gpu_utilization.min / 100,
        min_replicas=spec.scaling.min_replicas,
        max_replicas=spec.scaling.max_replicas,
        max_batch_size=spec.scaling.max_batch_size,
        scale_down_delay_s=spec.scaling.scale_down_delay_seconds,
        max_queue_delay_s=spec.batching.max_queue_delay_ms / 1e3,
        # Rounded: 99.9 / 100 is 0.9990000000000001 in binary floating point.
        objective=Objective(round(spec.sla.objective_percent / 100, 12), spec.sla.window_s),
    )


@dataclass
class TickResult:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    decision: Decision | None = None


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

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1e3, 2)

    doc: dict[str, Any] = {
        "p99Ms": ms(observation.p99_s),
        "p95Ms": ms(observation.p95_s),
        "queueP99Ms": ms(observation.queue_p99_s),
        "qps": None if observation.qps is None else round(observation.qps, 1),
        "rejectedQps": None
        if observation.rejected_qps is None
        else round(observation.rejected_qps, 1),
        "offeredQps": None
        if observation.offered_qps is None
        else round(observation.offered_qps, 1),
        "gpuUtilization": None
        if observation.utilization is None
        else round(observation.utilization * 100, 1),
        "meanBatchSize": None
        if observation.mean_batch is None
        else round(observation.mean_batch, 2),
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
        elif isinstance(new[key], dict):
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


class Autopilot:
    def __init__(
        self,
        kube: Kube,
        *,
        observe: Observe,
        pods: Pods,
        push: PushBatching,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        seconds: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._observe = observe
        self._pods = pods
        self._push = push
        self._clock = clock
        # Wall-clock seconds: remembered scale-down recommendations must outlive a restart.
        self._seconds = seconds

    def tick(self, body: dict[str, Any], *, observe: Observe | None = None) -> TickResult:
        """One tick for the InferenceService `body`; `observe` (default: the one given at
        construction) reads its metrics — the fleet's round hands each tick its own answers."""
        meta = body["metadata"]
        status = body.get("status") or {}
        try:
            spec = InferenceServiceSpec.model_validate(body.get("spec") or {})
        except ValueError:
            return TickResult()  # reconcile reports invalid specs
        if spec.scaling.mode == "off":
            return TickResult()
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=spec)
        deployment = self._kube.get(DEPLOYMENT, owner.namespace, owner.name)
        configmap = self._kube.get(CONFIGMAP, owner.namespace, owner.configmap_name)
        if deployment is None or configmap is None:
            return TickResult()  # reconcile has not created the children yet
        replicas = int(deployment.get("spec", {}).get("replicas") or spec.scaling.min_replicas)
        ready = int(deployment.get("status", {}).get("readyReplicas") or 0)
        recorded = batching_in(configmap)
        batch, delay_ms = (
            (recorded.batch_size, recorded.max_queue_delay_ms)
            if recorded is not None
            else (spec.batching.batch_size, spec.batching.max_queue_delay_ms)
        )
        current = InForce(replicas=replicas, batch_size=batch, max_queue_delay_s=delay_ms / 1e3)

        now = self._clock()
        observation = (observe or self._observe)(
            Scope(owner.namespace, owner.name), ready_replicas=ready
        )
        state = State.from_dict(status.get("autopilot"))
        seconds = self._seconds()
        decision, new_state = decide(observation, policy_of(spec), current, state, seconds)
        report = new_state.slo.report(seconds)

        result = TickResult(decision=decision)
        acting = spec.scaling.mode == "auto"
        in_force_deadline = None if recorded is None else recorded.deadline_ms
        deadline = default_deadline_ms(
            sla_ms=spec.sla.latency_p99_ms,
            outside_s=new_state.overhead_s,
            in_force_ms=in_force_deadline,
        )
        if acting and (decision.changes(current) or deadline != in_force_deadline):
            self._act(
                owner,
                current,
                decision,
                result,
                deadline_ms=deadline,
                in_force_deadline_ms=in_force_deadline,
            )
            result.status["deadlineMs"] = deadline

        generation = meta.get("generation")
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
        conds = conditions.set_condition(
            conds,
            type_=conditions.SCALING_LIMITED,
            status="True" if decision.scaling_limited else "False",
            reason="AtMaxReplicas" if decision.scaling_limited else "WithinLimits",
            message=decision.scaling_limited or "the autopilot can reach what the SLA needs",
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
            result.events.append(Event("Normal", SLO_WITHIN_BUDGET, slo_message))
        elif slo_state == "True" and (was_at_risk or {}).get("status") != "True":
            result.events.append(Event("Warning", SLO_AT_RISK, slo_message))
        previous = conditions.find(status.get("conditions"), conditions.SCALING_LIMITED)
        if decision.scaling_limited and (previous or {}).get("status") != "True":
            result.events.append(Event("Warning", LIMITED, decision.scaling_limited))
        was_available = conditions.find(status.get("conditions"), conditions.METRICS_AVAILABLE)
        if not decision.metrics_available and (was_available or {}).get("status") != "False":
            result.events.append(Event("Warning", HOLDING, decision.reason))

        if decision.changes(current):
            reason = DECIDED if acting else RECOMMENDED
            verb = "" if acting else "recommends: "
            result.events.append(Event("Normal", reason, f"{verb}{decision.reason}"))
            result.status["lastDecision"] = {
                "action": decision.action if acting else f"recommend-{decision.action}",
                "from": {"replicas": current.replicas, "batchSize": current.batch_size},
                "to": {"replicas": decision.replicas, "batchSize": decision.batch_size},
                "reason": decision.reason,
                "at": conditions.timestamp(now),
            }
        if acting and decision.changes(current):
            result.status["batchSize"] = decision.batch_size
            result.status["maxQueueDelayMs"] = round(decision.max_queue_delay_s * 1e3, 3)
        result.status["metrics"] = metrics_status(observation, now=now)
        result.status["slo"] = clearing(slo_status(spec.sla, report), status.get("slo"))
        result.status["conditions"] = conds
        result.status["autopilot"] = new_state.to_dict()
        if not acting:
            result.status["recommendation"] = {
                "replicas": decision.replicas,
                "batchSize": decision.batch_size,
                "reason": decision.reason,
            }
        return result

    def _act(
        self,
        owner: Owner,
        current: InForce,
        decision: Decision,
        result: TickResult,
        *,
        deadline_ms: float,
        in_force_deadline_ms: float | None,
    ) -> None:
        """Apply the decision, and the default deadline (which follows the SLA and the latency
        learned outside the batcher, whatever the decision)."""
        if decision.replicas != current.replicas:
            self._kube.patch(
                DEPLOYMENT, owner.namespace, owner.name, {"spec": {"replicas": decision.replicas}}
            )
        wanted = (decision.batch_size, decision.max_queue_delay_s, deadline_ms)
        if wanted != (current.batch_size, current.max_queue_delay_s, in_force_deadline_ms):
            document = batching_document(
                batch_size=decision.batch_size,
                max_queue_delay_ms=round(decision.max_queue_delay_s * 1e3, 3),
                deadline_ms=deadline_ms,
                **service_level(owner),
            )
            self._kube.patch(
                CONFIGMAP,
                owner.namespace,
                owner.configmap_name,
                {"data": {"batching.json": document}},
            )
            self._push_to_pods(owner, document, result)

    def _push_to_pods(self, owner: Owner, document: str, result: TickResult) -> None:
        secret = self._kube.get(SECRET, owner.namespace, owner.secret_name)
        token = token_in(secret) if secret is not None else None
        if token is None:
            return
        failed = []
        try:
            endpoints = self._pods.ready_pod_endpoints(owner.namespace, {ISVC_LABEL: owner.name})
        except KubeError as exc:
            log.warning("listing pods of %s/%s failed: %s", owner.namespace, owner.name, exc)
            return
        for endpoint in endpoints:
            try:
                self._push(endpoint, token=token, document=document)
            except Exception as exc:  # any failure: the ConfigMap still gets there
                failed.append(f"{endpoint} ({exc})")
        if failed:
            result.events.append(
                Event(
                    "Warning",
                    events.APPLY_FAILED,
                    "batch settings could not be pushed to "
                    + ", ".join(failed)
                    + "; they will pick them up from the ConfigMap",
                )
            )


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
