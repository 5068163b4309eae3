"""Feedback: replicas and batch limits moved on observed latency and refusals, not on the model.

Three cases. Without a model (no batch has been measured) but with the devices' busy share,
replicas planned to a busy share learned from the windows (`busy_plan`, see `busy`). Without
either, a step on observed P99 alone: the batch limit first (fast, cheap), then replicas
(`feedback_only`). With a model, the guard: when a
window of the present is over the SLA, or refuses more than `SHED_FEEDBACK` of its requests, and
the plan adds no capacity, the model is wrong somewhere — observed latency wins, and replicas are
added (`overruled`). What the guard found is remembered as a ceiling on the load a replica is
planned to carry (`ceiling`): the model that was wrong about N replicas would otherwise plan N
again at the next quiet scale-down, and miss again.

Pure: values in, replicas and a reason out.
"""

from __future__ import annotations

import math
from dataclasses import replace

from batchpilot.operator.autopilot.busy import (
    GIVE_BACK,
    LINEAR,
    MAX_ELASTIC_TARGET,
    MAX_TARGET,
    BusyShare,
    learned_target,
    measured_cost,
)
from batchpilot.operator.autopilot.capacity import adds_capacity
from batchpilot.operator.autopilot.ceiling import step_up
from batchpilot.operator.autopilot.explain import SHED_TOLERANCE, p99_over, unserved_beyond
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce, Policy, format_ms
from batchpilot.operator.autopilot.service_model import LatencyFit
from batchpilot.operator.autopilot.slo import SloLedger

SHED_FEEDBACK = 0.05
"""Refusals beyond this share, while the model says the replicas in force carry the offered
load, are evidence against the model and add replicas (as a P99 over the SLA does). Between
`explain.SHED_TOLERANCE` and this, a burst within the window is the likelier cause: the SLA is
reported missed, and the plan (which already counts every arrival) decides — unless the misses
recur (`misses_persist`): a burst passes, and misses that come back, or last two windows, are
load the model does not see (spikes of a second, recurring within every window, which no rate
averaged over seconds shows, refused 4–5 % of each window for as long as they came)."""
PERSISTENT_WINDOWS = 2.0
"""`misses_persist` judges over the verdicts since the replica count last changed, at least this
many metrics windows of them: a burst makes the windows that overlap it miss, about one window's
worth of verdicts in one run; misses throughout twice that, or in two runs, are no one burst."""
PERSISTENT_LOOKBACK_WINDOWS = 10.0
"""…and at most this many: older misses say little of the traffic now."""
THROUGHOUT = 0.9
"""`misses_persist`: the share of a lookback that must be judged, and judged bad for
"throughout"."""
MOSTLY_WINDOWS = 3.0
MOSTLY = 0.6
"""Or: outside the SLA more than this share of the time over at least `MOSTLY_WINDOWS` windows.
One burst makes about a window and its own length of misses: under 60 % of three windows for
any burst shorter than 48 s."""


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
    persistent: bool = False,
) -> tuple[int, str] | None:
    """The guard: the replicas to ask for, and why, when the window (one that describes the
    settings in force, all replicas ready) is over the SLA or sheds more than `SHED_FEEDBACK`
    and the plan (`want_replicas` at `want_batch`) adds no capacity, or — without raising the
    batch limit — less than the guard's step (the model that predicted the settings in force
    fine is wrong about them: a plan from it adding a replica is no answer either, and more load
    must not get fewer replicas than a little less would); None: the plan stands. A plan that
    raises the batch limit stands: batches measured at it correct the model within a window.
    `persistent`: the SLA was missed more than once since the replicas settled (see
    `PERSISTENT_WINDOWS`), so refusals beyond `explain.SHED_TOLERANCE` count as well, and a plan
    that only raises the batch limit stands no more."""
    assert observation.ready_replicas is not None
    sla = policy.sla_p99_s
    unserved = observation.unserved_share
    replicas = step_up(current.replicas)
    planned = InForce(want_replicas, want_batch, current.max_queue_delay_s)
    short = want_batch <= current.batch_size and adds_capacity(
        model, planned, replicas, current.batch_size
    )
    refused = unserved_beyond(observation, SHED_TOLERANCE if persistent else SHED_FEEDBACK)
    over = p99_over(observation, sla)
    if not (
        (over or refused)
        # (misses that recur since the replicas settled need no settled batch limit: the limit
        # retuned over the SLA and back, window after window, kept the guard from ever judging)
        and (settled or persistent)
        and observation.ready_replicas >= current.replicas
        and (
            short
            or not adds_capacity(model, current, want_replicas, want_batch)
            # Misses that recur at these replicas whatever the batch limit: the plan that
            # raises it once more (and lowers it once inside again) is no answer either.
            or (persistent and want_replicas <= current.replicas)
        )
    ):
        return None
    what = (
        "P99 over the SLA"
        if over
        else f"{unserved:.0%} of the requests refused or expired"
        + (", a miss that recurs," if unserved <= SHED_FEEDBACK else "")
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
    below a request's rows is doubled from the rows a request brings. A limit in force above the
    policy's maximum (lowered since: the spec edited, or the device's memory) comes down to it.
    Replicas are added only once the ones asked for are ready, in proportion to the ready ones:
    each tick over the SLA multiplied the count in force, the replicas not up yet with it
    (3 ready → 32 asked in five ticks while new pods waited for a node)."""
    held = min(current.batch_size, policy.max_batch_size)
    p99 = observation.p99_s
    sla = policy.sla_p99_s
    if p99 is not None and p99_over(observation, sla):
        if current.batch_size < policy.max_batch_size:
            runs = max(current.batch_size, round(observation.rows_per_request or 1.0))
            batch = min(policy.max_batch_size, runs * 2)
            return current.replicas, batch, "feedback: doubling the batch limit"
        ready = observation.ready_replicas
        if ready is not None and ready < current.replicas:
            return (
                current.replicas,
                held,
                f"feedback: over the SLA, {current.replicas - ready} of the replicas asked for "
                "not ready yet",
            )
        step = max(1, math.ceil(current.replicas * min(1.0, p99 / sla - 1)))
        replicas = min(policy.max_replicas, current.replicas + step)
        return (
            replicas,
            held,
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
        return current.replicas - 1, held, "feedback: device under-used with headroom"
    return current.replicas, held, "feedback: within the SLA"


def misses_persist(
    slo: SloLedger, now: float, *, changed_at: float | None, window_s: float
) -> bool:
    """Whether the SLA was missed more than once in the verdicts of windows that describe the
    replicas in force — from a window after their count last changed (`changed_at`), at most
    `PERSISTENT_LOOKBACK_WINDOWS`, at least `PERSISTENT_WINDOWS` of them: misses in two or more
    separate runs (one burst is one run, however many windows overlapping it missed; one flash
    crowd is an event, two are a pattern), throughout (`THROUGHOUT` of the time), or most of
    the time (`MOSTLY`) over `MOSTLY_WINDOWS` — the ledger's buckets merge misses a verdict apart
    into one run. Batch retunes do not restart it: a limit raised over the SLA and lowered once
    inside again, window after window, is the very pattern of misses that recur (and restarting
    on it hid them)."""
    longest = PERSISTENT_LOOKBACK_WINDOWS * window_s
    since = longest if changed_at is None else now - changed_at - window_s
    lookback = min(longest, since)
    if lookback < PERSISTENT_WINDOWS * window_s:
        return False
    seen = slo.misses(now, lookback)
    if seen.judged_s < THROUGHOUT * PERSISTENT_WINDOWS * window_s or seen.share <= 0:
        return False
    longer = MOSTLY_WINDOWS * window_s
    return (
        seen.runs >= 2
        or seen.share >= THROUGHOUT
        or (seen.judged_s >= THROUGHOUT * longer and seen.share >= MOSTLY)
    )


SATURATED = 0.85
"""`busy_plan`: a window over the SLA with the devices busy at least this share of it is
saturated: it missed for load, and a larger batch limit may carry more (a device that is never
idle gains throughput only from larger batches). Below it, its batches may have run too long:
a smaller limit."""
UNSTEADY_REFUSED = 0.2
"""A window that refused more than this share of its requests with the devices not saturated held
traffic that began inside it (a device that refuses a fifth of its load is busy all the time
that load lasts): its busy share is neither the load's before nor after, and it teaches nothing
of the target."""
BATCH_BUDGET = 0.5
"""`busy_plan` raises the batch limit only where a batch of the new limit would take at most this
share of the SLA even at the present cost of a request (see `BusyShare.batch_allowed`): a request
waits for at most the batch ahead of it and its own."""


def busy_plan(
    observation: Observation,
    policy: Policy,
    current: InForce,
    known: BusyShare,
    *,
    rate: float,
    settled: bool,
    rising: bool,
    comfortable_s: float,
    now: float,
    peak: float,
) -> tuple[int, int, str, BusyShare]:
    """Replicas, batch limit, reason and what the busy share taught, where there is no model but
    the devices' busy share (`busy`): replicas planned so that each is busy the learned target
    share at `rate`. A window teaches only where it describes the settings in force (`settled`,
    every replica ready). One over the SLA lowers the target below its busy share and adds at
    least the guard's step of replicas — unless it was no steady load (`rising`: it held the load
    before and after a step; or it refused much with the devices not saturated); with the devices
    not saturated it also halves the batch limit (its batches may have run too long), and that
    limit is not raised to again for `TOO_LARGE_S`. Over the SLA with them saturated, or
    comfortably inside it, the batch limit doubles where `BusyShare.batch_allowed`. A proven
    load above `peak` (the most offered in the hour) or at a batch limit above the one planned
    is dropped. Without a measured cost yet, `feedback_only`'s step."""
    ready = observation.ready_replicas or 0
    busy = observation.utilization
    sla = policy.sla_p99_s
    over = p99_over(observation, sla) or unserved_beyond(observation, SHED_FEEDBACK)
    # (a limit in force above the policy's maximum, lowered since, comes down to it)
    batch = min(current.batch_size, policy.max_batch_size)
    learned, cost, notes = known.current(now), None, ""
    missed = False
    if settled and ready >= current.replicas:
        cost = measured_cost(
            busy=busy,
            served_qps=observation.qps,
            replicas=observation.reporting_replicas or ready,
            window_s=observation.covered_s or observation.window_s,
        )
    if cost is not None and busy is not None:
        p99 = observation.p99_s
        saturated = busy >= SATURATED
        steady = not rising and (saturated or observation.unserved_share <= UNSTEADY_REFUSED)
        comfortable = (
            p99 is not None
            and p99 <= comfortable_s
            and not unserved_beyond(observation, SHED_TOLERANCE)
        )
        missed = over and steady
        # Room to stretch: a window comfortably inside the SLA, steady or (where the one before
        # had room) only unsteady — a rise within the window is no reason to plan as if the
        # busy share grew with the load in proportion.
        learned = learned.read(
            cost_s=cost,
            busy=busy,
            batch=current.batch_size,
            room=comfortable and not over and (steady or learned.room),
        )
        learned = replace(
            learned,
            target=learned_target(
                learned.target,
                busy=busy,
                over=missed,
                comfortable=comfortable,
                highest=MAX_TARGET if learned.elasticity >= LINEAR else MAX_ELASTIC_TARGET,
            ),
        )
        carried = min(busy, 1.0) / cost
        if missed:
            learned = learned.missed(carried, now=now)
        elif comfortable and steady:
            learned = learned.proving(carried, batch=current.batch_size, now=now)
        doubled = min(policy.max_batch_size, batch * 2)
        if missed and not saturated and batch > 1:
            batch = max(1, batch // 2)
            learned = replace(learned, too_large=current.batch_size, too_large_at=now)
            notes = (
                f"; over the SLA with the devices {busy:.0%} busy: "
                f"batch {current.batch_size}→{batch}"
            )
        elif (
            ((over and saturated) or comfortable)
            and doubled > batch
            and learned.batch_allowed(doubled, budget_s=BATCH_BUDGET * sla)
        ):
            batch = doubled
            change = f"batch {current.batch_size}→{batch}"
            notes = (
                f"; over the SLA with the devices {busy:.0%} busy: {change}"
                if over
                else f"; comfortably inside the SLA: trying {change}"
            )
    learned = learned.within(peak=peak, batch=batch)
    want = learned.replicas_for(rate)
    if want is None or learned.cost_s is None:
        replicas, batch, why = feedback_only(observation, policy, current)
        return replicas, batch, why, learned
    if want < current.replicas:
        # Replicas go back only as far as the rest stay busy below `GIVE_BACK` of the target.
        want = min(current.replicas, learned.replicas_for(rate, share=GIVE_BACK) or want)
    if missed and want < step_up(current.replicas):
        # A steady window missed at these replicas: whatever the cost read, at least the
        # guard's step (a miss below the busy share planned to is not the load's alone).
        want = step_up(current.replicas)
        notes += f"; over the SLA at {busy:.0%} busy: adding {want - current.replicas} replicas"
    measured = (
        f"{busy:.0%} busy × {observation.reporting_replicas or ready} / {observation.qps:.0f} rps"
        if cost is not None and busy is not None and observation.qps
        else "an earlier window"
    )
    carries = learned.carries() or 0.0
    stretched = learned.basis()
    why = (
        f"busy share (no batch sizes to model t(b) from): a request costs "
        f"{format_ms(learned.cost_s)} of device time at batch ≤ {learned.batch} ({measured}); "
        f"planned {learned.target:.0%} busy, {carries:.0f} rps a replica{stretched}: "
        f"{want} for {rate:.0f} rps{notes}"
    )
    return want, batch, why, learned
