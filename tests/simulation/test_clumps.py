"""Requests that arrive together: the clumped trace, what the replicas measure of it, and the
autopilot planning for it."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

import batchpilot.operator.autopilot.learn as learn
from batchpilot.api.arrivals import DISPERSION_SLOT_S
from batchpilot.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, cli, simulate
from batchpilot.simulation.cluster import simulate_cluster
from tests.simulation.test_simulate import Watcher


class TestTheTrace:
    @pytest.mark.parametrize("clump", [1.0, 4.0, 8.0])
    def test_the_rate_is_the_traces_and_the_variance_grows_with_the_clumps(
        self, clump: float
    ) -> None:
        times = Trace.constant(300, 200).arrivals(0, 200, np.random.default_rng(3), clump=clump)
        assert times.shape[0] == pytest.approx(300 * 200, rel=0.03)
        counts = np.bincount(np.floor(times / DISPERSION_SLOT_S).astype(np.int64))
        # Geometric clumps of mean m: E[X²]/E[X] = 2m − 1 (1 for one at a time, Poisson).
        assert counts.var() / counts.mean() == pytest.approx(2 * clump - 1, rel=0.1)

    def test_a_clump_arrives_at_once(self) -> None:
        times = Trace.constant(100, 60).arrivals(0, 60, np.random.default_rng(4), clump=5.0)
        distinct = np.unique(times).shape[0]
        assert distinct == pytest.approx(times.shape[0] / 5, rel=0.1)

    def test_a_clump_below_one_request_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 1"):
            ClusterConfig(clump=0.5)
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        with pytest.raises(SystemExit):
            parser.parse_args(["--trace-gen", "textbook", "--clump", "0"])


class TestWhatTheReplicasMeasure:
    @pytest.mark.parametrize(("replicas", "clump"), [(1, 1.0), (1, 4.0), (2, 4.0)])
    def test_the_dispersion_each_replica_sees(self, replicas: int, clump: float) -> None:
        watching = Watcher(replicas, 16, 0.005)
        simulate_cluster(
            Trace.constant(200, 300),
            TEXTBOOK,
            watching,
            sla_s=0.1,
            config=ClusterConfig(clump=clump),
        )
        # A Service that spreads requests at random splits a clump: each of R replicas sees
        # 1 + (2m − 2) / R.
        expected = 1 + (2 * clump - 2) / replicas
        later = [o.arrival_dispersion for o in watching.seen[6:]]
        assert later
        for dispersion in later:
            assert dispersion == pytest.approx(expected, rel=0.15)


def clumped_run(clump: float) -> float:
    scenario = Scenario(
        trace=Trace.constant(300, 1800),
        service=TEXTBOOK,
        sla_s=0.1,
        max_replicas=16,
        cluster=ClusterConfig(clump=clump),
    )
    return simulate(scenario, "autopilot").summary.interval_attainment


class TestTheAutopilot:
    def test_it_plans_for_clumps_it_measures(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # 300 rps in clumps of 8 on the textbook's service, half an hour.
        planned = clumped_run(8.0)
        monkeypatch.setattr(learn, "dispersion", lambda observation, known, settled=True: 1.0)
        unplanned = clumped_run(8.0)
        # (0.96 against 0.83 at this writing: the misses left are the start-up's, one replica
        # at batch 1, and a scale-down or two to the margin. Unmeasured, the clumps' refusals
        # recur and the guard's ceiling holds the replicas they need — 0.55 before it — but
        # only after they have cost the misses that showed it.)
        assert planned >= 0.9
        assert planned >= unplanned + 0.1
