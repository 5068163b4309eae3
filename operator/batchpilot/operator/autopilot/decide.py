"""The decision function: (observation, policy, what is in force, state, now) → (decision, state).

Targets, in order: P99 within the SLA; then device utilization inside its band; then the fewest
replicas. The last two agree: the fewest replicas is the busiest device. Utilization is not a
ceiling, though: a batching replica's device is busy nearly all the time long before its P99
suffers (batches grow to fill the time), so the band's maximum would buy replicas that change
nothing; latency is what bounds a replica's load. Batch size moves fast (it takes effect in
seconds, with no restart); replicas move slower: scale-up at once, scale-down only after a
stabilization window and with a wider margin than scale-up needs (`pacing`).

Steps, each small and named:
1. hold when metrics are missing or stale — never scale down blind (nor on a window Prometheus
   holds only the last part of: `pacing`);
2. learn: refit t(b) ≈ α + β·b; learn the latency spent outside the batcher (observed P99 minus
   the model's, from windows that describe the settings in force); estimate the load now from
   the window's rate and its trend (a 60 s window trails a step by 45 s), and for traffic that
   began inside a saturated window, from the share of it the devices were busy;
3. plan: the load to plan for — the present, raised for the rises the recent history shows
   recur and the error budget cannot pay for (`headroom`), and to the seasonal forecast where
   every past day rose at this time (`with_season`); then the fewest replicas that carry it
   (+ growth margin) with predicted P99 under the SLA with headroom, and their batch limit
   (`capacity.plan_capacity`);
4. guard: if P99 is over the SLA in a window that describes the present and the plan adds no
   capacity, add replicas on feedback instead (the model is wrong somewhere; observed latency
   wins: `feedback.overruled`);
   batch first on a rough model: when the plan adds replicas, the batch limit rises first and
   replicas wait (two intervals or two scrapes at most) for the windows to measure the new
   batch sizes, unless even the most optimistic reading of the guess needs more of them
   (`capacity.batch_first`); a rough model scales down only as far as its slowest reading
   allows (`capacity.rough_scale_down`);
   stand in for lost replicas: ones that were ready and are away (a node that died: its pods
   are replaced only once evicted, minutes later) are asked for again beside the plan's — at
   once over the SLA, else once away longer than a restart or the eviction takes (`lost`);
   replace a replica whose batches run slower than its peers' (`stragglers`);
5. pace replicas: cold start, scale-down stabilization, hysteresis, bounds (`pacing.pace`);
6. explain: action, reason and the condition inputs.

This module is the pipeline; each step lives with what it needs: what the window teaches
(`learn`, and `lost` for the replicas lost), the load to plan for (`headroom`, `season`, and
`with_season` here), the capacity plan and batch first (`capacity`), the guard and the feedback
used without a model (`feedback`), the pacing of replicas (`pacing`), the verdict and the account
of the decision (`explain`). What the decision is about (`Policy`, `InForce`, `Decision`) lives
in `policy`; what it remembers between decisions, and its round trip through
`status.autopilot`, in `state`.

Pure: state goes in and out explicitly, `now` is an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from batchpilot.operator.autopilot.capacity import (
    CapacityPlan,
    absorbed_rise,
    batch_first,
    burst_batch,
    plan_capacity,
    rough_scale_down,
    saturated_batch,
)
from batchpilot.operator.autopilot.ceiling import found_ceiling, kept_ceiling
from batchpilot.operator.autopilot.explain import explain, judge, near_the_edge
from batchpilot.operator.autopilot.feedback import (
    busy_plan,
    feedback_only,
    misses_persist,
    overruled,
)
from batchpilot.operator.autopilot.headroom import (
    Headroom,
    affordable,
    plan_rate,
)
from batchpilot.operator.autopilot.learn import (
    DEFAULT_INTERVAL_S,
    cold_start_of,
    learn,
    newest_rate,
    present_load,
    reaction_horizon,
    refused_lately,
    saturated_load,
    split_dispersion,
    unlearned,
    unserved_qps,
)
from batchpilot.operator.autopilot.lost import stand_ins, stood_in
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.pacing import CLEAN_SHARE, REFUSING_SHARE, pace, unseen
from batchpilot.operator.autopilot.policy import (
    LOAD_HEADROOM,
    Decision,
    InForce,
    Policy,
    format_ms,
    p99_bounds,
    stored_delay_s,
)
from batchpilot.operator.autopilot.season import seasonal_forecast
from batchpilot.operator.autopilot.service_model import LatencyFit, sla_capacity
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.autopilot.stragglers import hand_over
from batchpilot.operator.autopilot.stragglers import judge as judge_pods

BEYOND = LOAD_HEADROOM
"""A load this many times what the ready replicas carry inside the SLA at any limit, at
maxReplicas and refusing, is far beyond it: every window misses whatever the limit, and the
limit is the one that answers the most in time (`capacity.saturated_batch`). Nearer, where P99
sits at the SLA's edge, a smaller limit's shorter batches still keep some windows inside (the
textbook's service at 1.03 times its ceiling: 12 rows kept 87 % of windows inside, 6 rows
93 %)."""
BEYOND_REFUSED = 0.1
"""…and only where the window refused more than this share: the load estimate may run high (the
window's busiest second, a rise read from the last seconds) and the capacity inside the SLA low
(cut for clumps and varying batch times), while full batches answer about a tenth more than
that capacity — a load truly a quarter beyond it leaves a tenth or more unanswered. (Clumped
arrivals at 1.05 times the textbook's ceiling read "1552 rps is far beyond the 1164" with 5 %
refused, and the larger limit taken then answered less in time for half an hour.)"""
FLOOR_MARGIN = 1.5
"""Where the SLA is below what a request takes alone (the time outside the batcher and a batch of
its rows), the plan keeps P99 within this of that floor instead: the replicas and batches that
carry the load near its best latency, not every replica maxReplicas allows for nothing."""
STALE_WINDOWS = 3
"""An observation older than this many windows is stale."""
ESTIMATES_WINDOWS = 1.5
"""The newest intervals' rates estimated over this many windows are kept: the trend asks for the
one a window ago (`learn.newest_rate`)."""
MAX_ESTIMATES = 32
"""And at most this many (a long window read at a short interval falls back on the previous
window's mean)."""


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


def _all_refused(observation: Observation) -> bool:
    """A window whose requests were every one refused or expired: no latency was measured, and
    none is missing — nothing was answered."""
    return (
        observation.p99_s is None
        and observation.qps == 0.0
        and bool(observation.rejected_qps or observation.arrival_qps)
        and observation.ready_replicas is not None
    )


def _answering_nothing(
    observation: Observation, policy: Policy, current: InForce, state: State, now: float
) -> tuple[Decision, State]:
    """Every request refused: the window missed the SLA whole, its books say so, and a replica
    more is asked for once those asked for are ready — read as a window without latency, it held
    everything for as long as the pods refused (a deadline below the preprocess's time refused
    every request on an idle replica), and said the metrics were missing."""
    covers = observation.window_s if observation.covered_s is None else observation.covered_s
    slo = state.slo.for_objective(policy.objective).record(now, False, covers_s=covers)
    ready = observation.ready_replicas
    assert ready is not None
    offered = observation.offered_qps or 0.0
    reason = f"every request refused or expired ({offered:.0f} rps offered, none answered)"
    # Where the fit says the ready replicas carry the load, more would refuse it as well: the
    # pods refuse for a reason of their own (a deadline below a stage's time before the model),
    # and replicas up to maxReplicas would be a runaway that helps nothing.
    carries = None
    if state.fit is not None and state.fit.confident:
        carries = ready * sla_capacity(
            state.fit,
            max_batch=policy.max_batch_size,
            delay_s=current.max_queue_delay_s,
            overhead_s=state.overhead_s or 0.0,
            target_s=policy.sla_p99_s,
        )
    replicas = current.replicas
    if carries is not None and offered <= carries:
        reason += (
            f"; the {ready} ready replicas carry {carries:.0f} rps inside the SLA by the fit: "
            "they refuse for a reason of their own (their deadline, a stage before the model) "
            "that more replicas would not change"
        )
    elif ready >= current.replicas:
        replicas = min(policy.max_replicas, current.replicas + 1)
    if replicas > current.replicas:
        reason += f": {current.replicas}→{replicas} replicas"
    elif carries is not None and offered <= carries:
        pass
    elif ready < current.replicas:
        reason += f"; {current.replicas - ready} of the replicas asked for not ready yet"
    else:
        reason += f"; at maxReplicas ({policy.max_replicas})"
    at_max = replicas >= policy.max_replicas and not (carries is not None and offered <= carries)
    return (
        Decision(
            replicas=replicas,
            batch_size=current.batch_size,
            max_queue_delay_s=current.max_queue_delay_s,
            action="scale-up" if replicas > current.replicas else "steady",
            reason=reason,
            metrics_available=True,
            sla_met=False,
            scaling_limited=(
                f"at maxReplicas {policy.max_replicas} with every request refused; raise "
                "maxReplicas, or see why the replicas refuse (their deadline, a stage before "
                "the model)"
                if at_max
                else None
            ),
        ),
        replace(state, slo=slo),
    )


def decide(
    observation: Observation | None,
    policy: Policy,
    current: InForce,
    state: State,
    now: float,
) -> tuple[Decision, State]:
    # 0. What a spec edit left of the memory (a new model's batch times, a looser SLA).
    state, edited = unlearned(state, policy)
    # 1. Missing or stale metrics: hold everything, say why.
    blind = replace(
        unseen(state, now=now, replicas=current.replicas, delay_s=policy.scale_down_delay_s),
        slo=state.slo.for_objective(policy.objective).record(now, None, covers_s=0),
    )
    if observation is None:
        return _hold(current, blind, "holding: Prometheus did not answer", available=False)
    if now - observation.at > STALE_WINDOWS * observation.window_s:
        age = now - observation.at
        return _hold(current, blind, f"holding: metrics are {age:.0f} s old", available=False)
    if observation.ready_replicas is None:
        # A caller that counts no ready replicas (the operator always has the Deployment's):
        # those in force, as a steady service has them.
        observation = replace(observation, ready_replicas=current.replicas)
    if _all_refused(observation):
        # The books are kept of this window (blind's record says it unjudged).
        return _answering_nothing(observation, policy, current, replace(blind, slo=state.slo), now)
    if missing := observation.missing():
        return _hold(
            current,
            blind,
            f"holding: no {', '.join(missing)} in Prometheus; never scaling on missing metrics",
            available=False,
        )
    if (scrapes := observation.scrapes_per_replica) is not None and scrapes > 1:
        return _hold(
            current,
            blind,
            f"holding: Prometheus scrapes a replica {scrapes} times (two scrape jobs on its pod: "
            "a PodMonitor beside annotations, say), so every rate counts its load as many; "
            "drop one of the jobs",
            available=False,
        )
    assert observation.qps is not None
    assert observation.ready_replicas is not None
    memory = observation.memory_rows
    if memory is not None and memory < policy.max_batch_size:
        # The runtime forms no batch larger than its device has memory for: plan with what runs.
        policy = replace(policy, max_batch_size=memory)
    sla = policy.sla_p99_s
    idle = observation.idle
    ready = observation.ready_replicas
    offered = observation.offered_qps or 0.0
    delay_s = stored_delay_s(min(policy.max_queue_delay_s, 0.1 * sla))

    # 2. Judge the window, and keep the books of the objective.
    sla_met = judge(observation, policy)
    # A verdict stands for the part of the window Prometheus holds, no more.
    covers = observation.window_s if observation.covered_s is None else observation.covered_s
    slo = state.slo.for_objective(policy.objective).record(
        now, True if idle else sla_met, covers_s=covers
    )

    # A replica slower than its peers is replaced, not compensated with more replicas; and its
    # batches, in the window's until it is gone, teach the fit nothing of the service.
    stragglers = judge_pods(
        observation.pods,
        state.fit,
        state.stragglers,
        recent=observation.recent_pods,
        now=now,
        cold_start_s=cold_start_of(state),
        window_s=observation.window_s,
        comparable=not policy.rolling,
        act=policy.replace_slow,
    )
    taught = replace(observation, compute=()) if stragglers.taints else observation

    # 3. Learn: the fit; the latency outside the batcher; the cold start; the load now.
    learned = learn(taught, policy, current, state, now)
    model, overhead, settled = learned.state.fit, learned.state.overhead_s, learned.settled
    outside = min(overhead or 0.0, sla)
    # Headroom applies to the part of P99 the knobs move: the latency outside the batcher stays.
    target, near = p99_bounds(sla, outside)
    # A request alone spends the time outside the batcher and its own batch's: an SLA below that
    # no replica meets, and every replica bought for it serves nothing (maxReplicas, window after
    # window). Plan, and steer, for a P99 within `FLOOR_MARGIN` of that floor instead, and say so;
    # the verdict and the objective's books stay the SLA's.
    alone = None if model is None else outside + model.batch_seconds(model.request_rows())
    planning, steered, steering = policy, sla_met, observation
    below_floor: str | None = None
    if alone is not None and alone > sla:
        planning = replace(policy, sla_p99_s=alone * FLOOR_MARGIN)
        target, near = p99_bounds(planning.sla_p99_s, outside)
        delay_s = stored_delay_s(min(policy.max_queue_delay_s, 0.1 * planning.sla_p99_s))
        # (The runtime counts the requests over its SLA, not this one: the reading judges.)
        steering = replace(observation, late_share=None)
        steered = judge(steering, planning)
        below_floor = (
            f"the SLA is below what a request takes alone: {format_ms(alone)}, "
            f"{format_ms(outside)} of it outside the batcher; planning for P99 within "
            f"{FLOOR_MARGIN - 1:.0%} of that — raise the SLA or cut the time outside the batcher"
        )
    # What the newest interval ran at: the trend now where this window describes the settings
    # in force, and the trend a window from now whether or not (the arrivals do not depend on
    # them).
    newest = newest_rate(observation, state, now)
    rate, trend = present_load(observation, newest if settled else None)
    since = now - ESTIMATES_WINDOWS * observation.window_s
    kept = [(t, r) for t, r in state.estimates if since < t < now][-(MAX_ESTIMATES - 1) :]
    estimates = (*kept, (now, offered if newest is None else newest))
    # A batch limit changed inside the window: whether the limit in force refused too, where it
    # was in force over the whole interval the window took in since the previous decision.
    refused_since = settled or (
        state.changed_at is not None
        and state.rate is not None
        and state.changed_at <= state.rate[0]
        and refused_lately(observation, state, now)
    )
    saturated = saturated_load(
        observation, settled=learned.replicas_settled, refused_since=refused_since
    )
    # Rising (the recent rate above the window's; without it, the window's mean significantly
    # above the previous one's, whether or not the window describes the settings in force), and
    # the window saturated: the traffic began inside it. (A recent rate that shows no rise
    # overrules the mean: a spike since gone.)
    began = rate > offered or (newest is not None and observation.recent_qps is None)
    if began and saturated is not None and saturated > rate:
        rate = saturated
        trend = (
            f"; rising: {observation.unserved_share:.0%} refused with the devices busy "
            f"{observation.utilization:.0%} of the window, about {saturated:.0f} rps since"
        )
    if model is not None and offered * model.unevenness > rate:
        # The window's mean hides its busy seconds: plan for the rate its requests met there.
        rate = offered * model.unevenness
        trend = (
            f"; uneven: its requests met {rate:.0f} rps in their second, "
            f"{model.unevenness:.2f}× the window's {offered:.0f}"
        )
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
            sla_s=planning.sla_p99_s,
        )

    budget = affordable(policy.objective, slo.report(now))
    headroom = plan_rate(rate, history, horizon_s=horizon, affordable=budget, absorbed=absorbs)
    headroom = with_season(headroom, observation, present=rate, absorbed=absorbs)
    learned_state = replace(
        learned.state,
        slo=slo,
        history=history,
        rate=(now, offered),
        refused=unserved_qps(observation),
        estimates=estimates,
    )
    # A straggler chosen for replacement may serve on until its stand-in is ready: the ceiling
    # goes a window after it left, once the windows no longer hold its batches.
    serving_still = {pod for pod, _ in stragglers.state.waiting}
    ceiling = kept_ceiling(
        state.ceiling,
        sla_met=steered,
        settled=settled,
        offered=offered,
        ready=ready,
        now=now,
        replaced_since=lambda at: any(
            at < t <= now - observation.window_s and pod not in serving_still
            for pod, t in stragglers.state.replaced
        ),
    )

    def kept_in(plan: CapacityPlan) -> str:
        """Where the plan keeps its headroom, in the words of the reason."""
        if not plan.load_headroom:
            return f"inside {format_ms(target)}"
        return f"with {LOAD_HEADROOM - 1:.0%} to spare inside {format_ms(near)}"

    # 4. Plan from the model; or, without one yet, from feedback alone.
    notes: list[str] = [edited] if edited else []
    trying_the_batch = False
    predicted: float | None = None
    capacity_per_replica: float | None = None
    if idle and (model is None or headroom.rate <= 0):
        # An idle service whose traffic recurs keeps what the recurring rise needs (below).
        want_replicas = policy.min_replicas
        want_batch = min(current.batch_size, policy.max_batch_size)
        why = "no traffic"
    elif model is None and observation.utilization is not None:
        # No batch sized or timed, but the devices' busy share: planned to a busy share. (A
        # window without it gets P99's step below, whatever an earlier one taught: misses
        # must move something.)
        want_replicas, want_batch, why, busy = busy_plan(
            steering,
            planning,
            current,
            state.busy,
            rate=headroom.rate,
            settled=settled,
            rising=began,
            comfortable_s=target,
            now=now,
            peak=max(history.peak, offered),
        )
        why += headroom.note
        learned_state = replace(learned_state, busy=busy)
        capacity_per_replica = busy.carries()
    elif model is None:
        want_replicas, want_batch, why = feedback_only(observation, policy, current)
    else:

        def plan(planned: LatencyFit) -> CapacityPlan:
            return plan_capacity(
                planned,
                rate=headroom.rate,
                policy=planning,
                delay_s=delay_s,
                overhead_s=overhead or 0.0,
                target_s=target,
                prefer=current.batch_size,
            )

        def clumped(plan_of: Callable[[LatencyFit], CapacityPlan]) -> CapacityPlan:
            """Clumps split over the replicas: fewer replicas each see more of a clump. A plan
            for fewer replicas than measured it is made again with the dispersion they would
            see, until it holds (a plan for more keeps the measured one: a little more than
            needed)."""
            planned = plan_of(model)
            measured_over = max(1, ready)
            for _ in range(CLUMP_REPLANS):
                if model.dispersion <= 1.0 or planned.replicas >= measured_over:
                    break
                seen = split_dispersion(model.dispersion, measured_over, planned.replicas)
                again = plan_of(replace(model, dispersion=seen))
                if again.replicas <= planned.replicas:
                    break
                planned = again
            return planned

        chosen = clumped(plan)
        want_replicas, want_batch = chosen.replicas, chosen.batch_size
        predicted = chosen.predicted_p99_s
        capacity_per_replica = chosen.capacity
        why = (
            f"model t(b) = {model.alpha_s * 1e3:.2f} + {model.beta_s * 1e3:.2f}·b ms"
            f"{_varies_note(model)}"
            f"{'' if model.confident else ' (rough)'}"
            f"{_rows_note(model)}"
            f" + {format_ms(outside)} outside the batcher"
            f"{_clumps_note(model)}: "
            f"a replica carries "
            f"{chosen.capacity:.0f} rps at batch ≤ {chosen.batch_size} {kept_in(chosen)}, "
            f"so {chosen.replicas} for {headroom.rate:.0f} rps (P99 {format_ms(predicted)})"
        )
        if below_floor is not None:
            notes.append(below_floor)
        elif not chosen.feasible:
            notes.append("no configuration within maxReplicas is predicted to meet the SLA")
        # 5. Guard: over the SLA in a window of the present, and the plan adds no capacity →
        # trust the observation. Replicas lost serve nothing: the guard weighs the rest, as the
        # plan does.
        serving = replace(current, replicas=current.replicas - learned.state.lost.count)
        # (Below the floor no replica helps: the guard steers by the plan's SLA too.)
        overrule = overruled(
            steering,
            planning,
            serving,
            model,
            settled=settled,
            want_replicas=want_replicas,
            want_batch=want_batch,
            predicted=predicted,
            persistent=misses_persist(
                slo, now, changed_at=learned_state.ready_changed_at, window_s=observation.window_s
            ),
        )
        if overrule is not None:
            want_replicas, why = overrule
            want_batch = current.batch_size
            found = found_ceiling(
                offered,
                serving=serving.replicas,
                window_s=observation.covered_s or observation.window_s,
                now=now,
            )
            ceiling = found or ceiling
        elif not model.confident:
            if want_replicas > current.replicas:
                want_replicas, want_batch, predicted, first = batch_first(
                    model,
                    chosen,
                    current=current,
                    state=state,
                    rate=headroom.rate,
                    policy=planning,
                    delay_s=delay_s,
                    overhead_s=overhead or 0.0,
                    target_s=target,
                    now=now,
                    interval=learned.interval or DEFAULT_INTERVAL_S,
                    # the fast signal's span: the last two scrapes, about one scrape interval
                    scrape_s=observation.recent_window_s or 0.0,
                    sla_met=steered,
                    timed=bool(observation.compute),
                )
                why += f"; {first}"
                trying_the_batch = want_replicas == current.replicas
                if trying_the_batch and learned_state.batch_first_at is None:
                    learned_state = replace(learned_state, batch_first_at=now)
            elif want_replicas < current.replicas:
                measured = learned_state.anchor
                slowest = (
                    None
                    if measured is None
                    else clumped(
                        lambda planned: rough_scale_down(
                            planned,
                            measured,
                            rate=headroom.rate,
                            policy=planning,
                            delay_s=delay_s,
                            overhead_s=overhead or 0.0,
                            target_s=target,
                        )
                    )
                )
                if slowest is None or measured is None or not slowest.feasible:
                    want_replicas = current.replicas
                    notes.append("not scaling down on a rough model")
                else:
                    # Planned for batches no larger than the one measured: a larger limit lets a
                    # backlog run batches of unknown time (all per row, 4 take 4 times as long).
                    slow = (
                        f"if every batch up to the {measured.mean_batch:.1f} measured took its "
                        f"{format_ms(measured.mean_seconds)}, {slowest.replicas} would carry "
                        f"{headroom.rate:.0f} rps at batch ≤ {slowest.batch_size}"
                    )
                    if want_replicas < slowest.replicas <= current.replicas:
                        # (Where it needs more than are in force, the limit in force carries
                        # what it does; lowered, it would carry less.)
                        want_batch = min(want_batch, slowest.batch_size)
                    if slowest.replicas >= current.replicas:
                        want_replicas = current.replicas
                        notes.append(f"not scaling down on a rough model: {slow}")
                    else:
                        want_replicas = max(want_replicas, slowest.replicas)
                        notes.append(
                            f"a rough model gives back only what its slowest reading allows: {slow}"
                        )
        why += headroom.note
        if ceiling is not None and not idle and planning is policy:
            floor = min(policy.max_replicas, ceiling.floor(headroom.rate, want_replicas))
            if floor > want_replicas:
                want_replicas = floor
                why += (
                    f"; at least {floor}: {ceiling.replicas} replicas missed the SLA at "
                    f"{ceiling.rps_per_replica:.0f} rps each {now - ceiling.at:.0f} s ago, "
                    "where the model said they carried it"
                )
    why += trend
    away = stand_ins(
        learned_state.lost,
        plan=want_replicas,
        cold_start_s=cold_start_of(learned_state),
        now=now,
        evicted_after_s=policy.evicted_after_s,
        missed=steered is False,
    )
    if away and not idle:
        # Lost replicas (a node that died) are counted in force but serve nothing: ask for as
        # many beside the plan's, which start at once elsewhere.
        want_replicas += away
        why += f"; {stood_in(learned_state.lost, away, now=now)}"

    if stragglers.note:
        why += f"; {stragglers.note}"
    handover = hand_over(
        stragglers.replace,
        stragglers.state,
        # the replicas the load needs now, without the plan's headroom or margin for a rise
        needed=(
            offered / capacity_per_replica
            if capacity_per_replica and not idle
            else float(want_replicas)
        ),
        ready=ready,
        in_force=current.replicas,
        now=now,
        cold_start_s=cold_start_of(learned_state),
    )
    if handover.note:
        why += f"; {handover.note}"
    want_replicas += handover.extra

    # 6. Pace the replicas. A window refusing requests marks its recommendation (its load may
    # count retries); one refusing none, of the replicas in force, shows what they stood for.
    unserved = observation.unserved_share
    paced = pace(
        want=want_replicas,
        current=current,
        ready=ready,
        blocked=observation.blocked_replicas,
        scraped=observation.reporting_replicas,
        covered_s=observation.covered_s,
        window_s=observation.window_s,
        sla_met=steered,
        policy=planning,
        state=learned_state,
        now=now,
        model=model,
        rate=headroom.rate,
        batch=want_batch,
        delay_s=delay_s,
        overhead_s=overhead or 0.0,
        served_while_refusing=observation.qps if unserved > REFUSING_SHARE else None,
        stepwise=budget <= 0.0,
        clean_offered=(
            offered
            if unserved <= CLEAN_SHARE and steered and settled and ready >= current.replicas
            else None
        ),
    )
    replicas = paced.replicas
    if paced.shown:
        why += (
            f"; {offered:.0f} rps arrive with nothing refused, more than was served while "
            f"refusing: the rest of that load was retries, and the {paced.shown} "
            f"recommendations made then count for no more than {paced.wanted}"
        )
    if paced.note:
        notes.append(paced.note)
    trying_the_batch = trying_the_batch and replicas == current.replicas
    if (
        model is not None
        and not idle
        and not trying_the_batch
        and (replicas > ready or steered is False)
    ):
        # 7. Absorb: until the new replicas take traffic, the ready ones carry it all; and over
        # the SLA, capacity is not given back. The batch limit moves in seconds and costs
        # nothing: the one with the most capacity inside the SLA itself — or, far beyond the
        # ceiling, the one whose full batches answer the most in time.
        absorbing = burst_batch(
            model,
            planning,
            delay_s=delay_s,
            overhead_s=overhead or 0.0,
            in_force=current.batch_size,
        )
        what = "the most a replica carries inside the SLA"
        # The replicas that can come: those Kubernetes cannot start are no capacity to wait for.
        can_come = replicas - observation.blocked_replicas
        if (
            ready >= can_come
            and (replicas >= planning.max_replicas or observation.blocked_replicas)
            and model.confident
            and observation.unserved_share > BEYOND_REFUSED
        ):
            limit, most = saturated_batch(
                model,
                planning,
                delay_s=delay_s,
                overhead_s=overhead or 0.0,
                in_force=current.batch_size,
            )
            if rate > BEYOND * ready * most:
                # Every replica maxReplicas allows ready, refusing a tenth, the load far beyond
                # what they carry inside the SLA at any limit: the SLA is lost until the load
                # falls whatever the limit, and the requests answered in time are what full
                # batches carry. (Nearer the ceiling a smaller limit still wins some windows;
                # below it, replicas on the way bring the SLA back; a rough model's batch times
                # at larger limits are a guess.)
                absorbing = limit
                what = (
                    f"the most full batches carry in time: {rate:.0f} rps is far beyond the "
                    f"{ready * most:.0f} the {ready} replicas carry inside the SLA at any limit"
                )
        if absorbing != want_batch:
            why += f"; batch ≤ {absorbing} ({what}) while " + (
                f"{replicas - ready} of {replicas} replicas start"
                if replicas > ready
                else "over the SLA"
            )
            want_batch = absorbing
    elif (
        steered
        and policy.max_batch_size >= current.batch_size > want_batch
        and near_the_edge(observation, planning)
    ):
        # Back inside the SLA only just (P99 near it, or some requests still refused): the
        # verdict flickers from window to window, and each flip would push new settings to every
        # pod. A larger batch limit in force stays until the window is clearly inside (one above
        # the maximum, lowered since, does not).
        why += f"; batch stays {current.batch_size} until the window is clearly inside the SLA"
        want_batch = current.batch_size
    retuned = (want_batch, delay_s) != (current.batch_size, current.max_queue_delay_s)
    new_state = replace(
        learned_state,
        recommendations=paced.recommendations,
        refusing=paced.refusing,
        changed_at=now if retuned and policy.acting else learned_state.changed_at,
        # Only a count that is applied is waited for (a scale-up asked for before the mode
        # turned to recommend is still coming).
        pending_since=pending_since(
            learned_state.pending_since,
            asked=replicas if policy.acting else current.replicas,
            current=current.replicas,
            now=now,
        ),
        stragglers=handover.state,
        ceiling=ceiling,
    )

    # 8. Explain.
    decision = explain(
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
        below_floor=below_floor,
    )
    return replace(decision, replace=handover.delete), new_state


CLUMP_REPLANS = 4
"""Plans made again with the dispersion fewer replicas would see: it settles in two or three."""


def _clumps_note(model: LatencyFit) -> str:
    """How the arrivals clump, where they do: the model plans for it."""
    if model.dispersion <= 1.0:
        return ""
    return f", arrivals clumped {model.dispersion:.1f}× Poisson's variance"


def _varies_note(model: LatencyFit) -> str:
    """How much batch times vary around t(b), where they do: the model plans for it."""
    return f" ± {model.batch_cv:.0%}" if model.batch_cv > 0 else ""


def _rows_note(model: LatencyFit) -> str:
    """The rows a request brings, in the model's words, where it is not one; and how much they
    vary, where they do (requests of varied sizes queue as rows in clumps)."""
    rows = model.rows_per_request
    if model.rows_cv > 0:
        return f", {rows:.3g} rows a request ± {model.rows_cv:.0%}"
    return f", {rows:.3g} rows a request" if rows > 1 else ""


def pending_since(since: float | None, *, asked: int, current: int, now: float) -> float | None:
    """When the replicas not yet ready were asked for: set by a scale-up, kept while it waits,
    and dropped by a scale-down — the replicas it removes may be the ones that never started, so
    the ready count reaching the lower number measures no cold start."""
    if asked > current:
        return now if since is None else since
    if asked < current:
        return None
    return since


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
