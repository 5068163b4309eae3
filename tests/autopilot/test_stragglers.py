"""Replicas slower than their peers: found against the median pace, replaced with care."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batchpilot.operator.autopilot.observation import PodCompute
from batchpilot.operator.autopilot.service_model import LatencyFit
from batchpilot.operator.autopilot.stragglers import (
    MAX_PER_HOUR,
    MAX_WAIT_COLD_STARTS,
    REPLACE_GAP_S,
    SLOW_FOR_S,
    Handover,
    Stragglers,
    Verdict,
    hand_over,
    judge,
    paces,
    slow_pods,
)

FIT = LatencyFit(alpha_s=0.004, beta_s=0.002, confident=True)
"""t(b) = 4 + 2·b ms."""


def pod(name: str, *, batch: float = 4.0, pace: float = 1.0, batches: float = 1000) -> PodCompute:
    """A replica whose batches of `batch` rows took `pace` times t(b)."""
    return PodCompute(name, batch, pace * (FIT.alpha_s + FIT.beta_s * batch), batches)


def fleet(*slow: tuple[str, float], size: int = 6) -> list[PodCompute]:
    """`size` replicas at the fit's pace but the ones named, at theirs."""
    paced = dict(slow)
    return [pod(f"p{i}", pace=paced.get(f"p{i}", 1.0)) for i in range(size)]


def judged(
    pods: list[PodCompute],
    state: Stragglers | None = None,
    *,
    now: float = 1000.0,
    **options: object,
) -> Verdict:
    """The verdict on `pods`, read alike over the window and between the last two scrapes."""
    remembered = state or Stragglers()
    options.setdefault("recent", pods)
    return judge(pods, FIT, remembered, now=now, cold_start_s=30.0, window_s=60.0, **options)  # type: ignore[arg-type]


class TestPace:
    def test_is_the_batch_time_over_the_fit_at_the_replicas_own_batch(self) -> None:
        # A replica that ran larger batches took longer, and is no slower for it.
        pods = [pod("small", batch=2), pod("large", batch=16), pod("slow", batch=4, pace=2.0)]
        assert paces(pods, FIT) == pytest.approx({"small": 1.0, "large": 1.0, "slow": 2.0})

    def test_needs_enough_batches(self) -> None:
        assert paces([pod("p", batches=19)], FIT) == {}


class TestSlow:
    def test_one_replica_twice_as_slow_as_its_peers(self) -> None:
        assert slow_pods(fleet(("p3", 2.0)), FIT) == pytest.approx({"p3": 2.0})

    def test_against_the_peers_not_the_fit(self) -> None:
        # Every replica 1.6× what the fit says (the fit lags a slower model): none is slow.
        assert slow_pods([pod(f"p{i}", pace=1.6) for i in range(5)], FIT) == {}

    def test_a_little_slower_is_not_slow(self) -> None:
        assert slow_pods(fleet(("p1", 1.2)), FIT) == {}

    def test_one_replica_has_no_peer(self) -> None:
        assert slow_pods(fleet(("p0", 3.0), size=1), FIT) == {}

    def test_of_two_the_slower_one(self) -> None:
        # Slowness is what breaks: the faster one's pace is the normal one.
        assert slow_pods(fleet(("p0", 2.0), size=2), FIT) == pytest.approx({"p0": 2.0})

    def test_half_may_be_slow_not_more(self) -> None:
        half = fleet(("p0", 2.0), ("p1", 2.0), size=4)
        assert slow_pods(half, FIT) == pytest.approx({"p0": 2.0, "p1": 2.0})
        # Three of four "slow" is one fast: nothing to replace.
        assert slow_pods(fleet(("p0", 2.0), ("p1", 2.0), ("p2", 2.0), size=4), FIT) == {}

    def test_a_mean_over_few_batches_that_vary_must_pass_its_noise(self) -> None:
        varied = LatencyFit(alpha_s=0.004, beta_s=0.002, confident=True, batch_cv=2.0)
        few = [pod(f"p{i}", batches=20) for i in range(4)] + [pod("p4", pace=1.8, batches=20)]
        many = [pod(f"p{i}") for i in range(4)] + [pod("p4", pace=1.8)]
        assert slow_pods(few, varied) == {}  # 3 × 2 / √20: ± 134 %
        assert slow_pods(many, varied) == pytest.approx({"p4": 1.8})  # ± 19 %

    def test_replaced_pods_still_in_the_window_are_no_peers(self) -> None:
        pods = fleet(("p3", 2.0), size=4)
        assert slow_pods(pods, FIT, gone={"p3"}) == {}


class TestJudge:
    def test_a_slow_replica_is_replaced_once_slow_for_two_decisions(self) -> None:
        first = judged(fleet(("p2", 2.0)))
        assert first.replace == ()
        assert "pod p2's batches take 2.0× its peers'" in first.note
        assert first.state.slow == (("p2", 1000.0),)
        soon = judged(fleet(("p2", 2.0)), first.state, now=1000 + SLOW_FOR_S - 1)
        assert soon.replace == ()
        then = judged(fleet(("p2", 2.0)), soon.state, now=1000 + SLOW_FOR_S)
        assert then.replace == ("p2",)
        assert then.note == "replacing pod p2 (2.0× for 15 s): batches slower than their peers'"
        assert then.state == Stragglers(replaced=(("p2", 1000 + SLOW_FOR_S),))

    def test_read_over_the_window_alone_it_is_confirmed_a_window_later(self) -> None:
        # Too few batches between two scrapes: the windows a decision apart overlap.
        first = judged(fleet(("p2", 2.0)), recent=())
        assert "(replaced if it stays so for 60 s)" in first.note
        assert judged(fleet(("p2", 2.0)), first.state, now=1045, recent=()).replace == ()
        assert judged(fleet(("p2", 2.0)), first.state, now=1060, recent=()).replace == ("p2",)

    def test_among_many_the_chance_excess_of_the_slowest_is_not_slowness(self) -> None:
        # 200 replicas of 40 batches a window, batch times ±50 %: by chance alone the largest
        # mean is about 1.23× the others'; a replica 1.35× slower is not told from it.
        varied = replace(FIT, batch_cv=0.5)
        many = [pod(f"p{i}", batches=40) for i in range(199)] + [pod("x", pace=1.35, batches=40)]
        assert slow_pods(many, varied) == {}
        assert slow_pods(many[-4:], varied) == pytest.approx({"x": 1.35})  # of four, it is

    def test_one_that_recovers_is_forgotten(self) -> None:
        first = judged(fleet(("p2", 2.0)))
        again = judged(fleet(), first.state, now=1015)
        assert again.state.slow == ()
        assert judged(fleet(("p2", 2.0)), again.state, now=1045).replace == ()

    def test_the_next_waits_for_the_last_replacement_to_have_run(self) -> None:
        state = Stragglers(slow=(("p4", 900.0),), replaced=(("p2", 950.0),))
        waiting = judged(fleet(("p4", 2.0)), state, now=1000)
        assert waiting.replace == ()
        assert "once the last replacement has run" in waiting.note
        assert judged(fleet(("p4", 2.0)), state, now=950 + REPLACE_GAP_S).replace == ("p4",)

    def test_at_most_so_many_an_hour_then_only_said(self) -> None:
        replaced = tuple((f"old{i}", 100.0 + i) for i in range(MAX_PER_HOUR))
        state = Stragglers(slow=(("p4", 500.0),), replaced=replaced)
        verdict = judged(fleet(("p4", 2.0)), state, now=1000)
        assert verdict.replace == ()
        assert "replaced within the hour already" in verdict.note
        # An hour after them, it may be replaced again.
        assert judged(fleet(("p4", 2.0)), state, now=3700 + 100).replace == ("p4",)

    def test_several_slow_together_go_together_a_quarter_at_most(self) -> None:
        state = Stragglers(slow=(("p1", 900.0), ("p2", 900.0), ("p5", 900.0)))
        pods = fleet(("p1", 2.0), ("p2", 2.5), ("p5", 1.8), size=8)
        verdict = judged(pods, state)
        assert verdict.replace == ("p2", "p1")  # the slowest first; 8 / 4 at once
        assert verdict.state.slow == (("p5", 900.0),)

    def test_not_during_a_rollout_nor_without_a_fit(self) -> None:
        state = Stragglers(slow=(("p2", 500.0),))
        assert judged(fleet(("p2", 2.0)), state, comparable=False) == Verdict((), "", Stragglers())
        verdict = judge(fleet(("p2", 2.0)), None, state, now=1000, cold_start_s=30, window_s=60)
        assert verdict.replace == ()

    def test_told_not_to_it_only_says_so(self) -> None:
        state = Stragglers(slow=(("p2", 500.0),))
        verdict = judged(fleet(("p2", 2.0)), state, act=False)
        assert verdict.replace == ()
        assert verdict.note == (
            "pod p2's batches take 2.0× its peers' (replaceSlowReplicas is false: not replaced)"
        )


class TestMemory:
    def test_round_trips(self) -> None:
        state = Stragglers(slow=(("a", 1.5),), replaced=(("b", 2.25),))
        assert Stragglers.from_dict(state.to_dict()) == state
        assert Stragglers().to_dict() == {}

    @pytest.mark.parametrize("doc", [None, [], {"slow": [["a"]]}, {"replaced": [[1, "x"]]}])
    def test_anything_unreadable_is_forgotten(self, doc: object) -> None:
        assert Stragglers.from_dict(doc) == Stragglers()


def handed(
    chosen: list[str], state: Stragglers, *, needed: float, ready: int, in_force: int, now: float
) -> Handover:
    """The hand-over on a service whose replicas take 30 s to start."""
    return hand_over(
        chosen, state, needed=needed, ready=ready, in_force=in_force, now=now, cold_start_s=30
    )


class TestHandOver:
    """A slow replica goes at once where the others carry the plan without it; else it serves
    on beside one asked in its place, and goes once that one is ready."""

    def test_at_once_where_the_others_carry_the_plan(self) -> None:
        done = handed(["p2"], Stragglers(), needed=2.7, ready=4, in_force=4, now=100)
        assert done == Handover(("p2",), 0, "", Stragglers())

    def test_beside_one_asked_in_its_place_where_they_do_not(self) -> None:
        # Two replicas, one slow: the other alone cannot carry the load.
        first = handed(["p1"], Stragglers(), needed=1.4, ready=2, in_force=2, now=100)
        assert first.delete == ()
        assert first.extra == 1
        assert first.note == "pod p1 serves on until the 1 asked in its place is ready"
        assert first.state.waiting == (("p1", 100),)
        # The replica asked for is starting: the slow one keeps serving, the extra stays asked.
        starting = handed([], first.state, needed=1.4, ready=2, in_force=3, now=115)
        assert (starting.delete, starting.extra) == ((), 1)
        # It is ready (and carries the load with the other): the slow one goes, and nothing more
        # is asked for it.
        ready = handed([], starting.state, needed=1.4, ready=3, in_force=3, now=130)
        assert (ready.delete, ready.extra) == (("p1",), 0)
        assert ready.note == "deleting pod p1: the others carry the load without it"
        assert ready.state.waiting == ()

    def test_one_that_never_comes_is_not_waited_for_forever(self) -> None:
        waiting = Stragglers(waiting=(("p1", 100.0),))
        later = 100 + MAX_WAIT_COLD_STARTS * 30
        assert handed([], waiting, needed=1.4, ready=2, in_force=3, now=later - 1).delete == ()
        assert handed([], waiting, needed=1.4, ready=2, in_force=3, now=later).delete == ("p1",)

    def test_waiting_round_trips(self) -> None:
        state = Stragglers(replaced=(("p1", 100.0),), waiting=(("p1", 100.0),))
        assert Stragglers.from_dict(state.to_dict()) == state
