"""Pacing the replicas: from the count the plan wants to the count set now.

Batch size moves fast (it takes effect in seconds, with no restart); replicas move slower.
Scale-up happens at once. Scale-down waits until the stabilization window (the policy's
scale-down delay) has recommended fewer replicas all along — the highest recommendation in the
window wins, as in Kubernetes' HPA, and the count follows it down as the older ones age out —
but step by step, a whole window between steps, while the error budget cannot pay for a miss
(spent, or burning faster than the objective allows: `stepwise`): each step then keeps, for a
window more, the replicas a load that comes back would need — never while over the SLA,
while replicas are still starting or not scraped, or while Prometheus holds only part of the
window; and only with a wider margin than scale-up needs (hysteresis: the replicas that stay
must carry the load at `SCALE_DOWN_LOAD` of their capacity with the plan's headroom), so the
count does not flap.
Bounds (minReplicas, maxReplicas) apply to every recommendation.

A recommendation made while the service refused requests is marked: its load counts every
attempt that arrived, and clients retry what is refused (a 503 honoured after `Retry-After`, or
at once), so a retry storm reads as traffic several times the demand — which no replica count
needed. Which arrivals were retries nobody can tell at the time; a later window can. Once a
window with nothing refused describes the replicas in force and still carries at least what
was served while refusing (the demand did not go away), the marked recommendations count for no
more than that window's: the load the refusals stood for has shown what it was. Where the
traffic fell instead (less arrives than was served then), they stand. Scale-down still waits
the whole stabilization window; only how far it goes changes.

Apart from `decide` because it is a step with a memory of its own: the window of
recommendations kept in the state is computed only here.

Pure: state in, state out, `now` an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

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
REFUSING_SHARE = 0.01
"""A window that refused more than this share of its arrivals: its recommendation is marked (its
load may count retries)."""
CLEAN_SHARE = 0.001
"""A window that refused at most this share: it shows the demand without retries."""


@dataclass(frozen=True, slots=True)
class Paced:
    replicas: int
    """Replicas to set now."""
    recommendations: tuple[tuple[float, int], ...]
    """The recommendations to remember."""
    refusing: tuple[tuple[float, float], ...]
    """Which of them were made while refusing: (time, served rps then)."""
    note: str | None
    """Why the count stays where the plan would move it, if it does."""
    shown: int = 0
    """Recommendations made while refusing that this window lowered (it showed their load)."""
    wanted: int = 0
    """This window's recommendation within the bounds: what those now count for at most."""


def verified(
    history: Sequence[tuple[float, int]],
    refusing: Sequence[tuple[float, float]],
    *,
    want: int,
    clean_offered: float | None,
) -> tuple[list[tuple[float, int]], tuple[tuple[float, float], ...]]:
    """The recommendations with those made while refusing lowered to `want` where a clean
    window (`clean_offered`: its arrivals per second; None: this window is not one) carries at
    least what was served then; the marks that stand."""
    marked = {t: served for t, served in refusing}
    if clean_offered is None or not marked:
        return list(history), tuple(refusing)
    shown = {t for t, served in marked.items() if clean_offered >= served}
    lowered = [(t, min(r, want) if t in shown else r) for t, r in history]
    return lowered, tuple((t, q) for t, q in refusing if t not in shown)


def windowed(
    history: Sequence[tuple[float, int]], *, now: float, delay_s: float
) -> tuple[tuple[float, int], ...]:
    """The recommendations of the last `delay_s` seconds, plus the one in force when that window
    began (it proves the window is covered), oldest first."""
    ordered = sorted(history)
    cutoff = now - delay_s
    before = [entry for entry in ordered if entry[0] <= cutoff]
    return tuple(before[-1:] + [entry for entry in ordered if entry[0] > cutoff])


def unseen(state: State, *, now: float, replicas: int, delay_s: float) -> State:
    """A window nobody saw (Prometheus did not answer, its answer was stale or lacked a signal)
    recommends the `replicas` in force: the scale-down's window of low load is made of windows
    seen. Without it, a hold recorded nothing, and after an outage longer than the delay the
    last recommendation from before it — however old, and low — stood for the whole window:
    the first low window after the outage removed replicas (3 → 1 after 6 blind minutes between
    two dips, where the same minutes seen under load kept 3)."""
    window = windowed((*state.recommendations, (now, replicas)), now=now, delay_s=delay_s)
    kept = {t for t, _ in window}
    refusing = tuple(m for m in state.refusing if m[0] in kept)
    return replace(state, recommendations=window, refusing=refusing)


def pace(
    *,
    want: int,
    current: InForce,
    ready: int,
    blocked: int = 0,
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
    served_while_refusing: float | None = None,
    clean_offered: float | None = None,
    stepwise: bool = False,
) -> Paced:
    """Replicas to set now, the recommendations to remember, and a note on any restraint.
    `blocked`: replicas not ready that cannot come up, as Kubernetes says (not "starting");
    `served_while_refusing`: this window refused requests, and served this many per second (its
    recommendation is marked); `clean_offered`: it refused none, describes the replicas in
    force, and this many arrived per second (it shows what the marked ones stood for);
    `stepwise`: after a step down the window starts afresh (the error budget cannot pay for a
    miss)."""
    want = max(policy.min_replicas, min(policy.max_replicas, want))
    mark = () if served_while_refusing is None else ((now, served_while_refusing),)
    if want > current.replicas:
        return Paced(want, ((now, want),), mark, None)
    earlier, marks = verified(
        state.recommendations, state.refusing, want=want, clean_offered=clean_offered
    )
    shown = len(state.refusing) - len(marks)
    window = windowed((*earlier, (now, want)), now=now, delay_s=policy.scale_down_delay_s)
    before = window[:1] if window[0][0] <= now - policy.scale_down_delay_s else ()
    kept = {t for t, _ in window}
    marks = tuple(m for m in (*marks, *mark) if m[0] in kept)

    def stay(note: str | None) -> Paced:
        return Paced(current.replicas, window, marks, note, shown, want)

    def partly_seen(note: str) -> Paced:
        # Its rates lack some of the load: it recommends what is in force, not the count they
        # show — once the data is whole, one low window would otherwise scale down to it.
        seen = tuple((t, current.replicas if t == now else r) for t, r in window)
        return Paced(current.replicas, seen, marks, note, shown, want)

    if want == current.replicas:
        return stay(None)
    # Fewer replicas recommended. Every condition below keeps the current count.
    if sla_met is False:
        return stay("not scaling down while over the SLA")
    # Replicas that cannot come up (`Observation.blocked_replicas`) hold nothing: the
    # ReplicaSet removes pods not ready before ready ones. Waited for, one pod Pending for want
    # of a GPU froze the count at its peak for as long as the cluster had none.
    starting = current.replicas - ready - blocked
    if starting > 0:
        return stay(f"{starting} replicas still starting")
    if scraped is not None and scraped < ready:
        return partly_seen(
            f"{ready - scraped} of {ready} ready replicas not scraped: the rates miss their load"
        )
    if covered_s is not None and window_s and covered_s < COVERED_SHARE * window_s:
        return partly_seen(
            f"Prometheus holds {covered_s:.0f} s of the {window_s:.0f} s window: "
            "the load before that is unseen"
        )
    stable = max(r for _, r in window)
    if not before or stable >= current.replicas:
        waited = now - window[0][0]
        return stay(
            f"scale-down to {want} waits for {policy.scale_down_delay_s:.0f} s of low load "
            f"({waited:.0f} s so far)"
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
            return stay("fewer replicas would leave too little headroom")
    # The window stays: its highest recommendation falls as the older ones age out, and the
    # count follows it down, as the HPA's does (started afresh at each step, a load that fell
    # from 800 to 200 rps went 3 → 2 replicas after the delay, the first windows after the fall
    # still holding some of the old load, and 2 → 1 a whole delay later). Unless the budget is
    # spent: then the replicas of each step stay a window more, for a load that comes back
    # (spikes every few minutes found the count followed down to the quiet level between them).
    if stepwise:
        return Paced(stable, ((now, stable),), (), None, shown, want)
    return Paced(stable, window, marks, None, shown, want)
