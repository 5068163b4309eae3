"""The decision's account of itself: the window's verdict against the SLA (`judge`: what the
SLAMet condition and the objective's books record) and the decision's action, reason and condition
inputs (`explain`), which become Events, conditions and `status.lastDecision`.

Pure: values in, a `Decision` out.
"""

from __future__ import annotations

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import Decision, InForce, Policy, format_ms

SHED_TOLERANCE = 0.01
"""The SLA is met only while at most this share of the offered requests goes unserved (refused
at arrival, expired): a refused request is a request not answered within the SLA, and the
runtime's admission keeps the P99 of the admitted ones inside it however many it refuses."""


MIN_UNSERVED_REQUESTS = 5
"""Unserved requests are evidence only where the window went without at least this many: the
share of a few is a request or two in flight at the window's edges, or a counter's extrapolation
(at 2–3 rps every other window read "1% unserved" with none refused, and a window where traffic
resumed "6%")."""


def unserved_beyond(observation: Observation, share: float) -> bool:
    """Whether more than `share` of the window's offered requests went unserved, and at least
    `MIN_UNSERVED_REQUESTS` of them."""
    unserved = observation.unserved_share
    window_s = observation.covered_s or observation.window_s
    return (
        unserved > share
        and unserved * (observation.offered_qps or 0.0) * window_s >= MIN_UNSERVED_REQUESTS
    )


LATE_SHARE = 0.01
"""P99 inside the SLA: at most this share of the requests slower than it."""
SLA_MATCH_S = 0.0005
"""The runtime counted against the policy's SLA where its own is within this (the batching
document stores whole milliseconds)."""
BUCKET_SPREAD = 1.15
"""The runtime's latency buckets are this far apart: the histogram's P99 lies in the bucket of
the true one, so a reading more than a bucket from the SLA is on its side of it."""
COARSE_ABOVE_S = 2.2
"""…up to here; above it the runtime's buckets are 2.5, 5 and 10 s, and a P99 past 10 s reads
10 s (`histogram_quantile` answers the top finite edge): a reading there tells no side of the
SLA."""


def p99_over(observation: Observation, sla_s: float) -> bool:
    """Whether the window's P99 was over the SLA. Within a bucket of it, the histogram cannot
    tell: it interpolates inside the bucket, and reads a narrow tail's P99 up to a bucket high
    (a service at 52 ms, 40 of them outside the device, read 57 ms against a 55 ms SLA, and the
    guard added replicas that could not help, window after window). There the share of requests
    the runtime counted slower than the SLA decides, exactly: over it where more than
    `LATE_SHARE` were (`Observation.late_share`) — where every replica counted against this SLA
    all window (`Observation.counted_sla_min_s`, `…_max_s`: a spec whose SLA changed reaches
    the pods seconds later, and the share then speaks of the old one); the reading, elsewhere.
    So does the share where the reading is past `COARSE_ABOVE_S`, in buckets too wide to tell:
    a 30 s SLA with 3 % of requests at 45 s read a P99 of 10 s, "inside"."""
    p99 = observation.p99_s
    if p99 is None:
        return False
    late = observation.late_share
    counted = (observation.counted_sla_min_s, observation.counted_sla_max_s)
    against = all(s is not None and abs(s - sla_s) <= SLA_MATCH_S for s in counted)
    near = sla_s / BUCKET_SPREAD < p99 <= sla_s * BUCKET_SPREAD
    if late is None or not against or not (near or p99 > COARSE_ABOVE_S):
        return p99 > sla_s
    return late > LATE_SHARE


def judge(observation: Observation, policy: Policy) -> bool | None:
    """Whether the window was inside the SLA: P99 under it (`p99_over`) and at most
    `SHED_TOLERANCE` of the offered requests unserved (`unserved_beyond`); None when unknown
    (no traffic, no latency)."""
    if observation.idle or observation.p99_s is None:
        return None
    return not p99_over(observation, policy.sla_p99_s) and not unserved_beyond(
        observation, SHED_TOLERANCE
    )


EDGE = 0.9
"""Inside the SLA but within this share of it (P99), the verdict may flip from one window to the
next on noise alone."""


def near_the_edge(observation: Observation, policy: Policy) -> bool:
    """Inside the SLA, but not clearly: P99 above `EDGE` of it, or more than half the tolerated
    share of requests unserved — where `judge` flickers between windows, so what was done while
    over the SLA is not undone yet."""
    if observation.p99_s is None:
        return False
    return (
        observation.p99_s > EDGE * policy.sla_p99_s
        or observation.unserved_share > SHED_TOLERANCE / 2
    )


def explain(
    observation: Observation,
    policy: Policy,
    current: InForce,
    *,
    replicas: int,
    want_replicas: int,
    batch: int,
    delay_s: float,
    sla_met: bool | None,
    why: str,
    notes: list[str],
    predicted: float | None,
    capacity: float | None,
    retuned: bool,
    below_floor: str | None = None,
) -> Decision:
    """The decision with its action, reason and condition inputs."""
    sla, p99 = policy.sla_p99_s, observation.p99_s
    limited = None
    if (
        sla_met is False
        and replicas >= policy.max_replicas
        and want_replicas >= policy.max_replicas
    ):
        limited = (
            f"at maxReplicas {policy.max_replicas} with P99 {format_ms(p99)} over the "
            f"{format_ms(sla)} SLA; raise maxReplicas or maxBatchSize"
        )
    if replicas > current.replicas:
        action = "scale-up"
    elif replicas < current.replicas:
        action = "scale-down"
    elif retuned:
        action = "retune"
    else:
        action = "steady"
    unserved = observation.unserved_share
    observed = (
        "no traffic"
        if observation.idle
        else f"P99 {format_ms(p99)} vs SLA {format_ms(sla)} "
        f"at {observation.offered_qps or 0.0:.0f} rps"
        + (
            f" (and {retried:.0f} rps of retries, not counted)"
            if (retried := observation.retried_qps or 0.0) >= 0.5
            else ""
        )
        + (
            f", {withdrawn:.0f} rps of them withdrawn by their clients before the SLA"
            if (withdrawn := observation.withdrawn_qps or 0.0) >= 0.5
            and withdrawn >= SHED_TOLERANCE * (observation.offered_qps or 0.0)
            else ""
        )
        + (f", {unserved:.0%} unserved" if unserved > SHED_TOLERANCE else "")
        + (
            f", device {observation.utilization * 100:.0f}% busy"
            if observation.utilization is not None
            else ""
        )
    )
    changes = []
    if replicas != current.replicas:
        changes.append(f"replicas {current.replicas}→{replicas}")
    if batch != current.batch_size:
        changes.append(f"batch {current.batch_size}→{batch}")
    if delay_s != current.max_queue_delay_s:
        changes.append(f"queue delay {format_ms(current.max_queue_delay_s)}→{format_ms(delay_s)}")
    reason = f"{observed}; {why}" + (f"; {', '.join(changes)}" if changes else "; no change")
    if notes:
        reason += f" ({'; '.join(notes)})"
    return Decision(
        replicas=replicas,
        batch_size=batch,
        max_queue_delay_s=delay_s,
        action=action,
        reason=reason,
        metrics_available=True,
        sla_met=sla_met,
        scaling_limited=limited,
        below_floor=below_floor,
        predicted_p99_s=predicted,
        capacity_rps=capacity,
        notes=tuple(notes),
    )
