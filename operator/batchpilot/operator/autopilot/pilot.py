"""One autopilot tick for one InferenceService: observe → decide → act → report.

Free of kopf (the fleet's round calls `tick` and writes what it returns), with its edges behind
small interfaces: `Kube` for the Deployment and ConfigMap, an `Observe` function for Prometheus
(the fleet's round hands each tick its share of one round of answers), and what `acting` needs
to apply a decision (`Pods`, `PushBatching`).

The tick reads what is in force (replicas from the Deployment, batch settings from the
ConfigMap), takes its observation, calls the pure `decide`, acts in mode `auto` (`acting`; in
mode `recommend` the decision is computed and reported, never applied), and returns the status
and Events to write (`reporting`). The autopilot's memory (the t(b) fit, the latency outside the
batcher, scale-down recommendations, the verdicts the objective is kept with) is kept in
`status.autopilot`, so an operator restart, or a new leader, resumes without a jump.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from batchpilot.operator.autopilot.acting import Actuator, Pods, PushBatching
from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import Decision, InForce, Policy
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.reporting import report_tick
from batchpilot.operator.autopilot.slo import Objective
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.configmap import batching_in
from batchpilot.operator.children.deadline import default_deadline_ms
from batchpilot.operator.events import Event
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT
from batchpilot.operator.kube import Kube
from batchpilot.operator.spec import InferenceServiceSpec


class Observe(Protocol):
    def __call__(self, scope: Scope, *, ready_replicas: int | None) -> Observation | None: ...


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
        self._actuator = Actuator(kube, pods=pods, push=push)
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
            result.events += self._actuator.apply(
                owner,
                current,
                decision,
                deadline_ms=deadline,
                in_force_deadline_ms=in_force_deadline,
            )
            result.status["deadlineMs"] = deadline
        status_doc, said = report_tick(
            status,
            spec,
            observation=observation,
            decision=decision,
            current=current,
            state=new_state,
            report=report,
            acting=acting,
            generation=meta.get("generation"),
            now=now,
        )
        result.status |= status_doc
        result.events += said
        return result
