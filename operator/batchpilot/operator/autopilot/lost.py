"""Replicas lost while they served, and the stand-ins asked for in their place.

A replica that was ready and is ready no more, while the Deployment still counts it, is lost.
Its container restarting (killed for memory, a GPU fault) is back within about a cold start. A
node that died is worse: its pods turn NotReady about 40 s later (the node controller's grace
period) but are not deleted, so the ReplicaSet does not replace them, until they are evicted —
300 s later by default (the `unreachable` taint's tolerationSeconds) — and their replacements
then start from cold: six minutes or more in which the plan counts them as serving and the
replicas left carry their load.

So a loss not back within `grace` (twice the cold start learned, and at least `MIN_GRACE_S`:
a restart is back by then) gets a stand-in: the plan asks for the replicas it needs plus the
ones away, and the Deployment starts the stand-ins at once, on nodes that are up. Where the pods
tolerate a lost node for less than that (the operator renders 30 s; `children.node_loss` reads
what the pod template says), Kubernetes' own replacement comes first, and a stand-in is asked
for only if it has not come within the grace after the eviction (a crash-looping pod is never
evicted). Where the plan already had replicas to spare, the count in force may cover them and
nothing is added. Once every replica is ready again (the lost ones back, or replaced after their
eviction) the loss is over, and the surplus goes the way of any surplus: the scale-down gives it
back after its stabilization window. (A ReplicaSet removes not-ready pods first, so a scale-down
while a lost one is still away removes that one.)

The grace is for a service the replicas left still carry. One over the SLA gets its stand-ins
at once: whatever brings a lost replica back — a restart, a replacement after the eviction —
pays a cold start too, so one started now comes no later, and the grace would only be more of
the miss.

A rollout that replaces pods in place (no room for a surge pod: `rollout.rolls_in_place`) has
one down at a time by design: those are not lost (`replaced`).

Only replicas that were ready count: a scale-up that cannot start (a quota, no GPU node, an
image that does not pull) is no loss, and more replicas would not start either. A replica that
comes back and is lost again counts again, so stand-ins are never more than the plan's own
replicas: pods that crash again and again as soon as they serve (a request that kills the
runtime) cannot take the count to maxReplicas.

Pure: counts and times in, counts out.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchpilot.operator.children.node_loss import DEFAULT_EVICTION_S

MIN_GRACE_S = 60.0
"""The shortest wait before a lost replica gets a stand-in: a container restarted after a crash
is back by then on any service whose cold start is learned short (a back-off of 10 s, the
model's load and warm-up)."""
GRACE_COLD_STARTS = 2.0
"""The wait before a stand-in, in cold starts learned: a restart takes about one."""


@dataclass(frozen=True, slots=True)
class Loss:
    """Replicas lost and not back, and when the latest of them was noticed."""

    count: int = 0
    since: float | None = None


def track(
    loss: Loss,
    *,
    ready: int,
    replicas: int,
    was_ready: int | None,
    had_replicas: int | None,
    now: float,
    replaced: int = 0,
    blocked: int = 0,
) -> Loss:
    """The loss after a decision's observation: `ready` of `replicas` in force now, against
    `was_ready` of `had_replicas` at the decision before. Ready replicas that went away, beyond
    the ones a scale-down removed and the `replaced` ones a rollout in place has down, were
    lost; the loss is over once all are ready — all that can come: `blocked` replicas, which
    Kubernetes cannot start (no node with a free GPU), are not waited for, nor stood in for (a
    stand-in would be as blocked) — and never more than the replicas not ready."""
    if ready >= replicas - blocked:
        return Loss()
    count, since = loss.count, loss.since
    if was_ready is not None and had_replicas is not None:
        removed = max(0, had_replicas - replicas)
        new = was_ready - ready - removed - replaced
        if new > 0:
            count, since = count + new, now
    count = min(count, replicas - ready)
    return Loss(count, since) if count > 0 else Loss()


def grace_s(cold_start_s: float, *, evicted_after_s: float = DEFAULT_EVICTION_S) -> float:
    """How long a lost replica may be away before a stand-in is asked for: the time a restart
    takes, unless Kubernetes evicts and replaces the pod sooner than that — then as long again
    after the eviction."""
    restart = max(MIN_GRACE_S, GRACE_COLD_STARTS * cold_start_s)
    return restart if restart < evicted_after_s else evicted_after_s + restart


def stand_ins(
    loss: Loss,
    *,
    plan: int,
    cold_start_s: float,
    now: float,
    evicted_after_s: float = DEFAULT_EVICTION_S,
    missed: bool = False,
) -> int:
    """Replicas to ask for beside the `plan`'s, in place of the ones lost for longer than the
    grace — or at once where the window `missed` the SLA; at most as many as the plan's."""
    if loss.count <= 0 or loss.since is None:
        return 0
    if not missed and now - loss.since < grace_s(cold_start_s, evicted_after_s=evicted_after_s):
        return 0
    return min(loss.count, plan)


def stood_in(loss: Loss, away: int, *, now: float) -> str:
    """The decision's words for `away` stand-ins."""
    replicas = "replica" if loss.count == 1 else "replicas"
    since = now - (loss.since if loss.since is not None else now)
    return f"{away} more in place of {loss.count} {replicas} ready before and not for {since:.0f} s"
