"""Writes the shipped traces (`python examples/traces/make_traces.py`): seeded, so reproducible.

Each file is `t_seconds,rate_rps`, one row per change of rate; the last row ends the trace.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def write(name: str, rows: list[tuple[float, float]], comment: str) -> None:
    lines = [f"# {line}" for line in comment.strip().splitlines()]
    lines.append("t_seconds,rate_rps")
    lines += [f"{t:g},{r:.1f}" for t, r in rows]
    (HERE / f"{name}.csv").write_text("\n".join(lines) + "\n")


def textbook() -> None:
    write(
        "textbook",
        [(0, 300.0), (3600, 300.0)],
        """The textbook case: ResNet-50 on one A10, SLA P99 < 100 ms, 300 rps for an hour.
Start it at batch 1 on one replica (which overloads: 266 rps at most at batch 1);
the autopilot must find batch ~8 on one replica (410 rps at most) by itself.""",
    )


def diurnal() -> None:
    """A day's shape compressed into 4 hours (so its ramps are 6x steeper than a real day's):
    a night trough, a morning ramp, a lunch dip, an evening peak, minute by minute, with 3 %
    multiplicative noise."""
    rng = np.random.default_rng(20240601)
    rows = []
    minutes = 240
    for m in range(minutes):
        hour = (3 + m / minutes * 24) % 24  # the hour of the compressed day, from 03:00
        base = 0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4) / 24)  # trough at 04:00
        evening = math.exp(-(((hour - 20) / 2.5) ** 2))
        lunch = -0.15 * math.exp(-(((hour - 13) / 1.0) ** 2))
        shape = 0.08 + 0.75 * base + 0.35 * evening + lunch
        rate = 1400 * shape / 1.1 * (1 + 0.03 * rng.standard_normal())
        rows.append((m * 60.0, max(20.0, rate)))
    rows.append((minutes * 60.0, rows[-1][1]))
    write(
        "diurnal",
        rows,
        """Diurnal: a day's traffic compressed into 4 hours (ramps 6x steeper than a real day's),
one row a minute from 03:00: night trough ~100 rps, morning ramp, lunch dip, evening peak
~1350 rps, back down. 3 % noise. Made by make_traces.py (seeded).""",
    )


def step() -> None:
    levels = [200, 260, 350, 450, 600, 800, 600, 450, 300]
    rows = [(i * 1200.0, float(r)) for i, r in enumerate(levels)]
    rows.append((len(levels) * 1200.0, float(levels[-1])))
    write(
        "step",
        rows,
        """Step: 3 hours of flat levels joined by sudden steps every 20 minutes, up by 1.3x at a
time to 800 rps, then down: 200 → 260 → 350 → 450 → 600 → 800 → 600 → 450 → 300 rps.
Each step arrives faster than a replica can start (30 s).""",
    )


SPIKE = (1.2, 1.5)
"""Spikes multiply the base by this much (uniform)."""
SPIKES_PER_HOUR = 8.0
JITTER = 0.05
"""Lognormal sigma of the rate's jumps every 10-60 s."""


def bursty() -> None:
    """A drifting base whose rate jumps every 10-60 s (lognormal, 5 %), with spikes of
    1.2-1.5x lasting 10-45 s about eight times an hour."""
    rng = np.random.default_rng(11)
    duration = 2 * 3600
    rows: list[tuple[float, float]] = []
    spikes: list[tuple[float, float, float]] = []
    t = 0.0
    for _ in range(1000):  # bounded: at most 1000 spikes
        t += rng.exponential(3600 / SPIKES_PER_HOUR)
        if t >= duration - 60:
            break
        factor = float(rng.uniform(*SPIKE))
        spikes.append((round(t), round(t + rng.uniform(10, 45)), factor))
    t = 0.0
    for _ in range(100_000):  # bounded: one row per 10-60 s
        if t >= duration:
            break
        base = 450 + 150 * math.sin(2 * math.pi * t / 5400) if t >= 300 else 150 + t
        factor = max((f for s, e, f in spikes if s <= t < e), default=1.0)
        rows.append((t, base * factor * math.exp(JITTER * rng.standard_normal())))
        t = float(round(t + rng.uniform(10, 60)))
        nxt = min((s for s, _, _ in spikes if s > rows[-1][0]), default=math.inf)
        t = min(t, nxt)  # a spike starts on its own row
    rows.append((float(duration), rows[-1][1]))
    write(
        "bursty",
        rows,
        f"""Bursty: 2 hours; after a 5-minute ramp, a base drifting between 300 and 600 rps whose
rate jumps every 10-60 s (lognormal, 5 %), and {len(spikes)} spikes of 1.2-1.5x lasting 10-45 s
(about eight an hour), shorter than a replica takes to start. Made by make_traces.py (seeded).""",
    )


if __name__ == "__main__":
    textbook()
    diurnal()
    step()
    bursty()
