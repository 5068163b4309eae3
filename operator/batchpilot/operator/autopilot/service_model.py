"""A model of a batching inference service, to predict its operating point.

Per-batch compute time is close to linear in the batch size on accelerators: t(b) ≈ α + β·b
(α: launch and fixed overhead, β: per-row cost). The runtime exports compute time by batch-size
bucket; `fit` turns those points into α and β, with priors and sanity bounds, and `predict`
turns (α, β, load, replicas, batch limit, queue delay) into the batch size a replica will run,
its busy fraction and its P99 latency.

How a replica with the runtime's batcher behaves (one batch at a time; a batch dispatches when it
holds B requests, or when its oldest request has waited the queue delay D and the device is free):

- Batch size. A batch collects the arrivals of one cycle — the previous batch's compute, or the
  queue delay if that is longer — so the mean batch b solves b = m + e^(-m) with
  m = λ·max(t(b), D) (e^(-m): an empty queue still makes a batch of one); and a batch that
  starts on an idle device waits D for company, so b ≥ 1 + λ·D. Capped at B.
- Batch-size tail. A long batch collects a large next batch: sizes follow b' ≈ λα + λβ·b + noise,
  an AR(1) process with coefficient λβ and variance m / (1 - (λβ)²); its 99th percentile is
  b₉₉ = b + 2.33·√variance (at most B).
- Clumped arrivals. Requests that come together (a client's fan-out, a gateway's bursts) make
  a cycle's arrivals vary more than Poisson ones of the same rate: by the dispersion I, the
  variance of a short slot's count over its mean (E[X²]/E[X] for clumps of X requests at once).
  The batch sizes' variance is I·m / (1 - (λβ)²), and the backlog's tail decays I times slower
  (the same Cramér–Lundberg equation with work arriving in clumps of I requests). I below 1
  (arrivals more regular than Poisson) is taken as 1.
- Queue wait, the largest of three causes: waiting for the batch to fill (D at most); waiting for
  the batch in flight (up to t(b₉₉), while the device is busy); and the M/D/1-like backlog of
  full batches, whose tail is exponential — P(wait > x) ≈ ρ·e^(-θx), with ρ = λ·t(B)/B and θ the
  Cramér–Lundberg rate of per-request work t(B)/B: λ·(e^(θ·t(B)/B) - 1) = θ.
- Batch times that vary. A real device does not take exactly t(b): kernels contend for memory
  bandwidth, the thread that launches them is descheduled, clocks follow temperature. With a
  batch's time t(b)·X (X of mean 1 and coefficient of variation c, measured by the runtime), a
  request's own batch runs past t(b) by X's 99th percentile (log-normal), independent of the
  batch's size, so the two deviations add in quadrature; and the backlog of full batches of B,
  whose arrivals in units of a batch have a variance index of I/B where the service's is c²,
  has a tail (I/B + c²)/(1/B) times M/D/1's (Kingman): it stretches by I + B·c².
- Requests of varied rows. A request of r rows is r rows arriving at once: in units of a request
  of the mean size k, the rows' dispersion is the arrivals' plus the sizes' squared coefficient
  of variation c² (measured by the runtime), and it widens the batch sizes' spread and the
  backlog's tail as clumps do. The batcher fills the room a request that does not fit leaves
  with smaller ones from behind it, so a full batch holds B/k requests.
- P99 ≈ queue wait + t(b₉₉) + the latency spent outside the batcher (`overhead_s`: decoding,
  pre- and post-processing; the decision function learns it from observed P99).

Checked against the discrete-event simulator (`batchpilot.simulation`) over α from 1 to
20 ms, β from 0.5 to 4 ms, B from 1 to 64, D from 0 to 20 ms and loads from 20 % to 95 % of
saturation: the median P99 error is +3 %, 90 % of predictions are within -14 % / +36 % (the
worst: +40 % at batch 1 near saturation, where the tail's prefactor ρ is pessimistic; -26 % at
large batch limits around 80 % load). With batch times that vary (c 0.2 and 0.4, α 1-30 ms,
β 0.5-8 ms, B 1-64, loads 10-85 %): median +4 %, 80 % within -8 % / +34 % — where a model blind
to the variation reads -13 % / -36 % median at c 0.2 / 0.4, and most of its predictions are
short by more than 10 % (the worst over: +240 % at B 64 and c 0.4 under light load, where the
backlog's heavy-traffic stretch is pessimistic). The decision function anchors predictions to
the observed P99 and falls back to feedback when they disagree. With requests of varied rows,
against the batcher rule for rule in rows (`batchpilot.simulation.sizes`; three services, seven
mixes, B 16 and 64, D 2 and 10 ms, loads 30-85 %: `bench/request_sizes.py`): median -2 to +12 %
on mixes of cv 0.9-2.7, where the mean size alone reads -25 to -69 %; 2 of 144 such points
more than 25 % short.

Pure: arithmetic only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from batchpilot.operator.autopilot.observation import ComputePoint

Z99 = 2.33
"""Normal 99th percentile: a Poisson batch of mean b exceeds b + 2.33·√b 1 % of the time."""
MIN_BATCHES = 20
"""Buckets with fewer batches in the window are too noisy to fit."""
MIN_BATCH_SECONDS = 1e-6
"""A batch time below this is no measurement of one (no device runs a batch in less than a
microsecond; the status keeps milliseconds to four places): its bucket is left out of the fit."""
WHOLE_SLACK = 0.1
"""Whole requests and rows are counted to a tenth: a mean measured a little above a whole
number of rows (3.01 where every request carries 3) must not lose a request from every batch."""
VARIED_ROWS_CV = 0.05
"""Rows a request that vary less than this are one size: whole requests fill a batch."""
MAX_ROWS_CV = 10.0
"""The most spread of rows a request the model takes (one request in 100 a hundred times the
others' size is a cv of about 10)."""
MAX_BATCH_CV = 2.0
"""Batch times that vary more than this around t(b) are no longer t(b) with noise (a device
that stalls): the model takes this."""
MAX_UNEVENNESS = 10.0
"""The most times the window's mean rate the model takes requests to meet in their second."""
SMOOTHING = 0.5
"""Weight of a new fit against the previous one (a rough previous one is replaced: see `fit`)."""


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """t(b) = α + β·b, in seconds, for a batch of b rows. `confident`: fitted from at least two
    distinct batch sizes. `rows_per_request`: the rows a request brings (measured, see
    `Observation.rows_per_request`): rates are requests, batch limits rows, and a batch holds
    whole requests — the model counts in requests of k rows, each costing β·k (`in_requests`)."""

    alpha_s: float
    beta_s: float
    confident: bool
    rows_per_request: float = 1.0
    dispersion: float = 1.0
    """How the arrivals clump: the variance of their count over a short slot over its mean
    (measured, see `Observation.arrival_dispersion`); 1 for Poisson arrivals. The queue's
    randomness grows with it: the batch sizes' spread and the backlog's tail (`predict`)."""
    batch_cv: float = 0.0
    """How much a batch's time varies around t(b): the standard deviation of measured over
    predicted (measured, see `Observation.batch_time_cv`); 0 where every batch of a size takes
    the same time. The tail of a request's own batch and the backlog's grow with it (`predict`)."""
    rows_cv: float = 0.0
    """How much the rows a request brings vary around `rows_per_request`: their coefficient of
    variation (measured, see `Observation.request_rows_cv`); 0 where every request brings the
    same rows. A request of r rows is r rows arriving at once: the rows clump, and the queue's
    randomness grows as the arrivals' dispersion does, by the squared cv (`predict`)."""
    unevenness: float = 1.0
    """How many times the window's mean rate a request met in its second (measured, see
    `learn.unevenness`): 1 where the rate holds over the window, more where it swings within it
    (a square wave of seconds, pulses) and most requests come in its busy seconds. The model
    predicts at a rate; the decision asks it about the rate the requests meet."""

    def batch_seconds(self, batch: float) -> float:
        return self.alpha_s + self.beta_s * batch

    def in_requests(self, max_batch: int) -> tuple[float, float]:
        """(β per request, requests a batch limit of `max_batch` rows holds: at least one, a
        larger request runs alone). Requests of one size fill a batch with as many whole ones
        as fit. Requests of varied sizes fill it: the runtime's batcher fills the room a request
        that does not fit leaves with the smaller ones behind it, so a full batch holds the
        limit's rows, `max_batch / k` requests of the mean size k."""
        k = self.rows_per_request
        if self.rows_cv >= VARIED_ROWS_CV:
            return self.beta_s * k, max(1.0, max_batch / k)
        if k == 1.0:
            return self.beta_s, max_batch
        return self.beta_s * k, max(1, int(max_batch / k + WHOLE_SLACK))

    def request_rows(self) -> int:
        """The rows of one request, whole (to `WHOLE_SLACK`); where they vary, of the request a
        row comes in (E[r²]/E[r]): a batch limit below it runs most rows in batches of one
        request, over the limit."""
        k = self.rows_per_request
        if self.rows_cv >= VARIED_ROWS_CV:
            k *= 1.0 + self.rows_cv * self.rows_cv
        return int(k + WHOLE_SLACK)

    def capacity(self, max_batch: int) -> float:
        """Requests per second one replica serves at full batches of `max_batch` rows."""
        beta, requests = self.in_requests(max_batch)
        return requests / (self.alpha_s + beta * requests)


def usable_points(points: Sequence[ComputePoint]) -> list[ComputePoint]:
    """The points a fit may use: buckets of `MIN_BATCHES` batches or more, whose batch time is a
    measurement (`MIN_BATCH_SECONDS`)."""
    return [p for p in points if p.batches >= MIN_BATCHES and p.mean_seconds >= MIN_BATCH_SECONDS]


def fit(points: Sequence[ComputePoint], prior: LatencyFit | None) -> LatencyFit | None:
    """α and β from this window's compute points, smoothed with the previous fit.

    With points at two or more distinct batch sizes: weighted least squares (weights: batches).
    With one batch size only, α and β cannot be told apart: keep the prior's β if it was
    confident, otherwise split the time evenly (α = β·b), and say the fit is not confident.
    Fits that make no physical sense (β ≤ 0, α < 0) are clipped.

    Smoothing averages measurements. A rough prior is no measurement of β, only a guess at how
    one batch size's time splits, so the first confident fit replaces it outright: averaged in,
    the guess's error would halve once a window, the largest batch limit the plan allows would
    rise with it one window at a time, and the autopilot would creep towards the operating
    point the window had already measured.
    """
    usable = usable_points(points)
    if not usable:
        return prior
    weight = sum(p.batches for p in usable)
    mean_b = sum(p.batches * p.mean_batch for p in usable) / weight
    mean_t = sum(p.batches * p.mean_seconds for p in usable) / weight
    spread = max(p.mean_batch for p in usable) / min(p.mean_batch for p in usable)
    if len(usable) >= 2 and spread >= 1.5:
        var = sum(p.batches * (p.mean_batch - mean_b) ** 2 for p in usable)
        cov = sum(p.batches * (p.mean_batch - mean_b) * (p.mean_seconds - mean_t) for p in usable)
        beta = cov / var
        alpha = mean_t - beta * mean_b
        if beta <= 0:  # bigger batches no slower: compute is negligible next to overhead
            beta, alpha = mean_t * 1e-3 / mean_b, mean_t * 0.999
        if alpha < 0:  # no fixed overhead visible: all per-row cost
            alpha, beta = 0.0, mean_t / mean_b
        new = LatencyFit(alpha_s=alpha, beta_s=beta, confident=True)
    elif prior is not None and prior.confident:
        beta = min(prior.beta_s, mean_t / mean_b)
        new = LatencyFit(alpha_s=mean_t - beta * mean_b, beta_s=beta, confident=True)
    else:
        new = LatencyFit(alpha_s=mean_t / 2, beta_s=mean_t / (2 * mean_b), confident=False)
    if prior is None or (new.confident and not prior.confident):
        return new
    return LatencyFit(
        alpha_s=SMOOTHING * new.alpha_s + (1 - SMOOTHING) * prior.alpha_s,
        beta_s=SMOOTHING * new.beta_s + (1 - SMOOTHING) * prior.beta_s,
        confident=new.confident,
    )


def startup_fit(points: Sequence[ComputePoint]) -> LatencyFit | None:
    """t(b) through the batch times a replica measured at start-up (`Observation.startup`):
    the line through the smallest and the largest size, clipped as `fit` clips; None without
    two sizes. A measurement of the slope, so confident: the first plan needs no trial of the
    batch limit to tell fixed cost from per-row cost."""
    timed = sorted((p for p in points if p.mean_seconds > 0), key=lambda p: p.mean_batch)
    if len(timed) < 2 or timed[-1].mean_batch < 1.5 * timed[0].mean_batch:
        return None
    small, large = timed[0], timed[-1]
    beta = (large.mean_seconds - small.mean_seconds) / (large.mean_batch - small.mean_batch)
    alpha = small.mean_seconds - beta * small.mean_batch
    if beta <= 0:  # the larger batch no slower: all fixed cost
        mean_t = (small.mean_seconds + large.mean_seconds) / 2
        beta, alpha = mean_t * 1e-3 / large.mean_batch, mean_t * 0.999
    if alpha < 0:  # no fixed cost visible: all per-row cost
        alpha, beta = 0.0, large.mean_seconds / large.mean_batch
    return LatencyFit(alpha_s=alpha, beta_s=beta, confident=True)


@dataclass(frozen=True, slots=True)
class Prediction:
    batch: float
    """Mean rows per batch a replica will run."""
    utilization: float
    """Device busy fraction of a replica."""
    load: float
    """Arrival rate over capacity at full batches: above 1 the queue grows without bound."""
    p99_s: float
    """Predicted P99 latency (math.inf when overloaded)."""


TAIL = 0.01
"""The quantile's complement: P99 is exceeded by 1 % of requests."""
_ITERATIONS = 60
"""Bound on the fixed-point and Newton iterations (both converge in a few)."""


@lru_cache(maxsize=256)
def _tail_factor(cv: float) -> float:
    """The 99th percentile of a batch's time over its mean, for times of this coefficient of
    variation: log-normal (a right tail — a batch can take twice its time, never none)."""
    sigma2 = math.log1p(cv * cv)
    return math.exp(Z99 * math.sqrt(sigma2) - sigma2 / 2)


def _backlog_rate(rho: float) -> float:
    """The positive root x of ρ·(eˣ - 1) = x, for 0 < ρ < 1 (x = θ × per-request work).

    f(x) = ρ(eˣ - 1) - x is convex with f(0) = 0 and f'(0) < 0, and eˣ ≥ 1 + x + x²/2 puts the
    root below 2(1 - ρ)/ρ: Newton's method from there descends monotonically onto it. (The
    capacity search runs this a hundred times a decision: `exp`, `abs` and `max` are spelled out
    as local arithmetic, with the same ties.)"""
    exp = math.exp
    x = 2 * (1 - rho) / rho
    for _ in range(_ITERATIONS):
        grow = rho * exp(x)
        step = (grow - rho - x) / (grow - 1)
        x -= step
        bound = 1e-12 * (x if x > 1.0 else 1.0)
        if -bound < step < bound:
            break
    return x


Point = tuple[float, float, float, float]
"""(batch, utilization, load, P99 seconds): a `Prediction`'s fields, before one is built."""


def predict(
    model: LatencyFit,
    *,
    rate: float,
    replicas: int,
    max_batch: int,
    delay_s: float,
    overhead_s: float = 0.0,
) -> Prediction:
    """The steady state of `replicas` replicas sharing `rate` requests per second at random."""
    point = _operating_point(model, rate / replicas, max_batch, delay_s, overhead_s, math.inf)
    assert point is not None  # nothing is certain to exceed infinity
    batch, utilization, load, p99 = point
    return Prediction(batch=batch, utilization=utilization, load=load, p99_s=p99)


def _operating_point(
    model: LatencyFit,
    lam: float,
    max_batch: int,
    delay_s: float,
    overhead_s: float,
    give_up_above_s: float,
) -> Point | None:
    """`predict` for one replica offered `lam` requests per second; None, without the batch
    size's fixed point (the costly part: up to `_ITERATIONS` steps near saturation), when P99 is
    certain to exceed `give_up_above_s`.

    Certain, to the last bit: the backlog term needs no batch size, and the batch size never
    falls below its floor, so P99 = overhead + max(filling, in flight, backlog) + t(tail batch)
    is at least overhead + backlog + t(floor) — floating-point sums and products round
    monotonically, so the computed P99 is at least that bound computed the same way (β ≥ 0:
    t grows with the batch). The capacity search asks mostly such questions near saturation.

    t(b) = α + β·b is written out, and so are the fixed point's `max(t(b), D)`, `max(floor, ·)`
    and `min(B, ·)`, with the ties `max` and `min` break the same way: the capacity search runs
    this loop thousands of times a decision.

    The queue is modelled in requests (`LatencyFit.in_requests`): the batch size returned is
    converted back to rows."""
    alpha, beta, rows = model.alpha_s, model.beta_s, model.rows_per_request
    clumps = model.dispersion if model.dispersion > 1.0 else 1.0
    # Requests of varied rows are rows arriving in clumps: in units of a request of the mean
    # size, the rows' dispersion is the arrivals' plus the sizes' squared cv.
    varied = model.rows_cv >= VARIED_ROWS_CV
    if varied:
        clumps += model.rows_cv * model.rows_cv
    limit: float = max_batch
    if rows != 1.0 or varied:
        beta, limit = model.in_requests(max_batch)
    cv = model.batch_cv
    # The backlog is served in full batches of B requests taking t(B)·X each: in units of a
    # batch the arrivals' variance index is I/B and the service's X's cv², so its tail (a
    # Kingman-like scale, (I/B + cv²)/(1/B) times M/D/1's) stretches by I + B·cv².
    stretch = clumps + limit * cv * cv if cv > 0 else clumps
    delay = delay_s if limit > 1 else 0.0
    full = alpha + beta * limit
    load = lam * full / limit
    if lam <= 0:
        return rows, 0.0, 0.0, overhead_s + delay + (alpha + beta)
    if load >= 1:
        return limit * rows, 1.0, load, math.inf
    floor = min(float(limit), 1 + lam * delay)
    work = full / limit
    backlog = stretch * math.log(load / TAIL) * work / _backlog_rate(load) if load > TAIL else 0.0
    if beta >= 0 and overhead_s + backlog + (alpha + beta * floor) > give_up_above_s:
        return None
    # Mean batch: the fixed point of b = m + e^-m (a contraction: slope < λβ < 1).
    exp = math.exp
    batch: float = floor
    cycle_arrivals = 0.0
    for _ in range(_ITERATIONS):
        busy = alpha + beta * batch
        cycle_arrivals = lam * (delay if delay > busy else busy)
        grown = cycle_arrivals + exp(-cycle_arrivals)
        if floor > grown:
            grown = floor
        nxt: float = grown if grown < limit else limit
        if -1e-9 < nxt - batch < 1e-9:
            break
        batch = nxt
    utilization = min(1.0, lam * (alpha + beta * batch) / batch)
    # Batch-size tail of the AR(1) process b' = λα + λβ·b + noise.
    memory = lam * beta
    spread = math.sqrt(clumps * cycle_arrivals / (1 - memory * memory))
    tail_batch = min(float(limit), batch + Z99 * spread)
    tail_seconds = alpha + beta * tail_batch
    # Queue wait: filling, the batch in flight, the backlog of full batches.
    fill = limit - 1
    filling = min(delay, (fill + Z99 * math.sqrt(fill)) / lam) if fill else 0.0
    in_flight = tail_seconds * max(0.0, 1 - TAIL / utilization) if utilization > TAIL else 0.0
    p99 = overhead_s + max(filling, in_flight, backlog) + tail_seconds
    if cv > 0:
        # The request's own batch takes longer than t(b) by its draw of X: independent of the
        # batch's size, so the two deviations add in quadrature.
        mean_seconds = alpha + beta * batch
        late = mean_seconds * (_tail_factor(cv) - 1)
        size_tail = tail_seconds - mean_seconds
        p99 += math.sqrt(size_tail * size_tail + late * late) - size_tail
    return batch * rows, utilization, load, p99


def sla_capacity(
    model: LatencyFit,
    *,
    max_batch: int,
    delay_s: float,
    overhead_s: float,
    target_s: float,
) -> float:
    """The highest rate one replica carries with predicted P99 ≤ `target_s` (0 if even a
    trickle misses the target). Bisection: P99 grows with the rate. Latencies are taken to the
    microsecond, and answers remembered: a service in steady state asks the same questions tick
    after tick. (Utilization needs no bound of its own: latency bounds a batching replica.)"""
    return _sla_capacity(
        model, max_batch, round(delay_s, 6), round(overhead_s, 6), round(target_s, 6)
    )


CAPACITY_MEMO = 65_536
"""Capacity answers remembered: a fleet's worth. One service's tick asks about eight (a batch
limit each, the target and the SLA); at 4,096 a fleet of 1,000 services evicted every answer
before its next tick and each decision took 2–4 ms instead of 0.2 (bench/fleet_autopilot.py).
An answer is a few hundred bytes: 65,536 hold 8,000 services in about 20 MB."""


@lru_cache(maxsize=CAPACITY_MEMO)
def _sla_capacity(
    model: LatencyFit,
    max_batch: int,
    delay_s: float,
    overhead_s: float,
    target_s: float,
) -> float:

    def fits(rate: float) -> bool:
        # Near saturation most rates are certain to miss before the costly part is computed.
        point = _operating_point(model, rate, max_batch, delay_s, overhead_s, target_s)
        return point is not None and point[3] <= target_s

    high = model.capacity(max_batch)
    if not fits(high * 1e-3):
        return 0.0
    low = high * 1e-3
    for _ in range(CAPACITY_STEPS):
        middle = (low + high) / 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


CAPACITY_STEPS = 11
"""Bisection steps: the replica's saturation rate / 2¹¹, 0.05 %."""
