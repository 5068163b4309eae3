"""The sandbox's ReplicaSet and Deployment controllers: the strategy's limits as pod counts, and
what each pass creates and deletes — scaling, a rollout with a surge, a rollout in place, a
rollout that turns in place while its surge pod waits for room."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from batchpilot.operator.rollout import IN_PLACE, SURGE
from batchpilot.sandbox.rolling import PodView, RollingLimits, Step, rolling_limits, step

SURGE_LIMITS = RollingLimits(max_surge=1, max_unavailable=0)
IN_PLACE_LIMITS = RollingLimits(max_surge=0, max_unavailable=1)


def deployment(strategy: dict[str, Any] | None) -> dict[str, Any]:
    return {"spec": {} if strategy is None else {"strategy": strategy}}


def rolling(**limits: Any) -> dict[str, Any]:
    return deployment({"type": "RollingUpdate", "rollingUpdate": limits})


class TestTheStrategyAsPodCounts:
    def test_the_operators_two_strategies(self) -> None:
        assert rolling_limits(rolling(**SURGE), 2) == SURGE_LIMITS
        assert rolling_limits(rolling(**IN_PLACE), 2) == IN_PLACE_LIMITS

    @pytest.mark.parametrize(
        ("replicas", "expected"),
        [
            (1, RollingLimits(1, 0)),  # ceil(0.25) = 1 surge, floor(0.25) = 0 down
            (3, RollingLimits(1, 0)),  # ceil(0.75) = 1, floor(0.75) = 0
            (4, RollingLimits(1, 1)),
            (10, RollingLimits(3, 2)),  # ceil(2.5) = 3, floor(2.5) = 2
        ],
    )
    def test_percentages_round_as_kubernetes_does(
        self, replicas: int, expected: RollingLimits
    ) -> None:
        limits = rolling(maxSurge="25%", maxUnavailable="25%")
        assert rolling_limits(limits, replicas) == expected

    def test_the_api_servers_default_is_25_percent_each(self) -> None:
        assert rolling_limits(deployment(None), 4) == RollingLimits(1, 1)
        assert rolling_limits(rolling(), 10) == RollingLimits(3, 2)

    def test_both_zero_is_one_down(self) -> None:
        # Kubernetes' fencepost: 0% of 1 replica each would never roll.
        assert rolling_limits(rolling(maxSurge="0%", maxUnavailable="10%"), 1) == IN_PLACE_LIMITS

    def test_recreate_is_every_old_pod_first(self) -> None:
        assert rolling_limits(deployment({"type": "Recreate"}), 3) == RollingLimits(0, 3)

    @pytest.mark.parametrize("value", [-1, "-10%", "lots", "1.5", True])
    def test_what_kubernetes_would_refuse_is_refused(self, value: object) -> None:
        with pytest.raises(ValueError, match="maxSurge"):
            rolling_limits(rolling(maxSurge=value, maxUnavailable=1), 2)


class TestScalingWithoutANewTemplate:
    def test_up_to_the_replicas(self) -> None:
        assert step(replicas=3, limits=SURGE_LIMITS, current=[PodView("a", True)], old=[]) == (
            Step(create=2)
        )

    def test_down_unbound_first_then_not_ready_then_the_youngest(self) -> None:
        pods = [
            PodView("old", True, started_at=1),
            PodView("young", True, started_at=3),
            PodView("starting", False, started_at=2),
            PodView("waiting", False, bound=False, started_at=float("inf")),
        ]
        assert step(replicas=3, limits=SURGE_LIMITS, current=pods, old=[]).delete == ("waiting",)
        assert step(replicas=2, limits=SURGE_LIMITS, current=pods, old=[]).delete == (
            "waiting",
            "starting",
        )
        assert step(replicas=1, limits=SURGE_LIMITS, current=pods, old=[]).delete == (
            "waiting",
            "starting",
            "young",
        )

    def test_nothing_to_do_is_nothing_done(self) -> None:
        pods = [PodView("a", True), PodView("b", False)]
        assert step(replicas=2, limits=SURGE_LIMITS, current=pods, old=[]) == Step()


@dataclass
class Rollout:
    """Pods rolling from template 1 to 2, a pass at a time: each pod made becomes ready
    `ready_after` passes later (None: never, as a pod that finds no room)."""

    replicas: int
    ready_after: int | None = 2
    current: list[PodView] = field(default_factory=list)
    old: list[PodView] = field(default_factory=list)
    made_at: dict[str, int] = field(default_factory=dict)
    tick: int = 0

    def __post_init__(self) -> None:
        self.old = [PodView(f"old{i}", True, started_at=i) for i in range(self.replicas)]

    def run(self, limits: RollingLimits) -> Step:
        self.tick += 1
        if self.ready_after is not None:
            self.current = [
                PodView(p.name, True, started_at=p.started_at)
                if self.tick - self.made_at[p.name] >= self.ready_after
                else p
                for p in self.current
            ]
        decided = step(replicas=self.replicas, limits=limits, current=self.current, old=self.old)
        for _ in range(decided.create):
            name = f"new{len(self.made_at)}"
            self.made_at[name] = self.tick
            self.current.append(PodView(name, False, started_at=100 + self.tick))
        self.current = [p for p in self.current if p.name not in decided.delete]
        self.old = [p for p in self.old if p.name not in decided.delete]
        return decided

    @property
    def ready(self) -> int:
        return sum(p.ready for p in self.current + self.old)

    @property
    def pods(self) -> int:
        return len(self.current) + len(self.old)


class TestARolloutWithASurge:
    def test_a_new_pod_first_an_old_one_once_it_is_ready(self) -> None:
        rollout = Rollout(replicas=2)
        steps = [rollout.run(SURGE_LIMITS) for _ in range(8)]
        assert steps == [
            Step(create=1),  # 3 pods: 2 + a surge of 1
            Step(),  # new0 not ready: nothing goes
            Step(delete=("old0",)),  # new0 ready: the oldest old pod goes
            Step(create=1),
            Step(),
            Step(delete=("old1",)),
            Step(),
            Step(),
        ]
        assert rollout.old == []
        assert [p.name for p in rollout.current] == ["new0", "new1"]

    def test_never_fewer_ready_than_the_replicas(self) -> None:
        rollout = Rollout(replicas=3)
        for tick in range(20):
            rollout.run(SURGE_LIMITS)
            assert rollout.ready >= 3, tick
            assert rollout.pods <= 4, tick
        assert rollout.old == []

    def test_stuck_while_the_surge_pod_finds_no_room(self) -> None:
        rollout = Rollout(replicas=2, ready_after=None)
        for tick in range(10):
            rollout.run(SURGE_LIMITS)
            assert (len(rollout.current), len(rollout.old)) == (1, 2), tick

    def test_an_old_pod_that_is_not_ready_goes_first(self) -> None:
        current = [PodView("new0", True, started_at=10)]
        old = [PodView("old0", True, started_at=1), PodView("old1", False, started_at=2)]
        assert step(replicas=2, limits=SURGE_LIMITS, current=current, old=old) == Step(
            delete=("old1",)
        )


class TestARolloutInPlace:
    def test_an_old_pod_first_then_a_new_one_one_at_a_time(self) -> None:
        rollout = Rollout(replicas=2)
        steps = [rollout.run(IN_PLACE_LIMITS) for _ in range(8)]
        assert steps == [
            Step(delete=("old0",)),  # 2 - 1 = 1 must stay ready: one old pod may go
            Step(create=1),  # then its replacement: 2 pods, no surge
            Step(),  # new0 not ready: 1 ready, none more may go
            Step(delete=("old1",)),
            Step(create=1),
            Step(),
            Step(),
            Step(),
        ]
        assert [p.name for p in rollout.current] == ["new0", "new1"]

    def test_never_more_pods_than_the_replicas_nor_fewer_than_one_down(self) -> None:
        rollout = Rollout(replicas=3)
        for tick in range(20):
            rollout.run(IN_PLACE_LIMITS)
            assert rollout.pods <= 3, tick
            assert rollout.ready >= 2, tick
        assert rollout.old == []

    def test_a_not_ready_old_pod_goes_first(self) -> None:
        old = [PodView("old0", True, started_at=1), PodView("old1", False, started_at=2)]
        assert step(replicas=2, limits=IN_PLACE_LIMITS, current=[], old=old) == Step(
            delete=("old1",)
        )

    def test_a_stuck_surge_turned_in_place_frees_room_for_the_waiting_pod(self) -> None:
        # A surge pod that waits unschedulable, and the operator turns the rollout in place: an
        # old pod goes (its GPU is what the waiting pod needs), and no pod is made meanwhile.
        waiting = PodView("new0", False, bound=False, started_at=float("inf"))
        old = [PodView("old0", True, started_at=1), PodView("old1", True, started_at=2)]
        assert step(replicas=2, limits=IN_PLACE_LIMITS, current=[waiting], old=old) == Step(
            delete=("old0",)
        )
        # The waiting pod still not ready: the other old pod stays.
        assert step(replicas=2, limits=IN_PLACE_LIMITS, current=[waiting], old=old[1:]) == Step()
