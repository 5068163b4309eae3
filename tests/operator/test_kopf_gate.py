"""kopf's start-up gate wakes its waiters when its state changes, not at every toggle."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from batchpilot.operator import kopf_gate


def test_it_installs_once_on_the_kopf_it_was_written_for() -> None:
    assert kopf_gate.install()
    assert kopf_gate.install()  # idempotent
    assert aiotoggles.ToggleSet.drop_toggle is kopf_gate._drop_toggle


async def test_the_gate_opens_when_the_last_object_is_indexed_and_no_sooner() -> None:
    """As kopf uses it: a toggle per object listed, dropped once the object is indexed, and each
    object's worker then waiting until every one is."""
    assert kopf_gate.install()
    gate = aiotoggles.ToggleSet(all)
    toggles = [await gate.make_toggle(name=f"object-{i}") for i in range(200)]
    woken = 0
    notify_all = gate._condition.notify_all

    def counted() -> None:
        nonlocal woken
        woken += 1
        notify_all()

    gate._condition.notify_all = counted  # type: ignore[method-assign]
    opened: list[int] = []

    async def worker(index: int) -> None:
        await gate.wait_for(True)
        opened.append(index)

    workers = [asyncio.create_task(worker(i)) for i in range(200)]
    for toggle in toggles[:-1]:
        await gate.drop_toggle(toggle)
        await asyncio.sleep(0)
    assert opened == []
    assert woken == 0  # kopf's own: 199 wake-ups of every waiting worker
    await gate.drop_toggle(toggles[-1])
    await asyncio.wait_for(asyncio.gather(*workers), timeout=10)
    assert sorted(opened) == list(range(200))
    assert woken == 1


async def test_a_toggle_added_to_an_open_gate_closes_it_and_wakes_who_waits_for_that() -> None:
    assert kopf_gate.install()
    gate = aiotoggles.ToggleSet(all)
    closed = asyncio.create_task(gate.wait_for(False))
    await asyncio.sleep(0)
    assert not closed.done()  # empty: open
    toggle = await gate.make_toggle()
    await asyncio.wait_for(closed, timeout=10)
    reopened = asyncio.create_task(gate.wait_for(True))
    await toggle.turn_to(True)  # a member turned on wakes as kopf's does
    await asyncio.wait_for(reopened, timeout=10)
    await gate.drop_toggles([toggle])
    assert gate.is_on()


async def test_an_any_set_as_kopf_pauses_with_it() -> None:
    """kopf's operator pause is a ToggleSet(any): a toggle turned on pauses, dropped resumes."""
    assert kopf_gate.install()
    paused = aiotoggles.ToggleSet(any)
    peer = await paused.make_toggle(False, name="peering")
    on = asyncio.create_task(paused.wait_for(True))
    await peer.turn_to(True)
    await asyncio.wait_for(on, timeout=10)
    off = asyncio.create_task(paused.wait_for(False))
    await paused.drop_toggle(peer)
    await asyncio.wait_for(off, timeout=10)
