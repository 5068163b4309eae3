"""Clients that retry what is refused: the attempts come back, are counted as arrivals, and end."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from batchpilot.simulation import TEXTBOOK, ClusterConfig, Trace, cli
from batchpilot.simulation.clients import MIN_STEP_S, Retries, RetryQueue
from batchpilot.simulation.cluster import simulate_cluster
from batchpilot.simulation.policies import StaticController
from batchpilot.simulation.report import SimulationResult
from tests.simulation.test_simulate import Watcher


class TestTheirBehaviour:
    def test_parsed_from_the_command_line_form(self) -> None:
        assert Retries.parse("attempts=5,delay_s=0.1,backoff=2") == Retries(5, 0.1, 2.0, 0.5)
        assert Retries.parse("") == Retries()
        assert Retries.parse("marked=1") == Retries(marked=True)
        assert Retries.parse("marked=false,attempts=2") == Retries(2, marked=False)

    @pytest.mark.parametrize(
        ("text", "says"),
        [
            ("tries=3", "not one of attempts="),
            ("attempts=x", "attempts must be a number"),
            ("attempts=0", "at least 1"),
            ("delay_s=0", "delay_s must be positive"),
            ("jitter=1", "jitter must be in [0, 1)"),
            ("marked=maybe", "marked must be 1 or 0"),
        ],
    )
    def test_nonsense_is_refused_with_the_reason(self, text: str, says: str) -> None:
        with pytest.raises(ValueError, match=says.replace("[", r"\[").replace(")", r"\)")):
            Retries.parse(text)

    def test_a_pass_is_never_longer_than_the_shortest_delay(self) -> None:
        assert Retries(delay_s=1.0, jitter=0.5).step_s == 0.5
        assert Retries(delay_s=0.05).step_s == MIN_STEP_S


class TestTheQueue:
    def test_a_refusal_comes_back_after_its_delay_until_the_attempts_run_out(self) -> None:
        queue = RetryQueue(Retries(attempts=3, delay_s=1.0, backoff=2.0, jitter=0.0))
        rng = np.random.default_rng(0)
        queue.refused(np.array([0.2]), rng, lo=0.0, hi=0.5)
        assert queue.due(1.2).tolist() == []  # due at 1.2: not before
        assert queue.due(1.3).tolist() == [1.2]
        queue.refused(np.array([1.2]), rng, lo=1.0, hi=1.5)  # its second try refused too
        queue.settle()
        assert queue.due(3.3).tolist() == [3.2]  # 2 s: the delay doubled
        queue.refused(np.array([3.2]), rng, lo=3.0, hi=3.5)  # the third and last
        queue.settle()
        assert (queue.sent, queue.gave_up, queue.waiting) == (2, 1, 0)

    def test_one_due_inside_the_pass_that_refused_it_goes_a_pass_later(self) -> None:
        queue = RetryQueue(Retries(delay_s=0.1, jitter=0.0))
        queue.refused(np.array([0.0, 0.5]), np.random.default_rng(0), lo=0.0, hi=1.0)
        # Due at 0.1 and 0.6, inside [0, 1): out at 1.1 and 1.6, 0.5 s apart as they were.
        assert queue.due(2.0).tolist() == pytest.approx([1.1, 1.6])

    def test_delays_spread_within_the_jitter(self) -> None:
        queue = RetryQueue(Retries(delay_s=1.0, jitter=0.5))
        queue.refused(np.zeros(1000), np.random.default_rng(1), lo=0.0, hi=0.25)
        due = queue.due(10.0)
        assert due.min() >= 0.5
        assert due.max() <= 1.5
        assert due.std() > 0.2


def overloaded(
    retries: Retries | None, controller: StaticController | None = None
) -> SimulationResult:
    """One replica at batch 8 (about 330 rps) offered 600 rps for two minutes."""
    return simulate_cluster(
        Trace.constant(600, 120),
        TEXTBOOK,
        controller or StaticController(1, 8, 0.005),
        sla_s=0.1,
        config=ClusterConfig(retries=retries),
    )


class TestARetryStorm:
    def test_the_retries_are_arrivals_on_top_of_the_traffic(self) -> None:
        dropped, retried = overloaded(None), overloaded(Retries(attempts=3, delay_s=1.0))
        assert dropped.clients is None
        assert retried.clients is not None
        clients = retried.clients
        # The trace's own requests are the same; the retries come on top of them.
        assert clients["requests"] == pytest.approx(600 * 120, rel=0.02)
        assert clients["retries"] > 0.3 * clients["requests"]
        assert 0 < clients["gaveUp"] < clients["retries"]
        # The replica was offered (and refused) the retries too: more refusals than without.
        assert retried.summary.requests == clients["requests"] + clients["retries"]
        assert retried.summary.shed > dropped.summary.shed
        # It still serves what it can carry.
        served = retried.summary.requests - retried.summary.shed
        assert served == pytest.approx(dropped.summary.requests - dropped.summary.shed, rel=0.05)
        assert retried.settings["retries"]["attempts"] == 3
        assert retried.to_dict(intervals=False)["clients"] == clients

    def test_retries_that_say_so_are_served_alike_and_are_no_part_of_the_arrival_signals(
        self,
    ) -> None:
        plain, marked = Watcher(1, 8, 0.005), Watcher(1, 8, 0.005)
        unmarked_run = overloaded(Retries(attempts=3, delay_s=1.0), plain)
        marked_run = overloaded(Retries(attempts=3, delay_s=1.0, marked=True), marked)
        assert marked_run.clients is not None
        assert unmarked_run.clients is not None
        # The same storm reaches the replica: as many requests and retries, as many refused.
        for key in ("requests", "retries"):
            assert marked_run.clients[key] == pytest.approx(unmarked_run.clients[key], rel=0.02)
        assert marked_run.summary.requests == (
            marked_run.clients["requests"] + marked_run.clients["retries"]
        )
        assert marked_run.summary.shed == pytest.approx(unmarked_run.summary.shed, rel=0.02)
        # Once the window is all storm, the marked runtimes' arrivals are the clients' 600 rps;
        # unmarked, the requests and their retries.
        # The retries are counted apart, as many as the unmarked runtimes took for demand; the
        # share refused is of every attempt, the same either way.
        for counted, taken in zip(marked.seen[4:], plain.seen[4:], strict=True):
            assert counted.arrival_qps == pytest.approx(600, rel=0.05)
            assert counted.recent_qps == pytest.approx(600, rel=0.25)
            assert counted.now_qps == pytest.approx(600, rel=0.25)
            assert taken.arrival_qps is not None
            assert taken.arrival_qps > 1.3 * 600
            assert counted.retried_qps == pytest.approx(taken.arrival_qps - 600, rel=0.15)
            assert taken.retried_qps in (None, 0.0)
            assert counted.unserved_share == pytest.approx(taken.unserved_share, abs=0.03)
        assert marked_run.settings["retries"]["marked"] is True

    def test_one_attempt_only_gives_up_every_refusal(self) -> None:
        result = overloaded(Retries(attempts=1))
        assert result.clients is not None
        assert result.clients["retries"] == 0
        assert result.clients["gaveUp"] == result.summary.shed


class TestTheCommandLine:
    def test_retries_are_an_option(self, capsys: pytest.CaptureFixture[str]) -> None:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args(
            [
                "--trace-gen",
                "textbook",
                "--duration-s",
                "120",
                "--policy",
                "static",
                "--retries",
                "attempts=2,delay_s=0.5",
            ]
        )
        assert cli.main(args) == 0
        assert "clients:" in capsys.readouterr().out

    def test_a_bad_retry_option_says_why(self, capsys: pytest.CaptureFixture[str]) -> None:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        with pytest.raises(SystemExit):
            parser.parse_args(["--trace-gen", "textbook", "--retries", "attempts=0"])
        assert "attempts must be at least 1" in capsys.readouterr().err
