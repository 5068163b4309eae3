"""The decision function: (observation, policy, what is in force, state, now) → (decision, state).

Targets, in order: P99 within the SLA; then device utilization inside its band; then the fewest
replicas. The last two agree: the fewest replicas is the busiest device. Utilization is not a
ceiling, though: a batching replica's device is busy nearly all the time long before its P99
suffers (batches grow to fill the time), so the band's maximum would buy replicas that change
nothing; latency is what bounds a replica's load. Batch size moves fast (it takes effect in
seconds, with no restart); replicas move slower: scale-up at once, and scale-down only after the
stabilization window has recommended fewer replicas all along (the highest recommendation in the
window wins, as in Kubernetes' HPA), and only with a wider margin than scale-up needs
(hysteresis: no flapping).

Steps, each small and named:
1. hold when metrics are missing or stale — never scale down blind;
2. learn: refit t(b) ≈ α + β·b; learn the latency spent outside the batcher (observed P99 minus
   the model's, from windows that describe the settings in force); estimate the load now from
   the window's rate and its trend (a 60 s window trails a step by 45 s);
3. plan: the load to plan for — the present, raised for the rises the recent history shows
   recur and the error budget cannot pay for, and to the seasonal forecast where every past day
   rose at this time; for every batch limit, the rate one replica carries with predicted P99
   under the SLA with headroom — its capacity; then the fewest replicas that carry the load
   (+ growth margin), and among limits that need that many, the one with the most capacity.
   Limits whose full batches alone (one in flight, then one's own) would break the target are
   never chosen: they buy throughput only in a backlog, where their latency is already too long;
4. guard: if P99 is over the SLA in a window that describes the present and the plan adds no
   capacity, add replicas on feedback instead (the model is wrong somewhere; observed latency
   wins);
   batch first on a rough model: a fit from one batch size is a guess at how that batch's time
   splits between α and β, so while the plan raises the batch limit, replicas wait one interval
   for the next window to measure the new batch sizes — unless even the most optimistic reading
   of the guess needs more replicas, which are then added at once; a rough model never scales
   down;
5. pace replicas: cold start, scale-down stabilization, hysteresis, bounds;
6. explain: action, reason and the condition inputs.

Pure: state goes in and out explicitly, `now` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from batchpilot.operator.autopilot.headroom import (
    Headroom,
    RateHistory,
    affordable,
    plan_rate,
)
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.season import seasonal_forecast
from batchpilot.operator.autopilot.service_model import (
    LatencyFit,
    Prediction,
    fit,
    predict,
    sla_capacity,
)
from batchpilot.operator.autopilot.slo import Objective, SloLedger

SLA_HEADROOM = 0.8
"""Plan for predicted P99 at most this fraction of the SLA — of the part the batcher spends: the
latency outside it (the learned overhead) is the same whatever the replicas and batch limit."""
SCALE_DOWN_LOAD = 0.95
"""Remove replicas only if the rest carry the planned load at most at this fraction of their
capacity (hysteresis: scale-up happens above 100 %)."""
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
BATCH_STICKINESS = 0.97
BATCH_STICKINESS_GAIN = 1 / BATCH_STICKINESS - 1
"""A larger batch limit must carry this much more to be worth its latency (≈ 3 %)."""
"""Batch limits with at least this fraction of the best limit's capacity count as equally good."""
STALE_WINDOWS = 3
DEFAULT_COLD_START_S = 60.0
"""Until a scale-up has been watched, assume new replicas take a minute to take traffic."""
COLD_START_SMOOTHING = 0.3
"""Weight of a new cold-start measurement against the previous estimate."""
DEFAULT_INTERVAL_S = 15.0
"""An observation older than this many windows is stale."""
SHED_TOLERANCE = 0.01
"""The SLA is met only while at most this share of the offered requests goes unserved (refused
at arrival, expired): a refused request is a request not answered within the SLA, and the
runtime's admission keeps the P99 of the admitted ones inside it however many it refuses."""
SHED_FEEDBACK = 0.05
"""Refusals beyond this share, while the model says the replicas in force carry the offered
load, are evidence against the model and add replicas (as a P99 over the SLA does). Between
`SHED_TOLERANCE` and this, a burst within the window is the likelier cause: the SLA is
reported missed, and the plan (which already counts every arrival) decides."""


@dataclass(frozen=True, slots=True)
class Policy:
    """What the InferenceService spec asks of the autopilot."""

    sla_p99_s: float
    min_utilization: float
    """The device's busy fraction (0–1) below which, with P99 under half the SLA, the feedback
    rule gives back a replica (`spec.sla.gpuUtilization.min` / 100)."""
    min_replicas: int
    max_replicas: int
    max_batch_size: int
    scale_down_delay_s: float
    max_queue_delay_s: float
    objective: Objective = field(default_factory=Objective)
    """How often the SLA must hold (`spec.sla.objectivePercent` over `spec.sla.window`)."""


@dataclass(frozen=True, slots=True)
class InForce:
    """Replicas and batch settings currently applied."""

    replicas: int
    batch_size: int
    max_queue_delay_s: float


@dataclass(frozen=True, slots=True)
class State:
    """What the autopilot remembers between decisions (persisted across operator restarts)."""

    fit: LatencyFit | None = None
    overhead_s: float | None = None
    """Latency spent outside the batcher (decoding, pre- and post-processing): observed P99 minus
    the model's prediction. None until learned."""
    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, replicas) recommended within the scale-down window."""
    changed_at: float | None = None
    """When the capacity in force last changed (batch settings, ready replicas): the metrics
    window describes the present only a window later."""
    ready: int | None = None
    """Ready replicas at the previous decision."""
    rate: tuple[float, float] | None = None
    """(time, offered requests per second) at the previous decision, for the trend."""
    batch_first_at: float | None = None
    """When a rough model raised the batch limit and held the replicas it would have added: it
    does so once, then the window has measured the new batch sizes (see `_batch_first`)."""
    slo: SloLedger = field(default_factory=SloLedger)
    """Every decision's verdict on its window, for attainment, error budget and burn rate."""
    history: RateHistory = field(default_factory=RateHistory)
    """The offered rate over the last hour, for the headroom (see `headroom`)."""
    cold_start_s: float | None = None
    """How long new replicas took to become ready, learned; None until measured."""
    pending_since: float | None = None
    """When the replicas still starting were asked for."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "recommendations": [[round(t, 3), r] for t, r in self.recommendations],
            "slo": self.slo.to_dict(),
            "history": self.history.to_dict(),
        }
        if self.cold_start_s is not None:
            doc["coldStartS"] = round(self.cold_start_s, 3)
        if self.pending_since is not None:
            doc["pendingSince"] = round(self.pending_since, 3)
        if self.fit is not None:
            doc["fit"] = {
                "alphaMs": round(self.fit.alpha_s * 1e3, 4),
                "betaMs": round(self.fit.beta_s * 1e3, 4),
                "confident": self.fit.confident,
            }
        if self.overhead_s is not None:
            doc["overheadMs"] = round(self.overhead_s * 1e3, 4)
        if self.changed_at is not None:
            doc["changedAt"] = round(self.changed_at, 3)
        if self.ready is not None:
            doc["ready"] = self.ready
        if self.rate is not None:
            doc["rate"] = [round(self.rate[0], 3), round(self.rate[1], 3)]
        if self.batch_first_at is not None:
            doc["batchFirstAt"] = round(self.batch_first_at, 3)
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None) -> State:
        """Read persisted state; anything unreadable starts fresh rather than failing."""
        if not isinstance(doc, dict):
            return cls()
        try:
            raw_fit = doc.get("fit")
            model = (
                LatencyFit(
                    alpha_s=float(raw_fit["alphaMs"]) / 1e3,
                    beta_s=float(raw_fit["betaMs"]) / 1e3,
                    confident=bool(raw_fit["confident"]),
                )
                if isinstance(raw_fit, dict)
                else None
            )
            recs = tuple((float(t), int(r)) for t, r in doc.get("recommendations", []))
            overhead = doc.get("overheadMs")
            changed = doc.get("changedAt")
            ready = doc.get("ready")
            raw_rate = doc.get("rate")
            rate = (float(raw_rate[0]), float(raw_rate[1])) if raw_rate is not None else None
            batch_first = doc.get("batchFirstAt")
            return cls(
                fit=model,
                overhead_s=None if overhead is None else float(overhead) / 1e3,
                recommendations=recs,
                changed_at=None if changed is None else float(changed),
                ready=None if ready is None else int(ready),
                rate=rate,
                batch_first_at=None if batch_first is None else float(batch_first),
                slo=SloLedger.from_dict(doc.get("slo")),
                history=RateHistory.from_dict(doc.get("history")),
                cold_start_s=_number(doc.get("coldStartS")),
                pending_since=_number(doc.get("pendingSince")),
            )
        except (KeyError, IndexError, TypeError, ValueError):
            return cls()


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    batch_size: int
    max_queue_delay_s: float
    action: str
    """hold | steady | scale-up | scale-down | retune (batch settings only)."""
    reason: str
    metrics_available: bool
    sla_met: bool | None
    """None when unknown (no metrics, or no traffic)."""
    scaling_limited: str | None = None
    """Why the autopilot cannot do what the SLA needs (at maxReplicas), for the condition."""
    predicted_p99_s: float | None = None
    capacity_rps: float | None = None
    """Requests per second one replica carries inside the target at the chosen batch limit."""
    notes: tuple[str, ...] = field(default=())

    def changes(self, current: InForce) -> bool:
        return (self.replicas, self.batch_size, self.max_queue_delay_s) != (
            current.replicas,
            current.batch_size,
            current.max_queue_delay_s,
        )


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def stored_delay_s(delay_s: float) -> float:
    """A queue delay as the batching document stores it — milliseconds to three decimals — and
    as it reads back: a decision in these units is exactly the value in force on the next tick.
    (0.1 × 0.1 s is 0.010000000000000002 s in floating point, which read back as 10.0 ms would
    differ from the decision on every tick and rewrite every pod each interval.)"""
    return round(delay_s * 1e3, 3) / 1e3


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return "∞" if math.isinf(seconds) else f"{seconds * 1e3:.0f} ms"


def batch_candidates(max_batch: int) -> list[int]:
    """Batch limits worth comparing: 1, 2, 3, 4, 6, 8, 12, 16, … up to the ceiling."""
    values = {1, max_batch}
    power = 1
    while power <= max_batch:
        values.update(v for v in (power, power + power // 2) if v <= max_batch)
        power *= 2
    return sorted(values)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Replicas and batch limit that carry a rate inside the target, as the model predicts."""

    replicas: int
    batch_size: int
    prediction: Prediction
    predicted_p99_s: float
    feasible: bool
    capacity: float
    """Requests per second one replica carries at this batch limit inside the target."""


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
    for batch in batch_candidates(policy.max_batch_size):
        if batch > 1 and overhead_s + 2 * model.batch_seconds(batch) > target_s:
            continue  # a backlog of full batches alone would break the target
        # Latency, not utilization, bounds a batching replica: its device is busy nearly all the
        # time long before its P99 suffers (batches grow to fill the time), so a busy-fraction
        # ceiling would buy replicas that change nothing.
        per_replica = sla_capacity(
            model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=target_s
        )
        needed = math.ceil(rate / per_replica - 1e-9) if per_replica > 0 else 1 << 30
        options.append((max(policy.min_replicas, needed), -per_replica, batch))
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
    )


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
            f"{'' if model.confident else ' (rough)'} + {_ms(outside)} outside the batcher: "
            f"a replica carries "
            f"{chosen.capacity:.0f} rps at batch ≤ {chosen.batch_size} inside {_ms(target)}, "
            f"so {chosen.replicas} for {headroom.rate:.0f} rps (P99 {_ms(predicted)})"
        )
        if not chosen.feasible:
            notes.append("no configuration within maxReplicas is predicted to meet the SLA")
        # 5. Guard: over the SLA in a window of the present, and the plan adds no capacity →
        # trust the observation.
        if (
            ((p99 is not None and p99 > sla) or unserved > SHED_FEEDBACK)
            and settled
            and ready >= current.replicas
            and not _adds_capacity(model, current, want_replicas, want_batch)
        ):
            want_replicas = current.replicas + max(1, math.ceil(FEEDBACK_STEP * current.replicas))
            want_batch = current.batch_size
            what = (
                "P99 over the SLA"
                if p99 is not None and p99 > sla
                else f"{unserved:.0%} of the requests refused or expired"
            )
            why = (
                f"{what} although the model predicts {_ms(predicted)}; "
                f"feedback: adding {want_replicas - current.replicas} replicas"
            )
        elif not model.confident:
            if want_replicas > current.replicas and want_batch > current.batch_size:
                want_replicas, predicted, batch_first = _batch_first(
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
                why += f"; {batch_first}"
                if want_replicas == current.replicas:
                    learned_state = replace(learned_state, batch_first_at=now)
            elif want_replicas < current.replicas:
                want_replicas = current.replicas
                notes.append("not scaling down on a rough model")
        why += headroom.note
    why += trend

    # 6. Pace the replicas.
    replicas, recommendations, pace_note = _pace(
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


def burst_batch(model: LatencyFit, policy: Policy, *, delay_s: float, overhead_s: float) -> int:
    """The batch limit with the most capacity inside the SLA itself (not the planning target):
    what a replica carries at most while others start. Limits whose full batches alone would
    break the SLA are left out, as in the plan."""
    best, most = 1, -1.0
    for batch in batch_candidates(policy.max_batch_size):
        if batch > 1 and overhead_s + 2 * model.batch_seconds(batch) > policy.sla_p99_s:
            continue
        capacity = sla_capacity(
            model,
            max_batch=batch,
            delay_s=delay_s,
            overhead_s=overhead_s,
            target_s=policy.sla_p99_s,
        )
        if capacity > most * (1 + BATCH_STICKINESS_GAIN):
            best, most = batch, capacity
    return best


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
    the rise the latency headroom absorbs without a new replica."""
    planned = sla_capacity(
        model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=target_s
    )
    limit = sla_capacity(
        model, max_batch=batch, delay_s=delay_s, overhead_s=overhead_s, target_s=sla_s
    )
    return limit / planned if planned > 0 else 1.0


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
            f"at maxReplicas {policy.max_replicas} with P99 {_ms(p99)} over the "
            f"{_ms(sla)} SLA; raise maxReplicas or maxBatchSize"
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
        else f"P99 {_ms(p99)} vs SLA {_ms(sla)} at {observation.offered_qps or 0.0:.0f} rps"
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
        changes.append(f"queue delay {_ms(current.max_queue_delay_s)}→{_ms(delay_s)}")
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


def _optimistic(model: LatencyFit) -> LatencyFit:
    """The most optimistic reading of a rough fit: α and β are only known to add up to the
    measured time at the batch size the guess splits evenly (b₀ = α/β, where α = β·b₀); the
    reading that gives every larger batch the most capacity puts all of that time in α (β = 0),
    so every batch takes t(b₀)."""
    if model.beta_s <= 0:
        return model
    return LatencyFit(
        alpha_s=model.batch_seconds(model.alpha_s / model.beta_s),
        beta_s=0.0,
        confident=False,
    )


def _batch_first(
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
) -> tuple[int, float, str]:
    """Replicas to ask for when a rough model's plan raises the batch limit and adds replicas,
    the P99 predicted for them, and why.

    Raising the batch limit takes effect in seconds and costs nothing; a replica costs a device
    for at least the scale-down delay. The next window measures the new batch sizes and makes
    the fit confident, so replicas wait that one interval — unless even the most optimistic
    reading of the fit (`_optimistic`) needs more of them. Then no batch limit can carry the load
    whatever α and β turn out to be, the SLA stays broken until new replicas are ready, and
    waiting would only make them an interval later: the plan is followed at once (P99 comes
    before the fewest replicas). The wait happens once: if the fit is still
    rough after it, the plan is followed."""
    optimistic = _optimistic(model)
    best = plan_capacity(
        optimistic,
        rate=rate,
        policy=policy,
        delay_s=delay_s,
        overhead_s=overhead_s,
        target_s=target_s,
    )
    measured = _ms(optimistic.alpha_s)
    reading = (
        f"if every batch took the measured {measured} a replica would carry "
        f"{best.capacity:.0f} rps at batch ≤ {best.batch_size}"
    )
    if best.replicas > current.replicas:
        why = (
            f"the fit is a guess from one batch size, but even {reading}: no batch limit lets "
            f"{current.replicas} carry {rate:.0f} rps, so replicas are added at once"
        )
        return chosen.replicas, chosen.predicted_p99_s, why
    if state.batch_first_at is not None:
        why = "still a guess after an interval at a new batch limit: following it"
        return chosen.replicas, chosen.predicted_p99_s, why
    held = predict(
        model,
        rate=rate,
        replicas=current.replicas,
        max_batch=chosen.batch_size,
        delay_s=delay_s,
        overhead_s=overhead_s,
    )
    plural = "s" if current.replicas > 1 else ""
    why = (
        f"the fit is a guess from one batch size and {reading}: raising the batch limit first "
        f"and holding {current.replicas} replica{plural} one interval, until the next window "
        f"has measured the new batch sizes (the guess puts P99 at {_ms(held.p99_s)} meanwhile)"
    )
    return current.replicas, held.p99_s, why


def _adds_capacity(model: LatencyFit, current: InForce, replicas: int, batch: int) -> bool:
    return replicas * model.capacity(batch) > current.replicas * model.capacity(current.batch_size)


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


def _pace(
    *,
    want: int,
    current: InForce,
    ready: int,
    sla_met: bool | None,
    policy: Policy,
    state: State,
    now: float,
    model: LatencyFit | None,
    rate: float,
    batch: int,
    delay_s: float,
    overhead_s: float,
) -> tuple[int, tuple[tuple[float, int], ...], str | None]:
    """Replicas to set now, the recommendations to remember, and a note on any restraint."""
    want = max(policy.min_replicas, min(policy.max_replicas, want))
    if want > current.replicas:
        return want, ((now, want),), None
    # The recommendations of the last scale_down_delay seconds, plus the one in force when that
    # window began: it proves the window is covered.
    cutoff = now - policy.scale_down_delay_s
    history = sorted((*state.recommendations, (now, want)))
    before = [entry for entry in history if entry[0] <= cutoff]
    window = tuple(before[-1:] + [entry for entry in history if entry[0] > cutoff])
    if want == current.replicas:
        return want, window, None
    # Fewer replicas recommended. Every condition below keeps the current count.
    if sla_met is False:
        return current.replicas, window, "not scaling down while over the SLA"
    starting = current.replicas - ready
    if starting > 0:
        return current.replicas, window, f"{starting} replicas still starting"
    stable = max(r for _, r in window)
    if not before or stable >= current.replicas:
        waited = now - window[0][0]
        return (
            current.replicas,
            window,
            f"scale-down to {want} waits for {policy.scale_down_delay_s:.0f} s of low load "
            f"({waited:.0f} s so far)",
        )
    if model is not None:
        # Hysteresis: the replicas that stay must carry the load with room to spare.
        remaining = predict(
            model,
            rate=rate / SCALE_DOWN_LOAD,
            replicas=stable,
            max_batch=batch,
            delay_s=delay_s,
            overhead_s=overhead_s,
        )
        outside = min(overhead_s, policy.sla_p99_s)
        if remaining.p99_s > outside + SLA_HEADROOM * (policy.sla_p99_s - outside):
            return current.replicas, window, "fewer replicas would leave too little headroom"
    return stable, ((now, stable),), None
