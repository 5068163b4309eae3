"""The autopilot's fleet round: one observation round for every service, then each one's tick."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable
from typing import Any

import kopf
import pytest

from batchpilot.operator import handlers
from batchpilot.operator.autopilot.prometheus import FleetRound, Scope
from batchpilot.operator.fleet import FleetPilot, RoundReport, autopiloted
from batchpilot.operator.kinds import INFERENCESERVICE, ResourceKind
from batchpilot.operator.kube import KubeError
from tests.operator.fake_kube import FakeKube
from tests.operator.test_handlers import Operator
from tests.operator.test_reconciler import NS, T0, isvc


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconciles post Events through kopf, which needs its own context: not here."""
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: None)


class CountingRounds:
    """A Prometheus that answers nothing for anyone, and counts the rounds asked."""

    def __init__(self) -> None:
        self.rounds = 0

    def round(self, at: float | None = None) -> FleetRound:
        self.rounds += 1
        return FleetRound(T0.timestamp(), {}, 60, None, None, reading="recorded", took_s=0.25)


def fleet_of(count: int, kube: FakeKube | None = None) -> tuple[Operator, CountingRounds]:
    operator = Operator(isvc(), kube=kube)
    for i in range(count):
        body = copy.deepcopy(isvc())
        body["metadata"]["name"] = f"model-{i}"
        operator.kube.put_object(body)
    rounds = CountingRounds()
    operator.memo.fleet = FleetPilot(
        operator.memo.passes, operator.memo.autopilot, rounds, post=lambda body, found: None
    )
    return operator, rounds


def names(count: int) -> list[tuple[str, str]]:
    return [(NS, f"model-{i}") for i in range(count)]


def test_one_observation_round_for_every_service() -> None:
    operator, rounds = fleet_of(30)
    for i in range(30):
        handlers.reconcile(name=f"model-{i}", namespace=NS, memo=operator.memo)
    report = operator.memo.fleet.run_round(names(30))
    assert rounds.rounds == 1
    assert report == RoundReport(30, 30, 0, reading="recorded", observed_s=0.25)
    # Every service without series holds alone, and says so.
    for i in range(30):
        status = operator.kube.of(INFERENCESERVICE, NS, f"model-{i}")["status"]
        available = {c["type"]: c for c in status["conditions"]}["MetricsAvailable"]
        assert available["status"] == "False"


def test_a_service_whose_writes_fail_does_not_stop_the_round() -> None:
    class Flaky(FakeKube):
        def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
            if name == "model-3" and kind == INFERENCESERVICE:
                raise KubeError(503, "unavailable")
            return super().get(kind, namespace, name)

    operator, _ = fleet_of(6, kube=Flaky())
    report = operator.memo.fleet.run_round(names(6))
    assert (report.ticked, report.failed) == (5, 1)


def test_a_service_whose_series_cannot_be_read_does_not_stop_the_round() -> None:
    class Malformed(CountingRounds):
        def round(self, at: float | None = None) -> FleetRound:
            whole = super().round(at)

            class Broken(FleetRound):
                def lacks(self, scope: Scope) -> bool:
                    if scope.isvc == "model-2":
                        raise ValueError("invalid literal for int() with base 10: 'x'")
                    return super().lacks(scope)

            return Broken(whole.at, whole.answers, 60, None, None, reading="recorded")

    operator, _ = fleet_of(4)
    for i in range(4):
        handlers.reconcile(name=f"model-{i}", namespace=NS, memo=operator.memo)
    operator.memo.fleet = FleetPilot(
        operator.memo.passes, operator.memo.autopilot, Malformed(), post=lambda b, f: None
    )
    report = operator.memo.fleet.run_round(names(4))
    assert (report.services, report.ticked) == (4, 4)


def test_no_services_no_round() -> None:
    operator, rounds = fleet_of(0)
    assert operator.memo.fleet.run_round([]).services == 0
    assert rounds.rounds == 0


@pytest.mark.parametrize(
    ("spec", "piloted"),
    [
        ({"scaling": {"mode": "auto"}}, True),
        ({"scaling": {"mode": "recommend"}}, True),
        ({"scaling": {"mode": "off"}}, False),
        ({}, True),
    ],
)
def test_which_services_the_autopilot_ticks(spec: dict[str, Any], piloted: bool) -> None:
    assert autopiloted(NS, "m", spec) is piloted


async def test_the_loop_runs_a_round_per_interval_over_the_piloted_index(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=handlers.__name__)
    seen: list[list[tuple[str, str]]] = []
    done = asyncio.Event()

    class Recording:
        def run_round(
            self, services: list[tuple[str, str]], hold_events: bool = False
        ) -> RoundReport:
            seen.append(list(services))
            if len(seen) == 3:
                done.set()
            return RoundReport(len(services), len(services), 0, reading="raw", observed_s=1.5)

    index: dict[tuple[str, str], Any] = {(NS, "a"): True}
    loop = asyncio.create_task(handlers.fleet_loop(Recording(), index, 0.01))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(done.wait(), timeout=10)
    finally:
        loop.cancel()
    assert seen[:3] == [[(NS, "a")]] * 3
    rounds = [r.getMessage() for r in caplog.records if "autopilot round" in r.getMessage()]
    assert rounds[0].startswith(
        "autopilot round: 1 services, 1 ticked, 0 failed, 0 left for the next round, "
        "Prometheus answered from raw queries in 1.50 s, "
    )  # one line a round, for whoever sizes the operator: a WARNING when it outgrows the interval


@pytest.mark.parametrize(
    ("report", "said"),
    [
        (
            RoundReport(3, 3, 0, reading="raw", observed_s=0.5),
            "answered from raw queries in 0.50 s",
        ),
        (
            RoundReport(3, 3, 0, reading="recorded", observed_s=0.5, primed=2),
            "answered from its recording rules in 0.50 s "
            "(without the series of 2 services: their pods read first)",
        ),
        (
            RoundReport(3, 3, 0, reading=None),
            "unreachable (held, or decided on the pods' own metrics)",
        ),
        (
            RoundReport(3, 3, 0, reading=None, primed=3),
            "unreachable (pods read first, for a first window: 3 services)",
        ),
    ],
)
def test_the_round_line_says_where_the_signals_came_from(report: RoundReport, said: str) -> None:
    assert handlers._prometheus_said(report) == said


async def test_the_first_round_waits_for_the_fleet_to_be_known_and_no_longer() -> None:
    """The loop starts before kopf has listed anything; a leader that just took over must not
    find an empty index and leave the fleet a whole interval without a decision."""
    seen: list[list[tuple[str, str]]] = []
    ran = asyncio.Event()

    class Recording:
        def run_round(
            self, services: list[tuple[str, str]], hold_events: bool = False
        ) -> RoundReport:
            seen.append(list(services))
            ran.set()
            return RoundReport(len(services), len(services), 0, reading="raw")

    index: dict[tuple[str, str], Any] = {}
    listed = asyncio.Event()
    asked = asyncio.Event()

    def known() -> bool:
        asked.set()
        return listed.is_set()

    hour = 3600.0  # an interval no test waits out
    loop = asyncio.create_task(
        handlers.fleet_loop(Recording(), index, hour, known=known)  # type: ignore[arg-type]
    )
    try:
        await asyncio.wait_for(asked.wait(), timeout=10)
        assert seen == []  # nothing listed yet: no round, so no interval's wait begins
        index[(NS, "a")] = True  # kopf's initial list, then its first handler
        index[(NS, "b")] = True
        listed.set()
        await asyncio.wait_for(ran.wait(), timeout=10)
    finally:
        loop.cancel()
    assert seen == [[(NS, "a"), (NS, "b")]]


async def test_until_kopf_has_listed_the_fleet_the_rounds_go_over_the_operators_own_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A standby that takes the lead over 1,000 services waits 17 s for kopf's lists: its first
    round goes over the fleet as it lists it itself (stock.py), its Events held. Once only: a
    list of its own taken while kopf's watches run could put back what a watch just saw go."""
    caplog.set_level(logging.INFO, logger=handlers.__name__)
    rounds: list[tuple[list[tuple[str, str]], bool]] = []
    two = asyncio.Event()
    test_loop = asyncio.get_running_loop()

    class Recording:
        def run_round(
            self, services: list[tuple[str, str]], hold_events: bool = False
        ) -> RoundReport:
            rounds.append((list(services), hold_events))
            if not hold_events:
                test_loop.call_soon_threadsafe(two.set)
            return RoundReport(len(services), len(services), 0, reading="raw")

    index: dict[tuple[str, str], Any] = {}
    listings = 0

    def listed() -> list[tuple[str, str]]:
        nonlocal listings
        listings += 1
        return [(NS, "a"), (NS, "b")]

    started = time.monotonic()

    def known() -> bool:
        # kopf's lists come in after the first round, a dozen intervals after the start
        if rounds and time.monotonic() > started + 0.12:
            index[(NS, "a")] = index[(NS, "b")] = True
            return True
        return False

    loop = asyncio.create_task(
        handlers.fleet_loop(
            Recording(),  # type: ignore[arg-type]
            index,
            0.01,
            known=known,
            listed=listed,
        )
    )

    def said_rounds() -> list[str]:
        return [r.getMessage() for r in caplog.records if "autopilot round" in r.getMessage()]

    try:
        await asyncio.wait_for(two.wait(), timeout=10)
        # The second round's line comes once its run returns to the loop, after `two` is set.
        deadline = time.monotonic() + 10
        while len(said_rounds()) < 2:
            assert time.monotonic() < deadline, "the second round was never logged"
            await asyncio.sleep(0.005)
    finally:
        loop.cancel()
    both = [(NS, "a"), (NS, "b")]
    assert rounds[:2] == [(both, True), (both, False)]
    assert listings == 1
    said = said_rounds()
    assert said[0].endswith("(kopf's lists not in yet: the fleet as the operator listed it)")
    assert not said[1].endswith(")")


@pytest.mark.parametrize("listable", [True, False], ids=["listed", "left-to-kopf"])
async def test_the_first_round_says_when_it_is_over_so_kopf_starts_after_it(
    listable: bool,
) -> None:
    """kopf's watches start once the startup handlers are over; `start_autopilot` holds them
    until the first round is done (it shared the GIL with kopf's lists, 22 s at 1,000
    services) — or, where the operator cannot list the fleet, until the round is left to
    wait for kopf's own lists."""
    rounds: list[bool] = []

    class Recording:
        def run_round(
            self, services: list[tuple[str, str]], hold_events: bool = False
        ) -> RoundReport:
            rounds.append(hold_events)
            return RoundReport(len(services), len(services), 0, reading="raw")

    first = asyncio.Event()
    loop = asyncio.create_task(
        handlers.fleet_loop(
            Recording(),  # type: ignore[arg-type]
            {},
            3600.0,
            known=lambda: False,
            listed=lambda: [(NS, "a")] if listable else None,
            first=first,
        )
    )
    try:
        await asyncio.wait_for(first.wait(), timeout=10)
    finally:
        loop.cancel()
    assert rounds == ([True] if listable else [])


async def test_once_kopf_has_listed_the_fleet_its_round_comes_at_once() -> None:
    """After a round over the operator's own list, the first in kopf's context does not wait
    out the interval: kopf's handlers have made the children of services created meanwhile."""
    rounds: list[bool] = []
    first, second = asyncio.Event(), asyncio.Event()
    loop_of_test = asyncio.get_running_loop()

    class Recording:
        def run_round(
            self, services: list[tuple[str, str]], hold_events: bool = False
        ) -> RoundReport:
            rounds.append(hold_events)
            done = first if len(rounds) == 1 else second
            loop_of_test.call_soon_threadsafe(done.set)
            return RoundReport(len(services), len(services), 0, reading="raw")

    index: dict[tuple[str, str], Any] = {}
    listed = asyncio.Event()
    loop = asyncio.create_task(
        handlers.fleet_loop(
            Recording(),  # type: ignore[arg-type]
            index,
            3600.0,  # an interval no test waits out
            known=listed.is_set,
            listed=lambda: [(NS, "a")],
        )
    )
    try:
        await asyncio.wait_for(first.wait(), timeout=10)
        index[(NS, "a")] = True
        listed.set()
        await asyncio.wait_for(second.wait(), timeout=10)
    finally:
        loop.cancel()
    assert rounds == [True, False]


async def test_a_list_that_raises_leaves_the_first_round_to_kopfs_lists() -> None:
    rounds: list[bool] = []
    ran = asyncio.Event()
    test_loop = asyncio.get_running_loop()

    class Recording:
        holding = False

        def run_round(
            self, services: list[tuple[str, str]], hold_events: bool = False
        ) -> RoundReport:
            rounds.append(hold_events)
            test_loop.call_soon_threadsafe(ran.set)
            return RoundReport(len(services), len(services), 0, reading="raw")

    def listed() -> list[tuple[str, str]]:
        raise RuntimeError("a bug in the list")

    index: dict[tuple[str, str], Any] = {}
    first, kopf_listed = asyncio.Event(), asyncio.Event()
    loop = asyncio.create_task(
        handlers.fleet_loop(
            Recording(),  # type: ignore[arg-type]
            index,
            3600.0,
            known=kopf_listed.is_set,
            listed=listed,
            first=first,
        )
    )
    try:
        await asyncio.wait_for(first.wait(), timeout=10)  # kopf is not held for ever
        index[(NS, "a")] = True
        kopf_listed.set()
        await asyncio.wait_for(ran.wait(), timeout=10)  # and the loop lives on
    finally:
        loop.cancel()
    assert rounds == [False]


async def test_events_held_go_out_though_no_service_is_left_to_tick() -> None:
    posted = asyncio.Event()
    test_loop = asyncio.get_running_loop()

    class Holding:
        holding = True

        def forget_all(self) -> None:
            pass

        def post_held(self) -> None:
            test_loop.call_soon_threadsafe(posted.set)

    loop = asyncio.create_task(handlers.fleet_loop(Holding(), {}, 3600.0))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(posted.wait(), timeout=10)
    finally:
        loop.cancel()


def test_a_round_that_holds_its_events_has_the_next_post_them() -> None:
    operator, rounds = fleet_of(2)
    for i in range(2):
        handlers.reconcile(name=f"model-{i}", namespace=NS, memo=operator.memo)
    posted: list[tuple[str, list[str]]] = []
    fleet = FleetPilot(
        operator.memo.passes,
        operator.memo.autopilot,
        rounds,
        post=lambda body, found: posted.append(
            (body["metadata"]["name"], [event.reason for event in found])
        ),
    )
    assert fleet.run_round(names(2), hold_events=True).ticked == 2
    assert posted == []
    fleet.run_round([])  # the next round in kopf's context, services or none
    assert sorted(posted) == [
        ("model-0", ["MetricsUnavailable"]),
        ("model-1", ["MetricsUnavailable"]),
    ]
    fleet.run_round([])
    assert len(posted) == 2  # posted once


async def test_the_autopilot_turned_off_for_the_fleet_starts_no_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(
        handlers, "_SETTINGS", handlers._SETTINGS.model_copy(update={"autopilot_enabled": False})
    )
    memo = kopf.Memo()
    await handlers.start_autopilot(memo, piloted={(NS, "a"): True})
    assert "fleet_task" not in memo
    assert "the autopilot is off" in caplog.text


def test_the_round_gives_each_service_its_own_answers() -> None:
    asked: list[Scope] = []

    class Answering(CountingRounds):
        def round(self, at: float | None = None) -> FleetRound:
            round_ = super().round(at)
            original = round_.observe

            class Spy(FleetRound):
                def observe(self, scope: Scope, *, ready_replicas: int | None) -> Any:
                    asked.append(scope)
                    return original(scope, ready_replicas=ready_replicas)

            return Spy(round_.at, round_.answers, 60, None, None)

    operator, _ = fleet_of(3)
    for i in range(3):
        handlers.reconcile(name=f"model-{i}", namespace=NS, memo=operator.memo)
    operator.memo.fleet = FleetPilot(
        operator.memo.passes, operator.memo.autopilot, Answering(), post=lambda b, f: None
    )
    operator.memo.fleet.run_round(names(3))
    assert sorted(asked, key=lambda s: s.isvc) == [Scope(NS, f"model-{i}") for i in range(3)]


class Clock:
    """A clock the fleet sleeps on, and the API server's writes move."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def throttled_fleet(
    count: int, kube: FakeKube, clock: Clock, *, round_s: float
) -> tuple[Operator, list[tuple[str, str]]]:
    operator, _ = fleet_of(count, kube=kube)
    for i in range(count):
        handlers.reconcile(name=f"model-{i}", namespace=NS, memo=operator.memo)
    operator.memo.fleet = FleetPilot(
        operator.memo.passes,
        operator.memo.autopilot,
        CountingRounds(),
        post=lambda body, found: None,
        workers=1,
        round_s=round_s,
        clock=clock,
        sleep=clock.sleep,
    )
    return operator, names(count)


class Hooked(FakeKube):
    """A fake API server that calls `on_patch(name, subresource)` before each patch (to refuse
    it, or to take time), and records the InferenceServices read: a pass reads its own first."""

    def __init__(self, on_patch: Callable[[str, str], None]) -> None:
        super().__init__()
        self.on_patch = on_patch
        self.ticked: list[str] = []

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == INFERENCESERVICE:
            self.ticked.append(name)
        return super().get(kind, namespace, name)

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        self.on_patch(name, subresource)
        return super().patch(kind, namespace, name, patch, subresource=subresource)


def test_a_tick_the_api_server_asked_to_wait_runs_again_within_the_round() -> None:
    """API Priority and Fairness answers 429 with Retry-After: the client refuses every call
    until then. The ticks wait it out and run, where they failed until the next interval."""
    clock = Clock()
    asked = {"armed": False}

    def throttle(name: str, subresource: str) -> None:
        if asked["armed"] and subresource == "status" and name == "model-1":
            asked["armed"] = False
            raise KubeError(429, "too many requests", retry_after_s=1.0)

    kube = Hooked(throttle)
    operator, keys = throttled_fleet(6, kube, clock, round_s=15.0)
    asked["armed"] = True  # once the fleet is set up
    report = operator.memo.fleet.run_round(keys)
    assert (report.ticked, report.failed, report.skipped) == (6, 0, 0)
    assert clock.slept == [1.0]


def test_a_round_ends_with_its_interval_and_the_ticks_left_go_first_in_the_next() -> None:
    """A slow API server (a second a status write): the round would outlast its interval and
    its last ticks decide on an old reading; they wait for the next round, and go first."""
    clock = Clock()

    def slowly(name: str, subresource: str) -> None:
        clock.now += 1.0

    kube = Hooked(slowly)
    operator, keys = throttled_fleet(6, kube, clock, round_s=3.0)
    kube.ticked.clear()
    report = operator.memo.fleet.run_round(keys)
    assert (report.ticked, report.failed, report.skipped) == (3, 0, 3)
    assert kube.ticked == ["model-0", "model-1", "model-2"]
    kube.ticked.clear()
    operator.memo.fleet.run_round(keys)
    assert kube.ticked[:3] == ["model-3", "model-4", "model-5"]
