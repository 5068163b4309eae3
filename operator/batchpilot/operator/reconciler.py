"""One reconcile pass of an InferenceService: read the children, plan, write, report.

Reads go through `Kube`, which the operator backs with the watch-fed cache (cache.py): a pass
that finds nothing to change makes no request at all. A write refused with 409 means the read
was behind the API; the pass reads and plans again, once, before it reports a failure. A write
that got no answer, or a 429, is no refusal: the pass is retried without a word in status.

Free of kopf so that the same pass serves every trigger — the resource's own events, its
children's events, the periodic level-triggered pass — and so tests can run it directly.
It returns the status to write (only what changed) and the Events to post; `passes.Passes`
writes the status and the handlers post the Events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from batchpilot.operator import conditions, events, rollout
from batchpilot.operator.children.apikeys import access_document, auth_status, keys_secret_problem
from batchpilot.operator.children.common import (
    Owner,
    configmap_name,
    ours,
    secret_name,
)
from batchpilot.operator.children.deployment import UnsupportedModelSource
from batchpilot.operator.children.exposure import exposure_status, not_served_message
from batchpilot.operator.children.networkpolicy import access_status
from batchpilot.operator.children.quota_share import serving_replicas
from batchpilot.operator.children.route_acceptance import Exposure, exposure_now
from batchpilot.operator.children.service import grpc_address, service_url
from batchpilot.operator.events import Event
from batchpilot.operator.exposure_spec import CANARY_SELF_MESSAGE
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, KINDS, SECRET, ResourceKind
from batchpilot.operator.kube import Kube, KubeError
from batchpilot.operator.plan import (
    CHILD_KINDS,
    EXPOSURE_KINDS,
    Admitted,
    ChildrenPlan,
    admitted,
    child_names,
    owned_values,
    plan,
)
from batchpilot.operator.rollout import Trouble, why_not_ready
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec


@dataclass
class ReconcileOutcome:
    """What one reconcile pass asks its caller to write and report."""

    status: dict[str, Any] = field(default_factory=dict)
    """Status fields that differ from the current status (empty: write nothing)."""
    events: list[Event] = field(default_factory=list)
    permanent_error: str | None = None
    """The spec cannot work until someone changes it."""
    retry_error: str | None = None
    """A write failed; try again."""
    retry_after_s: float | None = None
    """Not before this many seconds: the API server asked so (`Retry-After`)."""
    waiting: str | None = None
    """Held until something the operator watches changes (the API keys' Secret): its watch
    event brings the next pass, so nothing is retried on a timer."""


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        parts.append(f"spec.{where}: {item['msg']}" if where else item["msg"])
    return "; ".join(parts)


def _changed(current: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in wanted.items() if current.get(key) != value}


ReadReferenced = Callable[[ResourceKind, str, str], dict[str, Any] | None]
"""Reads an object the spec names and the operator does not own (the API keys' Secret)."""
Rebalance = Callable[[Owner], None]
"""Asks the serving pods to retire their connections when a replica joins them. The handlers hand
`autopilot.push.ConnectionRebalancer`."""
ReadPods = Callable[[str, dict[str, str]], list[dict[str, Any]]]
"""The pods in a namespace with these labels (the watch-fed cache's)."""
PushAccess = Callable[[Owner, str | None], list[Event]]
"""Sends the access document to the ready pods that were not given it yet, and says what failed
(None: no `spec.auth`). The handlers hand `autopilot.push.AccessPusher`."""
ReadRollingInPlace = Callable[[], Collection[tuple[str, str]] | None]
"""The (namespace, name) of the operator's Deployments whose rollouts go in place now, fleet-wide
(`rollout.rolling_in_place`); None while they are not known (the watch-fed cache before its
lists are in)."""


class Reconciler:
    """`learned_outside_s(status)`: the latency the autopilot has learned is spent outside the
    batcher (None: not learned), which the pods' default deadline follows. Handed in rather than
    read here: that memory is the autopilot's, in its format, and the reconciler sits beside the
    autopilot, not above it (the handlers hand it `autopilot.pilot.learned_outside_s`).

    `read_referenced`: how to read what the spec names but the operator does not own (the API
    keys' Secret); default `kube.get`. The handlers hand the watch-fed cache's, which keeps such
    an object once read (a child's label filter would never let it in).

    `push_access`: how the access document reaches the running pods at once (None: through the
    ConfigMap alone). `rebalance`: what spreads kept-alive clients over a replica that joined
    (None: the pods' connection age alone).

    `read_pods`: the service's pods, whose statuses say why replicas are not ready (a crash, an
    image that cannot be pulled, no node with a free GPU); None: the Deployment's conditions
    alone.

    `read_rolling_in_place`: the Deployments, fleet-wide, whose rollouts go in place now, which
    `rollout_in_place_max_services` counts (the handlers hand the watch-fed cache's, so that a
    leader that just took over counts what is, not what its predecessor remembered); None: only
    those this reconciler turns in place are counted, while it writes them.

    `read_owner`: the InferenceService as the API server has it now, not as a cache remembers it:
    read before children are adopted (`plan.adoptable`), which a pass for a service
    already deleted must not do (the handlers hand the cache's read past its memory); None: the
    body each pass is given is taken as the service as it is."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        *,
        learned_outside_s: Callable[[dict[str, Any]], float | None],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        read_referenced: ReadReferenced | None = None,
        push_access: PushAccess | None = None,
        rebalance: Rebalance | None = None,
        read_pods: ReadPods | None = None,
        read_rolling_in_place: ReadRollingInPlace | None = None,
        read_owner: Callable[[str, str], dict[str, Any] | None] | None = None,
    ) -> None:
        self._kube = kube
        self._read_owner = read_owner
        self._settings = settings
        self._learned_outside_s = learned_outside_s
        self._clock = clock
        self._read_referenced = read_referenced or kube.get
        self._push_access = push_access
        self._rebalance = rebalance
        self._read_pods = read_pods
        self._read_rolling_in_place = read_rolling_in_place
        self._turns = threading.Lock()
        self._turning: set[tuple[str, str]] = set()
        """Services this reconciler's passes are turning in place (`_rolls_in_place`), from the
        count of turns to the write of their Deployment: counted as rolling in place, so that
        two passes at once cannot both take the last turn. Only for that while: after the
        write the Deployment says it (the cache keeps what a write answered)."""
        self._admitted: dict[tuple[str, str, str], Admitted] = {}
        """(kind, namespace, name) → what the API server stored of this reconciler's last write
        of a child, where that was not what was sent (`plan.Admitted`): an admission webhook's
        changes, accepted rather than written over every pass. Only such children are here. In
        memory: an operator that starts, or takes over, writes each such child once more."""

    def reconcile(self, body: dict[str, Any]) -> ReconcileOutcome:
        meta = body["metadata"]
        generation = meta.get("generation")
        status = body.get("status") or {}
        now = self._clock()
        try:
            spec = InferenceServiceSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            return self._refuse(status, generation, now, describe_validation_error(exc))
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=spec)
        canary = spec.exposure.canary if spec.exposure is not None else None
        if canary is not None and canary.service == owner.name:
            return self._refuse(status, generation, now, f"spec.{CANARY_SELF_MESSAGE}")
        if spec.auth is not None:
            # Pods would not start on a Secret that is missing or that the runtime refuses:
            # apply nothing of this spec until it can be used, and say why.
            secret = self._read_referenced(SECRET, owner.namespace, spec.auth.api_keys.secret_name)
            problem = keys_secret_problem(owner, secret)
            if problem is not None:
                return self._refuse(
                    status, generation, now, problem.message, reason=problem.reason, waiting=True
                )

        outcome = ReconcileOutcome()
        try:
            for attempt in (1, 2):
                observed = self._observe(owner)
                owned = owned_values(owner, observed, outside_s=self._learned_outside_s(status))
                in_place, held = self._rolls_in_place(owner, observed.get(DEPLOYMENT), now, outcome)
                owned = replace(owned, in_place=in_place)
                try:
                    todo = plan(
                        owner, self._settings, observed, owned, admitted=self._admitted_of(owner)
                    )
                except UnsupportedModelSource as exc:
                    return self._refuse(
                        status, generation, now, str(exc), reason="UnsupportedModel"
                    )
                if todo.adopted and not self._alive(owner):
                    # Deleted while a pass read it from a cache behind the API (each kind's
                    # watch is its own stream: the garbage collector's orphaning of its children
                    # can come before its own deletion): adopted again by its gone uid, an
                    # orphaned serving Deployment would be the garbage collector's to delete.
                    return outcome
                try:
                    rest, exposure = todo.split(EXPOSURE_KINDS)
                    children = dict(observed)  # as each write leaves them
                    self._apply(rest, children, outcome)
                    not_served = self._apply_exposure(exposure, children, outcome)
                    break
                except KubeError as exc:
                    if exc.status == 409 and attempt == 1:
                        # What was read is behind the API: a name taken by an object the reads
                        # did not see, or a child changed since. `Kube` has read it afresh: once
                        # more.
                        continue
                    if exc.transient:
                        return _try_again(outcome, exc)
                    return self._apply_failed(status, generation, now, outcome, str(exc))
        finally:
            self._turned((owner.namespace, owner.name))

        deployment = children[DEPLOYMENT]
        exposed = exposure_now(owner, {kind.kind: children[kind] for kind in EXPOSURE_KINDS})
        conflict_text = ", ".join(f"{kind.kind} {name}" for kind, name in todo.conflicts)
        ready = (deployment or {}).get("status", {}).get("readyReplicas") or 0
        desired = (deployment or {}).get("spec", {}).get("replicas", owned.replicas)
        serving = serving_replicas(deployment)  # they share service-wide quotas
        if self._push_access is not None:
            access = access_document(owner, serving_replicas=serving)
            outcome.events.extend(self._push_access(owner, access))
        if self._rebalance is not None:
            self._rebalance(owner)
        trouble: Trouble | None = None
        if todo.conflicts:
            ready_condition = (
                "False",
                "ChildConflict",
                f"{conflict_text} already exists and is not controlled by this "
                "InferenceService; it was left alone. Delete or rename it."
                + (
                    " The Deployment waits until then: its pods would mount or be fenced by it."
                    if todo.held
                    else ""
                ),
            )
        else:
            trouble = self._trouble(owner, deployment, ready=ready, desired=desired)
            ready_condition = rollout.ready_condition(ready=ready, desired=desired, trouble=trouble)
        previous = conditions.find(status.get("conditions"), conditions.READY)
        if held is not None and not todo.conflicts:
            said = ready_condition[2]
            ready_condition = (*ready_condition[:2], rollout.short(f"{said}; {held.condition}"))
            if not rollout.waits_its_turn(previous):
                outcome.events.append(Event("Normal", events.WAITING_TO_ROLL_IN_PLACE, held.event))
        if todo.conflicts and (previous or {}).get("reason") != "ChildConflict":
            outcome.events.append(Event("Warning", events.CHILD_CONFLICT, ready_condition[2]))
        if trouble is not None and (previous or {}).get("message") != ready_condition[2]:
            outcome.events.append(Event("Warning", events.REPLICAS_FAILING, trouble.message))
        wanted = {
            "observedGeneration": generation,
            "replicas": desired,
            "readyReplicas": ready,
            "replicasText": f"{ready}/{desired}",
            "selector": ",".join(f"{k}={v}" for k, v in owner.selector.items()),
            "url": service_url(owner),
            "grpcAddress": grpc_address(owner),
            "slaText": f"<{spec.sla.latency_p99_ms}ms",
            "batchSize": owned.batch_size,
            "maxQueueDelayMs": owned.max_queue_delay_ms,
            "deadlineMs": owned.deadline_ms,
            "access": access_status(owner, self._settings),
            "auth": auth_status(owner, serving_replicas=serving),
            "exposure": (
                _with_routes(exposure_status(owner), exposed)
                if not_served is None
                else status.get("exposure")
            ),
            "conditions": conditions.set_condition(
                self._exposed(
                    owner, status, exposure, not_served, exposed, generation, now, outcome
                ),
                type_=conditions.READY,
                status=ready_condition[0],  # type: ignore[arg-type]
                reason=ready_condition[1],
                message=ready_condition[2],
                generation=generation,
                now=now,
            ),
        }
        outcome.status = _changed(status, wanted)
        return outcome

    def _rolls_in_place(
        self,
        owner: Owner,
        deployment: dict[str, Any] | None,
        now: datetime,
        outcome: ReconcileOutcome,
    ) -> tuple[bool, rollout.Held | None]:
        """Whether the Deployment's rollout goes in place, for want of room for its surge pod
        (`rollout.rolls_in_place`), and, where it would and may not yet, why it waits
        (`rollout.in_place_turn`); an Event when it starts to go in place."""
        wait_s = self._settings.rollout_in_place_after_seconds
        if deployment is None or self._read_pods is None or wait_s <= 0:
            return False, None
        if not ours(deployment, owner) or not rollout.rollout_under_way(deployment):
            return False, None
        pods = self._read_pods(owner.namespace, dict(owner.selector))
        if not rollout.rolls_in_place(deployment, pods, now=now, wait_s=wait_s):
            return False, None
        if rollout.rolling_in_place(deployment):
            return True, None  # its turn, until the rollout is over
        held = self._take_turn((owner.namespace, owner.name), wait_s=wait_s)
        if held is not None:
            return False, held
        if not any(e.reason == events.ROLLING_IN_PLACE for e in outcome.events):
            outcome.events.append(
                Event(
                    "Warning",
                    events.ROLLING_IN_PLACE,
                    f"the rollout's new pod has found no room for {wait_s} s; replacing one "
                    "replica at a time instead, one fewer serving until each new one is ready",
                )
            )
        return True, None

    def _take_turn(self, key: tuple[str, str], *, wait_s: float) -> rollout.Held | None:
        """A turn to go in place for the service `key` (None: taken, until `_turned`), or why
        it waits: counted from what the Deployments say now, and the turns this reconciler's
        passes are taking (a pass that counted has not written yet)."""
        limit = self._settings.rollout_in_place_max_services
        if limit <= 0:
            return None  # no limit: nothing to count
        with self._turns:
            live = self._read_rolling_in_place() if self._read_rolling_in_place is not None else ()
            others = (
                None
                if live is None
                else [f"{ns}/{name}" for ns, name in sorted({*live, *self._turning} - {key})]
            )
            held = rollout.in_place_turn(others, wait_s=wait_s, max_services=limit)
            if held is None:
                self._turning.add(key)
        return held

    def _turned(self, key: tuple[str, str]) -> None:
        """The pass over `key` is over: its Deployment says whether it took its turn."""
        if key in self._turning:  # a set's lookup is atomic; most passes take no turn
            with self._turns:
                self._turning.discard(key)

    def _trouble(
        self, owner: Owner, deployment: dict[str, Any] | None, *, ready: int, desired: int
    ) -> Trouble | None:
        """Why replicas are missing, when some are (`rollout.why_not_ready`)."""
        if deployment is None or ready >= desired:
            return None
        pods = (
            self._read_pods(owner.namespace, dict(owner.selector))
            if self._read_pods is not None
            else []
        )
        return why_not_ready(deployment, pods)

    def _exposed(
        self,
        owner: Owner,
        status: dict[str, Any],
        todo: ChildrenPlan,
        not_served: ResourceKind | None,
        exposed: Exposure | None,
        generation: int | None,
        now: datetime,
        outcome: ReconcileOutcome,
    ) -> list[dict[str, Any]]:
        """The conditions with `Exposed` as this pass leaves it (none without spec.exposure):
        what the Gateway said of the routes (`route_acceptance`), unless they could not be
        applied. A Warning Event when the Gateway refuses one, once."""
        current = status.get("conditions")
        if owner.spec.exposure is None:
            return conditions.without(current, conditions.EXPOSED)
        state: tuple[conditions.Status, str, str]
        if not_served is not None:
            gateway_api = not_served.kind in {"HTTPRoute", "GRPCRoute"}
            reason = "GatewayAPIMissing" if gateway_api else "KindNotServed"
            state = ("False", reason, not_served_message(not_served.kind))
            previous = conditions.find(current, conditions.EXPOSED)
            if (previous or {}).get("message") != state[2]:
                outcome.events.append(Event("Warning", events.EXPOSURE_NOT_APPLIED, state[2]))
        elif todo.conflicts:
            taken = ", ".join(f"{kind.kind} {name}" for kind, name in todo.conflicts)
            state = (
                "False",
                "ChildConflict",
                f"{taken} is not controlled by this InferenceService",
            )
        else:
            assert exposed is not None  # spec.exposure, all applied
            state = (exposed.status, exposed.reason, exposed.message)
            previous = conditions.find(current, conditions.EXPOSED)
            was = (previous or {}).get("status"), (previous or {}).get("reason")
            if exposed.refused and was != ("False", exposed.reason):
                outcome.events.append(Event("Warning", events.EXPOSURE_REFUSED, exposed.message))
        return conditions.set_condition(
            current,
            type_=conditions.EXPOSED,
            status=state[0],
            reason=state[1],
            message=state[2],
            generation=generation,
            now=now,
        )

    def _apply_exposure(
        self,
        todo: ChildrenPlan,
        children: dict[ResourceKind, dict[str, Any] | None],
        outcome: ReconcileOutcome,
    ) -> ResourceKind | None:
        """The exposure's writes, as one. A create answered 404 means the API server does not
        serve that kind (the Gateway API's CRDs are not installed: a namespaced collection of a
        served kind always exists): what this pass created of the exposure is deleted again,
        nothing else of it is written — the way in that was in force stays — and the kind is
        returned. None: all written. `children` follows the writes, as `_apply`'s."""
        created: list[dict[str, Any]] = []
        for obj in todo.create:
            try:
                answered = self._kube.create(obj)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                for made in reversed(created):
                    meta = made["metadata"]
                    self._kube.delete(KINDS[made["kind"]], meta["namespace"], meta["name"])
                return KINDS[obj["kind"]]
            created.append(answered)
        for obj in created:
            kind = KINDS[obj["kind"]]
            children[kind] = obj
            outcome.events.append(
                Event("Normal", events.CREATED, f"created {obj['kind']} {obj['metadata']['name']}")
            )
            if (changed := self._stored(kind, obj, todo)) is not None:
                outcome.events.append(changed)
        self._apply(
            ChildrenPlan(
                replace=todo.replace,
                delete=todo.delete,
                adopted=todo.adopted,
                rendered=todo.rendered,
            ),
            children,
            outcome,
        )
        return None

    def _alive(self, owner: Owner) -> bool:
        """Whether `owner` still is, as the API server has it now, and is not being deleted
        (without `read_owner`, the body the pass was given is taken to be)."""
        if self._read_owner is None:
            return True
        found = self._read_owner(owner.namespace, owner.name)
        meta = (found or {}).get("metadata") or {}
        return meta.get("uid") == owner.uid and not meta.get("deletionTimestamp")

    def forget(self, namespace: str, name: str) -> None:
        """The InferenceService `name` is gone, and its children with it: what was remembered
        of their writes goes too (each kind by its own child's name: `x-batching`'s Deployment
        is no child of `x`)."""
        mine = _child_keys(namespace, name)
        for key in [k for k in list(self._admitted) if k in mine]:
            self._admitted.pop(key, None)

    def forget_all_but(self, services: Collection[tuple[str, str]]) -> None:
        """Keep what is remembered of the children of `services` (namespace, name) alone: the
        forgetting on a deletion races passes that read the service a moment longer."""
        kept: set[tuple[str, str, str]] = set()
        for namespace, name in services:
            kept |= _child_keys(namespace, name)
        for key in [k for k in list(self._admitted) if k not in kept]:
            self._admitted.pop(key, None)

    def _admitted_of(self, owner: Owner) -> dict[ResourceKind, Admitted]:
        """What the API server stored of the last writes of `owner`'s children, where not what
        was sent."""
        if not self._admitted:
            return {}
        names = child_names(owner)
        found = {
            kind: self._admitted.get((kind.kind, owner.namespace, names[kind]))
            for kind in CHILD_KINDS
        }
        return {kind: entry for kind, entry in found.items() if entry is not None}

    def _stored(
        self, kind: ResourceKind, answered: dict[str, Any], todo: ChildrenPlan
    ) -> Event | None:
        """Remember what the API server made of a write (`plan.admitted`); a Normal Event
        `ChangedOnAdmission` the first time it stores a rendering otherwise than sent."""
        meta = answered["metadata"]
        key = (kind.kind, meta["namespace"], meta["name"])
        rendered = todo.rendered.get(kind)
        now = None if rendered is None else admitted(rendered, answered)
        if now is None:
            self._admitted.pop(key, None)
            return None
        before = self._admitted.get(key)
        self._admitted[key] = now
        if before is not None and (before.rendered, before.stored) == (now.rendered, now.stored):
            return None  # the same as last time: said then
        return Event(
            "Normal",
            events.CHANGED_ON_ADMISSION,
            f"the API server stored {kind.kind} {meta['name']} otherwise than sent, at "
            f"{', '.join(now.changed) or 'its fields'} (an admission webhook's change): kept as "
            "stored, and written again only when the spec changes or someone else changes it",
        )

    def _observe(self, owner: Owner) -> dict[ResourceKind, dict[str, Any] | None]:
        names = child_names(owner)
        return {kind: self._kube.get(kind, owner.namespace, names[kind]) for kind in CHILD_KINDS}

    def _apply(
        self,
        todo: ChildrenPlan,
        children: dict[ResourceKind, dict[str, Any] | None],
        outcome: ReconcileOutcome,
    ) -> None:
        """Make the planned writes; `children` follows them (what each write answered, None for
        a child deleted): the Deployment's status and the routes' are read from it after."""
        for obj in todo.create:
            kind = KINDS[obj["kind"]]
            children[kind] = answered = self._kube.create(obj)
            outcome.events.append(
                Event("Normal", events.CREATED, f"created {obj['kind']} {obj['metadata']['name']}")
            )
            if (changed := self._stored(kind, answered, todo)) is not None:
                outcome.events.append(changed)
        for obj in todo.replace:
            kind, name = KINDS[obj["kind"]], obj["metadata"]["name"]
            children[kind] = answered = self._kube.replace(obj)
            said = (
                (
                    events.ADOPTED,
                    f"adopted {kind.kind} {name}, which the operator made for an earlier "
                    "InferenceService of this name; the values in force are kept",
                )
                if (kind, name) in todo.adopted
                else (events.UPDATED, f"updated {kind.kind} {name} to match the spec")
            )
            outcome.events.append(Event("Normal", *said))
            if (changed := self._stored(kind, answered, todo)) is not None:
                outcome.events.append(changed)
        for kind, name in todo.delete:
            namespace = observed_namespace(children, kind)
            self._kube.delete(kind, namespace, name)
            self._admitted.pop((kind.kind, namespace, name), None)
            children[kind] = None
            outcome.events.append(Event("Normal", events.DELETED, f"deleted {kind.kind} {name}"))

    def _apply_failed(
        self,
        status: dict[str, Any],
        generation: int | None,
        now: datetime,
        outcome: ReconcileOutcome,
        error: str,
    ) -> ReconcileOutcome:
        """A write the API server refused (a Deployment a cluster's policy or validation turns
        down, a quota): retried, and said in `Ready` — False, `ApplyFailed`, the API server's
        words — with a Warning Event when the words change, not on every retry."""
        message = f"applying children failed: {error}"
        outcome.retry_error = message
        previous = conditions.find(status.get("conditions"), conditions.READY)
        if previous is None or previous.get("message") != message:
            outcome.events.append(Event("Warning", events.APPLY_FAILED, message))
        outcome.status = _not_ready(status, generation, now, events.APPLY_FAILED, message)
        return outcome

    def _refuse(
        self,
        status: dict[str, Any],
        generation: int | None,
        now: datetime,
        message: str,
        *,
        reason: str = "InvalidSpec",
        waiting: bool = False,
    ) -> ReconcileOutcome:
        """Write nothing but the Ready condition. `waiting`: what is wrong may be fixed without
        a new spec (a Secret created later), and the watch of it brings the next pass."""
        previous = conditions.find(status.get("conditions"), conditions.READY)
        outcome = (
            ReconcileOutcome(waiting=message)
            if waiting
            else ReconcileOutcome(permanent_error=message)
        )
        if previous is None or previous.get("message") != message:
            event_reason = reason if waiting else events.INVALID_SPEC
            outcome.events.append(Event("Warning", event_reason, message))
        outcome.status = _not_ready(status, generation, now, reason, message)
        return outcome


def _try_again(outcome: ReconcileOutcome, error: KubeError) -> ReconcileOutcome:
    """A write that got no answer, or that the API server asked to be made later (429): nothing
    was refused, so neither `Ready` nor a Warning Event says anything of it — a fleet's worth of
    them would be as many writes more to a server asking for fewer. The pass is tried again,
    after the server's `Retry-After`; the writes that went through keep their Events."""
    outcome.retry_error = f"applying children: {error}"
    outcome.retry_after_s = error.retry_after_s
    return outcome


def _not_ready(
    status: dict[str, Any], generation: int | None, now: datetime, reason: str, message: str
) -> dict[str, Any]:
    """The status fields that say `Ready=False` for `reason` and nothing else, as changed."""
    wanted = {
        "observedGeneration": generation,
        "conditions": conditions.set_condition(
            status.get("conditions"),
            type_=conditions.READY,
            status="False",
            reason=reason,
            message=message,
            generation=generation,
            now=now,
        ),
    }
    return _changed(status, wanted)


def _with_routes(
    exposure: dict[str, Any] | None, exposed: Exposure | None
) -> dict[str, Any] | None:
    """`status.exposure` with each route's word from the Gateway (`kubectl describe`)."""
    if exposure is None or exposed is None:
        return exposure
    return {**exposure, "routes": exposed.routes}


def observed_namespace(
    observed: dict[ResourceKind, dict[str, Any] | None], kind: ResourceKind
) -> str:
    obj = observed[kind]
    assert obj is not None
    return str(obj["metadata"]["namespace"])


def _child_keys(namespace: str, name: str) -> set[tuple[str, str, str]]:
    """The (kind, namespace, name) of each child of the InferenceService `name`."""
    named = {SECRET: secret_name(name), CONFIGMAP: configmap_name(name)}
    return {(kind.kind, namespace, named.get(kind, name)) for kind in CHILD_KINDS}
