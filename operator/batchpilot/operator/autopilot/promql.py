"""The PromQL the autopilot asks: one text per signal, for one service or for every service.

Every query is scoped to the InferenceService by the `namespace` and `isvc` labels the runtime
puts on its series; the fleet's texts are the same with each aggregation grouped by
`FLEET_LABELS`, so one round asks as many questions as one service's tick, whatever the fleet's
size. Apart from the asking (`prometheus`) because the texts are the contract with the runtime's
metrics — the simulator and the tests read them too — and they are pure: strings in, strings out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from batchpilot.api.arrivals import ATTEMPT_LABEL, NOT_RETRIED, RETRY_ATTEMPT

UtilizationSource = Literal["busy", "nvml", "dcgm"]


@dataclass(frozen=True, slots=True)
class Scope:
    namespace: str
    isvc: str

    @property
    def selector(self) -> str:
        return f'namespace="{self.namespace}",isvc="{self.isvc}"'


@dataclass(frozen=True, slots=True)
class Seasonality:
    """Where to look for a recurring pattern: `periods` whole periods back (a day each by
    default), `lookahead_s` after that time, scaled by the mean rate over `level_s` before it."""

    period_s: int = 86_400
    periods: int = 2
    lookahead_s: int = 300
    level_s: int = 3600
    step_s: int = 30
    """The resolution of the look-ahead's peak (a subquery step)."""


POD_HASH = "[bcdfghjklmnpqrstvwxz2456789]"
"""The characters of a pod-template hash and a pod name's random suffix (Kubernetes'
`rand.SafeEncodeString`: no vowels, no 0, 1 or 3)."""

FLEET_LABELS = ("namespace", "isvc")
"""What the fleet's round groups every signal by: one series per InferenceService."""


def queries(
    scope: Scope | None,
    *,
    window_s: int,
    utilization: UtilizationSource,
    recent_s: int | None = None,
    seasonality: Seasonality | None = None,
) -> dict[str, str]:
    """The PromQL for each signal, by name: for one service (`scope`), or for every service at
    once (None: each aggregation grouped by `FLEET_LABELS`, the same text otherwise — so the
    fleet's round asks as many questions as one service's tick, whatever the fleet's size).
    `recent_s` adds the fast signals: the arrival rate between the last two scrapes within that
    range (empty unless two scrapes fit in it), and the runtime's rate of its last seconds.
    `seasonality` adds today's level and, per past period, its level and its look-ahead peak."""
    sel = scope.selector if scope is not None else 'isvc!=""'
    group = () if scope is not None else FLEET_LABELS
    w = f"{window_s}s"
    scraped_now = (
        f"last_over_time(batchpilot_engine_info{{{sel}}}[{w}]) and batchpilot_engine_info{{{sel}}}"
    )

    def agg(op: str, expr: str, *labels: str) -> str:
        by = ", ".join((*group, *labels))
        return f"{op} by ({by}) ({expr})" if by else f"{op}({expr})"

    def quantile(q: float, metric: str) -> str:
        return (
            f"histogram_quantile({q}, {agg('sum', f'rate({metric}_bucket{{{sel}}}[{w}])', 'le')})"
        )

    def rate(metric: str, extra: str = "", *labels: str) -> str:
        return agg("sum", f"rate({metric}{{{sel}{extra}}}[{w}])", *labels)

    busy = "batchpilot_device_busy_seconds_total"
    # dcgm-exporter labels pods, not services: a Deployment's pod is <isvc>-<hash>-<suffix>, both
    # in Kubernetes' alphabet without vowels (a Job's pod <isvc>-train-x7k2p, another service's
    # <isvc>-v2-…-…, are not this service's).
    pod_of = f"-{POD_HASH}{{1,10}}-{POD_HASH}{{5}}"
    if scope is not None:
        dcgm = (
            f'avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{{namespace="{scope.namespace}",'
            f'pod=~"{scope.isvc}{pod_of}"}}[{w}])) / 100'
        )
    else:
        dcgm = (
            agg(
                "avg",
                f'label_replace(avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{w}]), '
                f'"isvc", "$1", "pod", "(.+){pod_of}")',
            )
            + " / 100"
        )
    counted = "batchpilot_arrival_counted_seconds_total"
    util = {
        # The replicas' busy seconds over the seconds they served, in the window: a replica that
        # came or went inside it counts for its own time. (The mean of their rates counted it
        # for the whole window — `rate()` divides by it — and read 30–40 % low for a window
        # after every scale, rollout or replacement; a count of the series at the window's end
        # would divide a window's sum by it.) A runtime that does not count its seconds: that
        # mean.
        "busy": (
            f"({agg('sum', f'rate({busy}{{{sel}}}[{w}])')} "
            f"/ {agg('sum', f'rate({counted}{{{sel}}}[{w}])')}) "
            f"or {agg('avg', f'rate({busy}{{{sel}}}[{w}])')}"
        ),
        "nvml": agg("avg", f"avg_over_time(batchpilot_gpu_utilization_ratio{{{sel}}}[{w}])"),
        "dcgm": dcgm,
    }[utilization]
    # The demand: every arrival but those whose headers said they were retries (a runtime that
    # does not count by attempt matches as a whole).
    arrivals = f"batchpilot_arrivals_total{{{sel},{NOT_RETRIED}}}"
    served = rate("batchpilot_requests_total", ',outcome="success"')
    # irate: the rate between the last two scrapes in the range, the freshest Prometheus has.
    # And the runtime's own rate of the last seconds, as the last scrape read it.
    # Of the replicas scraped now: a range ignores the staleness marker of a replica gone, and
    # an instant selector looks back five minutes where no marker was written (a replica gone
    # while Prometheus was down), so each is kept to the series sampled in the range and not
    # marked stale.
    gauge = "batchpilot_recent_arrivals_per_second"

    def per_pod_irate(metric: str) -> str:
        """Each replica's rate between its last two scrapes (a replica gone: none)."""
        series = f"{metric}{{{sel}}}"
        return agg("sum", f"irate({series}[{recent_s}s]) and {series}", "pod")

    recent = (
        {}
        if recent_s is None
        else {
            "recent_pod_batches": per_pod_irate("batchpilot_batches_total"),
            "recent_pod_rows": per_pod_irate("batchpilot_batch_rows_total"),
            "recent_pod_seconds": per_pod_irate("batchpilot_batch_compute_seconds_total"),
            "recent": agg("sum", f"irate({arrivals}[{recent_s}s]) and {arrivals}"),
            "now": agg(
                "sum",
                f"last_over_time({gauge}{{{sel},{NOT_RETRIED}}}[{recent_s}s]) "
                f"and {gauge}{{{sel},{NOT_RETRIED}}}",
            ),
        }
    )
    seasonal: dict[str, str] = {}
    if seasonality is not None:
        level, ahead = f"{seasonality.level_s}s", f"{seasonality.lookahead_s}s"
        # The level is the median one-minute rate over the hour: what the traffic runs at,
        # which a burst within the hour (today's or a past day's) does not move.
        steps = f"[{level}:{seasonality.step_s}s]"
        median = f"quantile_over_time(0.5, {agg('sum', f'rate({arrivals}[{w}])')}{steps}"
        seasonal["level"] = f"{median})"
        for n in range(1, seasonality.periods + 1):
            back = n * seasonality.period_s
            seasonal[f"level_{n}"] = f"{median} offset {back}s)"
            seasonal[f"then_{n}"] = agg("sum", f"rate({arrivals}[{w}] offset {back}s)")
            # The subquery's range ends `lookahead` after this time, then: offset back − ahead.
            seasonal[f"ahead_{n}"] = (
                f"max_over_time({agg('sum', f'rate({arrivals}[{w}])')}"
                f"[{ahead}:{seasonality.step_s}s] offset {back - seasonality.lookahead_s}s)"
            )
    # How far back the window's samples go, and how far apart they are (`answers.covered_span`:
    # `rate()` divides what it sees by the whole range). A subquery at 1 s steps meets each sample
    # at the step right after it, and keeps it there only if it is under a second old: so its
    # minimum is the window's first sample, never one a lookback reaches from before a gap in
    # the history (a Prometheus that was down). The earliest of the service's series: one replica
    # there all along makes the window whole, whatever replicas joined inside it.
    info = f"batchpilot_engine_info{{{sel}}}"
    first = f"min_over_time((timestamp({info}) > time() - 1)[{w}:1s])"
    return (
        recent
        | seasonal
        | {
            "p99": quantile(0.99, "batchpilot_request_duration_seconds"),
            "p95": quantile(0.95, "batchpilot_request_duration_seconds"),
            "queue_p99": quantile(0.99, "batchpilot_queue_wait_seconds"),
            "qps": served,
            # The SLA the replicas counted the requests over it against, lowest and highest over
            # the window: the late share speaks of the policy's SLA only where both are it.
            "counted_sla_min": agg("min", f"min_over_time(batchpilot_sla_seconds{{{sel}}}[{w}])"),
            "counted_sla_max": agg("max", f"max_over_time(batchpilot_sla_seconds{{{sel}}}[{w}])"),
            # The share of the requests timed that took longer than the SLA, as the replicas that
            # count it (those that know the SLA) counted: P99 over the SLA is more than 1 %.
            "late_share": (
                f"{rate('batchpilot_requests_over_sla_total')} / "
                + agg(
                    "sum",
                    f"rate(batchpilot_request_duration_seconds_count{{{sel}}}[{w}]) and "
                    f"rate(batchpilot_requests_over_sla_total{{{sel}}}[{w}])",
                )
            ),
            "rejected": rate("batchpilot_requests_total", ',outcome="rejected"'),
            "arrivals": rate("batchpilot_arrivals_total", f",{NOT_RETRIED}"),
            "retried": rate("batchpilot_arrivals_total", f',{ATTEMPT_LABEL}="{RETRY_ATTEMPT}"'),
            # Arrivals their clients cancelled before the SLA passed: neither served nor missed.
            "withdrawn": rate("batchpilot_withdrawn_total"),
            "utilization": util,
            # How the arrivals clumped: each replica's gauge over the window, their mean.
            "dispersion": agg("avg", f"avg_over_time(batchpilot_arrival_dispersion{{{sel}}}[{w}])"),
            # How the arrivals crowded into busy seconds: with every arrival, the rate a request
            # met in its second (`batchpilot.api.arrivals.SECOND_SQUARES_SLOT_S`).
            "second_squares": rate("batchpilot_arrival_second_squares_total"),
            "counted_seconds": rate("batchpilot_arrival_counted_seconds_total"),
            # How batch times vary around t(b): each replica's gauge over the window, their mean.
            "batch_cv": agg("avg", f"avg_over_time(batchpilot_batch_time_cv{{{sel}}}[{w}])"),
            "mean_batch": (
                f"{rate('batchpilot_batch_size_sum')} / {rate('batchpilot_batch_size_count')}"
            ),
            # How much the rows a request brings vary: the cv of every arrival's rows, from the
            # sums of their rows and of their squares (0 where all bring the same rows).
            "rows_cv": (
                f"sqrt(clamp_min({rate('batchpilot_arrival_rows_squared_total')} * "
                f"{rate('batchpilot_arrivals_total')} / "
                f"{rate('batchpilot_arrival_rows_total')} ^ 2 - 1, 0))"
            ),
            # Rows run per request answered: the rates count requests, the fit t(b) rows.
            "rows_per_request": f"{rate('batchpilot_batch_size_sum')} / {served}",
            # Of it, the time inside the deadline's clock before the batcher, per request timed
            # (decode and preprocess waits, the preprocess): the deadline already counts it.
            "before": (
                f"{rate('batchpilot_before_batcher_seconds_total')} / "
                f"{rate('batchpilot_request_duration_seconds_count')}"
            ),
            # Time outside the batcher per request timed: duration less the time in the batcher.
            "outside": (
                f"({rate('batchpilot_request_duration_seconds_sum')} - "
                f"{rate('batchpilot_batcher_seconds_total')}) / "
                f"{rate('batchpilot_request_duration_seconds_count')}"
            ),
            # The batch times measured at start-up, by rows: gauges, the window's last value.
            "startup": agg(
                "avg", f"last_over_time(batchpilot_startup_batch_seconds{{{sel}}}[{w}])", "rows"
            ),
            "compute_seconds": rate("batchpilot_batch_compute_seconds_total", "", "batch_bucket"),
            "compute_rows": rate("batchpilot_batch_rows_total", "", "batch_bucket"),
            "compute_batches": rate("batchpilot_batches_total", "", "batch_bucket"),
            # Each replica's batches, by its pod: its pace against its peers' (`stragglers`).
            "pod_batches": rate("batchpilot_batches_total", "", "pod"),
            "pod_rows": rate("batchpilot_batch_rows_total", "", "pod"),
            "pod_seconds": rate("batchpilot_batch_compute_seconds_total", "", "pod"),
            # The replicas scraped now: sampled in the window and not marked stale (see `recent`),
            # each once, whatever the jobs that scrape it (by its address and pod)…
            "reporting": agg("count", agg("count", scraped_now, "instance", "pod")),
            # …and how many times the most scraped of them is: two jobs on one pod (a PodMonitor
            # beside an annotation-driven job) double every rate.
            "scrapes": agg("max", agg("count", scraped_now, "instance", "pod")),
            # The largest batch a replica's device has memory for, where one ran out (a gauge
            # absent until then): the smallest over the replicas scraped now.
            "memory_rows": agg("min", f"batchpilot_device_memory_batch_rows{{{sel}}}"),
            "covered": f"time() - {agg('min', first)}",
            # The mean distance between a series' samples in the window (one sample: none).
            "scrape_interval": agg(
                "min",
                f"(timestamp({info}) - {first}) / ((count_over_time({info}[{w}]) > 1) - 1)",
            ),
        }
    )
