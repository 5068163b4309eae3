"""Reports as tables for a terminal; the JSON form is the reports' own `to_dict`.

Kept apart from the runs so that formatting never touches what is measured.
"""

from __future__ import annotations

from batchpilot.runtime.loadgen.run import LoadReport
from batchpilot.runtime.loadgen.search import SearchResult


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_report(report: LoadReport, *, max_windows: int = 120) -> str:
    """The report as a table for a terminal."""
    mode = (
        f"open loop, {report.target_rps:.1f} rps target"
        if report.mode == "open" and report.target_rps is not None
        else f"closed loop, concurrency {report.concurrency}"
    )
    inputs = ", ".join(f"{name} {list(shape)}" for name, shape in report.inputs.items())
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(report.errors.items())) or "none"
    lines = [
        f"batchpilot loadgen: {report.url} model {report.model} ({mode})",
        f"  request      {inputs}, {report.request_bytes} bytes",
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
    for label, stats in (("latency", report.latency_ms), ("service", report.service_latency_ms)):
        if stats is None:
            lines.append(f"  {label:<12} no successful requests")
        else:
            lines.append(
                f"  {label:<12} p50 {stats.p50_ms:.1f}  p95 {stats.p95_ms:.1f}  "
                f"p99 {stats.p99_ms:.1f}  max {stats.max_ms:.1f}  mean {stats.mean_ms:.1f} ms"
            )
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
    return "\n".join(lines)


def format_search(result: SearchResult) -> str:
    lines = [
        f"batchpilot loadgen --find-max: P99 <= {result.sla_ms:g} ms, no errors",
        f"  {'probe':>5} {'rate rps':>10} {'achieved':>10} {'p99 ms':>9} {'errors':>7}  result",
    ]
    for i, probe in enumerate(result.probes, start=1):
        r = probe.report
        p99 = r.latency_ms.p99_ms if r.latency_ms else None
        verdict = "pass" if probe.passed else ("fail (stopped early)" if r.aborted else "fail")
        lines.append(
            f"  {i:>5} {probe.rate_rps:>10.1f} {r.achieved_qps:>10.1f} {_ms(p99):>9} "
            f"{sum(r.errors.values()):>7}  {verdict}"
        )
    best = "none passed" if result.best_rps is None else f"{result.best_rps:.1f} rps"
    lines.append(
        f"  best: {best} (search {result.stopped_because.replace('_', ' ')}, "
        f"precision {result.precision:.0%})"
    )
    return "\n".join(lines)
