"""`--find-max`: the highest constant rate whose P99 over all requests stays within the SLA,
a refused request (503/429) counting as a miss, with no other error.

The search steps are pure (`RateSearch`: an exponential ramp until a probe fails, then
bisection) so the tests check them without a server; `find_max_rate` runs one open-loop probe
per step on one shared session, each probe stopping early once it can no longer pass, the whole
search bounded in probes and in time.

A probe whose client could not keep its schedule (send lag, client-side drops: the report's
`valid`) is neither a pass nor a fail: it offered some other load than asked, and the lag itself
counts into its latency, so it says nothing about the asked rate either way. The search stops
there (`stopped_because="invalid_probe"`, with the probe's reason), keeping the best rate that
passed before it: a faster client or a lower rate is needed, not another bisection step.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Literal

from batchpilot.runtime.loadgen.client import TargetSession
from batchpilot.runtime.loadgen.config import LoadConfig, SearchConfig
from batchpilot.runtime.loadgen.loops import PRECISE_CLOCK, Clock
from batchpilot.runtime.loadgen.run import LoadReport, run_with
from batchpilot.runtime.loadgen.schedule import MAX_RATE_RPS, RateSchedule

StopReason = Literal["converged", "max_probes", "time_budget", "nothing_passes", "invalid_probe"]


@dataclass(slots=True)
class RateSearch:
    """Exponential ramp until a probe fails, then bisection (geometric, since the precision is
    relative) between the best passing and the lowest failing rate. Assumes that passing is
    monotone in the rate, which is what saturation looks like."""

    start_rps: float
    precision: float = 0.05
    min_rps: float = 0.5
    max_rps: float = MAX_RATE_RPS
    passed_rps: float = 0.0
    failed_rps: float | None = None

    def next_rate(self) -> float | None:
        """The next rate to probe, or None once the search is done."""
        if self.failed_rps is None:
            if self.passed_rps == 0:
                return self.start_rps
            return (
                min(self.passed_rps * 2, self.max_rps) if self.passed_rps < self.max_rps else None
            )
        if self.passed_rps == 0:
            rate = self.failed_rps / 2
            return rate if rate >= self.min_rps else None
        if self.failed_rps / self.passed_rps - 1 <= self.precision:
            return None
        return math.sqrt(self.passed_rps * self.failed_rps)

    def record(self, rate_rps: float, *, passed: bool) -> None:
        if passed:
            self.passed_rps = max(self.passed_rps, rate_rps)
        elif self.failed_rps is None or rate_rps < self.failed_rps:
            self.failed_rps = rate_rps


def probe_passes(report: LoadReport, *, sla_ms: float) -> bool:
    """A probe passes when the P99 of all its requests is within the SLA — a refused request
    (503/429) counting as one not answered in time, so late answers and refusals together stay
    within the 1 % that nearest-rank P99 allows — with no other error, the run not stopped
    early, and the run valid (an invalid probe never passes).

    Refusals count as misses rather than failures: a server that refuses the 0.5 % of requests
    it could not answer in time keeps the SLA for 99.5 %, where one that answers them late
    breaks it just the same."""
    misses = report.sla_misses
    if misses is None:  # a report without an SLA: every late answer and refusal is a miss
        late = 0 if report.latency_ms is None or report.latency_ms.p99_ms <= sla_ms else 1
        misses = report.shed + late * report.scheduled
    return (
        report.valid
        and not report.aborted
        and report.succeeded > 0
        and report.failed == 0
        and misses <= allowed_misses(report.scheduled)
    )


def allowed_misses(requests: int) -> int:
    """Requests that may miss the SLA while nearest-rank P99 of `requests` still meets it."""
    return requests - math.ceil(requests * 0.99 - 1e-9)


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    rate_rps: float
    passed: bool
    report: LoadReport


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    sla_ms: float
    best_rps: float | None
    """The highest probed rate that passed; None if none did."""
    stopped_because: StopReason
    precision: float
    probes: tuple[Probe, ...]
    invalid_reason: str | None = None
    """Why the last probe was invalid, when that stopped the search."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "sla_ms": self.sla_ms,
            "best_rps": self.best_rps,
            "stopped_because": self.stopped_because,
            "precision": self.precision,
            "invalid_reason": self.invalid_reason,
            "probes": [
                {"rate_rps": p.rate_rps, "passed": p.passed, "report": p.report.to_dict()}
                for p in self.probes
            ],
        }


async def find_max_rate(config: SearchConfig, *, clock: Clock = PRECISE_CLOCK) -> SearchResult:
    """The highest constant open-loop rate with P99 <= SLA, refusals counting as misses, and no
    other errors; an invalid probe stops the search (see the module docstring)."""
    started = clock()
    search = RateSearch(config.start_rps, precision=config.precision, min_rps=config.min_rps)
    probes: list[Probe] = []
    worst_probe_s = (
        config.settle_s + config.warmup_s + config.probe_duration_s + config.target.timeout_s
    )
    stopped: StopReason = "converged"
    invalid: str | None = None
    async with TargetSession(config.target, pool_size=config.max_outstanding) as client:
        while True:
            rate = search.next_rate()
            if rate is None:
                stopped = "converged" if search.passed_rps > 0 else "nothing_passes"
                break
            if len(probes) >= config.max_probes:
                stopped = "max_probes"
                break
            if clock() - started + worst_probe_s > config.max_total_s:
                stopped = "time_budget"
                break
            if probes and config.settle_s > 0:
                await asyncio.sleep(config.settle_s)
            report = await run_with(
                client,
                LoadConfig(
                    target=config.target,
                    duration_s=config.probe_duration_s,
                    schedule=RateSchedule.constant(rate),
                    arrivals=config.arrivals,
                    max_outstanding=config.max_outstanding,
                    warmup_s=config.warmup_s,
                    seed=config.seed + len(probes),
                    stop_early_sla_ms=config.sla_ms,
                    sla_ms=config.sla_ms,
                    max_send_lag_ms=config.max_send_lag_ms,
                ),
                clock=clock,
            )
            passed = probe_passes(report, sla_ms=config.sla_ms)
            probes.append(Probe(rate_rps=rate, passed=passed, report=report))
            if not report.valid:
                stopped, invalid = "invalid_probe", report.invalid_reason
                break
            search.record(rate, passed=passed)
    return SearchResult(
        sla_ms=config.sla_ms,
        best_rps=search.passed_rps or None,
        stopped_because=stopped,
        precision=config.precision,
        probes=tuple(probes),
        invalid_reason=invalid,
    )
