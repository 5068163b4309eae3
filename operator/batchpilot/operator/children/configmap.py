"""The batching ConfigMap: the batch settings new pods start with and running pods re-read.

Its batch settings are the autopilot's (the reconciler passes in the settings in force) and its
default deadline follows the SLA (`deadline.py`); it also carries the SLA and the objective
themselves, which the runtime exports as gauges so that Prometheus can judge the service against
them (the chart's burn-rate alerts), and in mode `auto` the burst size (`from_spec`). The
runtime watches the mounted file, and the autopilot also tells ready pods directly through their
admin endpoint, because a mounted ConfigMap takes up to a minute to reach a pod. It also carries
the pipeline document (spec.pipeline), which the runtime reads once at start: the Deployment's
pod template holds its hash, so a changed pipeline rolls the pods. With `spec.auth`, the access
document (allowed key ids, quotas; `children.apikeys`) rides along, re-read like the batch
settings and, like them, also sent to the ready pods' admin port. It is one replica's share of
service-wide limits, so it changes whenever the number of serving replicas does: the pod
template holds no hash of it, or every scale event would restart the service. The documents are
`batchpilot.api`'s, the contract the runtime reads them by.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from batchpilot.api.batching import STARTUP_TIMING_MAX_ROWS, BatchingDocument
from batchpilot.operator.children.apikeys import access_document
from batchpilot.operator.children.common import ACCESS_FILE, BATCHING_FILE, PIPELINE_FILE, Owner


class Batching(NamedTuple):
    """The batching document's values."""

    batch_size: int
    max_queue_delay_ms: float
    deadline_ms: float | None
    """None: a document without one (written by an older operator)."""


def batching_document(
    *,
    batch_size: int,
    max_queue_delay_ms: float,
    deadline_ms: float,
    sla_ms: float | None = None,
    objective_percent: float | None = None,
    burst_batch_size: int | None = None,
    calibration_rows: int | None = None,
) -> str:
    """The batching document (`batchpilot.api.batching`) as the ConfigMap and the pods get it."""
    doc: BatchingDocument = {
        "maxBatchSize": int(batch_size),
        "maxQueueDelayMs": float(max_queue_delay_ms),
        "deadlineMs": float(deadline_ms),
    }
    if sla_ms is not None:
        doc["slaMs"] = float(sla_ms)
    if objective_percent is not None:
        doc["objectivePercent"] = float(objective_percent)
    if burst_batch_size is not None:
        doc["burstBatchSize"] = int(burst_batch_size)
    if calibration_rows is not None:
        doc["calibrationRows"] = int(calibration_rows)
    return json.dumps(doc, sort_keys=True)


def from_spec(owner: Owner) -> dict[str, Any]:
    """What the batching document carries from the spec rather than the autopilot: the SLA and
    objective for the runtime's gauges, and in mode `auto` the burst size, `scaling.
    maxBatchSize`: the largest batch a backlog of more rows than the limit in force may run at
    once, the ceiling the spec allows the autopilot. In modes `recommend` and `off` the batch
    size is the spec's as written, and no batch runs beyond it; there the rows a new pod times
    at start-up are that ceiling all the same, `STARTUP_TIMING_MAX_ROWS` at most (in the
    document rather than the pod's arguments, so that changing it rolls no pod; in mode `auto`
    the pod times up to the burst size, the same rows, and a runtime older than the key is not
    given it)."""
    sla, scaling = owner.spec.sla, owner.spec.scaling
    auto = scaling.mode == "auto"
    return {
        "sla_ms": sla.latency_p99_ms,
        "objective_percent": sla.objective_percent,
        "burst_batch_size": scaling.max_batch_size if auto else None,
        "calibration_rows": None if auto else min(scaling.max_batch_size, STARTUP_TIMING_MAX_ROWS),
    }


def pipeline_document(owner: Owner) -> str | None:
    pipeline = owner.spec.pipeline
    if pipeline is None:
        return None
    return json.dumps(
        pipeline.model_dump(by_alias=True, exclude_unset=True, mode="json"), sort_keys=True
    )


def pipeline_hash(owner: Owner) -> str | None:
    """A short hash of the pipeline document, for the pod template: changed → pods roll."""
    document = pipeline_document(owner)
    return None if document is None else hashlib.sha256(document.encode()).hexdigest()[:16]


SPEC_BATCHING = "batchpilot.io/spec-batching"
"""The ConfigMap's annotation of the spec's `batching` when it was last written
(`spec_batching`): outside mode `auto` the spec's batch settings apply once it is edited, and
until then those in force stay (`plan.owned_values`)."""


def spec_batching(owner: Owner) -> str:
    """The spec's `batching`, as `SPEC_BATCHING` keeps it: "batch size/queue delay ms"."""
    batching = owner.spec.batching
    return f"{batching.batch_size}/{batching.max_queue_delay_ms:g}"


def build_configmap(
    owner: Owner,
    *,
    batch_size: int,
    max_queue_delay_ms: float,
    deadline_ms: float,
    serving_replicas: int = 1,
) -> dict[str, Any]:
    """The ConfigMap; `serving_replicas`: the replicas that share service-wide quotas
    (`quota_share.serving_replicas`)."""
    data = {
        BATCHING_FILE: batching_document(
            batch_size=batch_size,
            max_queue_delay_ms=max_queue_delay_ms,
            deadline_ms=deadline_ms,
            **from_spec(owner),
        )
    }
    if (pipeline := pipeline_document(owner)) is not None:
        data[PIPELINE_FILE] = pipeline
    if (access := access_document(owner, serving_replicas=serving_replicas)) is not None:
        data[ACCESS_FILE] = access  # re-read by running pods: quotas change without a restart
    metadata = owner.metadata(owner.configmap_name)
    metadata["annotations"] = {SPEC_BATCHING: spec_batching(owner)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def batching_edited(configmap: dict[str, Any], owner: Owner) -> bool:
    """Whether the spec's `batching` differs from the one the ConfigMap was last written with
    (`SPEC_BATCHING`); a ConfigMap without the annotation (an older operator's) says it does."""
    annotations = (configmap.get("metadata") or {}).get("annotations") or {}
    return annotations.get(SPEC_BATCHING) != spec_batching(owner)


def batching_in(configmap: dict[str, Any]) -> Batching | None:
    """The batching recorded in an existing ConfigMap, if readable."""
    try:
        doc: BatchingDocument = json.loads(configmap["data"][BATCHING_FILE])
        deadline = doc.get("deadlineMs")
        return Batching(
            int(doc["maxBatchSize"]),
            float(doc["maxQueueDelayMs"]),
            None if deadline is None else float(deadline),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
