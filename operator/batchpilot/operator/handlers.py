"""kopf glue: every trigger runs the same level-triggered reconcile pass.

Triggers: the InferenceService's create/update/resume, a periodic timer (drift that no event
reports), and events of the children it owns (someone edits or deletes a Deployment; a pod
becomes ready). Handlers parse nothing and decide nothing: `Reconciler` does, and they turn its
outcome into a status patch, Events and kopf's retry vocabulary.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from batchpilot.operator.autopilot.pilot import Autopilot, TickResult
from batchpilot.operator.autopilot.prometheus import PrometheusObserver, Seasonality, http_query
from batchpilot.operator.autopilot.push import push_batching
from batchpilot.operator.children.common import ISVC_LABEL, MANAGED_BY
from batchpilot.operator.kinds import INFERENCESERVICE
from batchpilot.operator.kube import KubeClient, KubeError
from batchpilot.operator.reconciler import ReconcileOutcome, Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
ANNOTATION_PREFIX = "batchpilot.io"
_SETTINGS = OperatorSettings()
CHILD_FILTER: dict[str, Any] = {
    "app.kubernetes.io/managed-by": MANAGED_BY,
    ISVC_LABEL: kopf.PRESENT,
}


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG as it is now (kopf's client-based login
    reads it once, at import)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    # Events come from the reconciler and the autopilot (kopf.event); of kopf's own log lines
    # only warnings and errors (a handler that failed) become Events too.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    kube = KubeClient.from_environment()
    memo.reconciler = Reconciler(kube, _SETTINGS)
    observer = PrometheusObserver(
        http_query(_SETTINGS.prometheus_url),
        window_s=_SETTINGS.metrics_window_seconds,
        recent_s=_SETTINGS.recent_window_seconds,
        seasonality=(
            Seasonality(
                period_s=_SETTINGS.seasonal_period_seconds,
                periods=_SETTINGS.seasonal_periods,
                lookahead_s=_SETTINGS.seasonal_lookahead_seconds,
            )
            if _SETTINGS.seasonal_period_seconds
            else None
        ),
        utilization=_SETTINGS.utilization_source,
        clock=time.time,
    )
    memo.autopilot = Autopilot(
        kube,
        observe=observer.observe,
        pods=kube,
        push=push_batching,
    )


def _post(body: Any, outcome: ReconcileOutcome) -> None:
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _finish(outcome: ReconcileOutcome) -> None:
    if outcome.permanent_error is not None:
        raise kopf.PermanentError(outcome.permanent_error)
    if outcome.retry_error is not None:
        raise kopf.TemporaryError(outcome.retry_error, delay=10)


def _reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> ReconcileOutcome:
    outcome: ReconcileOutcome = memo.reconciler.reconcile(_plain(body))
    if outcome.status:
        patch.status.update(outcome.status)
    _post(body, outcome)
    return outcome


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _finish(_reconcile(body, patch, memo))


@kopf.timer(
    GROUP,
    VERSION,
    PLURAL,
    interval=_SETTINGS.reconcile_interval_seconds,
    initial_delay=_SETTINGS.reconcile_interval_seconds,
)
def reconcile_periodically(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Level-triggered safety net: the same pass, and failures wait for the next period."""
    _reconcile(body, patch, memo)


@kopf.timer(
    GROUP,
    VERSION,
    PLURAL,
    interval=_SETTINGS.autopilot_interval_seconds,
    initial_delay=_SETTINGS.autopilot_interval_seconds,
)
def autopilot(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Observe, decide, act, explain — once per interval per InferenceService."""
    result: TickResult = memo.autopilot.tick(_plain(body))
    current = dict(body.status)
    changed = {k: v for k, v in result.status.items() if current.get(k) != v}
    if changed:
        patch.status.update(changed)
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def deleted(name: str, namespace: str | None, **_: Any) -> None:
    log.info("InferenceService %s/%s deleted; its children go with it", namespace, name)


def _on_child_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A child changed: reconcile its owner, so drift is restored and status follows."""
    obj = event["object"]
    meta = obj.get("metadata", {})
    owner_name = meta.get("labels", {}).get(ISVC_LABEL)
    namespace = meta.get("namespace")
    if not owner_name or not namespace or "reconciler" not in memo:
        return
    reconciler: Reconciler = memo.reconciler
    kube = reconciler.kube
    try:
        owner = kube.get(INFERENCESERVICE, namespace, owner_name)
        if owner is None or owner["metadata"].get("deletionTimestamp"):
            return
        outcome = reconciler.reconcile(owner)
        if outcome.status:
            kube.patch(
                INFERENCESERVICE,
                namespace,
                owner_name,
                {"status": outcome.status},
                subresource="status",
            )
    except KubeError as exc:
        log.warning("reconciling %s/%s after a child event failed: %s", namespace, owner_name, exc)
        return
    _post(owner, outcome)


for _group, _version, _plural in (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("", "v1", "secrets"),
    ("policy", "v1", "poddisruptionbudgets"),
):
    kopf.on.event(_group, _version, _plural, labels=CHILD_FILTER, id=f"child-{_plural}")(
        _on_child_event
    )


def _plain(body: kopf.Body) -> dict[str, Any]:
    return {
        "metadata": dict(body.metadata),
        "spec": dict(body.spec),
        "status": dict(body.status),
    }
