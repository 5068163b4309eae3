"""What the decision is about: the policy the spec sets, the settings in force, the decision.

`decide` and the steps it delegates to (the capacity plan, the pacing of replicas) all speak of
these, and so do the pilot and the simulator that run `decide`; they live apart from any one
step so that every step can import them without importing the others.

Pure: data and arithmetic, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchpilot.operator.autopilot.slo import Objective
from batchpilot.operator.children.node_loss import DEFAULT_EVICTION_S

SLA_HEADROOM = 0.8
"""Plan for predicted P99 at most this fraction of the SLA — of the part the batcher spends: the
latency outside it (the learned overhead) is the same whatever the replicas and batch limit."""
LOAD_HEADROOM = 1.25
"""Or plan for a load this many times the planned one with P99 just inside the SLA (`NEAR_SLA`),
whichever lets a replica carry more (`capacity.replica_capacity`). Both keep room for the load
to rise and the model to err before the next decision, and on a service whose batches take
mostly a fixed time the latency headroom costs far more: its P99 is near twice a batch's time
at any load up to the knee, so 20 % of the latency is half the batch the SLA allows, and half
the load a replica carries; 20 % of the load costs 20 %. Where a batch's time grows with its
size (the textbook's ResNet-50), the latency headroom is the cheaper one and is kept."""
NEAR_SLA = 0.95
"""The load headroom's P99 bound, as a fraction of the SLA's part the batcher spends: room for
the quantile's own noise (a histogram's buckets, one window's sample)."""


def p99_bounds(sla_s: float, overhead_s: float) -> tuple[float, float]:
    """(the latency headroom's P99 target, the load headroom's P99 bound) for an SLA, with
    `overhead_s` spent outside the batcher: the headroom applies to the part the knobs move."""
    outside = min(max(0.0, overhead_s), sla_s)
    return (
        outside + SLA_HEADROOM * (sla_s - outside),
        outside + NEAR_SLA * (sla_s - outside),
    )


@dataclass(frozen=True, slots=True)
class Policy:
    """What the InferenceService spec asks of the autopilot."""

    sla_p99_s: float
    min_utilization: float
    """The device's busy fraction (0–1) below which, with P99 under half the SLA, the feedback
    rule gives back a replica (`spec.sla.gpuUtilization.min` / 100)."""
    min_replicas: int
    max_replicas: int
    max_batch_size: int
    scale_down_delay_s: float
    max_queue_delay_s: float
    objective: Objective = field(default_factory=Objective)
    """How often the SLA must hold (`spec.sla.objectivePercent` over `spec.sla.window`)."""
    evicted_after_s: float = DEFAULT_EVICTION_S
    """How long after its node is lost Kubernetes evicts a replica and replaces it: the pod
    template's tolerations (`lost.eviction_s`); Kubernetes' default where they name none."""
    replaced_in_place: int = 0
    """Replicas a rollout in place has down at once while it is under way (the Deployment's
    maxUnavailable, `rollout.rolling_in_place`): not ready by design, so no loss."""
    replace_slow: bool = True
    """Replace replicas slower than their peers (`spec.scaling.replaceSlowReplicas`); False:
    only say so."""
    rolling: bool = False
    """A rollout is under way: the replicas run different templates (a new model version, a
    variant), whose batch times may differ by design — none is slow for it (`stragglers`)."""
    serving: str | None = None
    """What serves (a fingerprint of the model and of what runs it: `pilot.serving_of`): where
    it changed, what was learned of the batch times is another model's (`learn.unlearned`).
    None: not known (the simulator's)."""
    acting: bool = True
    """The decisions are applied (`spec.scaling.mode` auto). False in mode recommend, where
    they are only reported: no replica asked for is coming (no cold start to measure when the
    count in force is reached — it always is) and the batch settings in force did not change
    (the windows describe them: a limit recommended and never set left every window
    unsettled)."""

    def __post_init__(self) -> None:
        # One replica at least, as the CRD's minReplicas: the autopilot has no scale to zero,
        # and no prediction for a load carried by none.
        if self.min_replicas < 1:
            object.__setattr__(self, "min_replicas", 1)
        if self.max_replicas < self.min_replicas:
            object.__setattr__(self, "max_replicas", self.min_replicas)


@dataclass(frozen=True, slots=True)
class InForce:
    """Replicas and batch settings currently applied."""

    replicas: int
    batch_size: int
    max_queue_delay_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    batch_size: int
    max_queue_delay_s: float
    action: str
    """hold | steady | scale-up | scale-down | retune (batch settings only)."""
    reason: str
    metrics_available: bool
    sla_met: bool | None
    """None when unknown (no metrics, or no traffic)."""
    scaling_limited: str | None = None
    """Why the autopilot cannot do what the SLA needs (at maxReplicas), for the condition."""
    below_floor: str | None = None
    """Why no replica can meet the SLA (a request alone takes longer), for the condition."""
    predicted_p99_s: float | None = None
    capacity_rps: float | None = None
    """Requests per second one replica carries inside the target at the chosen batch limit."""
    notes: tuple[str, ...] = field(default=())
    replace: tuple[str, ...] = field(default=())
    """Pods to delete for the ReplicaSet to start afresh: replicas slower than their peers
    (`stragglers`)."""

    def changes(self, current: InForce) -> bool:
        return (self.replicas, self.batch_size, self.max_queue_delay_s) != (
            current.replicas,
            current.batch_size,
            current.max_queue_delay_s,
        )


def stored_delay_s(delay_s: float) -> float:
    """A queue delay as the batching document stores it — milliseconds to three decimals — and
    as it reads back: a decision in these units is exactly the value in force on the next tick.
    (0.1 × 0.1 s is 0.010000000000000002 s in floating point, which read back as 10.0 ms would
    differ from the decision on every tick and rewrite every pod each interval.)"""
    return round(delay_s * 1e3, 3) / 1e3


def format_ms(seconds: float | None) -> str:
    """A duration as the decision's reasons write it: whole milliseconds, ∞, or n/a."""
    if seconds is None:
        return "n/a"
    return "∞" if math.isinf(seconds) else f"{seconds * 1e3:.0f} ms"
