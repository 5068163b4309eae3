"""The simulated Deployment: replicas that start, serve, drain and cost, under one controller.

Time moves one control interval at a time (15 s by default). At the start of each interval the
controller gets the Prometheus-style observation of the window that just ended and says how many
replicas it wants and with which batch settings; then the interval's traffic is served:

- arrivals are Poisson from the trace, drawn for the whole interval at once and spread over the
  ready replicas at random per request (a Kubernetes Service with kube-proxy) or round-robin;
  what arrives while no replica is ready reaches no runtime: it fails, and no counter sees it;
- each replica admits as the runtime does (`ClusterConfig.admission`): by default it refuses at
  arrival a request predicted to finish past the deadline the operator writes (the SLA less the
  latency outside the device, `children.deadline`), and sheds when its queue is full;
- a new replica costs GPU-seconds from the moment it is requested and takes traffic after the
  cold-start delay (image pull, model load, readiness probe) — the interval is cut where one
  becomes ready — and Prometheus scrapes it from then on;
- a removed replica stops receiving traffic at once, finishes what it has queued, and stops
  costing when it is drained; it is scraped until then. Replicas not ready are removed first
  (a ReplicaSet deletes them first: starting ones, and dark ones once NotReady, see below), then
  the oldest ready ones;
- batch settings reach every replica immediately (the operator PUTs them to each ready pod);
- a pod the controller replaces (a replica slower than its peers) takes no traffic from then
  on and drains, and the ReplicaSet creates another at once, which pays the cold start;
- a node may die under some replicas (`ClusterConfig.node_losses`), and Kubernetes finds out as
  it does: at `NodeLoss.at_s` the oldest ready replicas go dark (what they held queued fails,
  Prometheus scrapes them no more); for `notice_s` (the node controller's
  node-monitor-grace-period) they stay ready in the Deployment and in the Service's endpoints,
  and what the Service sends them fails; then they are NotReady — out of the endpoints and the
  ready count, still in the Deployment's replicas and still billed (the ReplicaSet replaces only
  deleted pods); `eviction_s` later (the taints' tolerationSeconds) they are deleted and the
  ReplicaSet at once creates a replacement for each, which pays the cold start like any new
  pod of the run. A dark replica a scale-down deletes is gone at once, without a drain. The
  batch a dark replica was running is counted as answered;
- replicas may slow down (`ClusterConfig.slowdowns`): from `Slowdown.at_s`, for
  `duration_s`, their batches take `factor` times as long — every replica's, new ones too (a
  heavier input mix, a shared GPU, a thermal limit across the fleet), or `count` ready
  ones' (a GPU that throttles, a node with a noisy neighbour: a replica that replaces one of
  them is normal again). Each runtime's admission predicts with its own pace, as the runtime's
  learns its batch times within seconds.

The Deployment exists before t = 0, idle, and Prometheus has scraped it for a window: the first
windows see the trace's traffic start, as an autopilot would. `ready_replicas` in an observation
is the Deployment's ready count at the decision; the replicas whose series Prometheus holds
(ready ones, draining ones, and gone ones until their series go stale) are the telemetry's.

An interval is cut wherever who serves changes: a replica becomes ready, a node dies, its loss
is noticed, its pods are evicted, a slowdown begins or ends. Loops are bounded by the number of
intervals and, inside an interval, by its cuts and replicas.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from batchpilot.api.batching import STARTUP_TIMING_MAX_ROWS
from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.operator.autopilot.prometheus import Seasonality
from batchpilot.operator.children.deadline import default_deadline_ms
from batchpilot.operator.children.node_loss import DEFAULT_EVICTION_S
from batchpilot.simulation.clients import Retries, RetryQueue
from batchpilot.simulation.observe import Telemetry
from batchpilot.simulation.policies import Command, Controller
from batchpilot.simulation.replica import FloatArray, Replica, Served
from batchpilot.simulation.report import IntervalRecord, SimulationResult, summarize
from batchpilot.simulation.service import ServiceTruth
from batchpilot.simulation.sized import SizedReplica
from batchpilot.simulation.trace import Trace

Balancing = Literal["random", "round-robin"]
Admission = Literal["deadline", "queue"]
FastSignal = Literal["scraped", "oracle"]


@dataclass(frozen=True, slots=True)
class Gpus:
    """The cluster's GPUs for the service: `count` pods hold one at once; a pod created beyond
    them is Pending (not schedulable, as Kubernetes says: `rollout.blocked`) until one frees or
    `more_at_s`, when a node autoscaler has added nodes for every pod asked (inf: never), and
    starts its cold start then. A Pending pod costs nothing."""

    count: int
    more_at_s: float = math.inf

    def __post_init__(self) -> None:
        if self.count < 1 or self.more_at_s < 0:
            raise ValueError("the cluster holds at least one GPU, added at a time >= 0")


@dataclass(frozen=True, slots=True)
class NodeLoss:
    """A node that dies under `count` ready replicas at `at_s`, as Kubernetes then acts."""

    at_s: float
    count: int = 1
    """Ready replicas on the node: the oldest ready ones go dark."""
    notice_s: float = 40.0
    """Until the node controller marks the node NotReady (its node-monitor-grace-period): the
    dark replicas stay ready and in the Service's endpoints meanwhile."""
    eviction_s: float = DEFAULT_EVICTION_S
    """From then until the pods are deleted and replaced: the tolerationSeconds of the
    not-ready and unreachable taints in the pod template (Kubernetes gives 300 s where it names
    none; the operator renders `runtime.nodeLossTolerationSeconds`)."""

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.count < 1 or self.notice_s < 0 or self.eviction_s < 0:
            raise ValueError("a node loss needs a time >= 0, >= 1 replica, and delays >= 0")

    @property
    def noticed_s(self) -> float:
        """When its replicas become NotReady."""
        return self.at_s + self.notice_s

    @property
    def evicted_s(self) -> float:
        """When its replicas are deleted and the ReplicaSet replaces them."""
        return self.noticed_s + self.eviction_s

    def describe(self) -> dict[str, float]:
        return {
            "atS": self.at_s,
            "count": self.count,
            "noticeS": self.notice_s,
            "evictionS": self.eviction_s,
        }


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Batches that take `factor` times as long from `at_s` for `duration_s`: on every replica,
    those started meanwhile too (`count` None), or on the `count` oldest ready ones."""

    at_s: float
    factor: float
    duration_s: float = math.inf
    count: int | None = None

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.duration_s <= 0 or (self.count is not None and self.count < 1):
            raise ValueError("a slowdown needs a time >= 0, a duration > 0 and >= 1 replica")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError("a slowdown's factor is a positive number (2: twice as long)")

    @property
    def until_s(self) -> float:
        return self.at_s + self.duration_s

    @classmethod
    def parse(cls, text: str) -> Slowdown:
        """`AT_S:FACTOR[:DURATION_S[:COUNT]]`: `600:1.5` every replica 1.5× slower from 600 s
        on; `600:2:900:1` one replica twice as slow for 900 s."""
        parts = text.split(":")
        if not 2 <= len(parts) <= 4:
            raise ValueError(f"{text!r} is not AT_S:FACTOR[:DURATION_S[:COUNT]]")
        try:
            at, factor = float(parts[0]), float(parts[1])
            duration = float(parts[2]) if len(parts) > 2 and parts[2] else math.inf
            count = int(parts[3]) if len(parts) > 3 else None
        except ValueError:
            raise ValueError(f"{text!r} is not AT_S:FACTOR[:DURATION_S[:COUNT]]") from None
        return cls(at, factor, duration, count)

    def describe(self) -> dict[str, float | int | None]:
        return {
            "atS": self.at_s,
            "factor": self.factor,
            "durationS": self.duration_s if math.isfinite(self.duration_s) else None,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    interval_s: float = 15.0
    """The autopilot's control interval (the operator's `autopilot_interval_seconds`)."""
    window_s: float = 60.0
    """The metrics window (the operator's `metrics_window_seconds`)."""
    cold_start_s: float = 30.0
    queue_capacity: int = 1024
    """Requests one replica queues before it sheds (the runtime's `queue_capacity`)."""
    admission: Admission = "deadline"
    """"deadline": a replica refuses at arrival what it predicts would finish past the deadline
    the operator writes (the SLA less the latency outside the device), as the runtime does;
    "queue": it refuses only when its queue is full."""
    burst: bool = True
    """Under deadline admission a replica's backlog of more requests than the limit runs in one
    batch of up to the largest batch size (`scaling.maxBatchSize`, the burst size the operator
    writes in mode auto), as the runtime forms it; False: never beyond the limit."""
    scrape_interval_s: float = 15.0
    """Prometheus' scrape interval for the replicas (the chart's ServiceMonitor); 0: the exact
    view, windows aligned to the control interval and complete at each decision."""
    recent_window_s: float = 30.0
    """The window of the fast arrival rate (`Observation.recent_qps`): the operator's
    `recent_window_seconds`. `rate()` needs two scrapes inside it, or there is no value."""
    fast_signal: FastSignal = "scraped"
    """"scraped": the fast signal is the arrival counter's `irate` between the last two scrapes,
    as the operator reads it; "oracle": the trace's own rate at the moment of the decision,
    without sampling noise — faster and truer than any signal a runtime can export (a queue
    depth gauge, a shorter scrape), so what it buys bounds what such a signal could."""
    balancing: Balancing = "random"
    seasonality: Seasonality | None = field(default_factory=Seasonality)
    """The seasonal forecast's period, periods and look-ahead (the operator's
    `seasonal_*` settings; the same default, a day); None: off."""
    seed: int = 0
    node_losses: tuple[NodeLoss, ...] = ()
    """Nodes that die during the run (none by default)."""
    slowdowns: tuple[Slowdown, ...] = ()
    """Replicas whose batches slow down during the run (none by default)."""
    retries: Retries | None = None
    """Clients send what is refused again (`clients`); None: a refused request is dropped."""
    gpus: Gpus | None = None
    """The GPUs the cluster has for the service (`Gpus`); None: a GPU for every pod asked."""
    blocked_seen: bool = True
    """Whether the observations count the Pending pods as blocked, as the operator reads them
    from the pods it watches; False: as an operator that read only the Deployment's counts did
    (every pod not ready starting)."""
    clump: float = 1.0
    """Requests arrive in clumps of this mean size, all of a clump at once (`Trace.arrivals`):
    a client's fan-out, a gateway's bursts. 1: one at a time, Poisson."""
    rows_spread: bool = True
    """Where the service's requests bring varied rows (`ServiceTruth.row_mix`): whether the
    replicas export their spread (`batchpilot_arrival_rows_squared_total`) — runtimes before it
    did not, and the autopilot planned by the mean rows alone."""
    basic_signals: bool = False
    """Hand the policies only the basic signals — P99, P95, the served and refused rates, the
    queue's P99, the busy share, the mean batch and the ready replicas — as a runtime or an
    exporter without batchpilot's own series (batch times by size, arrivals, the recent rate,
    the start-up timing) would have them."""
    busy_signals: bool = False
    """Fewer still: P99, P95, the served and refused rates, the queue's P99, the busy share and
    the ready replicas, nothing of the batches (no mean batch) — an exporter that counts requests
    and reads the device's utilization, and nothing more."""

    def __post_init__(self) -> None:
        if self.scrape_interval_s < 0 or self.recent_window_s <= 0 or self.window_s <= 0:
            raise ValueError("windows must be positive and the scrape interval not negative")
        if not (math.isfinite(self.clump) and self.clump >= 1):
            raise ValueError("the mean clump is at least 1 request")
        if len({loss.eviction_s for loss in self.node_losses}) > 1:
            raise ValueError("node losses evict after one time: the pod template's tolerations")

    @property
    def eviction_s(self) -> float:
        """When Kubernetes evicts a replica after its node's loss is noticed, as the pod
        template's tolerations say (what the autopilot reads from them)."""
        return self.node_losses[0].eviction_s if self.node_losses else DEFAULT_EVICTION_S


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
    index: int
    """Its name, in effect: the order in which the Deployment created it."""
    replica: Replica | SizedReplica
    requested_at: float
    ready_at: float
    limit: int
    """The batch limit in force, in rows (the replica counts whole requests)."""
    removed_at: float | None = None
    gone_at: float | None = None
    """When it stopped costing: removal while starting, or the end of its drain."""
    lost: NodeLoss | None = None
    """The loss of its node: it serves nothing from `lost.at_s` on."""
    pace: float = 1.0
    """Its batches take this many times t(b) (`Slowdown`)."""
    scheduled_at: float | None = None
    """When it got a node (a GPU); None: Pending (`Gpus`)."""

    def is_ready(self, t: float) -> bool:
        """Ready as Kubernetes sees it: started, and its node's loss not yet noticed."""
        return self.ready_at <= t and (self.lost is None or t < self.lost.noticed_s)

    @property
    def draining(self) -> bool:
        return self.removed_at is not None and self.gone_at is None

    def billed(self, start: float, end: float) -> float:
        """GPU-seconds of this pod within [start, end)."""
        if self.scheduled_at is None:
            return 0.0  # Pending: it holds no GPU
        stop = end if self.gone_at is None else min(end, self.gone_at)
        return max(0.0, stop - max(start, self.scheduled_at))


@dataclass
class _Fleet:
    truth: ServiceTruth
    config: ClusterConfig
    telemetry: Telemetry
    deadline_s: float | None
    burst_rows: int | None = None
    """The runtime's burst size, in rows; None: none."""
    pods: list[Pod] = field(default_factory=list)
    batch_size: int = 1
    delay_s: float = 0.0
    losses: list[NodeLoss] = field(init=False, default_factory=list)
    """Node losses still to come, soonest first."""
    pace: float = 1.0
    """The fleet-wide slowdowns' factor in force: new replicas start at it."""
    slowing: list[tuple[float, bool, Slowdown]] = field(init=False, default_factory=list)
    """Slowdowns' beginnings and ends still to come, soonest first: (when, begins, which)."""
    slowed: dict[int, list[Pod]] = field(init=False, default_factory=dict)
    """The replicas each slowdown of some replicas slowed (by its place in the config)."""

    def __post_init__(self) -> None:
        self.losses = sorted(self.config.node_losses, key=lambda loss: loss.at_s)
        moments = [(s.at_s, True, s) for s in self.config.slowdowns]
        moments += [(s.until_s, False, s) for s in self.config.slowdowns if s.until_s < math.inf]
        self.slowing = sorted(moments, key=lambda m: (m[0], m[1]))

    def active(self) -> list[Pod]:
        """Pods that are wanted (starting, ready, or dark and not yet deleted), oldest first."""
        return [p for p in self.pods if p.removed_at is None]

    def ready(self, t: float) -> list[Pod]:
        """The Deployment's ready pods, which are the Service's endpoints."""
        return [p for p in self.active() if p.is_ready(t)]

    def blocked(self) -> int:
        """Pods wanted that cannot be scheduled (`Gpus`): what the operator counts as blocked."""
        return sum(1 for p in self.active() if p.scheduled_at is None)

    def _schedule(self, t: float, *, cold_start: bool) -> None:
        """Pending pods get the GPUs free at `t`, oldest first (all of them once the node
        autoscaler has added nodes), and start their cold start."""
        gpus = self.config.gpus
        if gpus is None:
            return
        holding = sum(1 for p in self.pods if p.scheduled_at is not None and p.gone_at is None)
        for pod in self.active():
            if pod.scheduled_at is not None:
                continue
            if holding >= gpus.count and t < gpus.more_at_s:
                break
            pod.scheduled_at = t
            pod.ready_at = t + (self.config.cold_start_s if cold_start else 0.0)
            holding += 1
            largest = max(self.batch_size, self.burst_rows or 0)
            self.telemetry.add_target(pod.index, since=pod.ready_at, batch_limit=largest)

    def reporting(self, t: float) -> int:
        """Pods whose metrics Prometheus has: ready ones that still answer, and ones draining."""
        answering = sum(1 for p in self.ready(t) if p.lost is None)
        return answering + sum(1 for p in self.pods if p.draining)

    def next_change(self, t: float, end: float) -> float:
        """The first moment after `t`, up to `end`, that changes who serves: a pod becoming
        ready, a node dying, its loss noticed, its pods evicted."""
        moments = [p.ready_at for p in self.active() if t < p.ready_at < end]
        gpus = self.config.gpus
        if gpus is not None and t < gpus.more_at_s < end:
            moments.append(gpus.more_at_s)
        for loss in self.config.node_losses:
            moments += [m for m in (loss.at_s, loss.noticed_s, loss.evicted_s) if t < m < end]
        moments += [m for m, _, _ in self.slowing if t < m < end]
        return min(moments, default=end)

    def advance(self, t: float, *, cold_start: bool) -> None:
        """What Kubernetes does by `t` on its own: nodes die, their pods are evicted, and the
        ReplicaSet replaces each evicted pod (the Deployment still wants it)."""
        while self.losses and self.losses[0].at_s <= t:
            loss = self.losses.pop(0)
            for pod in [p for p in self.ready(loss.at_s) if p.lost is None][: loss.count]:
                pod.lost = loss
                # What it held never gets an answer; Prometheus' scrapes of it fail.
                self.telemetry.record_unreached(pod.replica.waiting, loss.at_s)
                self.telemetry.remove_target(pod.index, at=loss.at_s)
        for pod in self.active():
            if pod.lost is not None and pod.lost.evicted_s <= t:
                at = pod.lost.evicted_s
                pod.removed_at = at
                self.retire(pod, at)
                self._create(at, cold_start=cold_start)
        while self.slowing and self.slowing[0][0] <= t:
            at, begins, slowdown = self.slowing.pop(0)
            self._slow(slowdown, at, begins=begins)
        self._schedule(t, cold_start=cold_start)

    def _slow(self, slowdown: Slowdown, at: float, *, begins: bool) -> None:
        """A slowdown begins or ends at `at`: its replicas' batches change pace."""
        factor = slowdown.factor if begins else 1.0 / slowdown.factor
        key = self.config.slowdowns.index(slowdown)
        if slowdown.count is None:
            self.pace *= factor
            pods = [p for p in self.pods if p.gone_at is None]
        elif begins:
            ready = [p for p in self.ready(at) if p.lost is None]
            pods = self.slowed[key] = ready[: slowdown.count]
        else:
            pods = [p for p in self.slowed.pop(key, []) if p.gone_at is None]
        for pod in pods:
            pod.pace *= factor
            self._paced(pod)

    def paces(self) -> dict[int, float]:
        """Each slowed pod's pace."""
        return {p.index: p.pace for p in self.pods if p.pace != 1.0}

    def _paced(self, pod: Pod) -> None:
        pod.replica.alpha_s = self.truth.alpha_s * pod.pace
        pod.replica.beta_s = self.truth.replica_beta_s * pod.pace

    def retire(self, pod: Pod, at: float) -> None:
        """It stops costing, and Prometheus stops scraping it."""
        pod.gone_at = at
        self.telemetry.remove_target(pod.index, at=at)

    def apply(
        self, command: Command, now: float, *, cold_start: bool, scraped_since: float | None = None
    ) -> None:
        """Put `command` in force at `now`. New pods are scraped once ready, or from
        `scraped_since` (pods that existed, idle, before the simulation began)."""
        self.batch_size = command.batch_size
        self.delay_s = command.max_queue_delay_s
        # The batch-size buckets a replica exports: up to the largest batch it may run.
        largest = max(command.batch_size, self.burst_rows or 0)
        for pod in self.pods:
            if pod.gone_at is None and pod.lost is None:
                if pod.limit != command.batch_size:
                    self.telemetry.batch_limit(pod.index, largest, at=now)
                pod.limit = command.batch_size
                pod.replica.max_batch = self.truth.replica_limit(command.batch_size)
                pod.replica.delay_s = command.max_queue_delay_s
        for name in command.replace:
            self._replace(name, now, cold_start=cold_start)
        active = self.active()
        for _ in range(command.replicas - len(active)):
            self._create(now, cold_start=cold_start, scraped_since=scraped_since)
        surplus = len(active) - command.replicas
        if surplus > 0:
            # Not-ready pods go first (a ReplicaSet deletes them first): Pending ones, starting
            # ones, and dark ones once their loss is noticed; then the ready ones, the oldest
            # first.
            victims = sorted(
                active,
                key=lambda p: (p.is_ready(now), p.scheduled_at is not None, p.requested_at),
            )[:surplus]
            for pod in victims:
                pod.removed_at = now
                if pod.ready_at > now or pod.lost is not None or pod.replica.idle_at(now):
                    self.retire(pod, now)
        self._schedule(now, cold_start=cold_start)

    def _replace(self, name: str, now: float, *, cold_start: bool) -> None:
        """Pod `name` is deleted: it takes no more traffic and drains, and the ReplicaSet at
        once creates another (at the fleet's pace: a slowdown of some replicas stays with
        them)."""
        pod = next((p for p in self.active() if str(p.index) == name), None)
        if pod is None:
            return
        pod.removed_at = now
        if pod.ready_at > now or pod.lost is not None or pod.replica.idle_at(now):
            self.retire(pod, now)
        self._create(now, cold_start=cold_start)

    def _create(self, now: float, *, cold_start: bool, scraped_since: float | None = None) -> None:
        """A new pod with the settings in force, scraped once ready (or from `scraped_since`)."""
        pod = Pod(
            index=len(self.pods),
            replica=self.truth.replica(
                max_batch=self.batch_size,
                delay_s=self.delay_s,
                capacity=self.config.queue_capacity,
                deadline_s=self.deadline_s,
                burst=(
                    None if self.burst_rows is None else self.truth.replica_limit(self.burst_rows)
                ),
                start=now,
                seed=self.config.seed * 100_003 + len(self.pods),
            ),
            limit=self.batch_size,
            requested_at=now,
            ready_at=now + (self.config.cold_start_s if cold_start else 0.0),
            pace=self.pace,
        )
        if pod.pace != 1.0:
            self._paced(pod)
        gpus = self.config.gpus
        holding = sum(1 for p in self.pods if p.scheduled_at is not None and p.gone_at is None)
        self.pods.append(pod)
        if gpus is not None and holding >= gpus.count and now < gpus.more_at_s:
            pod.ready_at = math.inf  # Pending: scraped once scheduled and started (`_schedule`)
            return
        pod.scheduled_at = now
        since = pod.ready_at if scraped_since is None else scraped_since
        largest = max(self.batch_size, self.burst_rows or 0)
        self.telemetry.add_target(pod.index, since=since, batch_limit=largest)


def startup_timing(
    truth: ServiceTruth, rows: int | None, *, admission: Admission
) -> tuple[ComputePoint, ...]:
    """The batch times a replica exports from its start-up timing: t(1) and t(rows), exact (a
    simulated accelerator's are), or none (queue admission times none)."""
    if rows is None or admission != "deadline":
        return ()
    sizes = sorted({1, min(rows, STARTUP_TIMING_MAX_ROWS)})
    return tuple(ComputePoint(float(b), truth.alpha_s + truth.beta_s * b, 0.0) for b in sizes)


def simulate_cluster(
    trace: Trace,
    truth: ServiceTruth,
    controller: Controller,
    *,
    sla_s: float,
    config: ClusterConfig | None = None,
    calibration_rows: int | None = None,
    burst_rows: int | None = None,
) -> SimulationResult:
    """Run `controller` over `trace` on replicas of `truth`, and report. `calibration_rows`:
    the larger batch every replica times at start-up, beside 1 row, as the runtime does under
    deadline admission (None: none timed); `burst_rows`: the runtime's burst size, where
    `config.burst` and deadline admission let it grow batches (None: none)."""
    config = config or ClusterConfig()
    began = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    interval = config.interval_s
    count = max(1, math.ceil(trace.duration_s / interval - 1e-9))
    telemetry = Telemetry(
        intervals=count,
        interval_s=interval,
        sla_s=sla_s,
        overhead_s=truth.overhead_s,
        window_s=config.window_s,
        recent_window_s=config.recent_window_s,
        scrape_interval_s=config.scrape_interval_s,
        seasonality=config.seasonality,
        seed=config.seed,
        startup=startup_timing(truth, calibration_rows, admission=config.admission),
        rows_cv=truth.row_mix.cv if truth.row_mix is not None and config.rows_spread else None,
    )
    deadline_s = (
        default_deadline_ms(sla_ms=sla_s * 1e3, outside_s=truth.overhead_s) / 1e3
        if config.admission == "deadline"
        else None
    )
    fleet = _Fleet(
        truth=truth,
        config=config,
        telemetry=telemetry,
        deadline_s=deadline_s,
        burst_rows=burst_rows if config.burst and deadline_s is not None else None,
    )
    # The Deployment already exists, idle, and Prometheus has scraped it for a while.
    history = max(config.window_s, config.recent_window_s) + config.scrape_interval_s
    fleet.apply(controller.initial(), 0.0, cold_start=False, scraped_since=-history)
    fleet.advance(0.0, cold_start=controller.cold_start)
    robin = 0
    ticks: list[_Tick] = []
    retrying = None if config.retries is None else RetryQueue(config.retries)
    step = math.inf if config.retries is None else config.retries.step_s
    steps = 0 if config.retries is None else math.ceil(interval / step)
    for k in range(count):
        start, end = k * interval, min((k + 1) * interval, trace.duration_s)
        observed_p99: float | None = None
        reason = "initial settings"
        if k > 0:
            ready_now = len(fleet.ready(start))
            observation = telemetry.observe(k, ready=ready_now, reporting=fleet.reporting(start))
            if config.blocked_seen and fleet.blocked():
                observation = replace(observation, blocked_replicas=fleet.blocked())
            if config.fast_signal == "oracle":
                observation = replace(
                    observation,
                    recent_qps=trace.rate_at(start - 1e-9),
                    recent_window_s=config.window_s,
                )
            if config.basic_signals or config.busy_signals:
                observation = basic(observation, batches=not config.busy_signals)
            observed_p99 = observation.p99_s
            current = InForce(len(fleet.active()), fleet.batch_size, fleet.delay_s)
            command = controller.decide(observation, current, now=start, interval=k)
            reason = command.reason
            fleet.apply(command, start, cold_start=controller.cold_start)
        ready_at_start = len(fleet.ready(start))
        # Every pass serves up to the next cut; each cut is a pod's readiness or a loss' moment
        # (and, while clients retry, at most a retry step after the last).
        lo = start
        cuts = len(fleet.pods) + 4 * len(config.node_losses) + 2 * len(config.slowdowns)
        for _ in range(cuts + 2 + steps):
            if lo >= end:
                break
            hi = min(fleet.next_change(lo, end), lo + step)
            robin = _serve(fleet, telemetry, trace, rng, lo, hi, robin, retrying)
            fleet.advance(hi, cold_start=controller.cold_start)
            lo = hi
        else:
            raise AssertionError("the interval's cuts did not end")  # pragma: no cover
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
        [
            (p.index, p.replica.serve([], since=trace.duration_s, until=math.inf))
            for p in fleet.pods
            if p.lost is None
        ],
        truth=truth,
        paces=fleet.paces(),
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
        clients=None if retrying is None else _clients(retrying, telemetry),
        settings={
            "intervalS": config.interval_s,
            "windowS": config.window_s,
            "coldStartS": config.cold_start_s if controller.cold_start else 0.0,
            "queueCapacity": config.queue_capacity,
            "admission": config.admission,
            "deadlineS": deadline_s,
            "scrapeIntervalS": config.scrape_interval_s,
            "recentWindowS": config.recent_window_s,
            "balancing": config.balancing,
            "seasonalPeriodS": None if config.seasonality is None else config.seasonality.period_s,
            "seed": config.seed,
            "nodeLosses": [loss.describe() for loss in config.node_losses],
            **(
                {"slowdowns": [slow.describe() for slow in config.slowdowns]}
                if config.slowdowns
                else {}
            ),
            **({} if config.retries is None else {"retries": config.retries.describe()}),
            **({} if config.clump == 1 else {"clump": config.clump}),
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
    retrying: RetryQueue | None = None,
) -> int:
    """Serve [lo, hi): spread its arrivals — the trace's, and the retries due — over the ready
    pods, run every pod's batches; what is refused goes back to `retrying`. Retries the clients
    mark are served as any arrival and counted apart: the arrival signals have the first
    attempts alone (`attempt!="retry"`)."""
    arrivals = trace.arrivals(lo, hi, rng, clump=fleet.config.clump)
    first = arrivals.shape[0]
    retried: np.ndarray[Any, np.dtype[np.bool_]] | None = None
    if retrying is not None and retrying.waiting:
        both = np.concatenate([arrivals, retrying.due(hi)])
        order = np.argsort(both, kind="stable")
        arrivals = both[order]
        if retrying.retries.marked:
            retried = order >= first
    telemetry.record_offered(arrivals if retried is None else arrivals[~retried])
    ready = fleet.ready(lo)
    served: list[tuple[int, Served]] = []
    unreached: list[FloatArray] = []
    if not ready:
        telemetry.record_unreached(int(arrivals.shape[0]), lo)  # no endpoints: refused
        unreached.append(arrivals)
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
        demand = None if retried is None else ~retried[order]
        for i, pod in enumerate(ready):
            mine = ordered[bounds[i] : bounds[i + 1]]
            if pod.lost is not None:
                # Its node is dead and nobody knows yet: what the Service sends it fails.
                telemetry.record_unreached(int(mine.shape[0]), lo)
                unreached.append(mine)
                continue
            if demand is None:
                telemetry.record_arrivals(pod.index, mine)
            else:
                fresh = demand[bounds[i] : bounds[i + 1]]
                telemetry.record_arrivals(pod.index, mine[fresh], retried=mine[~fresh])
            served.append((pod.index, pod.replica.serve(mine.tolist(), since=lo, until=hi)))
    for pod in fleet.pods:
        if pod.draining:
            served.append((pod.index, pod.replica.serve([], since=lo, until=hi)))
            if pod.replica.idle_at(hi):
                fleet.retire(pod, max(lo, pod.replica.free_at))
    telemetry.record(served, truth=fleet.truth, paces=fleet.paces())
    if retrying is not None:
        refused = [*unreached, *(r.shed_at for _, r in served), *(r.refused_at for _, r in served)]
        if refused:
            retrying.refused(np.sort(np.concatenate(refused)), rng, lo=lo, hi=hi)
        retrying.settle()
    return robin


def _clients(retrying: RetryQueue, telemetry: Telemetry) -> dict[str, int]:
    """What became of the clients' requests: sent (the trace's, each once), retried, never
    served (refused on their last attempt, or still waiting to retry at the end)."""
    offered = int(telemetry.offered.sum())  # the first attempts alone, where retries are marked
    return {
        "requests": offered if retrying.retries.marked else offered - retrying.sent,
        "retries": retrying.sent,
        "gaveUp": retrying.gave_up + retrying.waiting,
    }


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
                in_sla_rps=truth.within_sla / span,
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


def basic(observation: Observation, *, batches: bool = True) -> Observation:
    """`observation` with only the basic signals (`ClusterConfig.basic_signals`); without the
    mean batch where not `batches` (`ClusterConfig.busy_signals`)."""
    return Observation(
        at=observation.at,
        window_s=observation.window_s,
        p99_s=observation.p99_s,
        p95_s=observation.p95_s,
        qps=observation.qps,
        rejected_qps=observation.rejected_qps,
        queue_p99_s=observation.queue_p99_s,
        utilization=observation.utilization,
        mean_batch=observation.mean_batch if batches else None,
        ready_replicas=observation.ready_replicas,
        blocked_replicas=observation.blocked_replicas,  # the pods', not the metrics'
    )
