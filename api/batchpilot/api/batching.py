"""The batching settings document: the contract between the operator, which writes it, and the
runtime, which reads it.

`{"maxBatchSize": N, "maxQueueDelayMs": D, "deadlineMs": T, "slaMs": S, "objectivePercent": P,
"burstBatchSize": C, "calibrationRows": R}`
is what the operator writes into an InferenceService's ConfigMap (the file new pods mount and
running pods re-read) and PUTs to ready pods' admin endpoint; the runtime parses both
(`batchpilot.runtime.live_settings`) and shows the settings in force in the same shape.
`deadlineMs` is a request's default deadline (0: none). `slaMs` and `objectivePercent` are the
service's SLA and objective, which the runtime only exports as gauges
(`batchpilot_sla_seconds`, `batchpilot_slo_objective_ratio`) so that Prometheus can judge its
latency against them. `burstBatchSize` (0: none) is the largest batch a backlog of more rows
than `maxBatchSize` may run at once: the InferenceService's `scaling.maxBatchSize` in mode
`auto`. `calibrationRows` is the largest batch limit the
autopilot may set (`scaling.maxBatchSize`, `STARTUP_TIMING_MAX_ROWS` at most): what a pod times
at start-up, read from the mounted file when it starts — in the document, not in the pod's
arguments, so that a change of the spec's ceiling rolls no pod. To a reader every key is
optional: an absent key keeps the value in force (a document from an older operator has no
`deadlineMs`, `slaMs`, `objectivePercent`, `burstBatchSize` or `calibrationRows`).

The shape only, typed so that both sides' dict literals are checked against it: each side keeps
its own units (the runtime holds seconds, the operator milliseconds), and the runtime refuses a
bad document in its own error vocabulary.
"""

from __future__ import annotations

from typing import TypedDict


class BatchingDocument(TypedDict, total=False):
    """The batching settings document; every key optional. Its keys are the document's own
    camelCase names."""

    maxBatchSize: int
    maxQueueDelayMs: float
    deadlineMs: float
    slaMs: float
    objectivePercent: float
    burstBatchSize: int
    calibrationRows: int


STARTUP_TIMING_MAX_ROWS = 64
"""The runtime times batches of 1 row and of its largest allowed batch limit at start-up, that
one at most this many rows (`calibrationRows`, `--calibration-rows`): a limit of 512 image rows
would cost start-up seconds and hundreds of MB for a slope that 64 rows measure as well. The
operator writes the InferenceService's `scaling.maxBatchSize` capped at this."""

ASYNC_DEADLINE_S = 300.0
"""The deadline of an async job that sets no timeout of its own, from its submit
(`--async-deadline-s`, `spec.runtime.asyncInference.deadlineSeconds`): a job waits in a
background lane, behind the requests of the SLA, through a burst — not the SLA's deadline."""
ASYNC_DEADLINE_MAX_S = 600.0
"""The longest it may be: an async job id lapses (answers 404 where its replica is gone) ten
minutes of pending after it was made, with the result's TTL and the drain's hold."""

BATCHING_KEYS: tuple[str, ...] = tuple(BatchingDocument.__annotations__)
"""Every key a batching document may have, in the order above; any other is refused."""
