"""The periodic pass (periodic.py): each InferenceService the cache holds once per interval, the
fleet spread over it, a pass still running never doubled, none before kopf's lists are in; and
the operator's handlers need no finalizer, so kopf puts none on an InferenceService and takes
off the one an earlier operator put on. On looptime's fake clock: exact times, no waiting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import kopf
import pytest

from batchpilot.operator import handlers, periodic

INTERVAL = 60.0
A, B, C = ("team", "a"), ("team", "b"), ("vision", "c")


class Passes:
    """The passes started, with the loop's time of each; each is over at once unless held."""

    def __init__(self) -> None:
        self.started: list[tuple[float, periodic.Key]] = []
        self.held: dict[periodic.Key, asyncio.Future[None]] = {}
        self.hold: set[periodic.Key] = set()
        self.fail: set[periodic.Key] = set()

    def submit(self, namespace: str, name: str) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        key = (namespace, name)
        self.started.append((loop.time(), key))
        future: asyncio.Future[None] = loop.create_future()
        if key in self.hold:
            self.held[key] = future
        elif key in self.fail:
            future.set_exception(RuntimeError("a bug"))
        else:
            future.set_result(None)
        return future

    def of(self, key: periodic.Key) -> list[float]:
        return [at for at, started in self.started if started == key]


async def running_for(
    seconds: float,
    passes: Passes,
    services: Callable[[], set[periodic.Key] | None],
    *,
    ready: Callable[[], bool] = lambda: True,
    salt: int = 7,
) -> None:
    task = asyncio.create_task(
        periodic.run_periodically(
            services, passes.submit, interval_s=INTERVAL, ready=ready, salt=salt
        )
    )
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.looptime
class TestTheLoop:
    async def test_each_service_once_an_interval_at_its_own_place_in_it(self) -> None:
        passes = Passes()
        await running_for(4 * INTERVAL, passes, lambda: {A, B, C})
        for key in (A, B, C):
            # The first an interval after the start (kopf's resume handlers have just passed
            # over each), at its place in the interval; then an interval apart.
            first = INTERVAL + periodic.place(key, 7) * INTERVAL
            assert passes.of(key) == pytest.approx([first, first + INTERVAL, first + 2 * INTERVAL])
        # The fleet's passes spread over the interval rather than all at once.
        assert len({round(passes.of(key)[0], 3) for key in (A, B, C)}) == 3

    async def test_no_round_before_kopfs_lists_are_in(self) -> None:
        passes = Passes()
        listed = False

        def ready() -> bool:
            return listed

        task = asyncio.create_task(
            periodic.run_periodically(
                lambda: {A}, passes.submit, interval_s=INTERVAL, ready=ready, salt=7
            )
        )
        await asyncio.sleep(2.5 * INTERVAL)
        assert passes.started == []  # two rounds due, neither ran
        listed = True
        await asyncio.sleep(1.5 * INTERVAL)
        task.cancel()
        assert passes.of(A) == pytest.approx([3 * INTERVAL + periodic.place(A, 7) * INTERVAL])

    async def test_each_round_begins_with_the_services_there_are(self) -> None:
        # (the operator keeps memory of those alone: handlers._sweep)
        passes, seen = Passes(), []
        fleet = [{A, B}, {A}]

        def services() -> set[periodic.Key]:
            return fleet[0] if len(seen) < 1 else fleet[1]

        def each_round(keys: object) -> None:
            seen.append(set(keys))  # type: ignore[call-overload]
            if len(seen) == 2:
                raise RuntimeError("a bug: the loop goes on")

        task = asyncio.create_task(
            periodic.run_periodically(
                services, passes.submit, interval_s=INTERVAL, salt=7, each_round=each_round
            )
        )
        await asyncio.sleep(3.5 * INTERVAL)
        task.cancel()
        assert seen == [{A, B}, {A}, {A}]
        assert len(passes.of(A)) == 2  # (at 0.97 of each interval) the failed bookkeeping too

    async def test_nothing_known_is_no_round(self) -> None:
        passes = Passes()
        await running_for(3 * INTERVAL, passes, lambda: None)
        assert passes.started == []

    async def test_the_fleet_as_it_is_at_each_round(self) -> None:
        passes = Passes()
        fleet = {A, B}
        task = asyncio.create_task(
            periodic.run_periodically(
                lambda: set(fleet), passes.submit, interval_s=INTERVAL, salt=7
            )
        )
        await asyncio.sleep(2 * INTERVAL)
        fleet.discard(B)  # deleted
        fleet.add(C)  # created
        await asyncio.sleep(INTERVAL)
        task.cancel()
        assert len(passes.of(A)) == 2
        assert len(passes.of(B)) == 1
        assert len(passes.of(C)) == 1

    async def test_a_pass_still_running_is_not_started_again(self) -> None:
        passes = Passes()
        passes.hold.add(A)  # an API server slow to answer its pass
        task = asyncio.create_task(
            periodic.run_periodically(lambda: {A, B}, passes.submit, interval_s=INTERVAL, salt=7)
        )
        await asyncio.sleep(3 * INTERVAL)
        assert len(passes.of(A)) == 1  # rounds 2 and 3 found it running
        assert len(passes.of(B)) == 2
        passes.hold.clear()
        passes.held[A].set_result(None)
        await asyncio.sleep(INTERVAL)
        task.cancel()
        assert len(passes.of(A)) == 2  # its next round, once it was over

    async def test_a_failed_pass_is_logged_and_the_loop_goes_on(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        passes = Passes()
        passes.fail.add(A)
        await running_for(3 * INTERVAL, passes, lambda: {A, B})
        assert len(passes.of(A)) == len(passes.of(B)) == 2
        failed = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert [r.getMessage() for r in failed] == ["the periodic pass over team/a failed"] * 2

    async def test_stopped_it_starts_no_pass(self) -> None:
        passes = Passes()
        await running_for(
            INTERVAL + 0.5 * min(periodic.place(k, 7) for k in (A, B)), passes, lambda: {A, B}
        )
        await asyncio.sleep(3 * INTERVAL)
        assert passes.started == []


def test_the_places_are_in_the_interval_and_each_process_draws_its_own() -> None:
    keys = [("team", f"s{n}") for n in range(1000)]
    places = [periodic.place(key, 42) for key in keys]
    assert all(0 <= p < 1 for p in places)
    assert places != [periodic.place(key, 43) for key in keys]
    # Spread: each tenth of the interval holds about a tenth of a thousand services.
    tenths = [sum(1 for p in places if n / 10 <= p < (n + 1) / 10) for n in range(10)]
    assert min(tenths) > 60, tenths


def test_no_handler_of_the_operator_requires_a_finalizer() -> None:
    """kopf puts its finalizer on an object while a handler of it requires one (a timer, a
    daemon, a delete handler that is not optional) and takes it off while none does
    (kopf/_core/reactor/processing.py)."""
    registry = kopf.get_default_registry()
    ours = [
        handler
        for kind in (registry._spawning, registry._changing)
        for handler in kind._handlers
        if getattr(handler.fn, "__module__", None) == handlers.__name__
    ]
    assert {handler.id for handler in ours} == {"reconcile"}  # no timer, daemon or delete handler
    assert [handler.id for handler in ours if handler.requires_finalizer] == []
