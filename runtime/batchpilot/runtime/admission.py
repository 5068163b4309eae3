"""Deadline-aware admission: predict when a request would finish, and refuse it at arrival
when that is after its deadline.

A server without this keeps the SLA only while it has spare capacity. Past that point every
request waits behind all the others, its deadline passes while it waits, and the device spends
its time on answers nobody waits for any more (congestion collapse): at twice the capacity
nearly every request times out. Refusing the requests that cannot finish in time, at once and
with 503 + Retry-After, keeps the promise for the ones admitted; the client, or the load
balancer, retries elsewhere or later.

The prediction uses what the server measures of itself: per-batch compute time t(b) ≈ α + β·b,
fitted online from the batches it ran (`BatchTiming`), the batches running now and the rows
queued ahead (`DeviceLedger`), and how late its own predictions turned out (`Lateness`, kept as
a margin to the deadline). The same prediction lets the batcher form the largest batch that
still lets its oldest request meet its deadline, rather than a full one that cannot. A server
whose measurements a stall spoilt still takes a probe request now and then (`Predictor.
must_probe`), so that it learns the stall is over; a probe is never larger than a batch the
server forms anyway, so no request holds the device far past its deadline. A request larger
than that which the device, even idle and at the fastest it has been measured, cannot serve
in time is no load to shed but a request to change (`Predictor.fastest_s`): the queue refuses
it for good.

Pure core: no I/O, the clock is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

SIZE_MEMORY_BATCHES = 50
"""Each batch size's mean time follows its last ~this many batches (an exponential average):
long enough to average the noise of single batches, short enough to follow a device that slows
down (thermal throttling, a noisy neighbour) within seconds under load."""

SIZE_WEIGHT_CAP = 10
"""A batch size weighs in the fit by its number of batches, up to this: a size seen once (a
burst) counts less than one seen all day, and the commonest size cannot drown the others that
pin down the slope."""

CV_MIN_BATCHES = 10
"""`BatchTiming.cv` is said from this many predicted batches on (weighted as they fade)."""

STALL_FACTOR = 10.0
"""A batch that took this many times its prediction is a stall (a GPU that stopped for a while:
the first batch of a size the device tunes for, a kernel loaded lazily, a neighbour's burst,
an Xid's recovery), not the device's pace — unless the next one is one too, when it is the
pace: a stall is left out of the size's mean and counts in the spread as `ERROR_CAP`. Counted
in full, one 4 s batch against an 11 ms prediction took the spread from 0.08 to 80 and the
mean of its size to fifteen times its time: every prediction a hundred times too long, every
request refused, and the refusals let through one probe batch a second to correct it — 98 %
refused for over a minute and a half on an idle device."""

ERROR_CAP = 3.0
"""A batch's relative error counts in the spread at most this much (a batch four times its
prediction): the spread is of the device's noise, and one outlier must not multiply every
prediction for the next fifty batches."""

SPREAD_SIGMAS = 2.0
"""High estimates add this many standard deviations of the fit's relative one-step-ahead
error: a batch takes longer than predicted this way about 2-3 % of the time."""


@dataclass(frozen=True, slots=True)
class Fit:
    """t(b) = alpha_s + beta_s·b, and the relative spread of its prediction errors."""

    alpha_s: float
    beta_s: float
    spread: float
    """Standard deviation of (measured / predicted - 1) over recent batches."""
    floor_rows: float = 0.0
    """With one batch size seen (α unknown): batches up to this size take its time."""


@dataclass(slots=True)
class _SizeStat:
    mean_s: float
    count: int
    best_s: float
    """The fastest batch of this size measured: what a stall that spoilt the mean leaves."""


class BatchTiming:
    """t(b), fitted online by least squares over the mean time of each batch size run.

    Means are kept per size, so a slope measured once (the start-up calibration, a burst) is
    not forgotten while the traffic runs a single size for hours; each size follows its own
    recent batches. The fit is updated in O(1) per batch from running sums over the sizes.
    Coefficients are clamped (α ≥ 0, β ≥ 0): a noisy fit never predicts a bigger batch faster.
    """

    def __init__(self) -> None:
        self._sizes: dict[int, _SizeStat] = {}
        self._w = self._b = self._t = self._bb = self._bt = 0.0
        self._err2 = 0.0
        self._err_w = 0.0
        self._fit: Fit | None = None
        self._quickest_s: float | None = None
        self._stalled = False
        """Whether the last batch was a stall (`STALL_FACTOR`) left out of the means."""
        self._stalls = 0

    @property
    def fit(self) -> Fit | None:
        """The current fit; None until a batch has been measured."""
        return self._fit

    @property
    def cv(self) -> float | None:
        """How much batches vary around the fit: the root mean square of measured over
        predicted, less 1, over the last ~`SIZE_MEMORY_BATCHES` batches (the spread of
        `Fit`); None until `CV_MIN_BATCHES` have been predicted."""
        if self._fit is None or self._err_w < CV_MIN_BATCHES:
            return None
        return self._fit.spread

    @property
    def stalls(self) -> int:
        """Batches taken for stalls and left out of the means (`STALL_FACTOR`)."""
        return self._stalls

    @property
    def quickest_s(self) -> float | None:
        """The fastest batch of any size measured; None before any."""
        return self._quickest_s

    def observe(self, rows: int, seconds: float, *, fresh: bool = False) -> None:
        """Add one measured batch of `rows` rows that took `seconds`. A `fresh` measurement (a
        probe after a stall, see `Predictor.must_probe`) moves the size's mean halfway to it:
        what came before it may be spoilt."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        # Errors count from the first real fit on: a single size's stand-in is no prediction.
        predicted = self.seconds(rows) if self._fit and not self._fit.floor_rows else None
        if predicted is not None and predicted > 0:
            keep = 1.0 - 1.0 / SIZE_MEMORY_BATCHES
            error = max(-ERROR_CAP, min(ERROR_CAP, seconds / predicted - 1.0))
            self._err2 = self._err2 * keep + error * error
            self._err_w = self._err_w * keep + 1.0
            stalled = seconds > STALL_FACTOR * predicted
            if stalled and not self._stalled:
                # One stall: its time is no t(b). (The next, a stall too, is the pace now.)
                self._stalled = True
                self._stalls += 1
                self._fit = self._solve()
                return
            self._stalled = stalled
        if self._quickest_s is None or seconds < self._quickest_s:
            self._quickest_s = seconds
        stat = self._sizes.get(rows)
        if stat is None:
            stat = self._sizes[rows] = _SizeStat(mean_s=seconds, count=0, best_s=seconds)
        else:
            self._account(rows, stat, -1.0)
            stat.best_s = min(stat.best_s, seconds)
        stat.count += 1
        memory = min(stat.count, 2 if fresh else SIZE_MEMORY_BATCHES)
        stat.mean_s += (seconds - stat.mean_s) / memory
        self._account(rows, stat, 1.0)
        self._fit = self._solve()

    def _account(self, rows: int, stat: _SizeStat, sign: float) -> None:
        w = sign * min(stat.count, SIZE_WEIGHT_CAP)
        self._w += w
        self._b += w * rows
        self._t += w * stat.mean_s
        self._bb += w * rows * rows
        self._bt += w * rows * stat.mean_s

    def _solve(self) -> Fit:
        spread = math.sqrt(self._err2 / self._err_w) if self._err_w > 0 else 0.0
        return _line(
            self._w, self._b, self._t, self._bb, self._bt, sizes=len(self._sizes), spread=spread
        )

    def seconds(self, rows: int) -> float | None:
        """Expected time of a batch of `rows` rows; None before any batch was measured."""
        fit = self._fit
        if fit is None:
            return None
        return fit.alpha_s + fit.beta_s * max(rows, fit.floor_rows)

    def upper(self, rows: int, *, batches: int = 1) -> float | None:
        """A high estimate of the time of `batches` batches of `rows` rows run one after the
        other: their expected time plus `SPREAD_SIGMAS` deviations of the sum (independent
        errors: the deviation of a sum of n grows as √n)."""
        expected = self.seconds(rows)
        if expected is None:
            return None
        assert self._fit is not None
        return batches * expected * (1.0 + SPREAD_SIGMAS * self._fit.spread / math.sqrt(batches))

    def fastest(self, rows: int) -> float | None:
        """`upper` of one batch of `rows` rows by the line through the fastest batch of each
        size measured rather than through their means: what the device does when nothing slows
        it. A stall that spoilt the means leaves the fastest batches of the sizes seen before
        it as they were. Computed over the sizes (O(sizes)): for the rare request that needs
        it, not for every arrival."""
        fit = self._fit
        if fit is None:
            return None
        w = b = t = bb = bt = 0.0
        for size, stat in self._sizes.items():
            weight = min(stat.count, SIZE_WEIGHT_CAP)
            w += weight
            b += weight * size
            t += weight * stat.best_s
            bb += weight * size * size
            bt += weight * size * stat.best_s
        best = _line(w, b, t, bb, bt, sizes=len(self._sizes), spread=fit.spread)
        expected = best.alpha_s + best.beta_s * max(rows, best.floor_rows)
        return expected * (1.0 + SPREAD_SIGMAS * best.spread)


def _line(w: float, b: float, t: float, bb: float, bt: float, *, sizes: int, spread: float) -> Fit:
    """t(b) = α + β·b by weighted least squares from the sums over the sizes measured of the
    weights `w`, rows `b`, times `t`, rows² `bb` and rows × time `bt`."""
    mean_b, mean_t = b / w, t / w
    variance_b = bb / w - mean_b * mean_b
    if sizes < 2 or variance_b <= 1e-9 * mean_b * mean_b:
        # One batch size: through the origin and that point for larger batches, that
        # point's time for smaller ones. Both over-predict when α > 0, so admission errs
        # on the side of the deadline until a second size is measured.
        return Fit(alpha_s=0.0, beta_s=mean_t / mean_b, spread=spread, floor_rows=mean_b)
    beta = (bt / w - mean_b * mean_t) / variance_b
    alpha = mean_t - beta * mean_b
    if beta < 0:
        alpha, beta = mean_t, 0.0
    elif alpha < 0:
        alpha, beta = 0.0, mean_t / mean_b
    return Fit(alpha_s=alpha, beta_s=beta, spread=spread)


class DeviceLedger:
    """The batches running now, for the time they leave before an instance is free."""

    def __init__(self, *, instances: int) -> None:
        if instances < 1:
            raise ValueError(f"instances must be at least 1, got {instances}")
        self.instances = instances
        self._running: dict[int, tuple[float, int]] = {}
        self._next = 0

    def started(self, rows: int, now: float) -> int:
        token = self._next
        self._next += 1
        self._running[token] = (now, rows)
        return token

    def finished(self, token: int) -> None:
        self._running.pop(token, None)

    @property
    def idle(self) -> bool:
        return not self._running

    @property
    def running(self) -> int:
        """Batches running now."""
        return len(self._running)

    def busy_s(self, timing: BatchTiming, now: float) -> float:
        """Compute time the running batches still need, summed over instances: what t(b) leaves
        of each; for a batch past its time, as long again as it is late — a batch that does not
        end (a GPU that hangs) is no batch about to end: taken for one, every request was
        admitted behind it, to wait there until its deadline (504), none refused (503)."""
        total = 0.0
        for started, rows in self._running.values():
            expected = timing.seconds(rows)
            if expected is not None:
                total += abs(started + expected - now)
        return total


def predicted_finish(
    *,
    timing: BatchTiming,
    ledger: DeviceLedger,
    queued_rows: int,
    rows: int,
    max_batch_size: int,
    now: float,
    others: Iterable[int] = (),
    alone: Iterable[int] = (),
) -> float | None:
    """When a request of `rows` rows arriving `now` behind `queued_rows` queued rows of its own
    shape would be answered, or None when nothing has been measured yet (nothing to predict
    from). `others`: the rows queued of each other shape; `alone`: the rows of each queued
    request larger than `max_batch_size`, of any shape (not in `queued_rows` or `others`): the
    batcher runs each alone, in one batch — counted in full batches of the limit, each paying
    the fixed part of t(b) again, a 32-row request ahead of a one-row one under a limit of 8 read
    145 ms where 77 was the most it could take, and refused it.

    Running batches finish first. The rows ahead are served in full batches of
    `max_batch_size`, and so is the request's own when a full batch is ahead of it (the rows that
    arrive meanwhile fill it); otherwise its batch holds the rows queued now. Requests of other
    shapes never share a batch with it (their inputs do not stack): each shape's rows run in
    batches of their own — full ones, then one of the rest — and all of them count ahead, the
    batcher taking the oldest request's shape first (a model whose inputs vary in length, with
    one-row requests of 64 lengths queued: 64 batches of one row, where counting them as full
    batches of every shape admitted requests that expired and taught a lateness that then
    refused nine in ten with the device idle). A request of more
    rows than `max_batch_size` runs alone, as the batcher runs it (it never splits a request):
    one batch of its rows after the rows ahead — by the fit's straight line also beyond the
    sizes measured, which its batch, once run, measures. With several instances the work ahead
    is shared among them; the request's own batch still takes its full time. What this misses
    (rows joining a batch that was not full, a busy event loop) is measured as lateness and
    added by `Predictor.finish_time`.
    """
    ahead = ledger.busy_s(timing, now)
    if rows > max_batch_size:
        full = math.ceil(queued_rows / max_batch_size)
        own = timing.upper(rows)
    else:
        total = queued_rows + rows
        full = max(0, math.ceil(total / max_batch_size) - 1)
        own = timing.upper(min(total, max_batch_size) if full == 0 else max_batch_size)
    if own is None:
        return None
    if full:
        ahead_full = timing.upper(max_batch_size, batches=full)
        assert ahead_full is not None
        ahead += ahead_full
    for queued in others:
        whole, rest = divmod(queued, max_batch_size)
        if whole:
            ahead += timing.upper(max_batch_size, batches=whole) or 0.0
        if rest:
            ahead += timing.upper(rest) or 0.0
    for large in alone:
        ahead += timing.upper(large) or 0.0
    return now + ahead / ledger.instances + own


LATENESS_WINDOW_S = 2.0
"""The lateness of predictions is that of the answers of about the last this many seconds: it
says how the prediction errs under the load of now. A burst teaches a lateness that ends with
it, and an idle server has few answers to unlearn it with: a thousand requests at once once
left requests with a tight deadline refused for minutes, one answer on time at a time taking a
little of it away. Likewise a server starved of CPU for a while (a noisy neighbour, CFS
throttling) learns a large lateness and then refuses nearly everything, so few answers come to
correct it: it must not stay refused once the starvation is over. Under a sustained overload
answers never stop, and the margin holds: at 280 answers a second `LATENESS_MEMORY` reaches
back about 0.7 s, and the window cuts off the 6 % of its weight older than 2 s. (A 1 s window
cut 25 %: at 4x the capacity, bench/overload.py, 17-23 of 2,800 admitted requests expired in
10 s where 11-12 do with this one and did without a window.)"""

LATENESS_MEMORY = 200
"""Within the window the lateness follows about the last this many answers (an exponential
average), so that at high rates the recent answers weigh more."""

LATENESS_BINS = 20
"""The window is kept in this many slices of time, each dropped whole as it ages out."""


class Lateness:
    """How much later than predicted admitted requests finish: the error of the whole prediction,
    which t(b) alone does not see — an event loop busy with arrivals starts batches late, and
    under a backlog batches run smaller than full. Admission keeps this margin to the deadline.

    Only lateness counts (an early answer counts as zero): answers earlier than predicted say
    the prediction was pessimistic, which must shrink the margin, not widen its spread.

    The answers of the last `LATENESS_WINDOW_S` count, in `LATENESS_BINS` slices of time that
    leave the window whole; within it each answer weighs `1 / keep` more than the one before it
    (`LATENESS_MEMORY`). Weights are kept relative to a unit that grows with every answer and is
    brought back to 1 as each slice begins, when the totals are summed again from the slices:
    no rounding error outlives a slice.
    """

    def __init__(self) -> None:
        self._slice_s = LATENESS_WINDOW_S / LATENESS_BINS
        self._weights = [0.0] * LATENESS_BINS
        self._sums = [0.0] * LATENESS_BINS
        self._squares = [0.0] * LATENESS_BINS
        self._newest: int | None = None
        """The number of the newest slice: its start over the slice length."""
        self._unit = 1.0
        """The weight of the latest answer, in the slices' units."""
        self._weight = self._sum = self._square = 0.0

    def observe(self, error_s: float, *, now: float) -> None:
        """One request finished `error_s` seconds after (negative: before) its prediction."""
        error_s = max(0.0, error_s)
        slot = self._advance(now)
        self._unit /= 1.0 - 1.0 / LATENESS_MEMORY
        weight = self._unit
        self._weights[slot] += weight
        self._sums[slot] += weight * error_s
        self._squares[slot] += weight * error_s * error_s
        self._weight += weight
        self._sum += weight * error_s
        self._square += weight * error_s * error_s
        if self._unit > 1e12:  # ~5,500 answers in one slice: rescale before it overflows
            self._rescale()

    def measured(self, now: float) -> bool:
        """Whether an answer of the window says how late predictions run (a fresh server, or
        one that answered nothing for `LATENESS_WINDOW_S`, has none)."""
        self._advance(now)
        return self._weight > 0

    def margin_s(self, now: float) -> float:
        """Mean lateness plus `SPREAD_SIGMAS` deviations, over the answers of the window."""
        self._advance(now)
        if self._weight <= 0:
            return 0.0
        mean = self._sum / self._weight
        sigma = math.sqrt(max(0.0, self._square / self._weight - mean * mean))
        return max(0.0, mean + SPREAD_SIGMAS * sigma)

    def _advance(self, now: float) -> int:
        """Drop the slices that left the window by `now`; returns the newest slice's slot (a
        time before the newest slice counts in it: the window never moves back)."""
        index = math.floor(now / self._slice_s)
        newest = self._newest
        if newest is None:
            self._newest = index
        elif index > newest:
            for gone in range(newest + 1, min(index, newest + LATENESS_BINS) + 1):
                slot = gone % LATENESS_BINS
                self._weights[slot] = self._sums[slot] = self._squares[slot] = 0.0
            self._newest = index
            self._rescale()
        assert self._newest is not None
        return self._newest % LATENESS_BINS

    def _rescale(self) -> None:
        """Weights back to a unit of 1, and the totals summed again from the slices."""
        scale = 1.0 / self._unit
        for slot in range(LATENESS_BINS):
            self._weights[slot] *= scale
            self._sums[slot] *= scale
            self._squares[slot] *= scale
        self._unit = 1.0
        self._weight = math.fsum(self._weights)
        self._sum = math.fsum(self._sums)
        self._square = math.fsum(self._squares)


UNMEASURED_LATENESS_SHARE = 1.0
"""With no answer in the lateness window, admission keeps this share of the device time queued
ahead of a request as its margin: the server has not seen how late its predictions run under the
load of now, and the event loop's own work, which t(b) does not see, may hold the device up as
long as that work takes. That is what a burst on a fresh or idle server does: a thousand 1-row
requests at once on the simulated accelerator (t(b) = 8 + 1.5·b ms, deadline 1 s) kept the event
loop busy reading, checking and refusing them for 150-360 ms, about 150-350 µs each; the first
batch, due after 20 ms, was answered after 140 ms, every prediction made during the burst turned
out 105-167 ms late, and with no margin 45-74 of the ~400 requests admitted expired (504). No
answer can teach it in time: every admission of the burst was decided before its first answer.
The margin goes once the burst's first answers measure the real one; under a sustained load
answers never stop coming, so it never applies. A lone request on an idle server has nothing
queued ahead, so no margin either."""

PROBE_AFTER_S = 1.0
"""A device idle for this long with nothing queued takes the next request whatever the
prediction says: measurements this old may be spoilt (a stall inflated them), and a server
that refuses everything learns nothing new. Only a request no larger than a batch the server
forms anyway: measuring needs no more, and a larger one the prediction is right about would
hold the device for an answer nobody waits for (4000 rows on the simulated accelerator: 5.8 s
of device time for a caller gone after 1 s, every request behind it refused meanwhile)."""


class Predictor:
    """What the queue and the batcher share: t(b) as measured, the batches running now, and how
    late its predictions turned out."""

    def __init__(self, *, instances: int = 1, timing: BatchTiming | None = None) -> None:
        self.timing = timing or BatchTiming()
        self.ledger = DeviceLedger(instances=instances)
        self.lateness = Lateness()
        self._last_batch_at: float | None = None

    def must_probe(self, *, queued_rows: int, rows: int, ceiling: int, now: float) -> bool:
        """Whether a request of `rows` rows is taken whatever the prediction: it is no larger
        than `ceiling`, the largest batch the server forms, the device is idle, nothing is
        queued, and no batch ended for `PROBE_AFTER_S`."""
        return (
            rows <= ceiling
            and queued_rows == 0
            and self.ledger.idle
            and (self._last_batch_at is None or now - self._last_batch_at >= PROBE_AFTER_S)
        )

    def margin_s(
        self,
        *,
        predicted: float,
        queued_rows: int,
        rows: int,
        max_batch_size: int,
        now: float,
    ) -> float:
        """The margin admission keeps between a request's `predicted` finish (`finish_time` of
        the same arguments) and its deadline: the lateness of the answers of the last
        `LATENESS_WINDOW_S`, or with none `UNMEASURED_LATENESS_SHARE` of the time the rows
        queued ahead add to it."""
        if self.lateness.measured(now):
            return self.lateness.margin_s(now)
        alone = self.finish_time(queued_rows=0, rows=rows, max_batch_size=max_batch_size, now=now)
        if alone is None:
            return 0.0
        return UNMEASURED_LATENESS_SHARE * max(0.0, predicted - alone)

    def fastest_s(self, rows: int) -> float | None:
        """Admission's high estimate of a batch of `rows` rows at the fastest the device has
        been measured (`BatchTiming.fastest`): what the request would be predicted to take
        alone on an idle device whose means no stall spoilt. The fit's straight line is the
        optimistic reading beyond the sizes measured (an accelerator past saturation is
        slower): later than a deadline by this, admission never takes the request, on any
        replica as measured. None before any batch was measured."""
        return self.timing.fastest(rows)

    def started(self, rows: int, now: float) -> int:
        """A batch of `rows` rows started at `now`; returns its token for `finished`."""
        return self.ledger.started(rows, now)

    def finished(
        self, token: int, *, rows: int, seconds: float | None, now: float, probe: bool = False
    ) -> None:
        """The batch ended at `now`; `seconds` is its compute time, None when it failed (a
        failure's time says nothing about t(b)); `probe`: it carried a probe request."""
        self.ledger.finished(token)
        self._last_batch_at = now
        if seconds is not None:
            self.timing.observe(rows, seconds, fresh=probe)

    def finish_time(
        self,
        *,
        queued_rows: int,
        rows: int,
        max_batch_size: int,
        now: float,
        others: Iterable[int] = (),
        alone: Iterable[int] = (),
    ) -> float | None:
        """`predicted_finish` from this server's measurements (the lateness margin is the
        caller's to add: it also records the prediction without it)."""
        return predicted_finish(
            timing=self.timing,
            ledger=self.ledger,
            queued_rows=queued_rows,
            rows=rows,
            max_batch_size=max_batch_size,
            now=now,
            others=others,
            alone=alone,
        )
