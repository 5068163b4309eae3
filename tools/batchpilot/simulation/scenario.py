"""One simulated situation — trace, service, SLA, spec — and the controllers that can run it.

`simulate(scenario, "autopilot")` is the programmatic entry point: tests, the CLI and the sandbox
call it. The spec fields mirror the InferenceService's (`scaling.*`, `batching.*`,
`sla.gpuUtilization`), so a simulated autopilot gets the same `Policy` the operator would build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from batchpilot.operator.autopilot.capacity import batch_candidates
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.slo import Objective
from batchpilot.simulation.capacity import (
    Capacity,
    best_batch,
    capacity_table,
    interval_capacity,
)
from batchpilot.simulation.cluster import ClusterConfig, simulate_cluster
from batchpilot.simulation.policies import (
    AutopilotController,
    Controller,
    HpaController,
    OracleController,
    ReactiveController,
    StaticController,
    oracle_plan,
)
from batchpilot.simulation.report import SimulationResult
from batchpilot.simulation.service import ServiceTruth
from batchpilot.simulation.trace import Trace

ORACLE_CANDIDATES = 2
"""Batch limits the oracle considers: the best by long-run capacity (measuring one's interval
capacity costs a second of simulation)."""

PolicyName = Literal["autopilot", "oracle", "reactive", "hpa", "static"]
POLICIES: tuple[PolicyName, ...] = ("autopilot", "oracle", "reactive", "hpa", "static")


@dataclass(frozen=True, slots=True)
class Scenario:
    trace: Trace
    service: ServiceTruth
    sla_s: float
    min_replicas: int = 1
    max_replicas: int = 8
    start_replicas: int = 1
    max_batch_size: int = 64
    batch_size: int = 1
    """The spec's starting batch limit (`batching.batchSize`)."""
    max_queue_delay_s: float = 0.005
    scale_down_delay_s: float = 300.0
    util_min: int = 70
    """`sla.gpuUtilization.min`, in per cent as the spec writes it."""
    baseline_batch: int | None = None
    """The fixed batch limit of the HPA and static baselines; None: the starting batch limit."""
    hpa_target: float = 0.70
    hpa_tolerance: float = 0.10
    hpa_stabilization_s: float = 300.0
    reactive_margin: float = 1.0
    """How much more than the present rate the reactive bound provisions (1: exactly it)."""
    objective: float = 0.99
    """`sla.objectivePercent` / 100: the share of time the SLA must hold."""
    objective_window_s: float = 3600.0
    """`sla.window`: the objective's rolling window."""
    replace_slow: bool = True
    """`scaling.replaceSlowReplicas`: the autopilot replaces replicas slower than their peers."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.start_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min replicas <= start replicas <= max replicas")
        if not 1 <= self.batch_size <= self.max_batch_size:
            raise ValueError("need 1 <= batch size <= max batch size")
        if self.sla_s <= 0:
            raise ValueError("the SLA must be positive")

    @property
    def policy(self) -> Policy:
        """What the operator's `policy_of(spec)` builds from the same spec, and the eviction time
        it reads from the pod template's tolerations."""
        return Policy(
            sla_p99_s=self.sla_s,
            min_utilization=self.util_min / 100,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            max_batch_size=self.max_batch_size,
            scale_down_delay_s=self.scale_down_delay_s,
            max_queue_delay_s=self.max_queue_delay_s,
            objective=Objective(self.objective, self.objective_window_s),
            evicted_after_s=self.cluster.eviction_s,
            replace_slow=self.replace_slow,
        )

    @property
    def fixed_batch(self) -> int:
        return self.baseline_batch or self.batch_size

    def long_run_capacities(self) -> list[Capacity]:
        """Per-replica capacity with long-run P99 within the SLA, for every batch limit the
        autopilot may pick."""
        return capacity_table(
            self.service,
            sla_s=self.sla_s,
            batches=batch_candidates(self.max_batch_size),
            delay_s=self.max_queue_delay_s,
        )

    def interval_capacity(self, batch: int) -> Capacity:
        """Per-replica capacity with 99 % of control intervals within the SLA."""
        return interval_capacity(
            self.service,
            sla_s=self.sla_s,
            max_batch=batch,
            delay_s=self.max_queue_delay_s,
            interval_s=self.cluster.interval_s,
        )

    def capacities(self) -> list[Capacity]:
        """What the oracle provisions with: the interval capacity of the batch limits with the
        most long-run capacity (the others cannot win)."""
        best = sorted(self.long_run_capacities(), key=lambda c: -c.rate)[:ORACLE_CANDIDATES]
        return [self.interval_capacity(c.max_batch) for c in best]

    def best_capacity(self) -> Capacity:
        return best_batch(self.capacities())

    def controller(self, name: PolicyName) -> Controller:
        if name == "autopilot":
            return AutopilotController(
                self.policy,
                InForce(self.start_replicas, self.batch_size, self.max_queue_delay_s),
            )
        if name == "oracle":
            return OracleController(
                trace=self.trace,
                table=self.capacities(),
                interval_s=self.cluster.interval_s,
                min_replicas=self.min_replicas,
                max_replicas=self.max_replicas,
                max_queue_delay_s=self.max_queue_delay_s,
            )
        if name == "reactive":
            return ReactiveController(
                trace=self.trace,
                table=self.capacities(),
                margin=self.reactive_margin,
                hold_s=self.scale_down_delay_s,
                min_replicas=self.min_replicas,
                max_replicas=self.max_replicas,
                max_queue_delay_s=self.max_queue_delay_s,
            )
        if name == "hpa":
            return HpaController(
                target=self.hpa_target,
                tolerance=self.hpa_tolerance,
                stabilization_s=self.hpa_stabilization_s,
                min_replicas=self.min_replicas,
                max_replicas=self.max_replicas,
                batch_size=self.fixed_batch,
                max_queue_delay_s=self.max_queue_delay_s,
                start_replicas=self.start_replicas,
            )
        if name == "static":
            replicas, batch = oracle_plan(
                self.trace.max_rate,
                [self.interval_capacity(self.fixed_batch)],
                min_replicas=self.min_replicas,
                max_replicas=self.max_replicas,
            )
            return StaticController(replicas, batch, self.max_queue_delay_s)
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def simulate(scenario: Scenario, policy: PolicyName | Controller) -> SimulationResult:
    """Run one controller (by name, or one you built) over the scenario."""
    controller = scenario.controller(policy) if isinstance(policy, str) else policy
    result = simulate_cluster(
        scenario.trace,
        scenario.service,
        controller,
        sla_s=scenario.sla_s,
        config=scenario.cluster,
        # the operator's calibrationRows: the largest batch limit the autopilot may set
        calibration_rows=scenario.max_batch_size,
        # and the burst size it writes in mode auto: the same
        burst_rows=scenario.max_batch_size,
    )
    return result


def oracle_gpu_seconds(scenario: Scenario) -> float:
    """The oracle's bill without simulating it: its replicas × interval, summed."""
    controller = scenario.controller("oracle")
    assert isinstance(controller, OracleController)
    interval = scenario.cluster.interval_s
    count = math.ceil(scenario.trace.duration_s / interval - 1e-9)
    total = 0.0
    for k in range(count):
        span = min(interval, scenario.trace.duration_s - k * interval)
        command = controller.decide(None, InForce(1, 1, 0.0), now=k * interval, interval=k)
        total += command.replicas * span
    return total
