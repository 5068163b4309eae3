"""A cluster short of GPUs (`Gpus`): pods beyond its GPUs are Pending — blocked, as the operator
reads them from the pods — cost nothing, and start once a GPU frees or nodes are added; and the
autopilot, seeing them blocked, gives back what the load no longer needs while they wait."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Gpus, Scenario, Trace, simulate
from batchpilot.simulation.cluster import simulate_cluster
from batchpilot.simulation.policies import Command


@dataclass
class Asks:
    """Five replicas from the start; keeps what it was shown at each decision."""

    replicas: int = 5
    name: str = "asks"
    cold_start: bool = True
    seen: dict[float, tuple[int | None, int]] = field(default_factory=dict)
    """At each decision: (ready, blocked)."""

    def initial(self) -> Command:
        return Command(2, 8, 0.005, "start")

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        assert observation is not None
        self.seen[now] = (observation.ready_replicas, observation.blocked_replicas)
        return Command(self.replicas, 8, 0.005, "asks")


def run(gpus: Gpus, controller: Asks) -> float:
    config = ClusterConfig(cold_start_s=30.0, gpus=gpus)
    result = simulate_cluster(
        Trace.constant(300, 600), TEXTBOOK, controller, sla_s=0.1, config=config
    )
    return result.summary.gpu_seconds


class TestPendingPods:
    def test_wait_for_a_gpu_cost_nothing_and_are_blocked(self) -> None:
        controller = Asks()
        gpu_seconds = run(Gpus(3), controller)
        # asked at 15 s: one more starts (30 s), two stay Pending for good
        assert controller.seen[15.0] == (2, 0)
        assert controller.seen[60.0] == (3, 2)
        assert controller.seen[585.0] == (3, 2)
        # three GPUs billed, never five
        assert gpu_seconds <= 3 * 600 + 1e-6

    def test_start_when_nodes_are_added(self) -> None:
        controller = Asks()
        run(Gpus(3, more_at_s=300.0), controller)
        assert controller.seen[285.0] == (3, 2)
        assert controller.seen[315.0] == (3, 0)  # scheduled at 300, starting
        assert controller.seen[330.0] == (5, 0)  # 300 + 30 s cold start

    def test_a_gpu_freed_goes_to_the_oldest_pending_pod(self) -> None:
        controller = Asks(replicas=3)
        run(Gpus(2), controller)
        assert controller.seen[60.0] == (2, 1)


def test_the_autopilot_gives_back_what_the_load_no_longer_needs_while_pods_wait() -> None:
    # 5× a replica's load for 30 minutes on a cluster with 3 GPUs for good, then 1.5×: the
    # count asked comes down after the scale-down window (10 minutes after the fall, it is
    # down), where waiting for the Pending pods as "starting" held it at its peak to the end.
    sized = Scenario(trace=Trace.constant(100, 10), service=TEXTBOOK, sla_s=0.1, max_replicas=8)
    one = sized.best_capacity().rate
    points = [(0.0, 1.5 * one), (600.0, 5 * one), (2400.0, 1.5 * one), (3600.0, 1.5 * one)]
    trace = Trace.from_points(points, name="step", duration_s=None)

    def asked(seen: bool) -> list[int]:
        cluster = ClusterConfig(cold_start_s=30.0, gpus=Gpus(3), blocked_seen=seen)
        chosen = replace(sized, trace=trace, cluster=cluster, start_replicas=2)
        result = simulate(chosen, "autopilot")
        return [r.replicas for r in result.intervals if r.t >= 2400 + 900]

    assert max(asked(seen=True)) <= 3
    assert min(asked(seen=False)) > 3
