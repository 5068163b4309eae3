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

And what an SRE asks next:
- error budget used: (1 − interval attainment) / (1 − objective), for a declared objective
  (a share of intervals, 99 % unless told): 1.0 spends the whole budget, more overspends it.
  The objective is the reader's, not the run's, so it is applied when reporting
  (`Summary.budget_used`, `table`, `to_dict`);
- flaps: reversals of the replica count — a change whose direction is opposite to the previous
  change's, less than `FLAP_WINDOW_S` (5 minutes) after it. Up at t, down at t + 60 s is one
  flap; up, then down 10 minutes later is none;
- worst streak: the longest run of consecutive intervals over the SLA, in seconds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_OBJECTIVE = 0.99
"""The share of intervals within the SLA that the error budget is counted against."""
FLAP_WINDOW_S = 300.0
"""Two opposite changes of the replica count closer than this are a flap."""


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One control interval: what was in force, what happened, what the controller saw."""

    t: float
    offered_rps: float
    """Mean rate of the trace over the interval."""
    served_rps: float
    shed_rps: float
    in_sla_rps: float
    """Requests a second that finished inside the SLA: past the ceiling, what was answered in
    time."""
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
    flaps: int
    """Reversals of the replica count within `FLAP_WINDOW_S` of the previous change."""
    worst_streak_s: float
    """The longest run of consecutive intervals over the SLA, in seconds."""

    def budget_used(self, objective: float = DEFAULT_OBJECTIVE) -> float:
        """The share of the error budget spent: (1 − interval attainment) / (1 − objective)."""
        if not 0 < objective < 1:
            raise ValueError("the objective is a share of intervals strictly between 0 and 1")
        return (1 - self.interval_attainment) / (1 - objective)


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
    clients: dict[str, int] | None = None
    """Where clients retry (`ClusterConfig.retries`): the requests they meant to send, the
    retries they sent besides, and how many they gave up on; None where refusals are dropped."""

    def to_dict(
        self, *, intervals: bool = True, objective: float = DEFAULT_OBJECTIVE
    ) -> dict[str, Any]:
        summary = {_camel(k): _json(v) for k, v in asdict(self.summary).items()}
        summary["objective"] = objective
        summary["errorBudgetUsed"] = _json(self.summary.budget_used(objective))
        doc: dict[str, Any] = {
            "policy": self.policy,
            "trace": self.trace,
            "durationS": self.duration_s,
            "slaMs": self.sla_s * 1e3,
            "service": self.service,
            "wallS": round(self.wall_s, 3),
            "settings": self.settings,
            "summary": summary,
        }
        if self.clients is not None:
            doc["clients"] = self.clients
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
    end_s: float | None = None,
) -> Summary:
    """`end_s`: when the last interval ends (the trace's end); default: one interval after it
    starts, as long as the one before."""
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
        flaps=count_flaps(records),
        worst_streak_s=worst_streak_s(records, sla_s=sla_s, end_s=end_s),
    )


def count_flaps(records: Sequence[IntervalRecord], *, window_s: float = FLAP_WINDOW_S) -> int:
    """Changes of the replica count opposite in direction to the previous change and less than
    `window_s` after it."""
    changes = [
        (b.t, b.replicas > a.replicas)
        for a, b in itertools.pairwise(records)
        if a.replicas != b.replicas
    ]
    return sum(
        1
        for (t0, up0), (t1, up1) in itertools.pairwise(changes)
        if up0 != up1 and t1 - t0 < window_s
    )


def worst_streak_s(
    records: Sequence[IntervalRecord], *, sla_s: float, end_s: float | None = None
) -> float:
    """The longest run of consecutive intervals whose P99 is over the SLA, in seconds. An
    interval lasts until the next one starts; the last until `end_s`, or as long as the one
    before it (a lone interval with no end counts 0 s)."""
    worst = run = 0.0
    for k, record in enumerate(records):
        if k + 1 < len(records):
            span = records[k + 1].t - record.t
        elif end_s is not None:
            span = end_s - record.t
        else:
            span = record.t - records[k - 1].t if k else 0.0
        run = run + span if record.p99_s > sla_s else 0.0  # NaN (no traffic): within
        worst = max(worst, run)
    return worst


def table(results: Sequence[SimulationResult], *, objective: float = DEFAULT_OBJECTIVE) -> str:
    """A plain-text comparison, one row per simulation; `budget` is the error budget used
    against `objective` (1.00: all of it)."""
    header = (
        f"{'trace':<12} {'policy':<10} {'intervals':>9} {'requests':>9} {'budget':>6} "
        f"{'worst s':>7} {'GPU-s':>9} {'vs oracle':>9} {'actions':>7} {'flaps':>5} "
        f"{'batch±':>6} {'GPU util':>8} {'max rep':>7} {'wall s':>6}"
    )
    lines = [header, "-" * len(header)]
    oracle = {r.trace: r.summary.gpu_seconds for r in results if r.policy == "oracle"}
    for r in results:
        s = r.summary
        ratio = s.gpu_seconds / oracle[r.trace] if oracle.get(r.trace) else math.nan
        lines.append(
            f"{r.trace:<12} {r.policy:<10} {s.interval_attainment:>9.2%} "
            f"{s.request_attainment:>9.3%} {s.budget_used(objective):>6.2f} "
            f"{s.worst_streak_s:>7.0f} {s.gpu_seconds:>9.0f} "
            f"{'' if math.isnan(ratio) else f'{ratio:.3f}x':>9} {s.scaling_actions:>7} "
            f"{s.flaps:>5} {s.batch_changes:>6} {s.mean_utilization:>8.1%} "
            f"{s.max_replicas:>7} {r.wall_s:>6.1f}"
        )
    return "\n".join(lines)
