"""The decision function: (observation, policy, what is in force, state, now) → (decision, state).

Targets, in order: P99 within the SLA; then device utilization inside its band; then the fewest
replicas. Batch size moves fast (it takes effect in seconds, with no restart); replicas move
slower: scale-up at once, but not again while new replicas are still starting, and scale-down
only after the stabilization window has recommended fewer replicas all along (the highest
recommendation in the window wins, as in Kubernetes' HPA), and only with a wider margin than
scale-up needs (hysteresis: no flapping).

Steps, each small and named:
1. hold when metrics are missing or stale — never scale down blind;
2. learn: refit t(b) ≈ α + β·b and the calibration of predicted against observed P99;
3. plan: the fewest replicas, and for them the batch limit, that the model predicts keep P99
   under the SLA with headroom at the offered load (+ growth margin);
4. guard: if P99 is over the SLA and the plan adds no capacity, step up on feedback instead
   (the model is wrong somewhere; observed latency wins);
5. pace replicas: cold start, scale-down stabilization, hysteresis, bounds;
6. explain: action, reason and the condition inputs.

Pure: state goes in and out explicitly, `now` is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.service_model import LatencyFit, Prediction, fit, predict

SLA_HEADROOM = 0.8
"""Plan for predicted P99 at most this fraction of the SLA."""
SCALE_DOWN_MARGIN = 0.6
"""Remove a replica only if the rest are predicted at most this fraction of the SLA."""
GROWTH_MARGIN = 1.1
"""Plan for 10 % more load than observed: traffic moves between two decisions."""
CALIBRATION_BOUNDS = (0.5, 3.0)
STALE_WINDOWS = 3
"""An observation older than this many windows is stale."""


@dataclass(frozen=True, slots=True)
class Policy:
    """What the InferenceService spec asks of the autopilot."""

    sla_p99_s: float
    util_min: float
    util_max: float
    min_replicas: int
    max_replicas: int
    max_batch_size: int
    scale_down_delay_s: float
    max_queue_delay_s: float


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
    calibration: float = 1.0
    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, replicas) recommended within the scale-down window."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "calibration": round(self.calibration, 4),
            "recommendations": [[round(t, 3), r] for t, r in self.recommendations],
        }
        if self.fit is not None:
            doc["fit"] = {
                "alphaMs": round(self.fit.alpha_s * 1e3, 4),
                "betaMs": round(self.fit.beta_s * 1e3, 4),
                "confident": self.fit.confident,
            }
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
            calibration = float(doc.get("calibration", 1.0))
        except (KeyError, TypeError, ValueError):
            return cls()
        return cls(fit=model, calibration=calibration, recommendations=recs)


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
    notes: tuple[str, ...] = field(default=())

    def changes(self, current: InForce) -> bool:
        return (self.replicas, self.batch_size, self.max_queue_delay_s) != (
            current.replicas,
            current.batch_size,
            current.max_queue_delay_s,
        )


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
class Plan:
    replicas: int
    batch_size: int
    prediction: Prediction
    predicted_p99_s: float
    feasible: bool


def plan_capacity(
    model: LatencyFit,
    *,
    rate: float,
    policy: Policy,
    delay_s: float,
    calibration: float,
    target_s: float,
) -> Plan:
    """The fewest replicas whose predicted P99 (calibrated) fits `target_s`, and for them the
    batch limit with the lowest predicted P99; the best effort at maxReplicas if none fits."""
    best: Plan | None = None
    for replicas in range(policy.min_replicas, policy.max_replicas + 1):
        for batch in batch_candidates(policy.max_batch_size):
            prediction = predict(
                model, rate=rate, replicas=replicas, max_batch=batch, delay_s=delay_s
            )
            p99 = prediction.p99_s * calibration
            feasible = p99 <= target_s and prediction.utilization <= policy.util_max
            candidate = Plan(replicas, batch, prediction, p99, feasible)
            if best is None or (candidate.feasible, -candidate.predicted_p99_s) > (
                best.feasible,
                -best.predicted_p99_s,
            ):
                best = candidate
        if best is not None and best.feasible:
            return best
    assert best is not None
    return best


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
    if observation is None:
        return _hold(current, state, "holding: Prometheus did not answer", available=False)
    if now - observation.at > STALE_WINDOWS * observation.window_s:
        age = now - observation.at
        return _hold(current, state, f"holding: metrics are {age:.0f} s old", available=False)
    if missing := observation.missing():
        return _hold(
            current,
            state,
            f"holding: no {', '.join(missing)} in Prometheus; never scaling on missing metrics",
            available=False,
        )
    assert observation.qps is not None
    assert observation.ready_replicas is not None
    sla = policy.sla_p99_s
    p99 = observation.p99_s
    idle = observation.idle
    sla_met = None if idle or p99 is None else p99 <= sla
    rate = observation.offered_qps or 0.0
    delay_s = min(policy.max_queue_delay_s, 0.1 * sla)

    # 2. Learn: the fit, and how far its predictions are from what was observed.
    model = fit(observation.compute, state.fit)
    calibration = state.calibration
    if model is not None and p99 is not None and not idle:
        expected = predict(
            model,
            rate=rate,
            replicas=max(1, observation.ready_replicas),
            max_batch=current.batch_size,
            delay_s=current.max_queue_delay_s,
        )
        if expected.load < 0.85 and math.isfinite(expected.p99_s) and expected.p99_s > 0:
            ratio = p99 / expected.p99_s
            low, high = CALIBRATION_BOUNDS
            calibration = min(high, max(low, 0.5 * calibration + 0.5 * ratio))
    learned = replace(state, fit=model, calibration=calibration)

    # 3. Plan from the model; or, without one yet, from feedback alone.
    notes: list[str] = []
    predicted: float | None = None
    if idle:
        want_replicas, want_batch = policy.min_replicas, current.batch_size
        why = "no traffic"
    elif model is None:
        want_replicas, want_batch, why = _feedback(observation, policy, current)
    else:
        chosen = plan_capacity(
            model,
            rate=rate * GROWTH_MARGIN,
            policy=policy,
            delay_s=delay_s,
            calibration=calibration,
            target_s=SLA_HEADROOM * sla,
        )
        want_replicas, want_batch = chosen.replicas, chosen.batch_size
        predicted = chosen.predicted_p99_s
        why = (
            f"model t(b) = {model.alpha_s * 1e3:.2f} + {model.beta_s * 1e3:.2f}·b ms"
            f"{'' if model.confident else ' (rough)'} predicts P99 {_ms(predicted)} with "
            f"{chosen.replicas} replicas at batch ≤ {chosen.batch_size} for {rate:.0f} rps"
        )
        if not chosen.feasible:
            notes.append("no configuration within maxReplicas is predicted to meet the SLA")
        # 4. Guard: over the SLA and the plan adds no capacity → trust the observation.
        if sla_met is False and not _adds_capacity(model, current, want_replicas, want_batch):
            want_replicas, want_batch, why = _feedback(observation, policy, current)
            why = f"P99 over the SLA although the model disagrees; {why}"

    # 5. Pace the replicas.
    replicas, recommendations, pace_note = _pace(
        want=want_replicas,
        current=current,
        ready=observation.ready_replicas,
        sla_met=sla_met,
        policy=policy,
        state=learned,
        now=now,
        model=model,
        rate=rate,
        batch=want_batch,
        delay_s=delay_s,
        calibration=calibration,
    )
    if pace_note:
        notes.append(pace_note)
    new_state = replace(learned, recommendations=recommendations)

    # 6. Explain.
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
    elif (want_batch, delay_s) != (current.batch_size, current.max_queue_delay_s):
        action = "retune"
    else:
        action = "steady"
    observed = (
        "no traffic"
        if idle
        else f"P99 {_ms(p99)} vs SLA {_ms(sla)} at {rate:.0f} rps"
        + (
            f", device {observation.utilization * 100:.0f}% busy"
            if observation.utilization is not None
            else ""
        )
    )
    changes = []
    if replicas != current.replicas:
        changes.append(f"replicas {current.replicas}→{replicas}")
    if want_batch != current.batch_size:
        changes.append(f"batch {current.batch_size}→{want_batch}")
    if delay_s != current.max_queue_delay_s:
        changes.append(f"queue delay {_ms(current.max_queue_delay_s)}→{_ms(delay_s)}")
    reason = f"{observed}; {why}" + (f"; {', '.join(changes)}" if changes else "; no change")
    if notes:
        reason += f" ({'; '.join(notes)})"
    decision = Decision(
        replicas=replicas,
        batch_size=want_batch,
        max_queue_delay_s=delay_s,
        action=action,
        reason=reason,
        metrics_available=True,
        sla_met=sla_met,
        scaling_limited=limited,
        predicted_p99_s=predicted,
        notes=tuple(notes),
    )
    return decision, new_state


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
        step = max(1, math.ceil(current.replicas * (p99 / sla - 1)))
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
        and utilization * 100 < policy.util_min
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
    calibration: float,
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
        remaining = predict(
            model, rate=rate * GROWTH_MARGIN, replicas=stable, max_batch=batch, delay_s=delay_s
        )
        if remaining.p99_s * calibration > SCALE_DOWN_MARGIN * policy.sla_p99_s:
            return current.replicas, window, "fewer replicas would leave too little headroom"
    return stable, ((now, stable),), None
