"""One autopilot tick for one InferenceService: observe → decide → act → report.

Free of kopf (the fleet's round calls `tick` and writes what it returns), with its edges behind
small interfaces: `Kube` for the Deployment and ConfigMap, an `Observe` function for Prometheus
(the fleet's round hands each tick its share of one round of answers), and what `acting` needs
to apply a decision (`Pods`, `PushBatching`).

The tick reads what is in force (replicas from the Deployment, batch settings from the
ConfigMap), takes its observation, calls the pure `decide`, and returns the status and Events to
write (`reporting`) with, in mode `auto`, what applying the decision takes (`acting`; in mode
`recommend` the decision is computed and reported, never applied). The fleet applies it only
once the status that remembers the decision is written (`prepare`, then `TickResult.act`): the
scale-down waits for a window of recommendations read from that memory, so a scale-up applied
and then forgotten — its status write refused by an API server in trouble, or the operator
killed between the two writes — was given back at the next quiet tick instead of a window
later. The autopilot's memory (the t(b) fit, the latency outside the batcher, scale-down
recommendations, the verdicts the objective is kept with) is kept in
`status.autopilot`, so an operator restart, or a new leader, resumes without a jump. A tick
with nothing new for users (a service without traffic: only the ledger's count of quiet time and
the time of observation move) leaves its status waiting in memory, written within
`reporting.HEARTBEAT_S` (`may_wait`) — an idle fleet does not write every service's status every
interval.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from batchpilot.operator.autopilot.acting import Actuator, Pods, PushBatching
from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.elsewhere import OtherWriters
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.pod_metrics import PodScraper
from batchpilot.operator.autopilot.policy import Decision, InForce, Policy
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.reporting import HELD, clearing, may_wait, report_tick
from batchpilot.operator.autopilot.slo import Objective
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.configmap import batching_in
from batchpilot.operator.children.deadline import default_deadline_ms
from batchpilot.operator.children.node_loss import eviction_s
from batchpilot.operator.events import Event
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, INFERENCESERVICE
from batchpilot.operator.kube import Kube
from batchpilot.operator.rollout import blocked, rolling_in_place, rollout_under_way
from batchpilot.operator.spec import InferenceServiceSpec


class Observe(Protocol):
    def __call__(self, scope: Scope, *, ready_replicas: int | None) -> Observation | None: ...


def learned_outside_s(status: dict[str, Any]) -> float | None:
    """The latency learned to be spent outside the batcher, from the autopilot's memory in
    `status.autopilot` (None: not learned yet, or the memory is unreadable and starts afresh):
    reconcile keeps the pods' default deadline where the autopilot puts it."""
    return State.from_dict(status.get("autopilot")).outside_deadline_s


SERVING_FIELDS = (
    "device",
    "engine",
    "simulated_latency",
    "instances",
    "accelerator",
    "image",
    "resources",
    "resource_claims",
    "node_selector",
)
"""The fields of `spec.runtime` that change a batch's time: where it runs, on what, with
which program. (Labels, tolerations, the pull secrets and the like do not.)"""


def serving_of(spec: InferenceServiceSpec) -> str:
    """A fingerprint of what serves: the model, the runtime's `SERVING_FIELDS`, the pipeline
    around it — where it changes, the batch times the autopilot learned are another's."""
    serving = {
        "model": spec.model.model_dump(mode="json"),
        "runtime": spec.runtime.model_dump(mode="json", include=set(SERVING_FIELDS)),
        "pipeline": None if spec.pipeline is None else spec.pipeline.model_dump(mode="json"),
    }
    text = json.dumps(serving, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def policy_of(spec: InferenceServiceSpec) -> Policy:
    return Policy(
        sla_p99_s=spec.sla.latency_p99_ms / 1e3,
        min_utilization=spec.sla.gpu_utilization.min / 100,
        min_replicas=spec.scaling.min_replicas,
        max_replicas=spec.scaling.max_replicas,
        max_batch_size=spec.scaling.max_batch_size,
        scale_down_delay_s=spec.scaling.scale_down_delay_seconds,
        replace_slow=spec.scaling.replace_slow_replicas,
        max_queue_delay_s=spec.batching.max_queue_delay_ms / 1e3,
        # Rounded: 99.9 / 100 is 0.9990000000000001 in binary floating point.
        objective=Objective(round(spec.sla.objective_percent / 100, 12), spec.sla.window_s),
        serving=serving_of(spec),
    )


@dataclass
class TickResult:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    decision: Decision | None = None
    acting: Callable[[], list[Event]] | None = None
    """Applying the decision (the Deployment's replicas, the batch settings), not done yet: do
    it with `act` once `status`, which remembers the decision, is written."""
    catching_up: Callable[[], list[Event]] | None = None
    """Where the decision changes nothing: the settings in force to the pods that became ready
    since they were sent (`Actuator.catch_up`), done by `act` too. Unlike `acting`, it does
    not make the status worth writing."""
    written: Callable[[], None] | None = None
    """The status is written: the memory kept for it until then may go (`act` calls it first)."""

    def act(self) -> None:
        """Apply the decision, once; what it reports goes before the tick's own Events."""
        written, self.written = self.written, None
        if written is not None:
            written()
        acting, self.acting = self.acting, None
        catching_up, self.catching_up = self.catching_up, None
        if acting is not None:
            self.events[:0] = acting()
        elif catching_up is not None:
            self.events[:0] = catching_up()


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
        scrape: PodScraper | None = None,
        read_pods: Callable[[str, dict[str, str]], list[dict[str, Any]]] | None = None,
    ) -> None:
        """`read_pods`: a service's pods by namespace and selector, for the replicas that cannot
        come up (`rollout.blocked`); None: none are told apart from the ones starting."""
        self._read_pods = read_pods
        self._kube = kube
        self._observe = observe
        self._scrape = scrape
        self._actuator = Actuator(kube, pods=pods, push=push)
        self._clock = clock
        # Wall-clock seconds: remembered scale-down recommendations must outlive a restart.
        self._seconds = seconds
        self._lock = threading.Lock()
        self._accepted: dict[tuple[str, str], tuple[str, InferenceServiceSpec]] = {}
        """(uid, spec) the last spec of each service that parsed: what its ticks go on with
        while the operator refuses a newer one."""
        self._waiting: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        """(uid, status) a quiet service's ticks have not written yet (`may_wait`): of that
        object only — one deleted and created again under its name within a round is another,
        which must not take the old one's fit, cold start and ceiling for its own."""
        self._others = OtherWriters()

    def tick(self, body: dict[str, Any], *, observe: Observe | None = None) -> TickResult:
        """One tick for the InferenceService `body`, its decision applied at once; `observe`
        (default: the one given at construction) reads its metrics."""
        result = self.prepare(body, observe=observe)
        result.act()
        return result

    def prepare(self, body: dict[str, Any], *, observe: Observe | None = None) -> TickResult:
        """One tick for the InferenceService `body`, up to applying its decision, which is left
        in `TickResult.acting` for after the status write; `observe` (default: the one given at
        construction) reads its metrics — the fleet's round hands each tick its own answers."""
        meta = body["metadata"]
        stored = body.get("status") or {}
        key = (meta["namespace"], meta["name"])
        with self._lock:
            of, waiting = self._waiting.get(key) or ("", None)
        # What the last ticks said and did not write yet, over what is stored (`may_wait`).
        status = stored | waiting if waiting and of == meta["uid"] else stored
        try:
            spec = InferenceServiceSpec.model_validate(body.get("spec") or {})
        except ValueError:
            # Refused by the operator, not the CRD (reconcile reports it and leaves the children
            # as they are): the pods serve on, and so does the autopilot, on the spec it last
            # accepted of this object. It stopped — no scale-up under a rising load, the
            # objective's books unkept — for a pod label's key too long.
            with self._lock:
                of, accepted = self._accepted.get(key) or ("", None)
            if accepted is None or of != meta["uid"]:
                return TickResult()
            spec = accepted
        else:
            with self._lock:
                self._accepted[key] = (meta["uid"], spec)
        if spec.scaling.mode == "off":
            self._forget_count(key)
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
        acting = spec.scaling.mode == "auto"
        uid = str(deployment.get("metadata", {}).get("uid") or "")
        seconds = self._seconds()
        elsewhere = None
        if acting:
            with self._lock:
                elsewhere = self._others.check(
                    key,
                    uid=uid,
                    replicas=replicas,
                    low=spec.scaling.min_replicas,
                    high=spec.scaling.max_replicas,
                    now=seconds,
                )
        else:
            self._forget_count(key)

        now = self._clock()
        observation = (observe or self._observe)(
            Scope(owner.namespace, owner.name), ready_replicas=ready
        )
        if observation is not None and ready < replicas and self._read_pods is not None:
            stuck = blocked(deployment, self._read_pods(owner.namespace, dict(owner.selector)))
            if stuck:
                observation = replace(observation, blocked_replicas=min(stuck, replicas - ready))
        state = State.from_dict(status.get("autopilot"), now=seconds)
        # The pods' own tolerations say when Kubernetes replaces one whose node was lost.
        template = deployment.get("spec", {}).get("template", {}).get("spec", {})
        policy = replace(
            policy_of(spec),
            evicted_after_s=eviction_s(template.get("tolerations")),
            replaced_in_place=rolling_in_place(deployment),
            rolling=rollout_under_way(deployment),
            acting=acting,
        )
        decision, new_state = decide(observation, policy, current, state, seconds)
        if self._scrape is not None:
            if acting and not decision.metrics_available:
                decision, new_state = self._from_the_pods(
                    owner, decision, new_state, policy, current, state, ready=ready, now=seconds
                )
            else:
                self._scrape.drop(owner.namespace, owner.name)
        report = new_state.slo.report(seconds)

        result = TickResult(decision=decision, events=[elsewhere] if elsewhere else [])
        in_force_deadline = None if recorded is None else recorded.deadline_ms
        deadline = default_deadline_ms(
            sla_ms=spec.sla.latency_p99_ms,
            outside_s=new_state.outside_deadline_s,
            in_force_ms=in_force_deadline,
        )
        if acting and (
            decision.changes(current) or deadline != in_force_deadline or decision.replace
        ):
            apply = functools.partial(
                self._actuator.apply,
                owner,
                current,
                decision,
                deadline_ms=deadline,
                in_force_deadline_ms=in_force_deadline,
            )
            result.acting = functools.partial(self._applied, key, uid, decision.replicas, apply)
            result.status["deadlineMs"] = deadline
        elif acting:
            result.catching_up = functools.partial(
                self._actuator.catch_up, owner, current, deadline_ms=deadline, ready=ready
            )
        if acting and decision.replicas == current.replicas:
            with self._lock:
                self._others.left(key, uid=uid, replicas=current.replicas)
        status_doc, said = report_tick(
            status,
            spec,
            observation=observation,
            decision=decision,
            current=current,
            ready_replicas=ready,
            state=new_state,
            report=report,
            acting=acting,
            generation=meta.get("generation"),
            now=now,
        )
        doc = result.status | status_doc
        if result.acting is None and may_wait(stored, doc, now=now):
            # Nothing new for users: the memory waits here, and the pass writes nothing.
            with self._lock:
                self._waiting[key] = (owner.uid, {k: doc[k] for k in HELD if k in doc})
            # (A condition whose words drifted waits too: the write that comes says it.)
            result.status = {k: v for k, v in doc.items() if k not in HELD and stored.get(k) == v}
        else:
            # Kept until the write goes through (`written`): failed, the next tick goes on from
            # this one's memory, not from the stored one without what waited since.
            held = (owner.uid, {k: doc[k] for k in HELD if k in doc})
            with self._lock:
                self._waiting[key] = held
            result.written = functools.partial(self._written, key, held)
            if isinstance(doc.get("autopilot"), dict):
                # Status is written as a merge patch: what the memory no longer holds (a cold
                # start no longer pending, a loss over) must be written null, or the stored value
                # comes back at the next tick.
                doc["autopilot"] = clearing(doc["autopilot"], stored.get("autopilot"))
            result.status = doc
        result.events += said
        return result

    def _from_the_pods(
        self,
        owner: Owner,
        held: Decision,
        held_state: State,
        policy: Policy,
        current: InForce,
        state: State,
        *,
        ready: int,
        now: float,
    ) -> tuple[Decision, State]:
        """Where Prometheus did not answer (`held`): the decision on the pods' own metrics if it
        adds replicas (with the batch settings it plans them for), else the hold. Never fewer
        replicas on them: a window of one interval, read from the pods that answered, is too
        little to give capacity back on."""
        assert self._scrape is not None
        seen = self._scrape(owner, ready_replicas=ready, at=now)
        if seen is None:
            return held, held_state
        decision, new_state = decide(seen, policy, current, state, now)
        if decision.replicas <= current.replicas:
            return held, held_state
        reason = (
            f"{held.reason.removeprefix('holding: ')}; from the pods' own metrics over the last "
            f"{seen.window_s:.0f} s (only more replicas on them): {decision.reason}"
        )
        return replace(decision, reason=reason, metrics_available=False), new_state

    def prime(self, namespace: str, name: str) -> bool:
        """Read the pods of a service the autopilot acts on (mode auto) that has no read of them
        to start a window, ahead of its tick in a round Prometheus did not answer (see
        `pod_metrics.PodScraper.prime`); whether it read any. False without the pods' fallback."""
        if self._scrape is None:
            return False
        body = self._kube.get(INFERENCESERVICE, namespace, name)
        scaling = ((body or {}).get("spec") or {}).get("scaling") or {}
        if body is None or (scaling.get("mode") or "auto") != "auto":
            return False
        return self._scrape.prime(namespace, name)

    def _applied(
        self,
        key: tuple[str, str],
        uid: str,
        replicas: int,
        apply: Callable[..., list[Event]],
    ) -> list[Event]:
        """`apply(replicas_written=…)`; once the API took the replica count, `replicas` are what
        the tick left in force — even where a later write of the same decision (the batch
        settings) failed, whose next tick would otherwise take its own count for someone
        else's (`elsewhere`); a failed patch of the count left it as it was."""

        def written() -> None:
            with self._lock:
                self._others.left(key, uid=uid, replicas=replicas)

        return apply(replicas_written=written)

    def _written(self, key: tuple[str, str], held: tuple[str, dict[str, Any]]) -> None:
        """The status `held` was kept for is written: it no longer waits (unless a later tick's
        replaced it meanwhile)."""
        with self._lock:
            if self._waiting.get(key) is held:
                del self._waiting[key]

    def _forget_count(self, key: tuple[str, str]) -> None:
        """The service's replica count is not the autopilot's to keep (mode recommend or off)."""
        with self._lock:
            self._others.drop(key)

    def forget(self, keep: Iterable[tuple[str, str]]) -> None:
        """Drop what is remembered of every service but `keep` (deleted, or out of the
        autopilot's hands)."""
        kept = set(keep)
        with self._lock:
            for key in [k for k in self._waiting if k not in kept]:
                del self._waiting[key]
            for key in [k for k in self._accepted if k not in kept]:
                del self._accepted[key]
            self._others.forget(kept)
        self._actuator.forget(kept)
        if self._scrape is not None:
            self._scrape.forget(kept)
