"""Pacing the replicas: from the count the plan wants to the count set now.

Batch size moves fast (it takes effect in seconds, with no restart); replicas move slower.
Scale-up happens at once. Scale-down waits until the stabilization window (the policy's
scale-down delay) has recommended fewer replicas all along — the highest recommendation in the
window wins, as in Kubernetes' HPA — never while over the SLA, while replicas are still
starting or not scraped, or while Prometheus holds only part of the window; and only with a
wider margin than scale-up needs (hysteresis: the replicas that stay must carry the load at
`SCALE_DOWN_LOAD` of their capacity with the plan's headroom), so the count does not flap.
Bounds (minReplicas, maxReplicas) apply to every recommendation.

Apart from `decide` because it is a step with a memory of its own: the window of
recommendations kept in the state is computed only here.

Pure: state in, state out, `now` an argument.
"""

from __future__ import annotations

from batchpilot.operator.autopilot.policy import LOAD_HEADROOM, InForce, Policy, p99_bounds
from batchpilot.operator.autopilot.service_model import LatencyFit, predict
from batchpilot.operator.autopilot.state import State

COVERED_SHARE = 0.9
"""Remove replicas only on a window Prometheus holds at least this share of: the rest is unseen
(a Prometheus restarted without its history, or down for part of the window), and a missing
Prometheus never causes a scale-down."""
SCALE_DOWN_LOAD = 0.95
"""Remove replicas only if the rest carry the planned load at most at this fraction of their
capacity (hysteresis: scale-up happens above 100 %)."""


def pace(
    *,
    want: int,
    current: InForce,
    ready: int,
    scraped: int | None = None,
    covered_s: float | None = None,
    window_s: float | None = None,
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
    if scraped is not None and scraped < ready:
        return (
            current.replicas,
            window,
            f"{ready - scraped} of {ready} ready replicas not scraped: the rates miss their load",
        )
    if covered_s is not None and window_s and covered_s < COVERED_SHARE * window_s:
        return (
            current.replicas,
            window,
            f"Prometheus holds {covered_s:.0f} s of the {window_s:.0f} s window: "
            "the load before that is unseen",
        )
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
        # Either headroom will do, as in the plan (`capacity.replica_capacity`).
        target, near = p99_bounds(policy.sla_p99_s, overhead_s)

        def p99(load: float) -> float:
            return predict(
                model,
                rate=load / SCALE_DOWN_LOAD,
                replicas=stable,
                max_batch=batch,
                delay_s=delay_s,
                overhead_s=overhead_s,
            ).p99_s

        if p99(rate) > target and p99(rate * LOAD_HEADROOM) > near:
            return current.replicas, window, "fewer replicas would leave too little headroom"
    return stable, ((now, stable),), None
