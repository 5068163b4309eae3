"""The simulated Deployment: replicas that start, serve, drain and cost, under one controller.

Time moves one control interval at a time (15 s by default). At the start of each interval the
controller gets the Prometheus-style observation of the window that just ended and says how many
replicas it wants and with which batch settings; then the interval's traffic is served:

- arrivals are Poisson from the trace, drawn for the whole interval at once and spread over the
  ready replicas at random per request (a Kubernetes Service with kube-proxy) or round-robin;
- a new replica costs GPU-seconds from the moment it is requested and takes traffic after the
  cold-start delay (image pull, model load, readiness probe) — the interval is cut where one
  becomes ready;
- a removed replica stops receiving traffic at once, finishes what it has queued, and stops
  costing when it is drained; replicas still starting are removed first, then the newest;
- batch settings reach every replica immediately (the operator PUTs them to each ready pod).

Loops are bounded by the number of intervals and, inside an interval, by its cuts and replicas.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from batchpilot.operator.autopilot.decide import InForce
from batchpilot.operator.simulation.observe import Telemetry
from batchpilot.operator.simulation.policies import Command, Controller
from batchpilot.operator.simulation.replica import Replica, Served
from batchpilot.operator.simulation.report import IntervalRecord, SimulationResult, summarize
from batchpilot.operator.simulation.service import ServiceTruth
from batchpilot.operator.simulation.trace import Trace

Balancing = Literal["random", "round-robin"]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    interval_s: float = 15.0
    """The autopilot's control interval (the operator's `autopilot_interval_seconds`)."""
    window_s: float = 60.0
    """The metrics window (the operator's `metrics_window_seconds`)."""
    cold_start_s: float = 30.0
    queue_capacity: int = 1024
    """Requests one replica queues before it sheds (the runtime's `queue_capacity`)."""
    balancing: Balancing = "random"
    seed: int = 0


@dataclass(frozen=True, slots=True)
class _Tick:
    """What was in force during one interval, noted when it began."""

    start: float
    replicas: int
    ready: int
    batch_size: int
    delay_s: float
    observed_p99_s: float | None
    reason: str


@dataclass(eq=False)
class Pod:
    replica: Replica
    requested_at: float
    ready_at: float
    removed_at: float | None = None
    gone_at: float | None = None
    """When it stopped costing: removal while starting, or the end of its drain."""

    @property
    def draining(self) -> bool:
        return self.removed_at is not None and self.gone_at is None

    def billed(self, start: float, end: float) -> float:
        """GPU-seconds of this pod within [start, end)."""
        stop = end if self.gone_at is None else min(end, self.gone_at)
        return max(0.0, stop - max(start, self.requested_at))


@dataclass
class _Fleet:
    truth: ServiceTruth
    config: ClusterConfig
    pods: list[Pod] = field(default_factory=list)
    batch_size: int = 1
    delay_s: float = 0.0

    def active(self) -> list[Pod]:
        """Pods that are wanted (starting or ready), oldest first."""
        return [p for p in self.pods if p.removed_at is None]

    def ready(self, t: float) -> list[Pod]:
        return [p for p in self.active() if p.ready_at <= t]

    def reporting(self, t: float) -> int:
        """Pods whose metrics Prometheus has: ready ones and ones still draining."""
        return len(self.ready(t)) + sum(1 for p in self.pods if p.draining)

    def apply(self, command: Command, now: float, *, cold_start: bool) -> None:
        self.batch_size = command.batch_size
        self.delay_s = command.max_queue_delay_s
        for pod in self.pods:
            if pod.gone_at is None:
                pod.replica.max_batch = command.batch_size
                pod.replica.delay_s = command.max_queue_delay_s
        active = self.active()
        for _ in range(command.replicas - len(active)):
            self.pods.append(
                Pod(
                    replica=Replica(
                        alpha_s=self.truth.alpha_s,
                        beta_s=self.truth.beta_s,
                        max_batch=command.batch_size,
                        delay_s=command.max_queue_delay_s,
                        capacity=self.config.queue_capacity,
                        start=now,
                    ),
                    requested_at=now,
                    ready_at=now + (self.config.cold_start_s if cold_start else 0.0),
                )
            )
        surplus = len(active) - command.replicas
        if surplus > 0:
            # Starting pods go first (a ReplicaSet deletes not-ready pods first), then the newest.
            victims = sorted(active, key=lambda p: (p.ready_at <= now, p.requested_at))[:surplus]
            for pod in victims:
                pod.removed_at = now
                if pod.ready_at > now or pod.replica.idle_at(now):
                    pod.gone_at = now


def simulate_cluster(
    trace: Trace,
    truth: ServiceTruth,
    controller: Controller,
    *,
    sla_s: float,
    config: ClusterConfig | None = None,
) -> SimulationResult:
    """Run `controller` over `trace` on replicas of `truth`, and report."""
    config = config or ClusterConfig()
    began = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    interval = config.interval_s
    count = max(1, math.ceil(trace.duration_s / interval - 1e-9))
    telemetry = Telemetry(
        intervals=count, interval_s=interval, sla_s=sla_s, overhead_s=truth.overhead_s
    )
    fleet = _Fleet(truth=truth, config=config)
    fleet.apply(controller.initial(), 0.0, cold_start=False)  # the Deployment already exists
    robin = 0
    ticks: list[_Tick] = []
    for k in range(count):
        start, end = k * interval, min((k + 1) * interval, trace.duration_s)
        observed_p99: float | None = None
        reason = "initial settings"
        if k > 0:
            ready_now = len(fleet.ready(start))
            observation = telemetry.observe(
                k, window_s=config.window_s, ready=ready_now, reporting=fleet.reporting(start)
            )
            observed_p99 = observation.p99_s
            current = InForce(len(fleet.active()), fleet.batch_size, fleet.delay_s)
            command = controller.decide(observation, current, now=start, interval=k)
            reason = command.reason
            fleet.apply(command, start, cold_start=controller.cold_start)
        ready_at_start = len(fleet.ready(start))
        cuts = sorted(
            {start, end} | {p.ready_at for p in fleet.active() if start < p.ready_at < end}
        )
        for lo, hi in itertools.pairwise(cuts):
            robin = _serve(fleet, telemetry, trace, rng, lo, hi, robin)
        telemetry.close(k)
        ticks.append(
            _Tick(
                start=start,
                replicas=len(fleet.active()),
                ready=ready_at_start,
                batch_size=fleet.batch_size,
                delay_s=fleet.delay_s,
                observed_p99_s=observed_p99,
                reason=reason,
            )
        )
    # Traffic has stopped: let every replica finish what it holds.
    telemetry.record(
        [p.replica.serve([], since=trace.duration_s, until=math.inf) for p in fleet.pods],
        alpha_s=truth.alpha_s,
        beta_s=truth.beta_s,
    )
    telemetry.close(count + 1)
    records = _records(fleet, telemetry, trace, ticks, interval)
    gpu_seconds = sum(p.billed(0.0, trace.duration_s) for p in fleet.pods)
    busy = float(telemetry.busy_s.sum())
    requests = int(telemetry.completed.sum() + telemetry.shed.sum())
    summary = summarize(
        records,
        sla_s=sla_s,
        within_sla=int(telemetry.within_sla.sum()),
        requests=requests,
        shed=int(telemetry.shed.sum()),
        gpu_seconds=gpu_seconds,
        busy_seconds=busy,
    )
    return SimulationResult(
        policy=controller.name,
        trace=trace.name,
        duration_s=trace.duration_s,
        sla_s=sla_s,
        service=truth.describe(),
        summary=summary,
        intervals=records,
        wall_s=time.perf_counter() - began,
        settings={
            "intervalS": config.interval_s,
            "windowS": config.window_s,
            "coldStartS": config.cold_start_s if controller.cold_start else 0.0,
            "queueCapacity": config.queue_capacity,
            "balancing": config.balancing,
            "seed": config.seed,
        },
    )


def _serve(
    fleet: _Fleet,
    telemetry: Telemetry,
    trace: Trace,
    rng: np.random.Generator,
    lo: float,
    hi: float,
    robin: int,
) -> int:
    """Serve [lo, hi): spread its arrivals over the ready pods, run every pod's batches."""
    arrivals = trace.arrivals(lo, hi, rng)
    ready = fleet.ready(lo)
    served: list[Served] = []
    if not ready:
        telemetry.record_shed(int(arrivals.shape[0]), lo)  # no endpoints: refused
    else:
        n = len(ready)
        if fleet.config.balancing == "random":
            target = rng.integers(0, n, size=arrivals.shape[0])
        else:
            target = (robin + np.arange(arrivals.shape[0])) % n
            robin = int((robin + arrivals.shape[0]) % n)
        order = np.argsort(target, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(target, minlength=n))])
        ordered = arrivals[order]
        for i, pod in enumerate(ready):
            mine = ordered[bounds[i] : bounds[i + 1]].tolist()
            result = pod.replica.serve(mine, since=lo, until=hi)
            telemetry.record_shed(result.shed, lo)
            served.append(result)
    for pod in fleet.pods:
        if pod.draining:
            served.append(pod.replica.serve([], since=lo, until=hi))
            if pod.replica.idle_at(hi):
                pod.gone_at = max(lo, pod.replica.free_at)
    telemetry.record(served, alpha_s=fleet.truth.alpha_s, beta_s=fleet.truth.beta_s)
    return robin


def _records(
    fleet: _Fleet, telemetry: Telemetry, trace: Trace, ticks: list[_Tick], interval: float
) -> list[IntervalRecord]:
    records = []
    for k, tick in enumerate(ticks):
        end = min(tick.start + interval, trace.duration_s)
        span = end - tick.start
        truth = telemetry.truth[k]
        billed = sum(p.billed(tick.start, end) for p in fleet.pods) / span
        batches = int(telemetry.batches[k].sum())
        busy = float(telemetry.busy_s[k])
        records.append(
            IntervalRecord(
                t=tick.start,
                offered_rps=trace.mean(tick.start, end),
                served_rps=truth.completed / span,
                shed_rps=truth.shed / span,
                p99_s=truth.p99_s,
                observed_p99_s=tick.observed_p99_s,
                replicas=tick.replicas,
                ready=tick.ready,
                billed=billed,
                batch_size=tick.batch_size,
                max_queue_delay_s=tick.delay_s,
                mean_batch=float(telemetry.rows[k].sum()) / batches if batches else None,
                utilization=busy / span / billed if billed else None,
                reason=tick.reason,
            )
        )
    return records
