"""The sandbox's picture of a run: rate, P99 against the SLA, replicas and batch size over time.

Offered/served rate and the client P99 come from the load generator's per-second windows (the
honest measurement); the autopilot's P99, replicas and batch size from the live view's samples.
matplotlib is imported on use (batchpilot-tools' `plot` extra; the dev extra has it too), so the
sandbox runs without it and only the plot is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchpilot.sandbox.liveview import Sample


def plot_run(
    path: Path,
    *,
    samples: Sequence[Sample],
    windows: Sequence[Mapping[str, Any]],
    load_offset_s: float,
    sla_ms: float,
    title: str,
    decision_times_s: Sequence[float] = (),
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_rate, ax_p99, ax_rep, ax_batch) = plt.subplots(
        4, 1, figsize=(10, 10), sharex=True, constrained_layout=True
    )
    wt = [load_offset_s + float(w["start_s"]) for w in windows]
    ax_rate.plot(wt, [w["offered_rps"] for w in windows], label="offered (loadgen)", color="0.5")
    ax_rate.plot(wt, [w["served_rps"] for w in windows], label="served (loadgen)", color="C0")
    ax_rate.set_ylabel("requests/s")
    ax_rate.legend(loc="upper left")

    p99 = [w["p99_ms"] for w in windows]
    ax_p99.plot(wt, [float("nan") if v is None else v for v in p99], label="P99 client, 1 s window")
    st = [s.t_s for s in samples]
    ax_p99.plot(
        st,
        [float("nan") if s.pilot_p99_ms is None else s.pilot_p99_ms for s in samples],
        label="P99 the autopilot sees (Prometheus window)",
        color="C2",
    )
    ax_p99.axhline(sla_ms, color="C3", linestyle="--", label=f"SLA {sla_ms:g} ms")
    ax_p99.set_yscale("log")
    ax_p99.set_ylabel("P99 ms")
    ax_p99.legend(loc="upper left")

    ax_rep.step(st, [s.desired for s in samples], where="post", label="desired")
    ax_rep.step(st, [s.ready for s in samples], where="post", label="ready")
    ax_rep.set_ylabel("replicas")
    ax_rep.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_batch.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_rep.legend(loc="upper left")

    ax_batch.step(st, [s.batch or 0 for s in samples], where="post", color="C4")
    ax_batch.set_ylabel("batch size")
    ax_batch.set_xlabel("seconds since the sandbox started")
    for t in decision_times_s:
        for ax in (ax_p99, ax_rep, ax_batch):
            ax.axvline(t, color="0.8", linewidth=0.8, zorder=0)
    fig.suptitle(f"{title}  (grey lines: autopilot decisions)" if decision_times_s else title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
