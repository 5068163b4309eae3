"""What each window teaches the decision, before it plans: the fit t(b) ≈ α + β·b, the latency
spent outside the batcher, how long new replicas take to start, which ready replicas were lost
(`lost`), whether the window describes the settings in force, and the load now (a 60 s window
trails a rise by half its length).

These are the decision's measurements of the service — its own state, carried between decisions
in `State` — as opposed to what it plans from them (`capacity`, `headroom`, `pacing`).

Pure: state in, state out; `now` is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from batchpilot.api.arrivals import RECENT_ARRIVALS_S
from batchpilot.operator.autopilot.busy import BusyShare
from batchpilot.operator.autopilot.explain import SHED_TOLERANCE, p99_over, unserved_beyond
from batchpilot.operator.autopilot.lost import track
from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.policy import InForce, Policy, format_ms
from batchpilot.operator.autopilot.service_model import (
    MAX_BATCH_CV,
    MAX_ROWS_CV,
    MAX_UNEVENNESS,
    VARIED_ROWS_CV,
    LatencyFit,
    fit,
    predict,
    startup_fit,
    usable_points,
)
from batchpilot.operator.autopilot.slo import SloLedger
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.autopilot.stragglers import Stragglers

OVERHEAD_FALL = 0.5
"""Weight of a window that shows less latency outside the batcher than the estimate."""
OVERHEAD_RISE = 0.1
"""Weight of a window that shows more. The latency outside the batcher (decoding, the network,
post-processing) is a floor under every window's P99, while what the model misses comes and goes
with the operating point — a window whose P99 comes from its busiest part, a batch limit that
changed within it, a batch limit where the model under-predicts. Both land in the residual; the
estimate follows it down at once and up slowly, so it tracks the floor. Averaged evenly, a few
such windows taught 10 ms where there was none: the plan then ruled out the batch limits that
carry the load (on a fixed-cost service, 16 → 8 halves what a replica carries), and at the
smaller batch the model's error taught it again. A floor that really rises is followed within
ten windows, and an SLA broken meanwhile is the guard's business (`feedback`)."""
LEARN_BELOW_LOAD = 0.9
"""Learn from observed P99 only below this fraction of saturation: near it, P99 is too steep
(and too noisy) to tell the model's error from the load's."""
TREND_SIGNIFICANCE = 3.0
"""Extrapolate a rising rate only when the rise exceeds this many standard deviations of
Poisson noise (otherwise noise alone would add replicas)."""
DEFAULT_COLD_START_S = 60.0
"""Until a scale-up has been watched, assume new replicas take a minute to take traffic."""
BEFORE_SMOOTHING = 0.3
"""Weight of a window's time before the batcher (`State.before_s`) against the running mean."""
COLD_START_SMOOTHING = 0.3
"""Weight of a new cold-start measurement against the previous estimate."""
COLD_START_GAP_S = 120.0
"""A scale-up seen done longer than this after the tick before (the autopilot off and back
on, an operator down) became ready somewhere in that gap: no measure of its cold start (counted
as half the gap, two hours of mode off read as the longest cold start there is)."""
MAX_COLD_START_S = 600.0
"""The longest wait that counts as a cold start. Starting a GPU replica can take minutes (a new
node, a large image, the model's download and warm-up); a scale-up that waited longer was
blocked — a ResourceQuota, no node to schedule on, an image that does not pull (the Ready
condition says which) — and the hour it waited says nothing about how long the next replica
takes once it can start. Counted as such, it would stretch the reaction horizon to that hour and
the headroom would plan for an hour's rises long after the block cleared."""
SATURATED_SHARE = 0.05
"""A window that refuses more than this share of its requests ran its replicas flat out."""
MIN_BUSY = 0.05
"""The smallest busy share a saturated window's load is read from: traffic that began in the
last 3 s of a 60 s window says too little of its rate to be multiplied by more."""
LEARN_BELOW_UNSERVED = 0.05
"""Learn from windows that refused at most this share of their requests. Refusals at arrival
keep the admitted requests' P99 inside the SLA, so a window that refused a few per cent to do so
has its tail trimmed and reads the overhead short — and must teach it: a service whose windows
all refuse a little (one that started overloaded, say) would otherwise plan with no overhead, for
too few replicas, and never leave the miss. It teaches no rise beyond `explain.SHED_TOLERANCE`,
though: there P99 is pinned near the deadline (see `learn`). Where many were refused, P99 is the
deadline's, and says nothing of the overhead."""
CLUMPED = 1.2
"""A dispersion below this is Poisson's 1: the measurement's noise, and the rate's own change
over the runtime's 10 s, stay under it."""
DISPERSION_STEP = 1.1
"""The model's dispersion moves in steps of 10 %."""
MAX_DISPERSION = 1000.0
EVEN = 1.2
"""An unevenness below this is none: at 5 requests a second a replica, Poisson arrivals over a
minute read 1.14 at most once in a thousand windows, and at more, less (`unevenness`)."""
UNEVEN_MIN_RATE = 5.0
"""Below this many requests a second a replica, a window's unevenness is its count's noise
(at 1 a second it reads 1.5 once in a hundred windows): the last known stands. A replica's
capacity is rarely that low."""
UNEVEN_MIN_WINDOW_S = 5.0
"""A window shorter than this says nothing of unevenness: the runtime adds a second's square of
arrivals when the second ends, so a window of a second or two may hold a busy second's square
beside part of its arrivals (the pods' own metrics over 1 s, at a steady 45 rps, read 2.1-3.8x:
the replicas a start-up asked for then carried a rise before it came). The last known stands."""
STEADY_CV = 0.05
"""Batch times that vary less than this around t(b) are taken as steady: the P99 they add is a
few per cent of a batch's time, and a fit's own error on a device that keeps time reads about
this much."""
CV_STEP = 0.05
"""The model's batch-time variation moves in steps of this."""
ROWS_CV_STEP = 0.1
"""The model's spread of rows a request moves in steps of this."""
ONE_ROW = 1.01
"""Rows per request below this are one row: the rest is the edges of the window (a batch is
counted when it runs, its requests when they are answered)."""
ANCHOR_SPREAD = 1.5
"""Batch sizes this far apart give a slope (`service_model.fit` asks the same of one window)."""
DEFAULT_INTERVAL_S = 15.0
"""The decision interval assumed at the first decision, before one has been measured."""
DEFAULT_SCRAPE_S = 15.0
"""Prometheus' scrape interval where the observation does not give it (the chart's, and
Prometheus' usual): a window moves by whole scrapes, so one decision's gap shorter than that
holds a scrape's worth of new samples, or none."""


@dataclass(frozen=True, slots=True)
class Learned:
    state: State
    """The state with what was learned (fit, overhead, change, readiness, cold start)."""
    settled: bool
    """Whether the window describes the settings in force."""
    replicas_settled: bool
    """Whether the window describes the ready replicas (none came or went inside it); a batch
    limit changed inside it may still be the old one's."""
    interval: float
    """Seconds since the previous decision (0 at the first)."""


def unlearned(state: State, policy: Policy) -> tuple[State, str]:
    """The memory with what a spec edit made another service's dropped, and why (for the
    decision's reason; "" where nothing was).

    A new model, or a change in what runs it (engine, variant, device, image, resources,
    instances, pipeline: `Policy.serving`), has batch times of its own. The old fit stays, as a
    guess (rough): the new pods' start-up timings and the next windows replace it
    (`startup_fit`, `fit`) — kept confident, it ignored them, and a window of full batches at
    one size could only lower its slope (a model four times slower per row read as the old one
    with a larger fixed cost, for good). What was measured against the old batch times goes:
    the anchor, the busy share's cost and limits, the guard's ceiling, the stragglers. The load
    history, the objective's books, the recommendations, the cold start and the latency outside
    the batcher describe the traffic and the pods, and stay.

    A looser SLA (`Policy.sla_p99_s`): the guard's ceiling and the busy share's limits were
    misses of the tighter one, and would hold replicas (or a smaller batch) for an hour that the
    new SLA does not need; and the objective's verdicts were judged against it — kept, its misses
    went on spending the new promise's error budget (the headroom at its most, every scale-down
    a step at a time) for as long as the objective's window. A new promise starts its books. A
    tighter one keeps all of them: they only add capacity, and its misses are misses still."""
    notes: list[str] = []
    serving = policy.serving
    if serving is not None and state.serving is not None and state.serving != serving:
        state = replace(
            state,
            fit=None if state.fit is None else replace(state.fit, confident=False),
            anchor=None,
            batch_first_at=None,
            busy=BusyShare(),
            ceiling=None,
            stragglers=Stragglers(),
        )
        notes.append(
            "the model or what runs it changed: its batch times are taken as a guess until "
            "its batches are timed"
        )
    sla = policy.sla_p99_s
    if state.sla_s is not None and sla > state.sla_s:
        books = SloLedger(objective=state.slo.objective, last_at=state.slo.last_at)
        state = replace(state, ceiling=None, busy=state.busy.without_limits(), slo=books)
        notes.append(
            f"the SLA was loosened from {format_ms(state.sla_s)}: the limits found under it no "
            "longer hold, and the objective's books start afresh"
        )
    kept = replace(state, serving=serving if serving is not None else state.serving, sla_s=sla)
    return kept, "; ".join(notes)


def learn(
    observation: Observation,
    policy: Policy,
    current: InForce,
    state: State,
    now: float,
) -> Learned:
    """Refit t(b) (from the batch times timed at start-up until traffic has run two sizes);
    learn the latency outside the batcher from windows of the present with P99 inside the SLA
    (until one comes, the mean the runtime measures); note when the capacity in force changed
    and how long new replicas took to start; count the ready replicas lost since the decision
    before (`lost.track`)."""
    assert observation.ready_replicas is not None
    ready = observation.ready_replicas
    changed_at, ready_changed_at = state.changed_at, state.ready_changed_at
    if state.ready is not None and ready != state.ready:
        changed_at = ready_changed_at = now
    # The window describes the settings in force once it starts after the change, and after the
    # backlog of the old settings has drained: allow one decision interval for that.
    interval = now - state.rate[0] if state.rate is not None else 0.0
    settled = changed_at is None or now - changed_at >= observation.window_s + interval
    replicas_settled = (
        ready_changed_at is None or now - ready_changed_at >= observation.window_s + interval
    )
    prior = state.fit
    if prior is None or not prior.confident:
        # Before traffic has run two batch sizes, the slope the replicas timed at start-up.
        prior = startup_fit(observation.startup) or prior
    # The busy share describes the replicas ready now only where they served the whole window.
    measured = observation.compute or (busy_compute(observation) if settled else ())
    points, anchor = anchored(measured, state)
    model = fit(points, prior)
    if model is not None and model.confident:
        anchor = None
    if model is not None:
        known = state.fit or LatencyFit(alpha_s=0.0, beta_s=0.0, confident=False)
        model = replace(
            model,
            rows_per_request=rows_per_request(observation, known.rows_per_request),
            dispersion=dispersion(observation, known.dispersion, settled=replicas_settled),
            batch_cv=batch_cv(observation, known.batch_cv),
            rows_cv=rows_cv(observation, known.rows_cv),
            unevenness=unevenness(observation, known.unevenness, settled=settled),
        )
    overhead = state.overhead_s
    if overhead is None and observation.outside_s is not None:
        # Until a window inside the SLA teaches it, the mean the runtime measured: a service
        # that starts overloaded has only windows whose P99 is the queue's, and planned with no
        # time outside the batcher it asks for too few replicas, and learns it only once they
        # carry the load.
        overhead = min(policy.sla_p99_s, max(0.0, observation.outside_s))
    p99 = observation.p99_s
    if (
        model is not None
        and p99 is not None
        and not p99_over(observation, policy.sla_p99_s)
        and observation.unserved_share <= LEARN_BELOW_UNSERVED
        and settled
    ):
        # Only windows with P99 inside the SLA teach the overhead: one over it is the guard's
        # business. One that refused a few per cent to keep it there teaches it too (see
        # `LEARN_BELOW_UNSERVED`).
        # At the rate the requests met: a window whose P99 comes from its busy seconds read as
        # time outside the batcher (40 → 70 ms over a square wave of 10 s at 10× and 1×), and
        # the plan shrank its batch for it.
        expected = predict(
            model,
            rate=(observation.offered_qps or 0.0) * model.unevenness,
            replicas=max(1, ready),
            max_batch=current.batch_size,
            delay_s=current.max_queue_delay_s,
        )
        if expected.load < LEARN_BELOW_LOAD:
            # (Inside the SLA by the requests counted over it, a reading above it is the
            # histogram's: no more than the SLA.)
            p99 = min(p99, policy.sla_p99_s)
            residual = min(policy.sla_p99_s, max(0.0, p99 - expected.p99_s))
            if overhead is None:
                overhead = residual
            elif residual < overhead:
                overhead = OVERHEAD_FALL * residual + (1 - OVERHEAD_FALL) * overhead
            elif not unserved_beyond(observation, SHED_TOLERANCE):
                # A window that refused more than the SLA tolerates teaches no rise: admission
                # let in what it predicted would finish by the deadline, so its P99 sits near
                # the deadline whatever the overhead — spikes of load within it read as time
                # outside the batcher (40 → 53 ms where 40 were measured), the plan shrank its
                # batch and its replicas' capacity for it, and the miss stayed.
                overhead = OVERHEAD_RISE * residual + (1 - OVERHEAD_RISE) * overhead
    loss = track(
        state.lost,
        ready=ready,
        blocked=observation.blocked_replicas,
        replicas=current.replicas,
        was_ready=state.ready,
        had_replicas=state.replicas,
        now=now,
        replaced=policy.replaced_in_place,
    )
    cold_start, pending = state.cold_start_s, state.pending_since
    if pending is not None and observation.blocked_replicas:
        # Kubernetes cannot start some of them (no node with a free GPU, a quota): however
        # long they wait, it is not how long a replica takes to start (8 minutes waiting for a
        # node were learned as a cold start of 488 s where 30 s was true).
        pending = None
    if pending is not None and ready >= current.replicas - loss.count:
        # They became ready within the last interval: count half of it — where that says when
        # (`COLD_START_GAP_S`). Longer than a start can take, they were blocked: nothing learned.
        sample = max(0.0, now - pending - interval / 2)
        if interval <= COLD_START_GAP_S and sample <= MAX_COLD_START_S:
            cold_start = (
                sample
                if cold_start is None
                else COLD_START_SMOOTHING * sample + (1 - COLD_START_SMOOTHING) * cold_start
            )
        pending = None
    before = state.before_s
    if observation.before_s is not None and observation.qps:
        window_before = max(0.0, observation.before_s)
        before = (
            window_before
            if before is None
            else BEFORE_SMOOTHING * window_before + (1 - BEFORE_SMOOTHING) * before
        )
    return Learned(
        state=replace(
            state,
            fit=model,
            overhead_s=overhead,
            before_s=before,
            changed_at=changed_at,
            ready_changed_at=ready_changed_at,
            ready=ready,
            replicas=current.replicas,
            lost=loss,
            cold_start_s=cold_start,
            pending_since=pending,
            anchor=anchor,
        ),
        settled=settled,
        replicas_settled=replicas_settled,
        interval=interval,
    )


def dispersion(observation: Observation, known: float, *, settled: bool = True) -> float:
    """How the arrivals clump, for the model: the window's, else the last known. Below
    `CLUMPED` it is Poisson's 1 (a slow change of rate inside the runtime's 10 s reads as a
    little over 1); above, to the nearest step of `DISPERSION_STEP` — the capacity search
    remembers its answers by model, and a measurement that wobbles would find none of them.

    A window in which replicas came or went (not `settled`) may lower what is known but not
    raise it, as `unevenness`: each replica's rate changes inside the runtime's 10 s blocks as
    its share of the traffic does, which reads as clumping — Poisson arrivals read 1.9–2.4
    for three or four windows after every large scale-up, the plan added a replica for it, and
    the scale-down's hysteresis kept that replica at the load that followed."""
    measured = observation.arrival_dispersion
    if measured is None or not math.isfinite(measured):
        return known
    on_grid = _on_grid(measured)
    return on_grid if settled else min(known, on_grid)


def unevenness(observation: Observation, known: float, *, settled: bool = True) -> float:
    """How many times a replica's mean rate its requests met in their second, for the model:
    the window's where it describes the replicas in force (`settled`; else none: 1), and the
    last known where it is not counted or has too few arrivals to tell.

    Each replica counts its arrivals a second and sums their squares over the seconds (Σn²).
    For arrivals at λ a second that clump by D (the dispersion; 1 for Poisson), E[n²] = λ² + λD,
    so Σn²/Σn − D is Σλ²/Σλ: the rate a request met in its second, on average — the mean rate
    where it held over the window, more where the arrivals crowded into its busy seconds (a
    square wave of 10 s at 10× and 1× its low rate: 1.67 times the mean). Against a replica's
    mean over the same seconds (the arrivals over the seconds counted) that is the factor; below
    `EVEN` it is 1, above, on the dispersion's steps of 10 %. A replica busier than its peers
    (connections kept on it) reads as unevenness too: its requests do meet that rate. So do
    replicas that came or went inside the window, which is why a window that is not settled may
    lower what is known but not raise it: 19 of 23 replicas removed at a steady 150 rps left 4
    serving 38 rps each where 23 had served 6.5, and the window read 1.6 — the plan then asked
    for twice the replicas. (Kept whatever such windows read, the reading of a window where the
    traffic began held a step's replicas through every scale-up after it; read as none, every
    window after a change planned for the mean, and the replicas swung.)"""
    measured = _measured_unevenness(observation)
    if measured is None:
        return known
    # (An unsettled window may lower what is known, never raise it.)
    return measured if settled else min(known, measured)


def _measured_unevenness(observation: Observation) -> float | None:
    """The window's unevenness on the model's grid; None where it cannot tell."""
    squares = observation.arrival_second_squares
    counted = observation.arrival_counted_seconds
    arrived = (observation.arrival_qps or 0.0) + (observation.retried_qps or 0.0)
    if squares is None or counted is None or not (counted > 0 and arrived > 0):
        return None
    if observation.window_s < UNEVEN_MIN_WINDOW_S:
        return None
    mean = arrived / counted  # a replica's, a second
    if not (math.isfinite(squares) and math.isfinite(mean)) or mean < UNEVEN_MIN_RATE:
        return None
    noise = max(1.0, observation.arrival_dispersion or 1.0)
    factor = (squares / arrived - noise) / mean
    if not math.isfinite(factor):
        return 1.0
    return _on_grid(factor, least=EVEN, most=MAX_UNEVENNESS)


def batch_cv(observation: Observation, known: float) -> float:
    """How batch times vary around t(b), for the model: the window's, else the last known.
    Below `STEADY_CV` it is none (what a fit's own small errors leave on batches that take
    their time); above, in steps of `CV_STEP`, at most `MAX_BATCH_CV` — on a grid, as the
    dispersion is, for the capacity search's memory."""
    return _stepped(
        observation.batch_time_cv, known, least=STEADY_CV, step=CV_STEP, most=MAX_BATCH_CV
    )


def rows_cv(observation: Observation, known: float) -> float:
    """How the rows a request brings vary, for the model: the window's, else the last known.
    Below `VARIED_ROWS_CV` every request brings the same rows (the window's edges leave a
    little); above, in steps of `ROWS_CV_STEP` up to `MAX_ROWS_CV` — on a grid, for the
    capacity search's memory."""
    return _stepped(
        observation.request_rows_cv,
        known,
        least=VARIED_ROWS_CV,
        step=ROWS_CV_STEP,
        most=MAX_ROWS_CV,
    )


def _stepped(
    measured: float | None, known: float, *, least: float, step: float, most: float
) -> float:
    """A measured spread on the model's grid: the last known where none was measured, 0 below
    `least`, else to the nearest `step`, at most `most`."""
    if measured is None or not math.isfinite(measured):
        return known
    if measured < least:
        return 0.0
    return round(round(min(measured, most) / step) * step, 4)


def split_dispersion(measured: float, over: int, replicas: int) -> float:
    """The dispersion each of `replicas` replicas would see, where each of `over` replicas saw
    `measured`: a Service that spreads requests at random splits a clump binomially, so each
    replica's excess over Poisson's 1 is the whole stream's over the replicas (on the model's
    steps). A Service that keeps a client's connection on one replica splits nothing, and this
    is then more than the replicas will see: a plan for fewer replicas errs towards more."""
    return _on_grid(1.0 + (measured - 1.0) * over / max(1, replicas))


def _on_grid(ratio: float, *, least: float = CLUMPED, most: float = MAX_DISPERSION) -> float:
    """A ratio to Poisson's or an even rate's 1 on the model's steps of `DISPERSION_STEP`: 1
    below `least`, at most `most`."""
    if ratio < least:
        return 1.0
    steps = round(math.log(min(ratio, most)) / math.log(DISPERSION_STEP))
    return round(DISPERSION_STEP**steps, 4)


def rows_per_request(observation: Observation, known: float) -> float:
    """The rows a request brings: the window's, else (no request answered) the last known.
    The fit counts rows and the rates count requests: without this, a client that sends 8
    rows a request would be planned for an eighth of its load."""
    measured = observation.rows_per_request
    if measured is None or not math.isfinite(measured):
        return known
    return 1.0 if measured < ONE_ROW else measured


def present_load(observation: Observation, newest: float | None) -> tuple[float, str]:
    """The offered rate now, and a note when it is not the window's. `newest`: the rate of the
    interval the window took in since the previous decision (`newest_rate`), where the window
    describes the settings in force; None otherwise.

    The window's rate trails a sudden rise by half the window. The runtime's arrival counter
    over a short recent window shows it a few seconds in: taken when it is significantly above
    the window's (more than `TREND_SIGNIFICANCE` standard deviations of Poisson noise over the
    short window); a fall waits for the window (never scale down on a few seconds). At the
    first scrape after a step the counter's rate between the last two scrapes averages the new
    rate with the old; the runtime's gauge of its last seconds (`now_qps`) has it whole, and
    sizes a rise the counter shows, where it is higher and significant over its own span. (A
    spike of seconds the counter does not confirm is not a rise: no replica started for it
    would come in time.) Without the short window, a rising window's trend is extrapolated: the
    window moved by one interval, so the newest interval carries the whole change over the one
    it dropped (`newest_rate`)."""
    offered = observation.offered_qps or 0.0
    recent, span = observation.recent_qps, observation.recent_window_s
    if recent is not None and span:

        def rises(rate: float, seconds: float) -> bool:
            return rate - offered > TREND_SIGNIFICANCE * math.sqrt(max(offered, 1.0) / seconds)

        if not rises(recent, span):
            return offered, ""
        gauge = observation.now_qps
        if gauge is not None and gauge > recent and rises(gauge, RECENT_ARRIVALS_S):
            recent, span = gauge, RECENT_ARRIVALS_S
        return recent, f"; rising: {recent:.0f} rps over the last {span:.0f} s"
    if newest is not None and newest > offered:
        return newest, f", rising to {newest:.0f} rps"
    return offered, ""


def newest_rate(observation: Observation, state: State, now: float) -> float | None:
    """The rate of the interval the window took in since the previous decision, where the
    window's mean rose significantly over it (more than `TREND_SIGNIFICANCE` standard
    deviations of Poisson noise); None otherwise.

    The window's mean changes by what the newest interval brought less what the oldest took
    away: the newest ran at the oldest's rate plus the change times the window over the gap.
    The oldest's rate is what the decision a window earlier estimated for its own newest
    (`State.estimates`), and at most the previous window's mean — all one knows without it,
    which alone reads a step up to twice its height by the time the window has crossed it; the
    estimate alone, one made in a burst since gone, would read the burst into a small rise."""
    if state.rate is None:
        return None
    offered = observation.offered_qps or 0.0
    before = state.rate[1]
    gap = window_step(observation, state, now)
    if gap is None:
        return None
    noise = math.sqrt(2 * max(before, 1.0) * gap) / observation.window_s
    if offered - before <= TREND_SIGNIFICANCE * noise:
        return None
    at = now - observation.window_s
    near = [(abs(t - at), rate) for t, rate in state.estimates if abs(t - at) <= gap / 2]
    base = min(before, min(near)[1]) if near else before
    return base + (offered - before) * observation.window_s / gap


def saturated_load(
    observation: Observation, *, settled: bool, refused_since: bool = True
) -> float | None:
    """The load now that a window whose traffic began inside it implies, or None.

    Traffic that began inside the window (a new service, a cut-over, a step up) is averaged with
    what came before it, and the rate between the last two scrapes straddles its start: both
    trail the load now. A window that refused more than `SATURATED_SHARE` of its requests ran its
    devices flat out while the traffic was there, so the share of the window they were busy is
    the share it had the traffic: the offered rate over that share is the load since. Where the
    load was there all along, the devices were busy all along and this is the window's rate.
    Only where the replicas in force are the window's (`settled`): a replica that became ready
    inside the window was idle before it, which is no silence of the traffic. Where the batch
    limit changed inside the window, the devices stayed flat out after the change only if the
    limit in force refused too (`refused_since`, see `refused_lately`): otherwise the refusals
    may all be the old limit's, and the busy share since below 1 (a limit raised from 1 to 6 on
    the textbook's service read 334 rps of 300)."""
    busy, offered = observation.utilization, observation.offered_qps
    if not settled or not refused_since or not busy or not offered:
        return None
    if observation.unserved_share <= SATURATED_SHARE:
        return None
    return offered / max(busy, MIN_BUSY)


def unserved_qps(observation: Observation) -> float:
    """The window's requests a second not answered successfully: offered, less answered, less
    those their clients withdrew (no answer was owed)."""
    offered = observation.offered_qps or 0.0
    return max(0.0, offered - (observation.withdrawn_qps or 0.0) - (observation.qps or 0.0))


def window_step(observation: Observation, state: State, now: float) -> float | None:
    """How far the window moved since the previous decision: the time since it, and at least a
    scrape (the fast signal's span, the last two scrapes, where there is one, else
    `DEFAULT_SCRAPE_S`): a window moves by whole scrapes. None without a previous decision
    inside the window (or where the clock stepped back: NTP, a new leader's)."""
    if state.rate is None:
        return None
    gap = now - state.rate[0]
    if not 0 < gap < observation.window_s:
        return None
    return max(gap, observation.recent_window_s or DEFAULT_SCRAPE_S)


def refused_lately(observation: Observation, state: State, now: float) -> bool:
    """Whether the interval the window took in since the previous decision refused more than
    `SATURATED_SHARE` of the window's rate: the window's unserved requests grew by more than
    that since (the interval it dropped refused none of them, or some, so the newest refused at
    least the growth)."""
    gap = window_step(observation, state, now)
    if gap is None or state.refused is None:
        return False
    grown = (unserved_qps(observation) - state.refused) * observation.window_s / gap
    return grown > SATURATED_SHARE * (observation.offered_qps or 0.0)


def cold_start_of(state: State) -> float:
    """How long new replicas take to take traffic: learned, `DEFAULT_COLD_START_S` until
    measured."""
    return state.cold_start_s if state.cold_start_s is not None else DEFAULT_COLD_START_S


def reaction_horizon(state: State, *, interval: float) -> float:
    """How long a rise goes uncarried: until the metrics show it (a scrape, then the next
    decision: about two intervals, the scrape interval being about one), plus the cold start."""
    return 2 * (interval or DEFAULT_INTERVAL_S) + cold_start_of(state)


def anchored(
    points: tuple[ComputePoint, ...], state: State
) -> tuple[tuple[ComputePoint, ...], ComputePoint | None]:
    """The window's batch times with the anchor where that gives the fit its slope, and the
    anchor to keep. A slope needs two batch sizes; a window whose batches ran one size (a
    steady load; a window read from the busy share, `busy_compute`, is always one) leaves the
    fit rough, and a rough fit gives replicas back only as far as its slowest reading allows
    (`capacity.rough_scale_down`, from the anchor). So while the fit is rough the window's
    one size is kept (the anchor), and a later window at a size `ANCHOR_SPREAD` times apart
    joins it: two sizes, a slope, a confident fit. A window of several sizes needs none."""
    usable = usable_points(points)
    if not usable:
        return points, state.anchor
    sizes = [p.mean_batch for p in usable]
    if max(sizes) >= ANCHOR_SPREAD * min(sizes):
        return points, None  # a slope of its own
    here = _pooled(usable)
    kept = state.anchor
    if kept is None or (state.fit is not None and state.fit.confident):
        return points, here
    apart = max(here.mean_batch, kept.mean_batch) / min(here.mean_batch, kept.mean_batch)
    if apart >= ANCHOR_SPREAD:
        return (*points, kept), here
    # One size again: the anchor follows it, the newest window's weight beside the kept one's.
    return points, _pooled([here, kept])


def _pooled(points: list[ComputePoint]) -> ComputePoint:
    """Points of about one batch size as one: their batches' mean size and time."""
    weight = sum(p.batches for p in points)
    return ComputePoint(
        mean_batch=sum(p.batches * p.mean_batch for p in points) / weight,
        mean_seconds=sum(p.batches * p.mean_seconds for p in points) / weight,
        batches=weight,
    )


def busy_compute(observation: Observation) -> tuple[ComputePoint, ...]:
    """Where the window has no batch times by batch size (`compute`: a runtime or an exporter
    that does not count them), one point read from the device's busy share instead: replicas
    busy `utilization` of the time each, running `batches` batches a second between them, spend
    utilization × replicas / batches seconds on a batch of the window's mean size. Exact for a
    busy-seconds counter (a batch's device time); a utilization sampled from the device (NVML)
    reads the same where the device idles between batches. Empty where any of it is missing."""
    busy, served, batch = observation.utilization, observation.qps, observation.mean_batch
    replicas = observation.reporting_replicas or observation.ready_replicas
    if not (busy and served and batch and replicas) or batch < 1:
        return ()
    batches = served * (observation.rows_per_request or 1.0) / batch  # a second, every replica
    seconds = min(busy, 1.0) * replicas / batches
    if observation.p99_s is not None and seconds > observation.p99_s:
        # No request waits less than its batch's run: the batches a second are undercounted
        # (requests that carry several rows, where the rows a request are not known), and the
        # busy share says nothing of how long a batch takes. (Capped at P99 instead, a fit
        # twice too slow cost 4.6-18.6x the oracle's GPU-seconds; P99 alone steers.)
        return ()
    return (
        ComputePoint(
            mean_batch=batch, mean_seconds=seconds, batches=batches * observation.window_s
        ),
    )
