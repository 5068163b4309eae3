"""The decision function: (observation, policy, what is in force, state, now) → (decision, state).

Targets, in order: P99 within the SLA; then device utilization inside its band; then the fewest
replicas. The last two agree: the fewest replicas is the busiest device. Utilization is not a
ceiling, though: a batching replica's device is busy nearly all the time long before its P99
suffers (batches grow to fill the time), so the band's maximum would buy replicas that change
nothing; latency is what bounds a replica's load. Batch size moves fast (it takes effect in
seconds, with no restart); replicas move slower: scale-up at once, scale-down only after a
stabilization window and with a wider margin than scale-up needs (`pacing`).

Steps, each small and named:
1. hold when metrics are missing or stale — never scale down blind;
2. learn: refit t(b) ≈ α + β·b; learn the latency spent outside the batcher (observed P99 minus
   the model's, from windows that describe the settings in force); estimate the load now from
   the window's rate and its trend (a 60 s window trails a step by 45 s);
3. plan: the load to plan for — the present, raised for the rises the recent history shows
   recur and the error budget cannot pay for (`headroom`), and to the seasonal forecast where
   every past day rose at this time (`with_season`); then the fewest replicas that carry it
   (+ growth margin) with predicted P99 under the SLA with headroom, and their batch limit
   (`capacity.plan_capacity`);
4. guard: if P99 is over the SLA in a window that describes the present and the plan adds no
   capacity, add replicas on feedback instead (the model is wrong somewhere; observed latency
   wins);
   batch first on a rough model: while the plan raises the batch limit, replicas wait one
   interval for the next window to measure the new batch sizes, unless even the most
   optimistic reading of the guess needs more of them (`capacity.batch_first`); a rough model
   never scales down;
5. pace replicas: cold start, scale-down stabilization, hysteresis, bounds (`pacing.pace`);
6. explain: action, reason and the condition inputs.

What the decision is about (`Policy`, `InForce`, `Decision`) lives in `policy`; what it
remembers between decisions, and its round trip through `status.autopilot`, in `state`.

Pure: state goes in and out explicitly, `now` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from batchpilot.operator.autopilot.capacity import (
    absorbed_rise,
    adds_capacity,
    batch_first,
    burst_batch,
    plan_capacity,
)
from batchpilot.operator.autopilot.headroom import (
    Headroom,
    affordable,
    plan_rate,
)
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.pacing import pace
from batchpilot.operator.autopilot.policy import (
    SLA_HEADROOM,
    Decision,
    InForce,
    Policy,
    format_ms,
    stored_delay_s,
)
from batchpilot.operator.autopilot.season import seasonal_forecast
from batchpilot.operator.autopilot.service_model import fit, predict
from batchpilot.operator.autopilot.state import State

OVERHEAD_SMOOTHING = 0.2
"""Weight of a new estimate of the latency outside the batcher against the previous one."""
LEARN_BELOW_LOAD = 0.9
"""Learn from observed P99 only below this fraction of saturation: near it, P99 is too steep
(and too noisy) to tell the model's error from the load's."""
TREND_SIGNIFICANCE = 3.0
"""Extrapolate a rising rate only when the rise exceeds this many standard deviations of
Poisson noise (otherwise noise alone would add replicas)."""
FEEDBACK_STEP = 0.25
"""On feedback, add this fraction of the replicas (at least one)."""
STALE_WINDOWS = 3
"""An observation older than this many windows is stale."""
DEFAULT_COLD_START_S = 60.0
"""Until a scale-up has been watched, assume new replicas take a minute to take traffic."""
COLD_START_SMOOTHING = 0.3
"""Weight of a new cold-start measurement against the previous estimate."""
DEFAULT_INTERVAL_S = 15.0
"""The decision interval assumed at the first decision, before one has been measured."""
SHED_TOLERANCE = 0.01
"""The SLA is met only while at most this share of the offered requests goes unserved (refused
at arrival, expired): a refused request is a request not answered within the SLA, and the
runtime's admission keeps the P99 of the admitted ones inside it however many it refuses."""
SHED_FEEDBACK = 0.05
"""Refusals beyond this share, while the model says the replicas in force carry the offered
load, are evidence against the model and add replicas (as a P99 over the SLA does). Between
`SHED_TOLERANCE` and this, a burst within the window is the likelier cause: the SLA is
reported missed, and the plan (which already counts every arrival) decides."""


def _hold(
    current: InForce, state: State, reason: str, *, available: bool
) -> tuple[Decision, State]:
    return (
        Decision(
            replicas=current.replicas,
            batch_size=current.batch_size,
            max_queue_delay_s=current.max_queue_delay_s,
            action="hold",
            reason=reason,
            metrics_available=available,
            sla_met=None,
        ),
        state,
    )


def decide(
    observation: Observation | None,
    policy: Policy,
    current: InForce,
    state: State,
    now: float,
) -> tuple[Decision, State]:
    # 1. Missing or stale metrics: hold everything, say why.
    blind = replace(
        state, slo=state.slo.for_objective(policy.objective).record(now, None, covers_s=0)
    )
    if observation is None:
        return _hold(current, blind, "holding: Prometheus did not answer", available=False)
    if now - observation.at > STALE_WINDOWS * observation.window_s:
        age = now - observation.at
        return _hold(current, blind, f"holding: metrics are {age:.0f} s old", available=False)
    if missing := observation.missing():
        return _hold(
            current,
            blind,
            f"holding: no {', '.join(missing)} in Prometheus; never scaling on missing metrics",
            available=False,
        )
    assert observation.qps is not None
    assert observation.ready_replicas is not None
    sla = policy.sla_p99_s
    p99 = observation.p99_s
    idle = observation.idle
    ready = observation.ready_replicas
    offered = observation.offered_qps or 0.0
    unserved = observation.unserved_share
    delay_s = stored_delay_s(min(policy.max_queue_delay_s, 0.1 * sla))

    # 2. Judge the window, and keep the books of the objective.
    sla_met = judge(observation, policy)
    slo = state.slo.for_objective(policy.objective).record(
        now, True if idle else sla_met, covers_s=observation.window_s
    )

    # 3. Learn: the fit; the latency outside the batcher; the cold start; the load now.
    learned = learn(observation, policy, current, state, now, sla_met=sla_met)
    model, overhead, settled = learned.state.fit, learned.state.overhead_s, learned.settled
    outside = min(overhead or 0.0, sla)
    # Headroom applies to the part of P99 the knobs move: the latency outside the batcher stays.
    target = outside + SLA_HEADROOM * (sla - outside)
    rate, trend = present_load(observation, state, now, settled=settled)
    # Measurements only: an extrapolated rate in the history would raise the peak it caps by.
    history = state.history.add(now, max(offered, observation.recent_qps or 0.0))
    horizon = reaction_horizon(learned.state, interval=learned.interval)

    def absorbs() -> float:
        """How many times its planned load a replica in force carries inside the SLA."""
        if model is None:
            return 1.0
        return absorbed_rise(
            model,
            batch=current.batch_size,
            delay_s=delay_s,
            overhead_s=overhead or 0.0,
            target_s=target,
            sla_s=sla,
        )

    headroom = plan_rate(
        rate,
        history,
        horizon_s=horizon,
        affordable=affordable(policy.objective, slo.report(now)),
        absorbed=absorbs,
    )
    headroom = with_season(headroom, observation, present=rate, absorbed=absorbs)
    learned_state = replace(learned.state, slo=slo, history=history, rate=(now, offered))

    # 4. Plan from the model; or, without one yet, from feedback alone.
    notes: list[str] = []
    predicted: float | None = None
    capacity_per_replica: float | None = None
    if idle and (model is None or headroom.rate <= 0):
        # An idle service whose traffic recurs keeps what the recurring rise needs (below).
        want_replicas, want_batch = policy.min_replicas, current.batch_size
        why = "no traffic"
    elif model is None:
        want_replicas, want_batch, why = _feedback(observation, policy, current)
    else:
        chosen = plan_capacity(
            model,
            rate=headroom.rate,
            policy=policy,
            delay_s=delay_s,
            overhead_s=overhead or 0.0,
            target_s=target,
            prefer=current.batch_size,
        )
        want_replicas, want_batch = chosen.replicas, chosen.batch_size
        predicted = chosen.predicted_p99_s
        capacity_per_replica = chosen.capacity
        why = (
            f"model t(b) = {model.alpha_s * 1e3:.2f} + {model.beta_s * 1e3:.2f}·b ms"
            f"{'' if model.confident else ' (rough)'} + {format_ms(outside)} outside the batcher: "
            f"a replica carries "
            f"{chosen.capacity:.0f} rps at batch ≤ {chosen.batch_size} inside {format_ms(target)}, "
            f"so {chosen.replicas} for {headroom.rate:.0f} rps (P99 {format_ms(predicted)})"
        )
        if not chosen.feasible:
            notes.append("no configuration within maxReplicas is predicted to meet the SLA")
        # 5. Guard: over the SLA in a window of the present, and the plan adds no capacity →
        # trust the observation.
        if (
            ((p99 is not None and p99 > sla) or unserved > SHED_FEEDBACK)
            and settled
            and ready >= current.replicas
            and not adds_capacity(model, current, want_replicas, want_batch)
        ):
            want_replicas = current.replicas + max(1, math.ceil(FEEDBACK_STEP * current.replicas))
            want_batch = current.batch_size
            what = (
                "P99 over the SLA"
                if p99 is not None and p99 > sla
                else f"{unserved:.0%} of the requests refused or expired"
            )
            why = (
                f"{what} although the model predicts {format_ms(predicted)}; "
                f"feedback: adding {want_replicas - current.replicas} replicas"
            )
        elif not model.confident:
            if want_replicas > current.replicas and want_batch > current.batch_size:
                want_replicas, predicted, first = batch_first(
                    model,
                    chosen,
                    current=current,
                    state=state,
                    rate=headroom.rate,
                    policy=policy,
                    delay_s=delay_s,
                    overhead_s=overhead or 0.0,
                    target_s=target,
                )
                why += f"; {first}"
                if want_replicas == current.replicas:
                    learned_state = replace(learned_state, batch_first_at=now)
            elif want_replicas < current.replicas:
                want_replicas = current.replicas
                notes.append("not scaling down on a rough model")
        why += headroom.note
    why += trend

    # 6. Pace the replicas.
    replicas, recommendations, pace_note = pace(
        want=want_replicas,
        current=current,
        ready=ready,
        sla_met=sla_met,
        policy=policy,
        state=learned_state,
        now=now,
        model=model,
        rate=headroom.rate,
        batch=want_batch,
        delay_s=delay_s,
        overhead_s=overhead or 0.0,
    )
    if pace_note:
        notes.append(pace_note)
    if model is not None and not idle and (replicas > ready or sla_met is False):
        # 7. Absorb: until the new replicas take traffic, the ready ones carry it all; and over
        # the SLA, capacity is not given back. The batch limit moves in seconds and costs
        # nothing: the one with the most capacity inside the SLA itself.
        absorbing = burst_batch(model, policy, delay_s=delay_s, overhead_s=overhead or 0.0)
        if absorbing != want_batch:
            why += f"; batch ≤ {absorbing} (the most a replica carries inside the SLA) while " + (
                f"{replicas - ready} of {replicas} replicas start"
                if replicas > ready
                else "over the SLA"
            )
            want_batch = absorbing
    retuned = (want_batch, delay_s) != (current.batch_size, current.max_queue_delay_s)
    new_state = replace(
        learned_state,
        recommendations=recommendations,
        changed_at=now if retuned else learned_state.changed_at,
        pending_since=(
            now
            if replicas > current.replicas and learned_state.pending_since is None
            else learned_state.pending_since
        ),
    )

    # 8. Explain.
    return explain(
        observation,
        policy,
        current,
        replicas=replicas,
        want_replicas=want_replicas,
        batch=want_batch,
        delay_s=delay_s,
        sla_met=sla_met,
        why=why,
        notes=notes,
        predicted=predicted,
        capacity=capacity_per_replica,
        retuned=retuned,
    ), new_state


def judge(observation: Observation, policy: Policy) -> bool | None:
    """Whether the window was inside the SLA: P99 under it and at most `SHED_TOLERANCE` of the
    offered requests unserved; None when unknown (no traffic, no latency)."""
    if observation.idle or observation.p99_s is None:
        return None
    return observation.p99_s <= policy.sla_p99_s and observation.unserved_share <= SHED_TOLERANCE


@dataclass(frozen=True, slots=True)
class Learned:
    state: State
    """The state with what was learned (fit, overhead, change, readiness, cold start)."""
    settled: bool
    """Whether the window describes the settings in force."""
    interval: float
    """Seconds since the previous decision (0 at the first)."""


def learn(
    observation: Observation,
    policy: Policy,
    current: InForce,
    state: State,
    now: float,
    *,
    sla_met: bool | None,
) -> Learned:
    """Refit t(b); learn the latency outside the batcher from healthy windows of the present;
    note when the capacity in force changed and how long new replicas took to start."""
    assert observation.ready_replicas is not None
    ready = observation.ready_replicas
    changed_at = state.changed_at
    if state.ready is not None and ready != state.ready:
        changed_at = now
    # The window describes the settings in force once it starts after the change, and after the
    # backlog of the old settings has drained: allow one decision interval for that.
    interval = now - state.rate[0] if state.rate is not None else 0.0
    settled = changed_at is None or now - changed_at >= observation.window_s + interval
    model = fit(observation.compute, state.fit)
    overhead = state.overhead_s
    p99 = observation.p99_s
    if model is not None and p99 is not None and sla_met and settled:
        # Only healthy windows teach the overhead: an unhealthy one is the guard's business.
        expected = predict(
            model,
            rate=observation.offered_qps or 0.0,
            replicas=max(1, ready),
            max_batch=current.batch_size,
            delay_s=current.max_queue_delay_s,
        )
        if expected.load < LEARN_BELOW_LOAD:
            residual = min(policy.sla_p99_s, max(0.0, p99 - expected.p99_s))
            overhead = (
                residual
                if overhead is None
                else OVERHEAD_SMOOTHING * residual + (1 - OVERHEAD_SMOOTHING) * overhead
            )
    cold_start, pending = state.cold_start_s, state.pending_since
    if pending is not None and ready >= current.replicas:
        # They became ready within the last interval: count half of it.
        sample = max(0.0, now - pending - interval / 2)
        cold_start = (
            sample
            if cold_start is None
            else COLD_START_SMOOTHING * sample + (1 - COLD_START_SMOOTHING) * cold_start
        )
        pending = None
    return Learned(
        state=replace(
            state,
            fit=model,
            overhead_s=overhead,
            changed_at=changed_at,
            ready=ready,
            cold_start_s=cold_start,
            pending_since=pending,
        ),
        settled=settled,
        interval=interval,
    )


def present_load(
    observation: Observation, state: State, now: float, *, settled: bool
) -> tuple[float, str]:
    """The offered rate now, and a note when it is not the window's.

    The window's rate trails a sudden rise by half the window. The runtime's arrival counter
    over a short recent window shows it a few seconds in: taken when it is significantly above
    the window's (more than `TREND_SIGNIFICANCE` standard deviations of Poisson noise over the
    short window); a fall waits for the window (never scale down on a few seconds). Without the
    short window, a rising window's trend is extrapolated: the window moved by one interval, so
    the newest interval carries the whole change."""
    offered = observation.offered_qps or 0.0
    recent, span = observation.recent_qps, observation.recent_window_s
    if recent is not None and span:
        noise = math.sqrt(max(offered, 1.0) / span)
        if recent - offered > TREND_SIGNIFICANCE * noise:
            return recent, f"; rising: {recent:.0f} rps over the last {span:.0f} s"
        return offered, ""
    if settled and state.rate is not None:
        then, before = state.rate
        gap = now - then
        noise = math.sqrt(2 * max(before, 1.0) * gap) / observation.window_s
        if 0 < gap < observation.window_s and offered - before > TREND_SIGNIFICANCE * noise:
            rate = before + (offered - before) * observation.window_s / gap
            return rate, f", rising to {rate:.0f} rps"
    return offered, ""


def with_season(
    headroom: Headroom,
    observation: Observation,
    *,
    present: float,
    absorbed: Callable[[], float] = lambda: 1.0,
) -> Headroom:
    """The planned rate, raised where every past period (a day by default) rose at this time: by
    so much that the replicas in force when the rise comes carry it inside the SLA itself
    (`absorbed`: the latency headroom carries the rest) until the reaction to it has added what
    the rise needs. So the floor is in force before the rise, not a horizon after it; and the
    day's smooth ramps, which the headroom absorbs, buy nothing."""
    forecast = seasonal_forecast(observation.level_qps, observation.past)
    if forecast is None or forecast.rate <= headroom.rate:
        return headroom
    floor = forecast.rate / max(1.0, absorbed())
    if floor <= headroom.rate:
        return headroom
    return Headroom(
        floor,
        floor / max(present, 1e-9),
        f"; planning for {floor:.0f} rps: at this time in each of the last "
        f"{forecast.periods} periods the load rose to {forecast.rate:.0f} rps within minutes "
        f"(scaled ×{forecast.scale:.2f} to today's level)",
    )


def reaction_horizon(state: State, *, interval: float) -> float:
    """How long a rise goes uncarried: until the metrics show it (a scrape, then the next
    decision: about two intervals, the scrape interval being about one), plus the cold start
    (learned; `DEFAULT_COLD_START_S` until measured)."""
    cold = state.cold_start_s if state.cold_start_s is not None else DEFAULT_COLD_START_S
    return 2 * (interval or DEFAULT_INTERVAL_S) + cold


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
        predicted_p99_s=predicted,
        capacity_rps=capacity,
        notes=tuple(notes),
    )


def _feedback(observation: Observation, policy: Policy, current: InForce) -> tuple[int, int, str]:
    """A step on observed P99 alone: batch first (fast, cheap), then replicas."""
    p99 = observation.p99_s
    sla = policy.sla_p99_s
    if p99 is not None and p99 > sla:
        if current.batch_size < policy.max_batch_size:
            batch = min(policy.max_batch_size, current.batch_size * 2)
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
