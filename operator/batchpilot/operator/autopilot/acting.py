"""Acting on a decision, in mode `auto`: replicas on the Deployment, batch settings in the
ConfigMap and at every ready pod, and pods of slow replicas deleted.

- replicas: patch the Deployment's `spec.replicas` (the field reconcile leaves to the autopilot);
- batch settings: write them into the batching ConfigMap (what new pods start with, and what
  running pods re-read within a minute) and PUT them to every ready pod's admin endpoint, so
  they take effect within seconds. A pod that cannot be told is reported, not fatal: the
  ConfigMap reaches it anyway. A pod that becomes ready later is sent them too (`catch_up`):
  one that was starting when they changed read the file when its volume was set up, and the
  kubelet refreshes a mounted ConfigMap only every minute or so — the burst's new replicas
  would serve their first minute with the settings of before it;
- slow replicas (`stragglers`): delete the pod, once it is read back as this service's (the
  name came from a Prometheus label) and not already going; the ReplicaSet starts another. The
  Event names its node: slowness that comes back there points at the node.

Its edges are small interfaces: `Kube` for the Deployment, ConfigMap and Secret, `Pods` for the
ready pods' endpoints, `PushBatching` for the PUT.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from batchpilot.operator import events
from batchpilot.operator.autopilot.policy import Decision, InForce
from batchpilot.operator.children.common import ISVC_LABEL, Owner
from batchpilot.operator.children.configmap import batching_document, from_spec
from batchpilot.operator.children.secret import token_in
from batchpilot.operator.events import Event
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, POD, SECRET
from batchpilot.operator.kube import Kube, KubeError

log = logging.getLogger(__name__)


class PushBatching(Protocol):
    def __call__(self, endpoint: str, *, token: str, document: str) -> None:
        """PUT the batching document to one pod (`IP:PORT`); raises on failure."""
        ...


class Pods(Protocol):
    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class _Given:
    """The batching document a service's ready pods were given, and which pods they were."""

    document: str
    endpoints: frozenset[str]
    ready: int | None
    """The Deployment's ready replicas when the pods were listed (None: list them next tick)."""


class Actuator:
    """`apply(...)`: a decision's replicas and batch settings, and the default deadline;
    `catch_up(...)`: those settings to pods that became ready since."""

    def __init__(self, kube: Kube, *, pods: Pods, push: PushBatching) -> None:
        self._kube = kube
        self._pods = pods
        self._push = push
        self._given: dict[tuple[str, str], _Given] = {}
        self._lock = threading.Lock()

    def apply(
        self,
        owner: Owner,
        current: InForce,
        decision: Decision,
        *,
        deadline_ms: float,
        in_force_deadline_ms: float | None,
        replicas_written: Callable[[], None] = lambda: None,
    ) -> list[Event]:
        """Apply the decision, and the default deadline (which follows the SLA and the latency
        learned outside the batcher, whatever the decision). `replicas_written()` once the
        Deployment has the decision's replicas, before the batch settings are written (which
        may fail, the replicas staying written)."""
        replaced = [self._replace(owner, pod, decision.reason) for pod in decision.replace]
        said = [event for event in replaced if event is not None]
        if decision.replicas != current.replicas:
            self._kube.patch(
                DEPLOYMENT, owner.namespace, owner.name, {"spec": {"replicas": decision.replicas}}
            )
        replicas_written()
        wanted = (decision.batch_size, decision.max_queue_delay_s, deadline_ms)
        if wanted != (current.batch_size, current.max_queue_delay_s, in_force_deadline_ms):
            settings = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
            document = self.document(owner, settings, deadline_ms=deadline_ms)
            self._kube.patch(
                CONFIGMAP,
                owner.namespace,
                owner.configmap_name,
                {"data": {"batching.json": document}},
            )
            return said + self._push_to_pods(owner, document)
        return said

    def catch_up(
        self, owner: Owner, current: InForce, *, deadline_ms: float, ready: int
    ) -> list[Event]:
        """Send the batch settings in force to the service's ready pods that were not given
        them: those that became ready since they were last sent. Lists the pods only when the
        Deployment's ready count moved; a service first seen (an operator that has just started
        or taken over) is taken as told — its pods have had the ConfigMap since they started."""
        key = (owner.namespace, owner.name)
        document = self.document(owner, current, deadline_ms=deadline_ms)
        with self._lock:
            given = self._given.get(key)
        if given is not None and given.document == document and given.ready == ready:
            return []
        endpoints = self._ready_endpoints(owner)
        if endpoints is None:
            return []
        told = given.endpoints if given is not None and given.document == document else None
        with self._lock:
            self._given[key] = _Given(document, frozenset(endpoints), ready)
        new = [] if told is None else [e for e in endpoints if e not in told]
        if not new:
            return []
        return self._push_to_pods(owner, document, endpoints=new)

    def forget(self, keep: Iterable[tuple[str, str]]) -> None:
        """Drop what was given to the pods of every service but `keep`."""
        kept = set(keep)
        with self._lock:
            for key in [k for k in self._given if k not in kept]:
                del self._given[key]

    @staticmethod
    def document(owner: Owner, settings: InForce, *, deadline_ms: float) -> str:
        return batching_document(
            batch_size=settings.batch_size,
            max_queue_delay_ms=round(settings.max_queue_delay_s * 1e3, 3),
            deadline_ms=deadline_ms,
            **from_spec(owner),
        )

    def _replace(self, owner: Owner, name: str, reason: str) -> Event | None:
        """Delete the pod `name` if it is one of this service's and not already going."""
        try:
            pod = self._kube.get(POD, owner.namespace, name)
            if pod is None:
                return None  # gone already: the ReplicaSet has its replacement
            meta = pod.get("metadata", {})
            if (meta.get("labels") or {}).get(ISVC_LABEL) != owner.name:
                log.warning("not replacing pod %s/%s: not %s's", owner.namespace, name, owner.name)
                return None
            if meta.get("deletionTimestamp"):
                return None
            self._kube.delete(POD, owner.namespace, name)
        except KubeError as exc:
            log.warning("replacing pod %s/%s failed: %s", owner.namespace, name, exc)
            return Event("Warning", events.APPLY_FAILED, f"deleting slow pod {name} failed: {exc}")
        node = pod.get("spec", {}).get("nodeName") or "none"
        # The decision's words for it: "pod NAME (1.9× for 30 s)".
        _, found, rest = reason.partition(f"pod {name} (")
        how = f" ({rest.split(')', 1)[0]})" if found else ""
        return Event(
            "Normal",
            events.REPLACED_SLOW_REPLICA,
            f"deleted pod {name} on node {node}: its batches ran slower than its peers'{how}; "
            "the ReplicaSet starts another",
        )

    def _ready_endpoints(self, owner: Owner) -> list[str] | None:
        """The service's ready pods' admin endpoints; None where they could not be listed."""
        try:
            return self._pods.ready_pod_endpoints(owner.namespace, {ISVC_LABEL: owner.name})
        except KubeError as exc:
            log.warning("listing pods of %s/%s failed: %s", owner.namespace, owner.name, exc)
            return None

    def _push_to_pods(
        self, owner: Owner, document: str, *, endpoints: list[str] | None = None
    ) -> list[Event]:
        """Send `document` to `endpoints` (default: every ready pod, remembered as given, to be
        listed again at the next `catch_up`)."""
        token = admin_token(self._kube, owner)
        if token is None:
            return []
        if endpoints is None:
            endpoints = self._ready_endpoints(owner)
            if endpoints is None:
                return []
            with self._lock:
                self._given[(owner.namespace, owner.name)] = _Given(
                    document, frozenset(endpoints), None
                )
        failed = send_each(self._push, endpoints, token=token, document=document)
        if not failed:
            return []
        return [
            not_sent(
                "batch settings could not be pushed to",
                failed,
                "they will pick them up from the ConfigMap",
            )
        ]


def admin_token(kube: Kube, owner: Owner) -> str | None:
    """The token the service's pods take on their admin endpoint (its Secret, which the
    reconciler writes); None until there is one, and then the pods have none either."""
    secret = kube.get(SECRET, owner.namespace, owner.secret_name)
    return token_in(secret) if secret is not None else None


def send_each(push: PushBatching, endpoints: list[str], *, token: str, document: str) -> list[str]:
    """`document` to each pod's admin endpoint; the ones that failed, as `IP:PORT (reason)`.
    Any failure is only reported: the ConfigMap still gets the document to the pod."""
    failed = []
    for endpoint in endpoints:
        try:
            push(endpoint, token=token, document=document)
        except Exception as exc:
            failed.append(f"{endpoint} ({exc})")
    return failed


def not_sent(what: str, failed: list[str], then: str) -> Event:
    """The Warning for pods a document could not be sent to."""
    return Event("Warning", events.APPLY_FAILED, f"{what} {', '.join(failed)}; {then}")
