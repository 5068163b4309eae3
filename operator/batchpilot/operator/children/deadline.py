"""The default deadline the runtime enforces for every request, derived from the SLA.

The runtime refuses at arrival, with 503 + Retry-After, a request it predicts cannot be answered
within its deadline, and drops a queued request whose deadline passed before it reaches the
device. Its default deadline is the InferenceService's latency SLA, less the part of each
request's latency spent outside the deadline's clock (receiving the body, encoding the answer,
postprocessing): the autopilot learns the latency outside the batcher, and the part of it
inside the deadline's clock before the batcher (a preprocess, the decode's and its waits), and
hands the rest (`State.outside_deadline_s`); the deadline follows it.

The value moves in steps of 2 % of the SLA, and only once the wanted value has left the one in
force by more than a step, so that a learned overhead that wobbles by a millisecond does not
rewrite the ConfigMap and every pod each interval. It is whole milliseconds, the unit the
batching document stores: a value read back is the value written.

Pure: no Kubernetes, no I/O.
"""

from __future__ import annotations

import math

STEP_SHARE = 0.02
"""Steps of the deadline, as a share of the SLA (at least 1 ms)."""

MAX_OUTSIDE_SHARE = 0.5
"""The learned overhead takes at most this share of the SLA off the deadline: an overhead
estimate gone wild (a window of outliers) must not leave the batcher no time at all."""


def default_deadline_ms(
    *, sla_ms: float, outside_s: float | None, in_force_ms: float | None = None
) -> float:
    """The deadline for requests that set none, in whole milliseconds.

    `outside_s`: latency learned outside the batcher (None: not learned yet, the SLA itself).
    `in_force_ms`: the deadline the pods have now, kept while within a step of the wanted one.
    """
    step = max(1.0, math.floor(sla_ms * STEP_SHARE))
    outside_ms = 0.0 if outside_s is None else max(0.0, outside_s * 1e3)
    wanted = sla_ms - min(outside_ms, sla_ms * MAX_OUTSIDE_SHARE)
    if in_force_ms is not None and abs(in_force_ms - wanted) <= step:
        return in_force_ms
    # The step below the wanted value: a deadline slightly short refuses a little early, one
    # slightly long lets a request past the SLA.
    return max(1.0, math.floor(wanted / step) * step)
