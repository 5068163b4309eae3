"""The one module that talks to the Kubernetes API for the operator's own reads and writes.

kopf watches and patches the InferenceService itself; everything else — children, the status
of an InferenceService outside a handler — goes through `KubeClient`. Higher layers see plain
dicts (the API's JSON) and the small `Kube` protocol, so tests can count or fake calls here.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from batchpilot.operator.kinds import KINDS, POD, ResourceKind

log = logging.getLogger(__name__)

UNANSWERED = 0
"""`KubeError.status` when no answer came: the connection failed, was reset or timed out."""
API_FAILED = "batchpilot_api_failed"
"""The attribute of the client's DEBUG record of a request the API server failed as it does when
it is unwell (`KubeError.outage`): the `KubeError`. The operator's log reads it (outage_log.py)."""
API_ANSWERED = "batchpilot_api_answered"
"""The attribute (True) of the client's DEBUG record of the first answer after such a failure."""
LIST_PAGE = 500
"""Objects a list asks for at once (`limit`), the rest by `continue`: client-go's pager's page."""
_asking: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "batchpilot_kube_asking", default=False
)


def asking() -> bool:
    """Whether this thread is in a request of `KubeClient` to the API server: what urllib3 logs
    meanwhile — its retries of the request's connection (`own_retries`) — is about the API
    server. The operator's log reads it (outage_log.py)."""
    return _asking.get()


class KubeError(Exception):
    """A request the API server refused, or did not answer (`status` 0). `retry_after_s`: how
    long it asked to be left alone (`Retry-After`), when it said."""

    def __init__(self, status: int, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status}: {message}" if status != UNANSWERED else message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def transient(self) -> bool:
        """Nothing was refused: no answer came (a write may or may not have happened), or the API
        server asked to be asked again later (429: API Priority and Fairness). Try again, after
        `retry_after_s` when it said; nothing to report as the API server's verdict."""
        return self.status in (UNANSWERED, 429)

    @property
    def outage(self) -> bool:
        """The API server is unwell, not refusing: no answer came, it is overloaded (429) or it
        failed (5xx). What any request may meet in an outage, not a verdict on this one."""
        return self.status in (UNANSWERED, 429) or self.status >= 500


class WriteFence:
    """Whether this process may still write to the API server. A leader that lost its Lease
    stops kopf, but the autopilot's round and kopf's handler threads run on until they notice,
    and `stop_grace_s` later the process ends: writes sent meanwhile could land after a standby
    took over — two operators writing one service. Closed at the loss (`leading`), every write
    of every client is refused from then on, unsent; reads go on."""

    def __init__(self) -> None:
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()


WRITES = WriteFence()
"""This process's fence (`WriteFence`)."""


class Kube(Protocol):
    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]: ...

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> None: ...


class KubeClient:
    """`Kube` over the official client's REST layer (kubeconfig or in-cluster credentials).

    Every failure is a `KubeError`, a request that got no answer included (status 0). An answer
    with `Retry-After` (429 from API Priority and Fairness, a 5xx from a server going down) is
    obeyed by the whole client: until then every call fails at once with a 429 of its own,
    without a request — the passes that follow (a child's event, the periodic pass, another
    service's) would otherwise ask again at once, as client-go's clients do not."""

    def __init__(
        self,
        api_client: Any,
        *,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        fence: WriteFence = WRITES,
    ) -> None:
        self._api = api_client
        self._fence = fence
        self._timeout_s = timeout_s
        self._clock = clock
        self._quiet_until = 0.0
        self._quiet_lock = threading.Lock()
        self._unwell = False
        """Whether the last request the API server treated was failed as `KubeError.outage`."""
        self._unwell_lock = threading.Lock()

    @classmethod
    def from_environment(
        cls, *, kubeconfig: str | None = None, timeout_s: float = 10.0, connections: int = 0
    ) -> KubeClient:
        """A client from the pod's service account, `kubeconfig` or $KUBECONFIG. `connections`:
        keep this many connections to the API server open (0: the client's default, five a
        core). Every thread that calls at once needs one; urllib3 closes what the pool cannot
        keep ("Connection pool is full, discarding connection"), and the next call opens a new
        one, its TLS handshake included."""
        from kubernetes import client, config

        kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
        if kubeconfig is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
        else:  # read now: the client reads $KUBECONFIG once, when it is imported
            config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        configuration = client.Configuration.get_default_copy()
        if connections:
            configuration.connection_pool_maxsize = connections
        return cls(client.ApiClient(own_retries(configuration)), timeout_s=timeout_s)

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        if method != "GET" and self._fence.closed:
            raise KubeError(UNANSWERED, "not sent: this operator no longer leads")
        wait_s = self._quiet_until - self._clock()
        if wait_s > 0:
            raise KubeError(
                429,
                f"not asked: the API server asked to wait {wait_s:.1f} s more (Retry-After)",
                retry_after_s=wait_s,
            )
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = self._api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        asking = _asking.set(True)
        try:
            response = self._api.call_api(*params[:4], _request_timeout=self._timeout_s)
            response.read()
        except ApiException as exc:
            error = KubeError(exc.status or 0, _reason(exc.body) or str(exc.reason))
            self._heard(method, path, error)
            raise error from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # Reset, refused, timed out: the request may have been carried out, or not.
            error = KubeError(UNANSWERED, f"no answer from the API server: {_unanswered(exc)}")
            self._heard(method, path, error)
            raise error from None
        finally:
            _asking.reset(asking)
        data = response.data
        if response.status >= 400 and response.status != 404:
            retry_after_s = _retry_after_s(response.headers, data)
            if retry_after_s is not None and (response.status == 429 or response.status >= 500):
                with self._quiet_lock:
                    self._quiet_until = max(self._quiet_until, self._clock() + retry_after_s)
            error = KubeError(
                response.status, _reason(data) or "request failed", retry_after_s=retry_after_s
            )
            self._heard(method, path, error)
            raise error
        self._heard(method, path, None)
        if response.status == 404:
            return None
        return json.loads(data) if data else {}

    def _heard(self, method: str, path: str, error: KubeError | None) -> None:
        """Tell the log how the API server treated a request, for the outage statements
        (outage_log.py): each request it failed as `KubeError.outage`, and the first answer
        after such a failure — a refusal (4xx, 404 too) is an answer."""
        with self._unwell_lock:
            if error is not None and error.outage:
                self._unwell = True
                log.debug("%s %s: %s", method, path, error, extra={API_FAILED: error})
            elif self._unwell:
                self._unwell = False
                log.debug("%s %s: answered again", method, path, extra={API_ANSWERED: True})

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", f"{kind.collection(namespace)}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = KINDS[obj["kind"]]
        result = self._call("POST", kind.collection(obj["metadata"]["namespace"]), obj)
        if result is None:  # the collection is not there: the server does not serve the kind
            raise KubeError(404, f"the server does not serve {kind.plural} ({kind.group_version})")
        return result

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = KINDS[obj["kind"]]
        meta = obj["metadata"]
        result = self._call("PUT", f"{kind.collection(meta['namespace'])}/{meta['name']}", obj)
        if result is None:
            raise KubeError(404, f"{kind.kind} {meta['name']} is gone")
        return result

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        path = f"{kind.collection(namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        result = self._call("PATCH", path, patch, content_type="application/merge-patch+json")
        if result is None:
            raise KubeError(404, f"{kind.kind} {name} is gone")
        return result

    def list_objects(
        self, kind: ResourceKind, namespace: str | None, selector: Mapping[str, str | None]
    ) -> list[dict[str, Any]]:
        """The objects of `kind` in `namespace` (None: every namespace) with every label of
        `selector` (a value of None: the label, whatever its value), a page of `LIST_PAGE` at a
        time (each page a request an API server answers without holding its whole list in one
        response)."""
        items: list[dict[str, Any]] = []
        labels = ",".join(k if v is None else f"{k}={v}" for k, v in sorted(selector.items()))
        follow = ""
        while True:
            params = {"limit": str(LIST_PAGE)}
            if labels:
                params["labelSelector"] = labels
            if follow:
                params["continue"] = follow
            result = self._call(
                "GET", f"{kind.collection(namespace)}?{urllib.parse.urlencode(params)}"
            )
            items.extend((result or {}).get("items", []))
            follow = ((result or {}).get("metadata") or {}).get("continue") or ""
            if not follow:
                return items

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return ready_pod_endpoints(self.list_objects(POD, namespace, selector))

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, float | None]:
        return ready_pods(self.list_objects(POD, namespace, selector))

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> None:
        try:
            self._call("DELETE", f"{kind.collection(namespace)}/{name}")
        except KubeError as exc:
            if exc.status != 404:
                raise


def _unanswered(exc: BaseException) -> str:
    """Why a request got no answer, in the words of its innermost cause ("HTTPConnection(host=…,
    port=…): Failed to establish a new connection: [Errno 111] Connection refused"): urllib3
    wraps it in the pool's "Max retries exceeded with url: …", which a log line cut short keeps
    instead."""
    reason: BaseException = exc
    while isinstance(getattr(reason, "reason", None), BaseException):
        reason = reason.reason  # type: ignore[attr-defined]
    return str(reason)


def own_retries(configuration: Any) -> Any:
    """The official client's `configuration`, its connections retried as urllib3 does by default
    but without urllib3 sleeping out a `Retry-After` in the calling thread: a kopf worker or the
    lease's renewer held for as long as the server says, then the answer read as a connection
    failure. `KubeClient` obeys `Retry-After` itself, for every call. A request whose answer
    did not come is sent again only where that cannot write twice (reads): urllib3 takes PUT and
    DELETE for idempotent, and a PUT the API server had taken, sent again, met its own
    resourceVersion changed — a conflict, after as many timeouts as tries — where the caller
    must hear that the write may have happened (`UNANSWERED`)."""
    from urllib3.util.retry import Retry

    configuration.retries = Retry(
        3,
        allowed_methods=frozenset({"GET", "HEAD", "OPTIONS"}),
        respect_retry_after_header=False,
    )
    return configuration


def ready_pod_endpoints(pods: list[dict[str, Any]], *, port_name: str = "admin") -> list[str]:
    """`IP:PORT` of the runtime in each pod whose Ready condition is True and that is not
    terminating; the port is the container port named `port_name` (the admin endpoint's, where
    the autopilot pushes batch settings, by default)."""
    return list(ready_pods(pods, port_name=port_name))


def ready_pods(pods: list[dict[str, Any]], *, port_name: str = "admin") -> dict[str, float | None]:
    """`ready_pod_endpoints`, each with when the pod became ready: its Ready condition's
    lastTransitionTime in seconds since the epoch (None where it has none)."""
    found: dict[str, float | None] = {}
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        status = pod.get("status", {})
        ready = next(
            (
                c
                for c in status.get("conditions", [])
                if c.get("type") == "Ready" and c.get("status") == "True"
            ),
            None,
        )
        port = next(
            (
                p.get("containerPort")
                for c in pod.get("spec", {}).get("containers", [])
                for p in c.get("ports", [])
                if p.get("name") == port_name
            ),
            None,
        )
        if ready is not None and status.get("podIP") and port:
            found[f"{status['podIP']}:{port}"] = _epoch_s(ready.get("lastTransitionTime"))
    return found


def _epoch_s(text: object) -> float | None:
    """An RFC 3339 time as the API server writes it, in seconds since the epoch; None if it is
    not one."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def _retry_after_s(headers: Any, data: Any) -> float | None:
    """The wait an answer asks for: its `Retry-After` header (seconds), else the Status body's
    `details.retryAfterSeconds`; None when it asks none."""
    value: Any = (headers or {}).get("Retry-After")
    if value is None:
        try:
            doc = json.loads(data)
        except (TypeError, ValueError):
            return None
        details = doc.get("details") if isinstance(doc, dict) else None
        value = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if not isinstance(value, str | int | float):
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: the API server sends seconds
    return seconds if seconds > 0 else None


def _reason(data: Any) -> str:
    try:
        doc = json.loads(data)
    except (TypeError, ValueError):
        return ""
    return str(doc.get("message", "")) if isinstance(doc, dict) else ""
