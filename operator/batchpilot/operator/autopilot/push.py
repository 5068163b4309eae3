"""Tells running runtime pods new settings through their admin endpoint, because a mounted
ConfigMap takes up to a minute to reach a pod: the batch settings (the autopilot's decisions) and
the access document (allowed key ids and quotas: the reconciler sends it when the spec's quotas or
the number of serving replicas change, `AccessPusher`) — and asks the pods that were serving to
retire their connections when a replica joins them (`ConnectionRebalancer`)."""

from __future__ import annotations

import hashlib
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from typing import Protocol

from batchpilot.operator.autopilot.acting import (
    Pods,
    PushBatching,
    admin_token,
    not_sent,
    send_each,
)
from batchpilot.operator.children.common import Owner
from batchpilot.operator.events import Event
from batchpilot.operator.kube import Kube, KubeError

log = logging.getLogger(__name__)


def _put(
    endpoint: str, path: str, *, token: str, document: str, timeout_s: float, method: str = "PUT"
) -> None:
    request = urllib.request.Request(
        f"http://{endpoint}{path}",
        data=document.encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if response.status != 200:
            raise urllib.error.HTTPError(
                request.full_url, response.status, "unexpected status", response.headers, None
            )


def push_batching(endpoint: str, *, token: str, document: str, timeout_s: float = 2.0) -> None:
    """PUT the batching document to `http://IP:PORT/admin/batching`; raises on failure."""
    _put(endpoint, "/admin/batching", token=token, document=document, timeout_s=timeout_s)


def push_access(endpoint: str, *, token: str, document: str, timeout_s: float = 2.0) -> None:
    """PUT the access document to `http://IP:PORT/admin/access`; raises on failure."""
    _put(endpoint, "/admin/access", token=token, document=document, timeout_s=timeout_s)


def retire_connections(endpoint: str, *, token: str, document: str, timeout_s: float = 2.0) -> None:
    """POST to `http://IP:PORT/admin/connections/retire` (`document` is not used); raises on
    failure."""
    _put(
        endpoint,
        "/admin/connections/retire",
        token=token,
        document="",
        timeout_s=timeout_s,
        method="POST",
    )


PushDocument = PushBatching
"""PUT a document to one pod (`IP:PORT`), raising on failure: the batching and the access
document alike."""


class AccessPusher:
    """Sends an InferenceService's access document to each of its ready pods that was not given
    that document yet: after a spec change, after the number of serving replicas changed (each
    replica's share did), and to a pod that has just become ready. Called by every reconcile
    pass; a pass with nothing new sends nothing.

    What each pod (by its admin endpoint) was given is remembered, as a digest, in memory: after
    the operator restarts, each pod is sent the document once more. A pod that could not be
    reached is not tried again until the document changes: it reads the same document from the
    ConfigMap within a minute, and a pass never fails for it (a Warning Event says so)."""

    def __init__(self, kube: Kube, *, pods: Pods, push: PushDocument = push_access) -> None:
        self._kube = kube
        self._pods = pods
        self._push = push
        self._given: dict[tuple[str, str], dict[str, bytes]] = {}

    def __call__(self, owner: Owner, document: str | None) -> list[Event]:
        """Send `document` (None: the InferenceService has no `spec.auth`: forget its pods)."""
        key = (owner.namespace, owner.name)
        if document is None:
            self.forget(*key)
            return []
        try:
            endpoints = self._pods.ready_pod_endpoints(owner.namespace, owner.selector)
        except KubeError as exc:
            log.warning("listing pods of %s/%s failed: %s", owner.namespace, owner.name, exc)
            return []
        digest = hashlib.sha256(document.encode()).digest()
        given = {  # the pods that are gone are forgotten
            endpoint: sent
            for endpoint, sent in self._given.get(key, {}).items()
            if endpoint in endpoints
        }
        todo = [endpoint for endpoint in endpoints if given.get(endpoint) != digest]
        self._given[key] = given
        if not todo:
            return []
        token = admin_token(self._kube, owner)
        if token is None:  # the pods have no token either; the ConfigMap reaches them
            return []
        failed = send_each(self._push, todo, token=token, document=document)
        given.update(dict.fromkeys(todo, digest))
        if not failed:
            return []
        return [
            not_sent(
                "the access document (allowed keys, quotas) could not be sent to",
                failed,
                "they will read it from the ConfigMap",
            )
        ]

    def forget(self, namespace: str, name: str) -> None:
        """Drop what was given to an InferenceService's pods (it was deleted, or has no auth)."""
        self._given.pop((namespace, name), None)

    def forget_all_but(self, services: Collection[tuple[str, str]]) -> None:
        """Keep what was given to the pods of `services` (namespace, name) alone."""
        kept = set(services)
        for key in [key for key in list(self._given) if key not in kept]:
            self._given.pop(key, None)

    def __len__(self) -> int:
        """InferenceServices whose pods' documents are remembered."""
        return len(self._given)


JOINED_S = 60.0
"""With nothing remembered of a service (the operator started, or leads now), a pod that became
ready this recently joined the others: a takeover (the lease's 15 s, kopf's start) is over well
within it, and a replica that joined longer ago has had its share of connections by their age."""


class ReadyPods(Protocol):
    def ready_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, float | None]: ...


class ConnectionRebalancer:
    """When a replica becomes ready beside replicas that were serving, asks those to retire
    their HTTP connections: each one's next answer says `Connection: close`, and its client
    reconnects through the Service.

    A Service balances connections, not requests, so clients that keep their connections (a
    pool, a gRPC channel) stay on the replicas that were there when they connected, and a replica
    the autopilot added to relieve them would get only new connections: the overload it was added
    for would last until the clients' connections retire by age (`--max-connection-age-s`, 30 s
    by default). Asked, they reconnect within a few seconds (the runtime retires each 1 to 3 s
    later, once the Service's endpoints have the new replica), spread over every ready replica.
    gRPC channels still move by age alone (the runtime cannot send GOAWAY to one connection).

    Called by every reconcile pass, which a pod's readiness changing brings. What it remembers is
    each InferenceService's ready pods (by admin endpoint), in memory. Where it remembers nothing
    (after the operator starts, or takes the lead), the pods that became ready in the last
    `JOINED_S` (their Ready condition's time) joined the others, so a replica that joined while
    no operator led is not left to the connections' age. A pod that cannot be reached is only
    logged: its connections still retire by age."""

    def __init__(
        self,
        kube: Kube,
        *,
        pods: ReadyPods,
        post: PushDocument = retire_connections,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._pods = pods
        self._post = post
        self._clock = clock
        self._ready: dict[tuple[str, str], frozenset[str]] = {}

    def __call__(self, owner: Owner) -> None:
        key = (owner.namespace, owner.name)
        try:
            pods = self._pods.ready_pods(owner.namespace, owner.selector)
        except KubeError as exc:
            log.warning("listing pods of %s/%s failed: %s", owner.namespace, owner.name, exc)
            return
        ready = frozenset(pods)
        before = self._ready.get(key)
        self._ready[key] = ready
        if before is None:
            now = self._clock()
            joined = {e for e, at in pods.items() if at is not None and now - at < JOINED_S}
        else:
            joined = set(ready - before)
        serving = sorted(ready - joined)
        if not joined or not serving:
            return
        token = admin_token(self._kube, owner)
        if token is None:
            return
        log.info(
            "%s/%s: %d replica(s) joined; asking %d serving to retire their connections",
            owner.namespace,
            owner.name,
            len(joined),
            len(serving),
        )
        failed = send_each(self._post, serving, token=token, document="")
        if failed:
            log.info("connections not asked to retire (they retire by age): %s", ", ".join(failed))

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is remembered of an InferenceService's pods (it was deleted)."""
        self._ready.pop((namespace, name), None)

    def forget_all_but(self, services: Collection[tuple[str, str]]) -> None:
        """Keep what is remembered of the pods of `services` (namespace, name) alone."""
        kept = set(services)
        for key in [key for key in list(self._ready) if key not in kept]:
            self._ready.pop(key, None)

    def __len__(self) -> int:
        return len(self._ready)
