"""What a simulation returns: a per-interval time series and the summary the issue asks for.

The summary's numbers, defined once here:
- interval attainment: the share of control intervals whose exact P99 (over the requests that
  finished in it, shed requests counted as infinitely slow) is within the SLA; an interval with
  no traffic counts as within;
- request attainment: requests answered within the SLA over all requests offered (shed ones
  included, as failures);
- GPU-seconds: every replica from the moment it is requested (cold start included) until it is
  gone (after draining), or the end of the trace;
- scaling actions: changes of the replica count; batch changes are counted apart;
- mean GPU utilization: device-busy seconds over GPU-seconds — the share of what was paid for
  that did work.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One control interval: what was in force, what happened, what the controller saw."""

    t: float
    offered_rps: float
    """Mean rate of the trace over the interval."""
    served_rps: float
    shed_rps: float
    p99_s: float
    """Exact P99 of the requests that finished in the interval (∞ if over 1 % were shed)."""
    observed_p99_s: float | None
    """The P99 the controller saw at the interval's start (window, histogram interpolation)."""
    replicas: int
    """Replicas asked for (the Deployment's spec.replicas) during the interval."""
    ready: int
    """Replicas taking traffic at the interval's start."""
    billed: float
    """Mean replicas paid for over the interval (starting and draining ones included)."""
    batch_size: int
    max_queue_delay_s: float
    mean_batch: float | None
    utilization: float | None
    """Device busy fraction per paid replica."""
    reason: str


@dataclass(frozen=True, slots=True)
class Summary:
    interval_attainment: float
    request_attainment: float
    gpu_seconds: float
    scaling_actions: int
    batch_changes: int
    mean_utilization: float
    requests: int
    shed: int
    max_replicas: int
    final_batch_size: int


@dataclass(frozen=True, slots=True)
class SimulationResult:
    policy: str
    trace: str
    duration_s: float
    sla_s: float
    service: str
    summary: Summary
    intervals: Sequence[IntervalRecord]
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, *, intervals: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "policy": self.policy,
            "trace": self.trace,
            "durationS": self.duration_s,
            "slaMs": self.sla_s * 1e3,
            "service": self.service,
            "wallS": round(self.wall_s, 3),
            "settings": self.settings,
            "summary": {_camel(k): _json(v) for k, v in asdict(self.summary).items()},
        }
        if intervals:
            doc["intervals"] = [
                {_camel(k): _json(v) for k, v in asdict(record).items()}
                for record in self.intervals
            ]
        return doc


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _json(value: Any) -> Any:
    """JSON has no infinity: an infinite P99 (over 1 % shed) or an undefined one is null."""
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return None
        return round(value, 6)
    return value


def summarize(
    records: Sequence[IntervalRecord],
    *,
    sla_s: float,
    within_sla: int,
    requests: int,
    shed: int,
    gpu_seconds: float,
    busy_seconds: float,
) -> Summary:
    inside = sum(1 for r in records if r.p99_s <= sla_s or math.isnan(r.p99_s))
    replica_changes = sum(1 for a, b in itertools.pairwise(records) if a.replicas != b.replicas)
    batch_changes = sum(1 for a, b in itertools.pairwise(records) if a.batch_size != b.batch_size)
    return Summary(
        interval_attainment=inside / len(records) if records else 1.0,
        request_attainment=within_sla / requests if requests else 1.0,
        gpu_seconds=gpu_seconds,
        scaling_actions=replica_changes,
        batch_changes=batch_changes,
        mean_utilization=busy_seconds / gpu_seconds if gpu_seconds else 0.0,
        requests=requests,
        shed=shed,
        max_replicas=max((r.replicas for r in records), default=0),
        final_batch_size=records[-1].batch_size if records else 0,
    )


def table(results: Sequence[SimulationResult]) -> str:
    """A plain-text comparison, one row per simulation."""
    header = (
        f"{'trace':<12} {'policy':<10} {'intervals':>9} {'requests':>9} {'GPU-s':>9} "
        f"{'vs oracle':>9} {'actions':>7} {'batch±':>6} {'GPU util':>8} {'max rep':>7} "
        f"{'wall s':>6}"
    )
    lines = [header, "-" * len(header)]
    oracle = {r.trace: r.summary.gpu_seconds for r in results if r.policy == "oracle"}
    for r in results:
        s = r.summary
        ratio = s.gpu_seconds / oracle[r.trace] if oracle.get(r.trace) else math.nan
        lines.append(
            f"{r.trace:<12} {r.policy:<10} {s.interval_attainment:>9.2%} "
            f"{s.request_attainment:>9.3%} {s.gpu_seconds:>9.0f} "
            f"{'' if math.isnan(ratio) else f'{ratio:.3f}x':>9} {s.scaling_actions:>7} "
            f"{s.batch_changes:>6} {s.mean_utilization:>8.1%} {s.max_replicas:>7} "
            f"{r.wall_s:>6.1f}"
        )
    return "\n".join(lines)
