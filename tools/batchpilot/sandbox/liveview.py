"""The sandbox's live view: one line a second, and each autopilot decision as it happens.

A line holds what an operator of the service would look at: the load offered and served (as
the Service proxy counts it, over the last second), P99 as the clients see it (the proxy's last
5 s) and as the autopilot sees it (Prometheus over its window, from the InferenceService's
status) against the SLA, replicas desired/ready, the batch size in force, device utilization,
and whether the SLA is met. Formatting is pure; `Sample` is what `up` records for the plot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float
    offered_rps: float
    served_rps: float
    shed_rps: float
    client_p99_ms: float | None
    pilot_p99_ms: float | None
    sla_ms: float
    desired: int
    ready: int
    batch: int | None
    utilization_pct: float | None
    sla_met: str


def condition(status: Mapping[str, Any], type_: str) -> str:
    for found in status.get("conditions") or []:
        if found.get("type") == type_:
            return str(found.get("status", "?"))
    return "?"


def sample_from(
    *,
    t_s: float,
    previous: Mapping[str, Any] | None,
    stats: Mapping[str, Any],
    dt_s: float,
    isvc: Mapping[str, Any],
    deployment: Mapping[str, Any] | None,
) -> Sample:
    """A sample from two readings of the proxy's counters and the objects' current state."""

    def rate(key: str) -> float:
        if previous is None or dt_s <= 0:
            return 0.0
        return max(0.0, (float(stats.get(key, 0)) - float(previous.get(key, 0))) / dt_s)

    status = isvc.get("status") or {}
    metrics = status.get("metrics") or {}
    spec = isvc.get("spec") or {}
    dep_spec = (deployment or {}).get("spec") or {}
    dep_status = (deployment or {}).get("status") or {}
    batch = status.get("batchSize")
    return Sample(
        t_s=round(t_s, 1),
        offered_rps=rate("received"),
        served_rps=rate("ok"),
        shed_rps=rate("shed") + rate("failed"),
        client_p99_ms=stats.get("p99_ms"),
        pilot_p99_ms=metrics.get("p99Ms"),
        sla_ms=float((spec.get("sla") or {}).get("latencyP99Ms", 0)),
        desired=int(dep_spec.get("replicas") or 0),
        ready=int(dep_status.get("readyReplicas") or 0),
        batch=None if batch is None else int(batch),
        utilization_pct=metrics.get("gpuUtilization"),
        sla_met=condition(status, "SLAMet"),
    )


HEADER = (
    f"{'t':>5} {'offered':>8} {'served':>7} {'shed':>5} {'P99 client':>10} "
    f"{'P99 pilot':>9} {'SLA':>6} {'replicas':>8} {'batch':>5} {'util':>5} {'SLAMet':>6}"
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


def line(sample: Sample) -> str:
    util = "-" if sample.utilization_pct is None else f"{sample.utilization_pct:.0f}%"
    return (
        f"{sample.t_s:>4.0f}s {sample.offered_rps:>7.0f}/s {sample.served_rps:>6.0f}/s "
        f"{sample.shed_rps:>4.0f}/s {_ms(sample.client_p99_ms):>10} {_ms(sample.pilot_p99_ms):>9} "
        f"{'<' + _ms(sample.sla_ms):>6} {f'{sample.desired}/{sample.ready}':>8} "
        f"{'-' if sample.batch is None else sample.batch:>5} {util:>5} {sample.sla_met:>6}"
    )


def decision_line(t_s: float, decision: Mapping[str, Any]) -> str:
    before, after = decision.get("from") or {}, decision.get("to") or {}
    return (
        f"{t_s:>4.0f}s  >> {decision.get('action', '?')}: replicas "
        f"{before.get('replicas')}→{after.get('replicas')}, batch "
        f"{before.get('batchSize')}→{after.get('batchSize')} — {decision.get('reason', '')}"
    )
