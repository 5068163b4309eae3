"""The fleet's signals as Prometheus recording rules, and the round's texts that read them.

Asked raw, each of the round's grouped queries makes Prometheus read every pod's series for the
window at the moment of asking — the three latency quantiles every bucket of every pod — inside
the query's timeout; on a Prometheus busy ingesting thousands of targets those queries are the
first to time out, and the autopilot then holds every service. Recorded, Prometheus computes the
same expressions on its own schedule (one rule group, every autopilot interval) and the round
reads one precomputed series per service and signal. The latency buckets are summed per service
once and both quantiles read that sum.

The same rules ship in the chart's PrometheusRule (templates/prometheusrule.yaml, checked
against `rules` by the chart's tests) and the sandbox's Prometheus loads them from here. A
marker series (`marker`) says which window and utilization source the rules were written for;
the round reads the recorded series only while Prometheus has the marker for its own, and asks
the raw grouped queries otherwise (`FleetObserver`).

What stays raw: the fast signal (`recent`: the arrival rate between the last two scrapes, whose
point is to be as fresh as Prometheus is) and the count of reporting pods; both read one series
per pod, no window. A recorded value older than its own window is treated as missing, so a rule
group that stopped being evaluated makes the autopilot hold rather than act on old numbers.

Pure: strings and dicts in and out.
"""

from __future__ import annotations

from typing import Any

from batchpilot.operator.autopilot.promql import FLEET_LABELS, UtilizationSource, queries

GROUP = "batchpilot-autopilot"
"""The rule group's name, in the chart's PrometheusRule and the sandbox's rule file."""

RECORDED = (
    "p99",
    "p95",
    "queue_p99",
    "qps",
    "rejected",
    "arrivals",
    "utilization",
    "mean_batch",
    "compute_batches",
    "compute_rows",
    "compute_seconds",
)
"""The signals read from recorded series; the others of `queries` are asked raw."""

_QUANTILES = {
    "p99": (0.99, "batchpilot_request_duration_seconds"),
    "p95": (0.95, "batchpilot_request_duration_seconds"),
    "queue_p99": (0.99, "batchpilot_queue_wait_seconds"),
}


def series(signal: str, window_s: int) -> str:
    """The recorded series of one signal over a window, e.g. `batchpilot:autopilot_p99:60s`."""
    return f"batchpilot:autopilot_{signal}:{window_s}s"


def marker(window_s: int) -> str:
    """The series that says the rules for this window are loaded (its `utilization` label says
    the source they were written for)."""
    return f"batchpilot:autopilot_rules:{window_s}s"


def marker_query(window_s: int, utilization: UtilizationSource) -> str:
    return f'{marker(window_s)}{{utilization="{utilization}"}}'


def _buckets(metric: str, window_s: int) -> str:
    return f"batchpilot:autopilot_{metric.removeprefix('batchpilot_')}_bucket:rate{window_s}s"


def rules(window_s: int, utilization: UtilizationSource) -> list[dict[str, Any]]:
    """The recording rules, in evaluation order (the bucket sums before the quantiles that read
    them, the marker last): Prometheus' rule-file shape (`record`, `expr`, optional `labels`)."""
    raw = queries(None, window_s=window_s, utilization=utilization)
    by = ", ".join((*FLEET_LABELS, "le"))
    out: list[dict[str, Any]] = []
    for metric in dict.fromkeys(metric for _, metric in _QUANTILES.values()):
        out.append(
            {
                "record": _buckets(metric, window_s),
                "expr": f'sum by ({by}) (rate({metric}_bucket{{isvc!=""}}[{window_s}s]))',
            }
        )
    for signal in RECORDED:
        if signal in _QUANTILES:
            q, metric = _QUANTILES[signal]
            expr = f"histogram_quantile({q}, {_buckets(metric, window_s)})"
        else:
            expr = raw[signal]
        out.append({"record": series(signal, window_s), "expr": expr})
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
