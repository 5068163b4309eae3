"""Reports as tables for a terminal; the JSON form is the reports' own `to_dict`.

Kept apart from the runs so that formatting never touches what is measured. An invalid run is
flagged first and last, so that neither a glance at the top nor at the end of a long window
table takes it for a result.
"""

from __future__ import annotations

from batchpilot.runtime.loadgen.run import LoadReport
from batchpilot.runtime.loadgen.search import SearchResult
from batchpilot.runtime.loadgen.stats import LatencyStats


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _percentiles(stats: LatencyStats) -> str:
    return f"p50 {stats.p50_ms:.1f}  p99 {stats.p99_ms:.1f}  max {stats.max_ms:.1f} ms"


def _overload_lines(report: LoadReport) -> list[str]:
    """Send lag (open loop), refusal latency and goodput: what an overload benchmark needs."""
    lines = []
    if report.send_lag_ms is not None:
        late = report.late_send_fraction or 0.0
        limit = "-" if report.max_send_lag_ms is None else f"{report.max_send_lag_ms:g}"
        lines.append(
            f"  {'send lag':<12} {_percentiles(report.send_lag_ms)}; {late:.1%} of sends over "
            f"{limit} ms late (valid while p99 <= {limit} ms)"
        )
    if report.shed_latency_ms is not None:
        lines.append(
            f"  {'refused in':<12} {_percentiles(report.shed_latency_ms)} "
            f"({report.shed_latency_ms.count} answered 503/429, from send)"
        )
    if report.goodput_rps is not None and report.sla_ms is not None:
        lines.append(
            f"  {'goodput':<12} {report.goodput_rps:.1f} rps answered within the "
            f"{report.sla_ms:g} ms SLA"
        )
    return lines


def format_report(report: LoadReport, *, max_windows: int = 120) -> str:
    """The report as a table for a terminal."""
    mode = (
        f"open loop, {report.target_rps:.1f} rps target"
        if report.mode == "open" and report.target_rps is not None
        else f"closed loop, concurrency {report.concurrency}"
    )
    inputs = ", ".join(f"{name} {list(shape)}" for name, shape in report.inputs.items())
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(report.errors.items())) or "none"
    invalid = [] if report.valid else [f"  INVALID RUN: {report.invalid_reason}"]
    lines = [
        f"batchpilot loadgen: {report.url} model {report.model} ({mode})",
        *invalid,
        f"  request      {inputs}, {report.request_bytes} bytes",
        *([f"  rows         {report.row_mix}"] if report.row_mix else []),
        f"  duration     {report.duration_s:.1f} s measured (+{report.warmup_s:.1f} s warm-up), "
        f"elapsed {report.elapsed_s:.2f} s" + (" — stopped early" if report.aborted else ""),
    ]
    if report.offered_rps is not None:
        lines.append(f"  offered      {report.offered_rps:.1f} rps ({report.scheduled} arrivals)")
    lines += [
        f"  achieved     {report.achieved_qps:.1f} qps "
        f"({report.succeeded} succeeded of {report.sent} sent)",
        f"  errors       shed {report.shed}, failed {report.failed} ({errors})",
    ]
    if report.retries:
        lines.append(
            f"  retries      {report.retries} refused sends repeated: "
            f"{report.sent + report.retries} arrivals at the server for {report.sent} requests"
        )
    if report.hedges:
        lines.append(
            f"  hedged       {report.hedges} requests sent twice, the slower send cancelled: "
            f"{report.sent + report.hedges} arrivals at the server for {report.sent} requests"
        )
    for label, stats in (("latency", report.latency_ms), ("service", report.service_latency_ms)):
        if stats is None:
            lines.append(f"  {label:<12} no successful requests")
        else:
            lines.append(
                f"  {label:<12} p50 {stats.p50_ms:.1f}  p95 {stats.p95_ms:.1f}  "
                f"p99 {stats.p99_ms:.1f}  max {stats.max_ms:.1f}  mean {stats.mean_ms:.1f} ms"
            )
    lines += _overload_lines(report)
    if report.windows:
        if len(report.windows) > max_windows:
            lines.append(f"  {len(report.windows)} windows of {report.window_s:g} s: see --json")
        else:
            lines.append(
                f"  {'window s':>10} {'offered':>9} {'served':>9} {'errors':>7} {'p99 ms':>9}"
            )
            for w in report.windows:
                lines.append(
                    f"  {w.start_s:>10.1f} {w.offered_rps:>9.1f} {w.served_rps:>9.1f} "
                    f"{w.errors:>7} {_ms(w.p99_ms):>9}"
                )
    if invalid and len(lines) > 12:  # the first one has scrolled away
        lines += invalid
    return "\n".join(lines)


def format_search(result: SearchResult) -> str:
    lines = [
        f"batchpilot loadgen --find-max: P99 <= {result.sla_ms:g} ms (refusals are misses), "
        "no other errors",
        f"  {'probe':>5} {'rate rps':>10} {'achieved':>10} {'p99 ms':>9} {'errors':>7}  result",
    ]
    for i, probe in enumerate(result.probes, start=1):
        r = probe.report
        p99 = r.latency_ms.p99_ms if r.latency_ms else None
        verdict = (
            "INVALID"
            if not r.valid
            else "pass"
            if probe.passed
            else ("fail (stopped early)" if r.aborted else "fail")
        )
        lines.append(
            f"  {i:>5} {probe.rate_rps:>10.1f} {r.achieved_qps:>10.1f} {_ms(p99):>9} "
            f"{sum(r.errors.values()):>7}  {verdict}"
        )
    best = "none passed" if result.best_rps is None else f"{result.best_rps:.1f} rps"
    lines.append(
        f"  best: {best} (search {result.stopped_because.replace('_', ' ')}, "
        f"precision {result.precision:.0%})"
    )
    if result.invalid_reason is not None:
        lines.append(f"  INVALID PROBE, search stopped: {result.invalid_reason}")
    return "\n".join(lines)
