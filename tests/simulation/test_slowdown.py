"""Replicas that slow down, and the autopilot that replaces the ones slower than their peers.

The textbook's service at 1,200 rps: four or five replicas at the batch limits the autopilot
picks (or at 500 rps, two). From 300 s on, one replica's batches take twice as long (a GPU that
throttles): it gets its share of the requests all the same, and its queue is the fleet's P99.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import pytest

from batchpilot.operator.autopilot.observation import Observation
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, cli, simulate
from batchpilot.simulation.cluster import Slowdown, simulate_cluster
from batchpilot.simulation.policies import Command
from batchpilot.simulation.report import SimulationResult

SLOW_ONE = Slowdown(at_s=300.0, factor=2.0, count=1)


def scenario(
    *slowdowns: Slowdown, replace_slow: bool = True, cv: float = 0.0, rps: float = 1200
) -> Scenario:
    return Scenario(
        trace=Trace.constant(rps, 1200),
        service=replace(TEXTBOOK, cv=cv),
        sla_s=0.1,
        max_replicas=12,
        start_replicas=max(1, round(rps / 300)),
        batch_size=8,
        replace_slow=replace_slow,
        cluster=ClusterConfig(slowdowns=slowdowns, seed=7),
    )


def replacements(result: SimulationResult) -> list[float]:
    return [r.t for r in result.intervals if "replacing pod" in r.reason]


class TestSlowdown:
    @pytest.mark.parametrize(
        ("text", "slowdown"),
        [
            ("600:1.5", Slowdown(600, 1.5)),
            ("600:2:900:1", Slowdown(600, 2.0, 900, 1)),
            ("600:2::2", Slowdown(600, 2.0, count=2)),
        ],
    )
    def test_parses(self, text: str, slowdown: Slowdown) -> None:
        assert Slowdown.parse(text) == slowdown

    @pytest.mark.parametrize("text", ["600", "a:2", "600:0", "600:2:0", "600:2:10:0", "1:2:3:4:5"])
    def test_refuses_nonsense(self, text: str) -> None:
        with pytest.raises(ValueError, match=r"slowdown|AT_S"):
            Slowdown.parse(text)

    def test_the_cli_takes_it(self) -> None:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args(
            ["--trace-gen", "step:1", "--slowdown", "300:2::1", "--keep-slow-replicas"]
        )
        made = cli.scenario_of(args)
        assert made.cluster.slowdowns == (SLOW_ONE,)
        assert made.replace_slow is False


@dataclass
class Fixed:
    """Two replicas at batch 8, whatever happens."""

    name: str = "fixed"
    cold_start: bool = True

    def initial(self) -> Command:
        return Command(2, 8, 0.005, "start")

    def decide(
        self, observation: Observation | None, current: InForce, *, now: float, interval: int
    ) -> Command:
        return self.initial()


class TestPace:
    def test_a_fleet_wide_slowdown_slows_every_batch_while_it_lasts(self) -> None:
        slowdown = ClusterConfig(slowdowns=(Slowdown(120, 1.5, 120),), balancing="round-robin")
        result = simulate_cluster(
            Trace.constant(300, 360), TEXTBOOK, Fixed(), sla_s=1.0, config=slowdown
        )
        busy = {r.t: r.utilization for r in result.intervals}
        before, during, after = busy[90.0], busy[180.0], busy[300.0]
        assert before is not None
        assert during is not None
        assert after is not None
        assert during == pytest.approx(1.5 * before, rel=0.1)
        assert after == pytest.approx(before, rel=0.1)


class TestTheAutopilot:
    def test_replaces_the_slow_replica_and_keeps_the_sla(self) -> None:
        result = simulate(scenario(SLOW_ONE), "autopilot")
        (replaced,) = replacements(result)
        assert 300 < replaced <= 300 + 60  # read between two scrapes, at two decisions in a row
        assert result.summary.interval_attainment >= 0.95

    def test_of_two_the_slow_one_serves_on_until_the_one_asked_in_its_place_is_ready(
        self,
    ) -> None:
        # 500 rps on two replicas: the other alone cannot carry them.
        result = simulate(scenario(SLOW_ONE, rps=500), "autopilot")
        said = [(r.t, r.reason) for r in result.intervals if "pod 0" in r.reason]
        (chosen,) = [t for t, reason in said if "pod 0 serves on until the 1 asked" in reason]
        (gone,) = [t for t, reason in said if "deleting pod 0: the others carry" in reason]
        assert chosen < gone <= chosen + 30 + 15  # a cold start, and the decision after it
        assert result.summary.interval_attainment >= 0.95

    def test_without_it_the_replica_stays_slow_and_the_sla_is_missed(self) -> None:
        kept = simulate(scenario(SLOW_ONE, replace_slow=False), "autopilot")
        replaced = simulate(scenario(SLOW_ONE), "autopilot")
        assert replacements(kept) == []
        assert any("replaceSlowReplicas is false" in r.reason for r in kept.intervals)
        assert kept.summary.interval_attainment < 0.9 < 0.95 < replaced.summary.interval_attainment

    def test_a_fleet_slower_as_a_whole_has_no_replica_to_replace(self) -> None:
        result = simulate(scenario(Slowdown(300, 2.0)), "autopilot")
        assert replacements(result) == []
        assert "peers" not in " ".join(r.reason for r in result.intervals)

    def test_batch_times_that_vary_replace_nothing(self) -> None:
        result = simulate(scenario(cv=0.5), "autopilot")
        assert "peers" not in " ".join(r.reason for r in result.intervals)
