"""The fleet's signals as Prometheus recording rules, and the round's texts that read them.

Asked raw, each of the round's grouped queries makes Prometheus read every pod's series for the
window at the moment of asking — the three latency quantiles every bucket of every pod — inside
the query's timeout; on a Prometheus busy ingesting thousands of targets those queries are the
first to time out, and the autopilot then holds every service. Recorded, Prometheus computes the
same expressions on its own schedule (one rule group, every autopilot interval) and the round
reads one precomputed series per service and signal. Each rule records exactly its signal's raw
grouped query. (Recording the latency buckets summed per service, for both quantiles to read,
was measured and dropped: with a pod or two per service the sums are as many series as the
pods' own buckets, and appending them every evaluation cost more than the quantile it saved.)

The same rules ship in the chart's PrometheusRule (templates/prometheusrule.yaml, checked
against `rules` by the chart's tests) and the sandbox's Prometheus loads them from here. A
marker series (`marker`) says which window and utilization source the rules were written for;
the round reads the recorded series only while Prometheus has the marker for its own, and asks
the raw grouped queries otherwise (`FleetObserver`).

What stays raw: the fast signals (`recent`: the arrival rate between the last two scrapes, `now`:
the runtime's gauge of its last seconds' arrivals, and `recent_pod_*`: each replica's batches
between its last two scrapes, whose point is to be as fresh as Prometheus is), the count of
reporting pods (and how many times the most scraped is) and the rows a device has memory for (a
gauge, absent until one ran out); they read one series per pod, no window. A recorded value older
than its own window is treated as missing, so a rule group that stopped being evaluated makes the
autopilot hold rather than act on old numbers.

Pure: strings and dicts in and out.
"""

from __future__ import annotations

from typing import Any

from batchpilot.operator.autopilot.promql import UtilizationSource, queries

GROUP = "batchpilot-autopilot"
"""The rule group's name, in the chart's PrometheusRule and the sandbox's rule file."""

RECORDED = (
    "p99",
    "p95",
    "queue_p99",
    "qps",
    "late_share",
    "counted_sla_min",
    "counted_sla_max",
    "rejected",
    "arrivals",
    "retried",
    "withdrawn",
    "utilization",
    "dispersion",
    "second_squares",
    "counted_seconds",
    "batch_cv",
    "rows_cv",
    "mean_batch",
    "rows_per_request",
    "outside",
    "before",
    "startup",
    "compute_batches",
    "compute_rows",
    "compute_seconds",
    "pod_batches",
    "pod_rows",
    "pod_seconds",
    "covered",
    "scrape_interval",
)
"""The signals read from recorded series; the others of `queries` are asked raw. How much of the
window Prometheus holds is recorded with the rates it corrects: measured at the same moment."""


def series(signal: str, window_s: int) -> str:
    """The recorded series of one signal over a window, e.g. `batchpilot:autopilot_p99:60s`."""
    return f"batchpilot:autopilot_{signal}:{window_s}s"


def marker(window_s: int) -> str:
    """The series that says the rules for this window are loaded (its `utilization` label says
    the source they were written for)."""
    return f"batchpilot:autopilot_rules:{window_s}s"


def marker_query(window_s: int, utilization: UtilizationSource) -> str:
    return f'{marker(window_s)}{{utilization="{utilization}"}}'


def rules(window_s: int, utilization: UtilizationSource) -> list[dict[str, Any]]:
    """The recording rules, the marker last: Prometheus' rule-file shape (`record`, `expr`,
    optional `labels`). Each records its signal's raw grouped query: the same numbers."""
    raw = queries(None, window_s=window_s, utilization=utilization)
    out: list[dict[str, Any]] = [
        {"record": series(signal, window_s), "expr": raw[signal]} for signal in RECORDED
    ]
    out.append(
        {"record": marker(window_s), "expr": "vector(1)", "labels": {"utilization": utilization}}
    )
    return out


def rule_group(
    window_s: int, utilization: UtilizationSource, *, interval_s: float
) -> dict[str, Any]:
    """The rules as one group evaluated every `interval_s` (the autopilot's interval: each
    round finds a value at most that old)."""
    return {
        "name": GROUP,
        "interval": f"{round(interval_s * 1000)}ms",
        "rules": rules(window_s, utilization),
    }


def recorded_queries(
    window_s: int, utilization: UtilizationSource, *, recent_s: int | None
) -> dict[str, str]:
    """The round's texts with the rules loaded: the same names as the raw grouped `queries`
    (without seasonality), each recorded signal read from its series while it is no older than
    the window it describes."""
    texts = queries(None, window_s=window_s, utilization=utilization, recent_s=recent_s)
    for signal in RECORDED:
        name = series(signal, window_s)
        texts[signal] = f"{name} and (time() - timestamp({name}) <= {window_s})"
    return texts
