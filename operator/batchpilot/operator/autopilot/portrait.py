"""The textbook performance portrait of one service: each signal against its healthy range, and
the next tuning step.

Healthy ranges (the textbook view batchpilot is built on): GPU busy 70-95 %, GPU memory 60-90 %,
GPU memory bandwidth 50-80 %, CPU under 70 % (above that, pre- and post-processing are the
bottleneck). The tuning order: fix the latency SLA first; then look at utilization; then tune
batching; then replicas.

Pure: numbers in, lines and a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Signals:
    qps: float | None
    p99_s: float | None
    sla_s: float
    gpu_util: float | None
    """Device busy fraction, 0-1."""
    gpu_band: tuple[float, float]
    """The service's healthy utilization band, 0-1 (from its SLA spec)."""
    gpu_memory: float | None
    """Used / total GPU memory, 0-1 (NVML); None without a GPU."""
    memory_bandwidth: float | None
    """No source yet: NVML does not report it; DCGM's DCGM_FI_PROF_DRAM_ACTIVE would."""
    cpu_util: float | None
    """Process CPU seconds per second over the cores it may use, 0-1."""
    batch_size: float | None
    """Mean rows per batch."""
    rows_per_request: float | None = None
    """Rows a request brings (clients that batch on their side send more than one)."""
    outside_s: float | None = None
    """Mean seconds a request spends outside the batcher: decoding, pre- and post-processing,
    encoding. No batch size or replica count moves it."""
    batch_limit: float | None = None
    """The batch limit in force (the largest of the replicas')."""
    burst_size: float | None = None
    """The largest batch a backlog may run (the burst size; the limit where none is set)."""


OUTSIDE_SHARE = 0.5
"""Above this share of the SLA spent outside the batcher, the batcher has too little left:
batching and replicas can only work in the rest."""


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    value: str
    healthy: str
    status: str
    """ok | low | high | over SLA | no data."""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"


def _band(value: float | None, low: float, high: float) -> str:
    if value is None:
        return "no data"
    if value < low:
        return "low"
    if value > high:
        return "high"
    return "ok"


def _limits(s: Signals) -> str:
    """The batch limit, and the burst size where a backlog may run larger batches."""
    if s.batch_limit is None:
        return "-"
    text = f"limit {s.batch_limit:.0f}"
    if s.burst_size is not None and s.burst_size > s.batch_limit:
        text += f", a backlog up to {s.burst_size:.0f}"
    return text


def rows(s: Signals) -> list[Row]:
    low, high = s.gpu_band
    p99_status = "no data" if s.p99_s is None else ("ok" if s.p99_s <= s.sla_s else "over SLA")
    return [
        Row("QPS", "-" if s.qps is None else f"{s.qps:.0f}", "-", "ok" if s.qps else "no data"),
        Row(
            "P99 latency",
            "-" if s.p99_s is None else f"{s.p99_s * 1e3:.0f} ms",
            f"< {s.sla_s * 1e3:.0f} ms (SLA)",
            p99_status,
        ),
        Row(
            "GPU utilization",
            _pct(s.gpu_util),
            f"{low:.0%}-{high:.0%}",
            _band(s.gpu_util, low, high),
        ),
        Row("GPU memory", _pct(s.gpu_memory), "60%-90%", _band(s.gpu_memory, 0.6, 0.9)),
        Row(
            "GPU memory bandwidth",
            _pct(s.memory_bandwidth),
            "50%-80%",
            _band(s.memory_bandwidth, 0.5, 0.8) if s.memory_bandwidth is not None else "no source",
        ),
        Row("CPU utilization", _pct(s.cpu_util), "< 70%", _band(s.cpu_util, 0.0, 0.7)),
        Row("batch size", "-" if s.batch_size is None else f"{s.batch_size:.1f}", _limits(s), "-"),
        Row(
            "rows per request",
            "-" if s.rows_per_request is None else f"{s.rows_per_request:.1f}",
            "-",
            "-",
        ),
        Row(
            "outside the batcher",
            "-" if s.outside_s is None else f"{s.outside_s * 1e3:.0f} ms",
            f"< {OUTSIDE_SHARE * s.sla_s * 1e3:.0f} ms (half the SLA)",
            _band(s.outside_s, 0.0, OUTSIDE_SHARE * s.sla_s),
        ),
    ]


def verdict(s: Signals) -> str:
    """The next tuning step, in the textbook's order: SLA, utilization, batching, replicas."""
    low, high = s.gpu_band
    if s.qps is None or (s.p99_s is None and s.qps):
        return "no metrics for this service in Prometheus: is the runtime being scraped?"
    if not s.qps:
        return "no traffic in the window: nothing to tune"
    assert s.p99_s is not None
    cpu_bound = s.cpu_util is not None and s.cpu_util > 0.7
    outside_heavy = s.outside_s is not None and s.outside_s > OUTSIDE_SHARE * s.sla_s
    if s.p99_s > s.sla_s:
        if outside_heavy:
            assert s.outside_s is not None
            return (
                f"P99 over the SLA with {s.outside_s * 1e3:.0f} ms of every request spent outside "
                "the batcher (decoding, pre/post-processing), over half the SLA: make that "
                "faster or relax the SLA; batch size and replicas only move the rest"
            )
        if cpu_bound:
            return (
                "P99 over the SLA and the CPU above 70 %: pre/post-processing is the bottleneck; "
                "give replicas more CPU or move processing off the request path"
            )
        if s.gpu_util is not None and s.gpu_util >= high:
            return "P99 over the SLA with the GPU saturated: add replicas"
        return (
            "P99 over the SLA with GPU capacity left: requests wait in the queue; raise the "
            "batch size so each pass carries more of them"
        )
    if cpu_bound:
        return (
            "inside the SLA, but the CPU is above 70 %: the next load increase hits the CPU first"
        )
    if s.gpu_util is not None and s.gpu_util < low:
        if s.p99_s < 0.7 * s.sla_s:
            return "GPU under-used, P99 has headroom: raise the batch size (or remove a replica)"
        if s.outside_s is not None:
            return (
                f"GPU under-used but P99 is near the SLA: {s.outside_s * 1e3:.0f} ms of it is "
                "spent outside the device (decoding, pre/post-processing); make that faster, "
                "batching cannot"
            )
        return "GPU under-used but P99 is near the SLA: latency is spent outside the device"
    if s.gpu_util is not None and s.gpu_util > high:
        return "GPU saturated while inside the SLA: add a replica before the load grows"
    if s.gpu_memory is not None and s.gpu_memory > 0.9:
        return "healthy, but GPU memory is nearly full: larger batches may not fit"
    return "healthy: inside the SLA with the GPU in its band"


def render(name: str, s: Signals) -> str:
    table = rows(s)
    header = ("signal", "value", "healthy range", "status")
    widths = [
        max(len(title), *(len(getattr(r, f)) for r in table))
        for title, f in zip(header, ("name", "value", "healthy"), strict=False)
    ]
    lines = [f"performance portrait of {name}", ""]
    lines.append(
        f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  {header[2]:<{widths[2]}}  {header[3]}"
    )
    for r in table:
        lines.append(
            f"{r.name:<{widths[0]}}  {r.value:>{widths[1]}}  {r.healthy:<{widths[2]}}  {r.status}"
        )
    lines += ["", f"next step: {verdict(s)}"]
    return "\n".join(lines)
