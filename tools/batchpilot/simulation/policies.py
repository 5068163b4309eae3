"""Who turns the knobs in a simulation: the autopilot, and the baselines it is judged against.

Every controller sees the same thing at each control interval — the Prometheus-style
`Observation` and the settings in force — and answers with replicas, batch limit and queue delay.

- `AutopilotController` runs the operator's own `decide` with the spec's `Policy`, carrying its
  `State` from tick to tick exactly as the operator carries it in `status.autopilot`: written
  into the document as a merge patch and read back from it, rounding and all.
- `HpaController` is Kubernetes' HorizontalPodAutoscaler on GPU utilization: desired =
  ceil(replicas × utilization / target) outside a ±10 % tolerance, not-ready pods counted as idle
  when scaling up, scale-up at most max(2×, +4) per 15 s (the HPA's default behaviour), scale-down
  to the highest recommendation of the stabilization window (300 s), missing metrics hold.
  The batch limit is fixed (HPA does not know it exists).
- `StaticController` provisions once, for the trace's peak, and never moves.
- `OracleController` knows the trace: for each interval it provisions the fewest replicas (and
  the batch limit) whose true capacity at the SLA — measured on the simulated service, see
  `capacity` — covers the interval's peak rate. The simulation runs it without cold starts.
- `ReactiveController` is the best any reactive policy could hope for, a bound rather than a
  baseline: it knows the rate at the moment it decides (exactly, not a window's average) and the
  true capacity, but not the future, and its new replicas pay the cold start. It provisions
  `margin` times that rate and scales down only to the highest provision of the last `hold_s`
  seconds (the scale-down delay). What it cannot reach, no controller that reacts can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.reporting import clearing
from batchpilot.operator.autopilot.state import State
from batchpilot.sandbox.patching import merge_patch
from batchpilot.simulation.capacity import Capacity
from batchpilot.simulation.trace import Trace


@dataclass(frozen=True, slots=True)
class Command:
    """What a controller wants in force from now on, and why."""

    replicas: int
    batch_size: int
    max_queue_delay_s: float
    reason: str = ""
    replace: tuple[str, ...] = ()
    """Pods to delete for the ReplicaSet to start afresh (by their index in the run)."""


class Controller(Protocol):
    name: str

    @property
    def cold_start(self) -> bool:
        """Whether new replicas pay the cold-start delay (only the oracle does not)."""
        ...

    def initial(self) -> Command: ...

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command: ...


@dataclass
class AutopilotController:
    policy: Policy
    start: InForce
    state: State = field(default_factory=State)
    status: dict[str, Any] = field(default_factory=dict)
    """`status.autopilot`, the document the state goes through between decisions."""
    name: str = "autopilot"
    cold_start: bool = True

    def initial(self) -> Command:
        return Command(
            self.start.replicas, self.start.batch_size, self.start.max_queue_delay_s, "spec"
        )

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        decision, state = decide(observation, self.policy, current, self.state, now)
        # Kept as the operator keeps it: written into `status.autopilot` as a merge patch (what
        # the memory dropped written null) and read back from the document, rounding and all.
        self.status = merge_patch(self.status, clearing(state.to_dict(), self.status))
        self.state = State.from_dict(self.status)
        return Command(
            decision.replicas,
            decision.batch_size,
            decision.max_queue_delay_s,
            decision.reason,
            replace=decision.replace,
        )


HPA_SCALE_UP_PODS = 4
"""The HPA's default scale-up policies: +100 % or +4 pods per 15 s, whichever is more."""


@dataclass
class HpaController:
    target: float
    tolerance: float
    stabilization_s: float
    min_replicas: int
    max_replicas: int
    batch_size: int
    max_queue_delay_s: float
    start_replicas: int
    name: str = "hpa"
    cold_start: bool = True
    recommendations: list[tuple[float, int]] = field(default_factory=list)

    def initial(self) -> Command:
        return Command(self.start_replicas, self.batch_size, self.max_queue_delay_s, "start")

    def _hold(self, current: InForce, reason: str) -> Command:
        return Command(current.replicas, self.batch_size, self.max_queue_delay_s, reason)

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        if (
            observation is None
            or observation.utilization is None
            or observation.ready_replicas is None
        ):
            return self._hold(current, "no utilization metric")
        ready = observation.ready_replicas
        ratio = observation.utilization / self.target
        pods = max(1, ready)
        if ratio > 1 and ready < current.replicas:
            # Not-ready pods count as 0 % when scaling up (HPA's conservative rule).
            ratio = observation.utilization * ready / (current.replicas * self.target)
            pods = current.replicas
        desired = current.replicas if abs(ratio - 1) <= self.tolerance else math.ceil(pods * ratio)
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        # Scale-down stabilization: the highest recommendation of the window wins.
        self.recommendations = [
            (t, r) for t, r in self.recommendations if t > now - self.stabilization_s
        ]
        self.recommendations.append((now, desired))
        if desired < current.replicas:
            desired = min(current.replicas, max(r for _, r in self.recommendations))
        elif desired > current.replicas:
            limit = max(2 * current.replicas, current.replicas + HPA_SCALE_UP_PODS)
            desired = min(desired, limit)
        return Command(
            desired,
            self.batch_size,
            self.max_queue_delay_s,
            f"utilization {observation.utilization:.0%} vs target {self.target:.0%}",
        )


@dataclass
class StaticController:
    replicas: int
    batch_size: int
    max_queue_delay_s: float
    name: str = "static"
    cold_start: bool = True

    def initial(self) -> Command:
        return Command(self.replicas, self.batch_size, self.max_queue_delay_s, "static")

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        return self.initial()


def oracle_plan(
    peak: float, table: list[Capacity], *, min_replicas: int, max_replicas: int
) -> tuple[int, int]:
    """(replicas, batch limit) for a known peak rate: the fewest replicas over all batch limits;
    on a tie, the limit that leaves the most headroom."""
    best: tuple[int, float, float, int] | None = None
    for cap in table:
        needed = cap.replicas_for(peak)
        if not math.isfinite(needed):
            continue
        replicas = max(min_replicas, math.ceil(needed - 1e-9))
        key = (replicas, needed, -cap.rate, cap.max_batch)
        if best is None or key < best:
            best = key
    if best is None:
        return max_replicas, max(table, key=lambda c: c.rate).max_batch
    return min(max_replicas, best[0]), best[3]


@dataclass
class OracleController:
    trace: Trace
    table: list[Capacity]
    interval_s: float
    min_replicas: int
    max_replicas: int
    max_queue_delay_s: float
    name: str = "oracle"
    cold_start: bool = False

    def _for(self, interval: int) -> Command:
        start = interval * self.interval_s
        peak = self.trace.peak(start, start + self.interval_s)
        replicas, batch = oracle_plan(
            peak, self.table, min_replicas=self.min_replicas, max_replicas=self.max_replicas
        )
        return Command(replicas, batch, self.max_queue_delay_s, f"knows the peak: {peak:.0f} rps")

    def initial(self) -> Command:
        return self._for(0)

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        return self._for(interval)


@dataclass
class ReactiveController:
    trace: Trace
    table: list[Capacity]
    margin: float
    hold_s: float
    min_replicas: int
    max_replicas: int
    max_queue_delay_s: float
    name: str = "reactive"
    cold_start: bool = True
    recommendations: list[tuple[float, int]] = field(default_factory=list)

    def _for(self, now: float) -> Command:
        rate = self.trace.rate_at(now)
        replicas, batch = oracle_plan(
            rate * self.margin,
            self.table,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
        )
        self.recommendations = [
            (t, r) for t, r in self.recommendations if t > now - self.hold_s
        ] + [(now, replicas)]
        held = max(r for _, r in self.recommendations)
        return Command(held, batch, self.max_queue_delay_s, f"knows the present: {rate:.0f} rps")

    def initial(self) -> Command:
        return self._for(0.0)

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        return self._for(now)
