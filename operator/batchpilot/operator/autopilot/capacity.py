"""The capacity plan: how many replicas, at which batch limit, carry a rate inside a target.

Given the fit t(b) ≈ α + β·b, every batch limit has a capacity — the rate one replica carries
with headroom: predicted P99 under the target, or just inside the SLA at 1.25× the rate,
whichever lets it carry more (`replica_capacity`) — and the plan is the fewest replicas that
carry the load, with, among the limits that need that many, the one with the most capacity.
Limits whose full batches alone (one in flight, then one's own) would break those bounds are
never chosen: they buy throughput only in a backlog, where their latency is already too long.

The same search answers the other questions `decide` asks of the model: the batch limit to
absorb a burst while replicas start (`burst_batch`), the one that serves the most in time
under a load beyond them (`saturated_batch`), how much of a rise the latency headroom
absorbs (`absorbed_rise`), and, on a rough model, whether replicas must be added at once or can
wait one interval behind a larger batch limit (`batch_first`). They live together because they
share the candidates, the stickiness rule and the exclusion of over-long batches.

Pure: arithmetic on the fit, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from batchpilot.operator.autopilot.observation import ComputePoint
from batchpilot.operator.autopilot.policy import (
    LOAD_HEADROOM,
    InForce,
    Policy,
    format_ms,
    p99_bounds,
)
from batchpilot.operator.autopilot.service_model import (
    LatencyFit,
    Prediction,
    predict,
    sla_capacity,
)
from batchpilot.operator.autopilot.state import State

TRIAL_INTERVALS = 2
"""Intervals a rough model's plan waits behind a raised batch limit for the fit to become
confident (`batch_first`)…"""
TRIAL_SCRAPES = 2
"""…or this many scrape intervals, if longer: a batch size shows in `rate()` from the second
scrape after its limit."""
BATCH_STICKINESS = 0.97
"""Batch limits with at least this fraction of the best limit's capacity count as equally good."""
BATCH_STICKINESS_GAIN = 1 / BATCH_STICKINESS - 1
"""A larger batch limit must carry this much more to be worth its latency (≈ 3 %)."""
RETUNE_GAIN = 0.1
"""While absorbing, a limit other than the one in force must carry this much more to replace it.
Each retune leaves the window unsettled for a window and an interval (no learning, no guard), and
the capacities of neighbouring limits differ by less than the noise of the arrivals' measured
clumping moves them: a limit retuned on every tick (4 → 6 → 4 as the clumping read 1.5× then
1.3× Poisson's) kept the guard from ever judging the window, at 0 % of intervals inside the SLA."""

SATURATED_GAIN = 0.05
"""Past the ceiling, a limit other than the one in force must carry this much more at full
batches to replace it. Not `RETUNE_GAIN`: there every tenth is requests answered in time (10 +
1·b ms behind 5 ms: 24 rows carry 706 rps a replica, 32 rows 762, 8 % more). Not
`BATCH_STICKINESS_GAIN`: where a batch's time is mostly per row, full batches of neighbouring
limits differ by a few per cent, and the fit's α, moving by a few tenths of a millisecond from
window to window, reorders them (1 + 8·b ms with batch times varying by 40 %: the limit went
3 → 4 → 2 → 3 → 1 → 2 → 3 over ten minutes of one overload at 3 %)."""


def batch_candidates(max_batch: int) -> list[int]:
    """Batch limits worth comparing: 1, 2, 3, 4, 6, 8, 12, 16, … up to the ceiling."""
    values = {1, max_batch}
    power = 1
    while power <= max_batch:
        values.update(v for v in (power, power + power // 2) if v <= max_batch)
        power *= 2
    return sorted(values)


def limits(model: LatencyFit, max_batch: int) -> list[int]:
    """The candidates a request fits in: a limit below the rows a request brings runs each
    request alone, as the limit of that many rows does, and would read "batch ≤ 1" where every
    batch runs 4 rows."""
    whole = model.request_rows()
    return [b for b in batch_candidates(max_batch) if b >= whole] or [max_batch]


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Replicas and batch limit that carry a rate inside the target, as the model predicts."""

    replicas: int
    batch_size: int
    prediction: Prediction
    predicted_p99_s: float
    feasible: bool
    capacity: float
    """Requests per second one replica carries at this batch limit with headroom."""
    load_headroom: bool = False
    """Whether that headroom is kept in load rather than in latency (`replica_capacity`)."""


def plan_capacity(
    model: LatencyFit,
    *,
    rate: float,
    policy: Policy,
    delay_s: float,
    overhead_s: float,
    target_s: float,
    prefer: int | None = None,
) -> CapacityPlan:
    """The fewest replicas that carry `rate` inside `target_s`, and for them the batch limit with
    the most capacity — among limits nearly as good, `prefer` (the one in force), else the
    largest; the best effort at maxReplicas if none fits."""
    options: list[tuple[int, float, int]] = []  # (replicas needed, -capacity, batch limit)
    by_load: set[int] = set()  # the limits whose capacity keeps its headroom in load
    candidates = limits(model, policy.max_batch_size)
    for batch in candidates:
        # Latency, not utilization, bounds a batching replica: its device is busy nearly all the
        # time long before its P99 suffers (batches grow to fill the time), so a busy-fraction
        # ceiling would buy replicas that change nothing.
        per_replica = replica_capacity(
            model,
            batch=batch,
            delay_s=delay_s,
            overhead_s=overhead_s,
            target_s=target_s,
            sla_s=policy.sla_p99_s,
            alone=batch == candidates[0],
        )
        if per_replica is None:
            continue  # a backlog of full batches alone would break the SLA's bound
        if per_replica.load_headroom:
            by_load.add(batch)
        carried = per_replica.rate
        needed = math.ceil(rate / carried - 1e-9) if carried > 0 else 1 << 30
        options.append((max(policy.min_replicas, needed), -carried, batch))
    needed, negative_capacity, batch = min(options)
    # Limits within a few per cent of the best are as good: keep the one in force (no churn),
    # else take the largest (most throughput when a burst fills the batches).
    equivalent = [
        option
        for option in options
        if option[0] == needed and -option[1] >= BATCH_STICKINESS * -negative_capacity
    ]
    kept = [option for option in equivalent if option[2] == prefer]
    needed, negative_capacity, batch = (kept or sorted(equivalent, key=lambda o: o[2]))[-1]
    feasible = needed <= policy.max_replicas
    replicas = min(needed, policy.max_replicas)
    prediction = predict(
        model,
        rate=rate,
        replicas=replicas,
        max_batch=batch,
        delay_s=delay_s,
        overhead_s=overhead_s,
    )
    return CapacityPlan(
        replicas=replicas,
        batch_size=batch,
        prediction=prediction,
        predicted_p99_s=prediction.p99_s,
        feasible=feasible,
        capacity=-negative_capacity,
        load_headroom=batch in by_load,
    )


class Carried(NamedTuple):
    rate: float
    """Requests per second a replica is planned to carry."""
    load_headroom: bool
    """Whether its headroom is kept in load (else in latency)."""


def replica_capacity(
    model: LatencyFit,
    *,
    batch: int,
    delay_s: float,
    overhead_s: float,
    target_s: float,
    sla_s: float,
    alone: bool = False,
) -> Carried | None:
    """The rate one replica at batch limit `batch` is planned to carry, with headroom kept the
    cheaper of two ways (`policy.LOAD_HEADROOM`): predicted P99 under `target_s` at that rate
    (the latency headroom), or just inside the SLA (`policy.p99_bounds`) at `LOAD_HEADROOM`
    times it (the load headroom). None when the limit's full batches alone (one in flight, then
    one's own) would break both bounds: such a limit buys throughput only in a backlog, where
    its latency is already too long. Batch 1 — or `alone`, the smallest limit a request fits in,
    where clients send several rows — is never left out: there is no smaller batch to run, and
    the plan needs a best effort when nothing fits."""
    near = p99_bounds(sla_s, overhead_s)[1]
    full = overhead_s + 2 * model.batch_seconds(batch)
    best: Carried | None = None
    if batch == 1 or alone or full <= target_s:
        rate = sla_capacity(
            model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=target_s
        )
        best = Carried(rate, load_headroom=False)
    # No replica carries more than full batches back to back: where even that, less the load
    # headroom, is no more than the latency headroom's rate, the search would not change it.
    beyond = best is None or model.capacity(batch) / LOAD_HEADROOM > best.rate
    if (batch == 1 or alone or full <= near) and beyond:
        rate = sla_capacity(
            model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=near
        )
        if best is None or rate / LOAD_HEADROOM > best.rate:
            best = Carried(rate / LOAD_HEADROOM, load_headroom=True)
    return best


def burst_batch(
    model: LatencyFit,
    policy: Policy,
    *,
    delay_s: float,
    overhead_s: float,
    in_force: int | None = None,
) -> int:
    """The batch limit with the most capacity inside the SLA itself (not the planning target):
    what a replica carries at most while others start. Limits whose full batches alone would
    break the SLA are left out, as in the plan. `in_force` stays unless the best carries
    `RETUNE_GAIN` more."""
    best, most = -1, -1.0
    kept = -1.0
    for batch, capacity in inside_the_sla(
        model, policy, delay_s=delay_s, overhead_s=overhead_s
    ).items():
        if batch == in_force:
            kept = capacity
        if capacity > most * (1 + BATCH_STICKINESS_GAIN):
            best, most = batch, capacity
    if in_force is not None and kept * (1 + RETUNE_GAIN) >= most:
        return in_force
    return best


def inside_the_sla(
    model: LatencyFit, policy: Policy, *, delay_s: float, overhead_s: float
) -> dict[int, float]:
    """What one replica carries inside the SLA itself at each candidate limit, in increasing
    order, leaving out the limits whose full batches alone (one in flight, then one's own) would
    break it — but the smallest, which a request always has."""
    candidates = limits(model, policy.max_batch_size)
    inside: dict[int, float] = {}
    for batch in candidates:
        too_long = overhead_s + 2 * model.batch_seconds(batch) > policy.sla_p99_s
        if batch > candidates[0] and too_long:
            continue
        inside[batch] = sla_capacity(
            model,
            max_batch=batch,
            delay_s=delay_s,
            overhead_s=overhead_s,
            target_s=policy.sla_p99_s,
        )
    return inside


def saturated_batch(
    model: LatencyFit,
    policy: Policy,
    *,
    delay_s: float,
    overhead_s: float,
    in_force: int | None = None,
) -> tuple[int, float]:
    """(the batch limit for a load beyond what the replicas carry inside the SLA at any limit,
    the most one replica carries inside the SLA at any limit). Past that point the queue is
    never empty, the runtime refuses what would finish late, and what is answered in time is
    what full batches carry: among the limits that carry within `BATCH_STICKINESS` of the most
    inside the SLA (so batch times that vary and arrivals that clump, which the SLA capacity
    counts, still bound the choice) and whose full batches alone fit it, the one whose full
    batches carry the most (`LatencyFit.capacity`). `in_force` stays where its full batches fit
    the SLA and carry within `SATURATED_GAIN` of that limit's."""
    inside = inside_the_sla(model, policy, delay_s=delay_s, overhead_s=overhead_s)
    most = max(inside.values())
    near = [batch for batch, rate in inside.items() if rate >= BATCH_STICKINESS * most]
    best = max(near, key=lambda batch: (model.capacity(batch), -batch))
    # The limit in force stays while its full batches fit, whatever it carries inside the SLA
    # now: past the ceiling the fit's spread and the clumping are read from windows of refused
    # requests, and the capacities inside the SLA they give move by a tenth and more from
    # window to window (which would take it in and out of the set on every tick).
    if in_force in inside and model.capacity(in_force) * (1 + SATURATED_GAIN) >= (
        model.capacity(best)
    ):
        return in_force, most
    return best, most


def absorbed_rise(
    model: LatencyFit,
    *,
    batch: int,
    delay_s: float,
    overhead_s: float,
    target_s: float,
    sla_s: float,
) -> float:
    """How many times its planned load a replica carries before its P99 reaches the SLA itself:
    the rise the headroom absorbs without a new replica."""
    # The limit in force may be one the plan would not choose (the burst's): judged all the same.
    carried = replica_capacity(
        model, batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=target_s, sla_s=sla_s
    )
    planned = max(
        sla_capacity(
            model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=target_s
        ),
        carried.rate if carried is not None else 0.0,
    )
    limit = sla_capacity(
        model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=sla_s
    )
    return limit / planned if planned > 0 else 1.0


def adds_capacity(model: LatencyFit, current: InForce, replicas: int, batch: int) -> bool:
    """Whether `replicas` at batch limit `batch` carry more, as the model sees it, than what is
    in force."""
    return replicas * model.capacity(batch) > current.replicas * model.capacity(current.batch_size)


def _optimistic(model: LatencyFit) -> LatencyFit:
    """The most optimistic reading of a rough fit: α and β are only known to add up to the
    measured time at the batch size the guess splits evenly (b₀ = α/β, where α = β·b₀); the
    reading that gives every larger batch the most capacity puts all of that time in α (β = 0),
    so every batch takes t(b₀)."""
    if model.beta_s <= 0 or model.alpha_s <= 0:
        return model  # no split to read otherwise: all fixed, or (a stored fit) all per-row
    return replace(
        model,
        alpha_s=model.batch_seconds(model.alpha_s / model.beta_s),
        beta_s=0.0,
        confident=False,
    )


def rough_scale_down(
    model: LatencyFit,
    measured: ComputePoint,
    *,
    rate: float,
    policy: Policy,
    delay_s: float,
    overhead_s: float,
    target_s: float,
) -> CapacityPlan:
    """What a rough model may give replicas back to: the plan of its slowest reading at every
    batch up to the one its windows ran (`measured`), at a batch limit no larger.

    From one batch size α and β cannot be told apart, and the guess that splits the time evenly
    is too fast wherever the time is all fixed (a smaller batch takes as long) or, beyond the
    size measured, all per row. Up to that size, though, no split makes a batch slower than
    the measured one: planned as if every batch took that long, at batches no larger, the
    replicas kept carry the load whatever α and β turn out to be, at that limit (a larger one
    lets a backlog run batches of unknown time). (Never giving a replica back on a rough model
    kept a burst's fleet for the rest of the day where every batch ran one size — requests of 4
    rows on a limit of 4.)"""
    slowest = replace(model, alpha_s=measured.mean_seconds, beta_s=0.0, confident=False)
    largest = max(1, math.floor(measured.mean_batch + 1e-9))
    return plan_capacity(
        slowest,
        rate=rate,
        policy=replace(policy, max_batch_size=min(policy.max_batch_size, largest)),
        delay_s=delay_s,
        overhead_s=overhead_s,
        target_s=target_s,
    )


def batch_first(
    model: LatencyFit,
    chosen: CapacityPlan,
    *,
    current: InForce,
    state: State,
    rate: float,
    policy: Policy,
    delay_s: float,
    overhead_s: float,
    target_s: float,
    now: float,
    interval: float,
    scrape_s: float,
    sla_met: bool | None,
    timed: bool = True,
) -> tuple[int, int, float, str]:
    """Replicas and batch limit to ask for when a rough model's plan adds replicas, the P99
    predicted for them, and why.

    Raising the batch limit takes effect in seconds and costs nothing; a replica costs a device
    for at least the scale-down delay. The next window measures the new batch sizes and makes
    the fit confident, so replicas wait that one interval behind a larger batch limit — unless
    even the most optimistic reading of the fit (`_optimistic`) needs more of them. Then no batch
    limit can carry the load whatever α and β turn out to be, the SLA stays broken until new
    replicas are ready, and waiting would only make them an interval later: the plan is followed
    at once (P99 comes before the fewest replicas). The wait happens once, and lasts until the
    fit is confident, or `TRIAL_INTERVALS` intervals or `TRIAL_SCRAPES` scrape intervals
    (`scrape_s`) have passed, whichever is longer: a batch size shows in `rate()` from the
    second scrape after the limit changed, so the window right after the change rarely holds it,
    and a plan followed then would be the guess's.
    (Take t(b) = 30 + 0.5·b ms: the guess from batch 1 reads 15 + 15·b, and its plan for 200 rps
    is 16 replicas where one carries the load.) If the fit is still rough after the wait, the
    plan is followed.

    The larger batch limit is the plan's when it raises one and the SLA holds. Otherwise — the
    guess splits the measured time evenly, so it sees little gain in batching, while a fixed
    cost α much larger than β (common on accelerators) would make batching carry many times the
    load — it is the optimistic reading's: if α dominates, that limit carries the load at once;
    if β does, a replica carries about what it did, and the next fit says so. Over the SLA the
    interval is missed whichever limit is tried, so the one that could carry the most is.

    `timed`: the windows time batches by size (the runtime's compute series). Without that, a
    new batch size shows only in the busy share of a window that began after the change, a
    window and an interval later, and the trial is a wait that measures nothing: over the SLA
    (requests refused or late while it waits) the guess is followed at once. (Raising the
    limit the optimistic reading would run beside its replicas was tried: where β dominates, the
    backlog ran batches too long for the SLA — 5 + 8·b ms on/off −1.7 points, the 4-row
    textbook's flash crowd −1.1 — and 10 + 1·b ms in steps took 1.7 times the GPU-seconds.)"""
    if not timed and sla_met is False:
        why = (
            "the fit is a guess from one batch size, and the windows time no batch sizes (a new "
            "limit shows in the busy share only a window after it changed): over the SLA, the "
            "guess is followed now"
        )
        return chosen.replicas, chosen.batch_size, chosen.predicted_p99_s, why
    optimistic = _optimistic(model)
    best = plan_capacity(
        optimistic,
        rate=rate,
        policy=policy,
        delay_s=delay_s,
        overhead_s=overhead_s,
        target_s=target_s,
    )
    measured = format_ms(optimistic.alpha_s)
    reading = (
        f"if every batch took the measured {measured} a replica would carry "
        f"{best.capacity:.0f} rps at batch ≤ {best.batch_size}"
    )
    if best.replicas > current.replicas:
        why = (
            f"the fit is a guess from one batch size, but even {reading}: no batch limit lets "
            f"{current.replicas} carry {rate:.0f} rps, so replicas are added at once"
        )
        return chosen.replicas, chosen.batch_size, chosen.predicted_p99_s, why
    if state.batch_first_at is not None:
        waited = now - state.batch_first_at
        trial = max(TRIAL_INTERVALS * interval, TRIAL_SCRAPES * scrape_s)
        if waited >= trial - interval / 2:
            why = f"still a guess {waited:.0f} s after the batch limit was raised: following it"
            return chosen.replicas, chosen.batch_size, chosen.predicted_p99_s, why
        held = predict(
            model,
            rate=rate,
            replicas=current.replicas,
            max_batch=current.batch_size,
            delay_s=delay_s,
            overhead_s=overhead_s,
        )
        why = (
            f"the fit is a guess from one batch size, and the batch limit raised {waited:.0f} s "
            f"ago is not measured yet (a batch size shows from the second scrape after it "
            f"changes): holding {current.replicas} replica{'s' if current.replicas > 1 else ''} "
            f"one more interval"
        )
        return current.replicas, current.batch_size, held.p99_s, why
    # The plan's larger limit, judged by the guess; else the optimistic reading's, judged by it.
    guessed = chosen.batch_size > current.batch_size and sla_met is not False
    batch = (
        chosen.batch_size
        if guessed
        else max(best.batch_size, chosen.batch_size, current.batch_size)
    )
    held = predict(
        model if guessed else optimistic,
        rate=rate,
        replicas=current.replicas,
        max_batch=batch,
        delay_s=delay_s,
        overhead_s=overhead_s,
    )
    plural = "s" if current.replicas > 1 else ""
    why = (
        f"the fit is a guess from one batch size and {reading}: raising the batch limit first "
        f"and holding {current.replicas} replica{plural} until the windows have measured the "
        f"new batch sizes ({'the guess' if guessed else 'that reading'} "
        f"puts P99 at {format_ms(held.p99_s)} meanwhile)"
    )
    return current.replicas, batch, held.p99_s, why
