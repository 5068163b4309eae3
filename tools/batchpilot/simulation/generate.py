"""Traffic-trace generators: one seeded, pure function per kind of traffic the autopilot must face.

Why a module and not only a script: a policy tuned on the shipped traces has to be judged on
traces it has never seen, so every trace must come back from (kind, seed, parameters) alone —
written by `examples/traces/make_traces.py`, simulated by `batchpilot simulate --trace-gen
onoff:7`, checked by tests. Nothing here reads a clock or a file; `write_csv` is the one writer.

Every generator is `kind(seed, *, duration_s, base_rps, …) -> rows`: `(t_seconds, rate_rps)`
pairs, one per change of rate, from t = 0; the last row ends the trace (its rate is not used),
exactly as in the CSV. The kinds:

- `textbook`, `diurnal`, `step`, `bursty` — the four shipped since the simulator's first day
  (their defaults rewrite the shipped files byte for byte);
- `onoff` — minute-scale on/off bursts from a low or zero base: the autopilot's hardest case;
- `flash` — a flash crowd (5–8x within seconds, held for minutes, decaying), once or twice;
- `ramp` — a steady linear ramp 1 → 6x over 30 minutes and back;
- `realistic` — a smooth production-like day in 2 hours with correlated (AR(1)) noise;
- `steps6` — one 6x step up and, later, one down;
- `daily` — several compressed days alike but not equal: the same scheduled job (a 6x step for
  10 minutes) at about the same time every day, unscheduled flash crowds on some days — the
  traffic a seasonal forecast is for; `scheduled=0` moves the job to a random time each day, the
  same traffic without the pattern;
- `regimes`, `walk`, `sawtooth`, `spikes` — shapes none of the above has, for judging the
  autopilot on traffic it was not tuned on: levels switching at no rhythm (a Markov-modulated
  rate), a geometric random walk, a rise that never settles with a drop every period, and
  heavy-tailed spikes.

The newer kinds take `amplitude` (how many times `base_rps` the traffic peaks at) and round times
to whole seconds and rates to 0.1 rps, so a generated trace equals its CSV exactly.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Rows = list[tuple[float, float]]
"""`(t_seconds, rate_rps)`, one row per change of rate; the last row ends the trace."""


# --- the four shipped first -------------------------------------------------------------------


def textbook(seed: int, *, duration_s: float = 3600.0, base_rps: float = 300.0) -> Rows:
    """Flat: `base_rps` for `duration_s`. Nothing random: `seed` is not used."""
    del seed
    return [(0.0, float(base_rps)), (float(duration_s), float(base_rps))]


def diurnal(seed: int, *, duration_s: float = 4 * 3600.0, peak_rps: float = 1400.0) -> Rows:
    """A day's shape compressed into `duration_s` (4 hours: ramps 6x steeper than a real day's):
    a night trough, a morning ramp, a lunch dip, an evening peak, minute by minute, with 3 %
    multiplicative noise. `peak_rps` is nominal: the evening reaches about 0.96 of it."""
    rng = np.random.default_rng(seed)
    rows: Rows = []
    minutes = round(duration_s / 60)
    for m in range(minutes):
        hour = (3 + m / minutes * 24) % 24  # the hour of the compressed day, from 03:00
        base = 0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4) / 24)  # trough at 04:00
        evening = math.exp(-(((hour - 20) / 2.5) ** 2))
        lunch = -0.15 * math.exp(-(((hour - 13) / 1.0) ** 2))
        shape = 0.08 + 0.75 * base + 0.35 * evening + lunch
        rate = peak_rps * shape / 1.1 * (1 + 0.03 * rng.standard_normal())
        rows.append((m * 60.0, max(20.0, rate)))
    rows.append((minutes * 60.0, rows[-1][1]))
    return rows


STEP_LEVELS = (1.0, 1.3, 1.75, 2.25, 3.0, 4.0, 3.0, 2.25, 1.5)
"""`step`'s levels, times `base_rps`: up by about 1.3x at a time, then down."""


def step(seed: int, *, duration_s: float = 3 * 3600.0, base_rps: float = 200.0) -> Rows:
    """Flat levels joined by sudden steps (`STEP_LEVELS`), each held a ninth of `duration_s`.
    Nothing random: `seed` is not used."""
    del seed
    held = duration_s / len(STEP_LEVELS)
    rows = [(i * held, base_rps * level) for i, level in enumerate(STEP_LEVELS)]
    rows.append((len(STEP_LEVELS) * held, rows[-1][1]))
    return rows


SPIKE = (1.2, 1.5)
"""`bursty`'s spikes multiply the base by this much (uniform)."""
SPIKES_PER_HOUR = 8.0
JITTER = 0.05
"""Lognormal sigma of `bursty`'s jumps every 10-60 s."""


def _bursty_spikes(rng: np.random.Generator, duration_s: float) -> list[tuple[float, float, float]]:
    spikes: list[tuple[float, float, float]] = []
    t = 0.0
    for _ in range(1000):  # bounded: at most 1000 spikes
        t += rng.exponential(3600 / SPIKES_PER_HOUR)
        if t >= duration_s - 60:
            break
        factor = float(rng.uniform(*SPIKE))
        spikes.append((round(t), round(t + rng.uniform(10, 45)), factor))
    return spikes


def bursty_spikes(seed: int, *, duration_s: float = 2 * 3600.0) -> int:
    """How many spikes `bursty(seed, duration_s=…)` has (for its description)."""
    return len(_bursty_spikes(np.random.default_rng(seed), duration_s))


def bursty(seed: int, *, duration_s: float = 2 * 3600.0, base_rps: float = 450.0) -> Rows:
    """After a 5-minute ramp from a third of `base_rps`, a base drifting ±1/3 around it (a 90-minute
    sine) whose rate jumps every 10-60 s (lognormal, 5 %), with spikes of 1.2-1.5x lasting 10-45 s
    about eight times an hour."""
    rng = np.random.default_rng(seed)
    spikes = _bursty_spikes(rng, duration_s)
    rows: Rows = []
    t = 0.0
    for _ in range(100_000):  # bounded: one row per 10-60 s
        if t >= duration_s:
            break
        if t >= 300:
            base = base_rps + base_rps / 3 * math.sin(2 * math.pi * t / 5400)
        else:
            base = base_rps / 3 + t * (2 * base_rps / 3) / 300
        factor = max((f for s, e, f in spikes if s <= t < e), default=1.0)
        rows.append((t, base * factor * math.exp(JITTER * rng.standard_normal())))
        t = float(round(t + rng.uniform(10, 60)))
        nxt = min((s for s, _, _ in spikes if s > rows[-1][0]), default=math.inf)
        t = min(t, nxt)  # a spike starts on its own row
    rows.append((float(duration_s), rows[-1][1]))
    return rows


# --- the kinds the autopilot is weakest on ----------------------------------------------------


class _Rows:
    """Rows built forward in time, whole seconds and 0.1 rps, cut at the trace's end."""

    def __init__(self, duration_s: float) -> None:
        self.end = float(round(duration_s))
        if self.end < 60:
            raise ValueError("a generated trace lasts at least 60 s")
        self.rows: Rows = []

    def add(self, t: float, rate: float) -> None:
        t, rate = float(round(t)), round(max(0.0, rate), 1)
        if t >= self.end:
            return
        if self.rows and t <= self.rows[-1][0]:
            self.rows[-1] = (self.rows[-1][0], rate)  # same second: the later rate wins
        else:
            self.rows.append((t, rate))

    def done(self) -> Rows:
        return [*self.rows, (self.end, self.rows[-1][1])]


def _noisy(rng: np.random.Generator, level: float, noise: float) -> float:
    """`level` times a uniform factor in [1 - noise, 1 + noise]: bounded, so bounds are testable."""
    return level * (1 + noise * float(rng.uniform(-1, 1)))


ONOFF_QUIET_S = (120, 900)
ONOFF_BURST_S = (60, 360)
ONOFF_ZERO_SHARE = 0.25
"""The share of quiet stretches with no traffic at all."""
ONOFF_NOISE = 0.10


def onoff(
    seed: int,
    *,
    duration_s: float = 5400.0,
    base_rps: float = 100.0,
    amplitude: float = 10.0,
) -> Rows:
    """Minute-scale on/off bursts. Quiet stretches of 2-15 minutes at `base_rps` (±10 %, a row
    every 30-90 s) — or, one in four, at nothing — alternate with bursts of 1-6 minutes at
    `amplitude`/2 to `amplitude` times `base_rps` (±10 %, a row every 10-30 s), which rise in
    4-8 s and stop at once. Starts quiet. Rates stay within [0, 1.1 · amplitude · base_rps];
    with the defaults the quiet level is about a tenth of the bursts' highest."""
    if amplitude < 1:
        raise ValueError("onoff: the amplitude is at least 1")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    t, level = 0.0, 0.0
    while t < out.end:
        quiet_end = t + int(rng.integers(ONOFF_QUIET_S[0], ONOFF_QUIET_S[1] + 1))
        silent = rng.random() < ONOFF_ZERO_SHARE
        while t < quiet_end:
            level = 0.0 if silent else _noisy(rng, base_rps, ONOFF_NOISE)
            out.add(t, level)
            t = min(quiet_end, t + int(rng.integers(30, 91)))
        burst_end = t + int(rng.integers(ONOFF_BURST_S[0], ONOFF_BURST_S[1] + 1))
        target = base_rps * float(rng.uniform(amplitude / 2, amplitude))
        rise_s = int(rng.integers(4, 9))
        for k in range(4):  # the rise, in four rows
            out.add(t + k * rise_s // 4, level + (target - level) * (k + 1) / 4)
        t += rise_s
        while t < burst_end:
            out.add(t, _noisy(rng, target, ONOFF_NOISE))
            t = min(burst_end, t + int(rng.integers(10, 31)))
    return out.done()


FLASH_RISE_S = (10, 30)
FLASH_HOLD_S = (300, 1200)
FLASH_DECAY_S = (120, 300)
FLASH_SEGMENT_S = 2200
"""Each flash crowd gets a stretch of the trace this long at least (5 min quiet either side)."""


def flash(
    seed: int,
    *,
    duration_s: float = 5400.0,
    base_rps: float = 200.0,
    amplitude: float = 8.0,
) -> Rows:
    """A flash crowd, or two (half the seeds, if the trace has room): a steady base (±3 %, a row
    every 30-90 s), then within 10-30 s a rise to 5/8 of `amplitude` to `amplitude` times
    `base_rps`, held 5-20 minutes (±10 %, a row every 10-30 s), decaying geometrically back to
    the base over 2-5 minutes (a row every 15 s). Needs at least 2200 s."""
    if duration_s < FLASH_SEGMENT_S:
        raise ValueError(f"flash: a trace with a flash crowd lasts at least {FLASH_SEGMENT_S} s")
    if amplitude < 1:
        raise ValueError("flash: the amplitude is at least 1")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    crowds = 2 if rng.random() < 0.5 and out.end >= 2 * FLASH_SEGMENT_S else 1
    segment = out.end / crowds
    t = 0.0

    def steady(until: float) -> None:
        nonlocal t
        while t < until:
            out.add(t, _noisy(rng, base_rps, 0.03))
            t = min(until, t + int(rng.integers(30, 91)))

    for i in range(crowds):
        rise = int(rng.integers(FLASH_RISE_S[0], FLASH_RISE_S[1] + 1))
        hold = int(rng.integers(FLASH_HOLD_S[0], FLASH_HOLD_S[1] + 1))
        decay = int(rng.integers(FLASH_DECAY_S[0], FLASH_DECAY_S[1] + 1))
        factor = float(rng.uniform(amplitude * 5 / 8, amplitude))
        latest = i * segment + segment - (rise + hold + decay) - 300
        steady(round(float(rng.uniform(i * segment + 300, latest))))
        steps = max(2, rise // 5)
        for k in range(steps):  # the rise, a row every ~5 s
            out.add(t + k * rise / steps, base_rps * (1 + (factor - 1) * (k + 1) / steps))
        t += rise
        hold_end = t + hold
        while t < hold_end:
            out.add(t, _noisy(rng, base_rps * factor, 0.10))
            t = min(hold_end, t + int(rng.integers(10, 31)))
        for k in range(math.ceil(decay / 15)):  # geometric decay: base · factor^(1 - τ/decay)
            out.add(t + 15 * k, base_rps * factor ** (1 - 15 * k / decay))
        t += decay
    steady(out.end)
    return out.done()


RAMP_STEP_S = 15
"""`ramp` changes its rate this often while ramping."""


def ramp(
    seed: int,
    *,
    duration_s: float = 5400.0,
    base_rps: float = 200.0,
    amplitude: float = 6.0,
    ramp_s: float = 1800.0,
) -> Rows:
    """A steady linear ramp: flat at `base_rps`, up to `amplitude` times it over `ramp_s` (a step
    every 15 s), flat at the top, down over `ramp_s`, flat again — the three flats share what
    is left of `duration_s` (10 minutes each by default). 2 % noise (a row a minute when flat)."""
    flat = (duration_s - 2 * ramp_s) / 3
    if flat < 0:
        raise ValueError("ramp: the trace must last at least twice the ramp")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    steps = max(1, round(ramp_s / RAMP_STEP_S))
    top = base_rps * amplitude

    def hold(start: float, level: float) -> None:
        for k in range(math.ceil(flat / 60)):
            out.add(start + 60 * k, _noisy(rng, level, 0.02))

    def slope(start: float, low: float, high: float) -> None:
        for k in range(steps):
            out.add(
                start + k * ramp_s / steps, _noisy(rng, low + (high - low) * (k + 1) / steps, 0.02)
            )

    hold(0, base_rps)
    slope(flat, base_rps, top)
    hold(flat + ramp_s, top)
    slope(2 * flat + ramp_s, top, base_rps)
    hold(2 * flat + 2 * ramp_s, base_rps)
    return out.done()


REALISTIC_STEP_S = 30
REALISTIC_SIGMA = 0.10
"""Stationary standard deviation of the log-rate's AR(1) noise."""
REALISTIC_TAU_S = 600.0
"""Correlation time of that noise: 10 minutes."""


def _day_shape(hour: float) -> float:
    """diurnal's day, without its floor: trough at 04:00, lunch dip, evening peak."""
    base = 0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4) / 24)
    evening = math.exp(-(((hour - 20) / 2.5) ** 2))
    lunch = -0.15 * math.exp(-(((hour - 13) / 1.0) ** 2))
    return 0.75 * base + 0.35 * evening + lunch


_DAY = [_day_shape(h / 10) for h in range(240)]
_DAY_LOW, _DAY_HIGH = min(_DAY), max(_DAY)


def realistic(
    seed: int,
    *,
    duration_s: float = 7200.0,
    base_rps: float = 150.0,
    amplitude: float = 6.0,
) -> Rows:
    """A smooth production-like day compressed into `duration_s`, from 03:00: a trough at
    `base_rps`, a peak at `amplitude` times it in the evening, a lunch dip, and an AR(1) noise on
    the log-rate (10 % deviation, 10-minute correlation) instead of jumps — nothing on/off. A
    row every 30 s."""
    if amplitude < 1:
        raise ValueError("realistic: the amplitude is at least 1")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    phi = math.exp(-REALISTIC_STEP_S / REALISTIC_TAU_S)
    innovation = REALISTIC_SIGMA * math.sqrt(1 - phi**2)
    x = REALISTIC_SIGMA * float(rng.standard_normal())
    for k in range(math.ceil(out.end / REALISTIC_STEP_S)):
        t = k * REALISTIC_STEP_S
        hour = (3 + t / out.end * 24) % 24
        shape = (_day_shape(hour) - _DAY_LOW) / (_DAY_HIGH - _DAY_LOW)
        out.add(t, base_rps * (1 + (amplitude - 1) * shape) * math.exp(x))
        x = phi * x + innovation * float(rng.standard_normal())
    return out.done()


def steps6(
    seed: int,
    *,
    duration_s: float = 3600.0,
    base_rps: float = 150.0,
    amplitude: float = 6.0,
) -> Rows:
    """One step up from `base_rps` to `amplitude` times it, 20-35 % into the trace, and one step
    back down 30-40 % of the trace later; 2 % noise, a row every 30-90 s."""
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    up = round(out.end * float(rng.uniform(0.20, 0.35)))
    down = up + round(out.end * float(rng.uniform(0.30, 0.40)))
    t = 0.0
    for until, level in ((up, base_rps), (down, base_rps * amplitude), (out.end, base_rps)):
        while t < until:
            out.add(t, _noisy(rng, level, 0.02))
            t = min(until, t + int(rng.integers(30, 91)))
    return out.done()


def pulses(
    seed: int,
    *,
    duration_s: float = 1800.0,
    base_rps: float = 550.0,
    amplitude: float = 3.0,
    period_s: float = 15.0,
    width_s: float = 1.0,
) -> Rows:
    """Pulses of `amplitude` times `base_rps`, `width_s` long, every `period_s` (the seed picks
    their phase, and 2 % noise on each level): load whose spikes recur within every metrics
    window yet show in no rate averaged over seconds. The defaults, on the textbook's service,
    put one pulse in every 15 s interval at 4.5 times what a replica carries."""
    return _periodic(seed, duration_s, base_rps, amplitude, period_s, width_s)


def _periodic(
    seed: int, duration_s: float, base_rps: float, amplitude: float, period_s: float, width_s: float
) -> Rows:
    """`amplitude` times `base_rps` for `width_s` of every `period_s` from a phase the seed
    draws, `base_rps` the rest, 2 % noise on each level."""
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    t = float(rng.uniform(0, period_s))
    out.add(0.0, _noisy(rng, base_rps, 0.02))
    while t < out.end:
        out.add(round(t, 3), _noisy(rng, base_rps * amplitude, 0.02))
        out.add(round(min(t + width_s, out.end), 3), _noisy(rng, base_rps, 0.02))
        t += period_s
    return out.done()


def square(
    seed: int,
    *,
    duration_s: float = 1800.0,
    base_rps: float = 220.0,
    amplitude: float = 10.0,
    period_s: float = 20.0,
    width_s: float = 10.0,
) -> Rows:
    """A square wave: `amplitude` times `base_rps` for `width_s` of every `period_s`, `base_rps`
    the rest (the seed picks the phase, and 2 % noise on each level). Its minute's mean is about
    the middle of the two, which carries neither: nine requests in ten come in the busy half,
    at nearly twice the mean. The defaults, on the textbook's service, need six replicas in the
    busy half and one in the quiet one."""
    if not 0 < width_s < period_s:
        raise ValueError("square: the busy part is shorter than the period")
    return _periodic(seed, duration_s, base_rps, amplitude, period_s, width_s)


DAILY_JOB_PHASE = 0.30
"""The scheduled job starts this far into each day (± `DAILY_JOB_JITTER_S`)."""
DAILY_JOB_JITTER_S = 120
DAILY_JOB_S = 600
DAILY_LEVEL_SPREAD = 0.10
"""Each day's level within ±10 % of the others'."""


def daily(
    seed: int,
    *,
    duration_s: float = 4 * 7200.0,
    period_s: float = 7200.0,
    base_rps: float = 150.0,
    amplitude: float = 6.0,
    scheduled: float = 1,
) -> Rows:
    """Days of `period_s` each (4 by default) until `duration_s`, alike but not equal — the
    traffic a daily forecast is for. Each day: `realistic`'s shape from `base_rps` to half of
    `amplitude` times it, with its AR(1) noise and its own level (±10 %); the same scheduled job
    every day, adding `amplitude` − 1 times `base_rps` at once, 30 % into the day (± 2 minutes),
    for 10 minutes; and on about half the days an unscheduled flash crowd (4x `base_rps` more,
    at once, for 5 minutes) at a random time away from the job. `scheduled=0`: the job runs at
    a random time each day instead — the same traffic, no pattern. A row every 30 s and at every
    edge."""
    if amplitude < 2:
        raise ValueError("daily: the amplitude is at least 2")
    if period_s < 1800:
        raise ValueError("daily: a period lasts at least 30 minutes")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    days = math.ceil(out.end / period_s)
    phi = math.exp(-REALISTIC_STEP_S / REALISTIC_TAU_S)
    innovation = REALISTIC_SIGMA * math.sqrt(1 - phi**2)
    x = REALISTIC_SIGMA * float(rng.standard_normal())
    extras: list[tuple[float, float, float]] = []  # (start, end, added rps)
    levels = []
    for day in range(days):
        start = day * period_s
        levels.append(1 + DAILY_LEVEL_SPREAD * float(rng.uniform(-1, 1)))
        phase = DAILY_JOB_PHASE if scheduled else float(rng.uniform(0.05, 0.85))
        jitter = float(rng.integers(-DAILY_JOB_JITTER_S, DAILY_JOB_JITTER_S + 1))
        job = start + phase * period_s + jitter
        extras.append((job, job + DAILY_JOB_S, (amplitude - 1) * base_rps))
        if rng.uniform() < 0.5:
            # Away from the job (as far as a short day allows): a flash is not the job's pattern.
            apart = min(2 * DAILY_JOB_S, period_s / 4)
            flashes = start + rng.uniform(0.05, 0.9, size=64) * period_s
            away = flashes[np.abs(flashes - job) > apart]
            if away.size:
                extras.append((float(away[0]), float(away[0]) + 300.0, 4 * base_rps))
    edges = sorted({e for lo, hi, _ in extras for e in (lo, hi)})
    times = sorted(set(np.arange(0.0, out.end, REALISTIC_STEP_S).tolist()) | set(edges))
    noise_at = -1.0
    for t in times:
        while noise_at + REALISTIC_STEP_S <= t:
            noise_at += REALISTIC_STEP_S
            x = phi * x + innovation * float(rng.standard_normal())
        day = min(days - 1, int(t // period_s))
        hour = (3 + (t - day * period_s) / period_s * 24) % 24
        shape = (_day_shape(hour) - _DAY_LOW) / (_DAY_HIGH - _DAY_LOW)
        smooth = base_rps * (1 + (amplitude / 2 - 1) * shape) * math.exp(x) * levels[day]
        added = sum(extra for lo, hi, extra in extras if lo <= t < hi)
        out.add(t, smooth + added)
    return out.done()


# --- shapes no kind above has: for judging on traffic the autopilot was not tuned on -------------


REGIME_MEAN_S = 240.0
"""The mean time a regime of `regimes` holds (exponential), each at least `REGIME_MIN_S`."""
REGIME_MIN_S = 20


def regimes(
    seed: int,
    *,
    duration_s: float = 3600.0,
    base_rps: float = 400.0,
    amplitude: float = 3.0,
) -> Rows:
    """Regime switching (a Markov-modulated Poisson process's rate): levels drawn log-uniformly
    between `base_rps` / `amplitude` and `base_rps` · `amplitude`, each held an exponential time
    of mean 4 minutes (at least 20 s), the next independent of the last — steps up and down of
    any size, at no rhythm a history could learn."""
    if amplitude < 1:
        raise ValueError("regimes: the amplitude is at least 1")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    low, high = math.log(base_rps / amplitude), math.log(base_rps * amplitude)
    t = 0.0
    while t < out.end:
        out.add(t, math.exp(float(rng.uniform(low, high))))
        t += REGIME_MIN_S + int(rng.exponential(REGIME_MEAN_S))
    return out.done()


WALK_STEP_S = 10
WALK_SIGMA = 0.05
"""The log-rate's step every `WALK_STEP_S`: normal, this standard deviation."""


def walk(
    seed: int,
    *,
    duration_s: float = 3600.0,
    base_rps: float = 400.0,
    amplitude: float = 5.0,
) -> Rows:
    """A geometric random walk: from `base_rps`, every 10 s the log-rate takes a normal step of
    standard deviation 0.05 (±5 % a step; over an hour the typical drift is a factor of about
    2.6 either way), reflected within `base_rps` / `amplitude` and `base_rps` · `amplitude` — a
    load with no level to return to."""
    if amplitude < 1:
        raise ValueError("walk: the amplitude is at least 1")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    low, high = math.log(base_rps / amplitude), math.log(base_rps * amplitude)
    x = math.log(base_rps)
    for t in range(0, int(out.end), WALK_STEP_S):
        out.add(t, math.exp(x))
        x += float(rng.normal(0.0, WALK_SIGMA))
        if x > high:
            x = 2 * high - x
        if x < low:
            x = 2 * low - x
    return out.done()


def sawtooth(
    seed: int,
    *,
    duration_s: float = 3600.0,
    base_rps: float = 200.0,
    amplitude: float = 5.0,
    period_s: float = 300.0,
) -> Rows:
    """A sawtooth: a linear rise from `base_rps` to `amplitude` times it over each period (a row
    every 5 s), then a drop to the base at once; the seed picks the phase. A rise that never
    settles and a fall that comes at once, every period."""
    if amplitude < 1:
        raise ValueError("sawtooth: the amplitude is at least 1")
    if period_s < 30:
        raise ValueError("sawtooth: the period is at least 30 s")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    phase = float(rng.uniform(0, period_s))
    for t in range(0, int(out.end), 5):
        into = ((t + phase) % period_s) / period_s
        out.add(t, base_rps * (1 + (amplitude - 1) * into))
    return out.done()


SPIKE_WIDTH_S = (5, 60)
SPIKE_GAP_MEAN_S = 150.0
SPIKE_SHAPE = 1.5
"""The Pareto shape of the spikes' heights above the base: heavy-tailed, most small, a few huge."""


def spikes(
    seed: int,
    *,
    duration_s: float = 3600.0,
    base_rps: float = 300.0,
    amplitude: float = 6.0,
) -> Rows:
    """Heavy-tailed spikes on a flat base: after the first minute, spikes 5-60 s wide, gaps of an
    exponential time (mean 150 s, at least 10 s), each `base_rps` times 1 + a Pareto(1.5) draw,
    at most `amplitude` — most spikes small, a few as high as the amplitude, unrelated in height
    to the ones before them."""
    if amplitude < 1:
        raise ValueError("spikes: the amplitude is at least 1")
    rng = np.random.default_rng(seed)
    out = _Rows(duration_s)
    out.add(0, base_rps)
    t = 60.0
    while t < out.end:
        height = min(amplitude, 1 + float(rng.pareto(SPIKE_SHAPE)))
        width = int(rng.integers(SPIKE_WIDTH_S[0], SPIKE_WIDTH_S[1] + 1))
        out.add(t, base_rps * height)
        out.add(t + width, base_rps)
        t += width + 10 + int(rng.exponential(SPIKE_GAP_MEAN_S))
    return out.done()


# --- the catalogue and the writer -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Kind:
    make: Callable[..., Rows]
    seed: int
    """The seed of the shipped file (or the default one)."""
    summary: str

    @property
    def parameters(self) -> tuple[str, ...]:
        """The keyword parameters `make` takes besides the seed."""
        return tuple(inspect.signature(self.make).parameters)[1:]


KINDS: dict[str, Kind] = {
    "textbook": Kind(textbook, 0, "flat"),
    "diurnal": Kind(diurnal, 20240601, "a day's shape compressed, a row a minute"),
    "step": Kind(step, 0, "flat levels joined by sudden steps of about 1.3x"),
    "bursty": Kind(bursty, 11, "a drifting base with 10-45 s spikes of 1.2-1.5x"),
    "onoff": Kind(onoff, 1, "minute-scale on/off bursts from a low or zero base"),
    "flash": Kind(flash, 2, "a flash crowd or two: up within 10-30 s, held 5-20 min, decaying"),
    "ramp": Kind(ramp, 3, "a linear ramp up over 30 minutes and back"),
    "realistic": Kind(realistic, 4, "a production-like day, AR(1) noise on the log-rate"),
    "steps6": Kind(steps6, 5, "one step up, and later one down"),
    "daily": Kind(daily, 6, "compressed days alike: a scheduled job at the same time each day"),
    "pulses": Kind(pulses, 7, "second-long pulses of 3x recurring every 15 s"),
    "square": Kind(square, 8, "a square wave: 10x for 10 s of every 20 s"),
    "regimes": Kind(regimes, 9, "regime switching: levels of 1/3-3x held ~4 min, no rhythm"),
    "walk": Kind(walk, 10, "a geometric random walk, ±5 % every 10 s, within 1/5-5x"),
    "sawtooth": Kind(sawtooth, 11, "a linear rise 1 → 5x over 5 minutes, then a drop, again"),
    "spikes": Kind(spikes, 12, "heavy-tailed spikes of 5-60 s, Pareto heights up to 6x"),
}


def generate(name: str, seed: int | None = None, **parameters: float) -> Rows:
    """The rows of kind `name` (its default seed if None), with the parameters given."""
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown trace kind {name!r}; choose from {', '.join(KINDS)}")
    unknown = sorted(set(parameters) - set(kind.parameters))
    if unknown:
        raise ValueError(
            f"{name} takes no {', '.join(unknown)}; it takes {', '.join(kind.parameters)}"
        )
    return kind.make(kind.seed if seed is None else seed, **parameters)


def describe(name: str, seed: int, rows: Rows, parameters: dict[str, float] | None = None) -> str:
    """One line on what a generated trace is (kind, seed, parameters not left at their
    defaults) and what its numbers are."""
    given = "".join(f", {key} {value:g}" for key, value in (parameters or {}).items())
    duration = rows[-1][0]
    spans = [(b[0] - a[0], a[1]) for a, b in itertools.pairwise(rows)]
    mean = sum(span * rate for span, rate in spans) / duration
    rates = [rate for _, rate in rows[:-1]]
    return (
        f"{name}, seed {seed}{given}: {KINDS[name].summary}. {duration:.10g} s, {len(rows)} rows, "
        f"{min(rates):.0f}-{max(rates):.0f} rps, mean {mean:.0f} rps."
    )


def csv_text(rows: Rows, comment: str) -> str:
    """The trace CSV: `comment` as `#` lines, the header, one `t,rate` row per change."""
    lines = [f"# {line}" for line in comment.strip().splitlines()]
    lines.append("t_seconds,rate_rps")
    lines += [f"{t:.10g},{r:.1f}" for t, r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: str | Path, rows: Rows, comment: str) -> None:
    Path(path).write_text(csv_text(rows, comment))
