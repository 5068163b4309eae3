"""One picture of a simulation: offered rate, P99 against the SLA, replicas and batch limit.

matplotlib is imported here and only here, when a plot is asked for: the simulator itself needs
none of it (batchpilot-tools' `plot` extra installs it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from batchpilot.simulation.report import SimulationResult

COLORS = {
    "autopilot": "tab:blue",
    "oracle": "tab:green",
    "reactive": "tab:purple",
    "hpa": "tab:orange",
    "static": "tab:gray",
}


def plot(results: Sequence[SimulationResult], path: str | Path) -> None:
    """Write a PNG with four panels sharing the time axis, one line per simulation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("--plot needs matplotlib: pip install 'batchpilot-tools[plot]'") from exc

    if not results:
        raise ValueError("nothing to plot")
    first = results[0]
    hours = first.duration_s >= 3 * 3600
    scale, unit = (3600.0, "h") if hours else (60.0, "min")
    fig, (rate_ax, p99_ax, rep_ax, batch_ax) = plt.subplots(
        4, 1, figsize=(12, 10), sharex=True, gridspec_kw={"height_ratios": [1.1, 1.3, 1, 0.8]}
    )
    times = [r.t / scale for r in first.intervals]
    rate_ax.step(times, [r.offered_rps for r in first.intervals], where="post", color="black", lw=1)
    for result in results:
        rate_ax.step(
            [r.t / scale for r in result.intervals],
            [r.served_rps for r in result.intervals],
            where="post",
            color=COLORS.get(result.policy),
            lw=0.6,
            alpha=0.6,
        )
    rate_ax.set_ylabel("offered (black) / served rps")
    sla_ms = first.sla_s * 1e3
    ceiling = sla_ms * 4
    for result in results:
        color = COLORS.get(result.policy)
        t = [r.t / scale for r in result.intervals]
        p99 = [
            min(ceiling, r.p99_s * 1e3) if not math.isnan(r.p99_s) else math.nan
            for r in result.intervals
        ]
        s = result.summary
        label = (
            f"{result.policy}: {s.interval_attainment:.1%} intervals, "
            f"{s.gpu_seconds / 3600:.1f} GPU-h"
        )
        p99_ax.step(t, p99, where="post", color=color, lw=0.9, label=label)
        rep_ax.step(t, [r.billed for r in result.intervals], where="post", color=color, lw=1.2)
        batch_ax.step(
            t, [r.batch_size for r in result.intervals], where="post", color=color, lw=1.2
        )
    p99_ax.axhline(sla_ms, color="red", ls="--", lw=1, label=f"SLA {sla_ms:.0f} ms")
    p99_ax.set_ylim(0, ceiling * 1.02)
    p99_ax.set_ylabel("P99 per interval (ms)")
    p99_ax.legend(loc="upper right", fontsize=8)
    rep_ax.set_ylabel("replicas (paid)")
    rep_ax.set_ylim(bottom=0)
    batch_ax.set_ylabel("batch limit")
    batch_ax.set_yscale("log", base=2)
    batch_ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    batch_ax.set_xlabel(f"time ({unit})")
    fig.suptitle(f"{first.trace} — {first.service}, SLA P99 < {sla_ms:.0f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
