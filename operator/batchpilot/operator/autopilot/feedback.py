"""Feedback: replicas and batch limits moved on observed latency and refusals, not on the model.

Two cases. Without a model yet (no batch has been measured), a step on observed P99 alone: the
batch limit first (fast, cheap), then replicas (`feedback_only`). With a model, the guard: when a
window of the present is over the SLA, or refuses more than `SHED_FEEDBACK` of its requests, and
the plan adds no capacity, the model is wrong somewhere — observed latency wins, and replicas are
added (`overruled`).

Pure: values in, replicas and a reason out.
"""

from __future__ import annotations

import math

from batchpilot.operator.autopilot.capacity import adds_capacity
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce, Policy, format_ms
from batchpilot.operator.autopilot.service_model import LatencyFit

FEEDBACK_STEP = 0.25
"""On feedback, add this fraction of the replicas (at least one)."""
SHED_FEEDBACK = 0.05
"""Refusals beyond this share, while the model says the replicas in force carry the offered
load, are evidence against the model and add replicas (as a P99 over the SLA does). Between
`explain.SHED_TOLERANCE` and this, a burst within the window is the likelier cause: the SLA is
reported missed, and the plan (which already counts every arrival) decides."""


def overruled(
    observation: Observation,
    policy: Policy,
    current: InForce,
    model: LatencyFit,
    *,
    settled: bool,
    want_replicas: int,
    want_batch: int,
    predicted: float | None,
) -> tuple[int, str] | None:
    """The guard: the replicas to ask for, and why, when the window (one that describes the
    settings in force, all replicas ready) is over the SLA or sheds more than `SHED_FEEDBACK`
    and the plan (`want_replicas` at `want_batch`) adds no capacity, or — without raising the
    batch limit — less than the guard's step (the model that predicted the settings in force
    fine is wrong about them: a plan from it adding a replica is no answer either, and more load
    must not get fewer replicas than a little less would); None: the plan stands. A plan that
    raises the batch limit stands: batches measured at it correct the model within a window."""
    assert observation.ready_replicas is not None
    p99, sla = observation.p99_s, policy.sla_p99_s
    unserved = observation.unserved_share
    replicas = current.replicas + max(1, math.ceil(FEEDBACK_STEP * current.replicas))
    planned = InForce(want_replicas, want_batch, current.max_queue_delay_s)
    short = want_batch <= current.batch_size and adds_capacity(
        model, planned, replicas, current.batch_size
    )
    if not (
        ((p99 is not None and p99 > sla) or unserved > SHED_FEEDBACK)
        and settled
        and observation.ready_replicas >= current.replicas
        and (short or not adds_capacity(model, current, want_replicas, want_batch))
    ):
        return None
    what = (
        "P99 over the SLA"
        if p99 is not None and p99 > sla
        else f"{unserved:.0%} of the requests refused or expired"
    )
    why = (
        f"{what} although the model predicts {format_ms(predicted)}; "
        f"feedback: adding {replicas - current.replicas} replicas"
    )
    return replicas, why


def feedback_only(
    observation: Observation, policy: Policy, current: InForce
) -> tuple[int, int, str]:
    """A step on observed P99 alone: batch first (fast, cheap), then replicas. The batch limit
    doubles what a batch runs: a request of more rows than the limit runs alone, so a limit
    below a request's rows is doubled from the rows a request brings."""
    p99 = observation.p99_s
    sla = policy.sla_p99_s
    if p99 is not None and p99 > sla:
        if current.batch_size < policy.max_batch_size:
            runs = max(current.batch_size, round(observation.rows_per_request or 1.0))
            batch = min(policy.max_batch_size, runs * 2)
            return current.replicas, batch, "feedback: doubling the batch limit"
        step = max(1, math.ceil(current.replicas * min(1.0, p99 / sla - 1)))
        replicas = min(policy.max_replicas, current.replicas + step)
        return (
            replicas,
            current.batch_size,
            f"feedback: adding {replicas - current.replicas} replicas",
        )
    utilization = observation.utilization
    if (
        p99 is not None
        and p99 < 0.5 * sla
        and utilization is not None
        and utilization < policy.min_utilization
        and current.replicas > policy.min_replicas
    ):
        return current.replicas - 1, current.batch_size, "feedback: device under-used with headroom"
    return current.replicas, current.batch_size, "feedback: within the SLA"
