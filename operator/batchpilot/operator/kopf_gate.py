"""kopf's start-up gate, made linear in the fleet's size.

kopf runs no resource handler before every index has had its initial list — what the watch-fed
cache relies on (cache.py). It keeps that gate as a set of toggles (`aiotoggles.ToggleSet`): one
per kind until its list is in, one per object until its index functions have run; and every
object's worker, once it has indexed its object, waits on the set's condition until none is left.
Every toggle added or dropped — two per object — wakes every waiting worker, each of which looks
at the set and goes back to sleep: for N objects, on the order of N² wake-ups. A new leader over
1,000 InferenceServices (6,000 objects: the services, their children and pods) spent 64 s there
before its first handler ran, with no decision for any service; over 300, 5.5 s.

A waiter waits for the set's aggregate state (every toggle on, or any); adding or dropping a toggle
can satisfy it only when that state changes. `install()` makes the set wake its waiters then and
only then. A member toggle turned on or off wakes them as before (kopf's own `Toggle.turn_to`).
It applies where kopf's ToggleSet has the shape this relies on, and leaves any other as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kopf._cogs.aiokits import aiotoggles

log = logging.getLogger(__name__)

_INSTALLED = "_batchpilot_wakes_on_change"


async def _make_toggle(
    self: Any, __val: bool = False, *, name: str | None = None
) -> aiotoggles.Toggle:
    toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: Any, toggle: aiotoggles.Toggle) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != before:
            self._condition.notify_all()


async def _drop_toggles(self: Any, toggles: Iterable[aiotoggles.Toggle]) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != before:
            self._condition.notify_all()


def install() -> bool:
    """Make kopf's toggle sets wake their waiters only when their state changes; whether they
    do (False: this kopf's ToggleSet is not the one this was written for, and stays as it is)."""
    toggle_set = aiotoggles.ToggleSet
    if getattr(toggle_set, _INSTALLED, False):
        return True
    probe = toggle_set(all)
    shaped = (
        isinstance(getattr(probe, "_toggles", None), set)
        and hasattr(probe, "_condition")
        and all(callable(getattr(toggle_set, n, None)) for n in ("is_on", "wait_for"))
    )
    if not shaped:
        log.warning(
            "kopf's ToggleSet is not the one batchpilot knows: its start-up gate stays as kopf "
            "has it (quadratic in the objects listed)"
        )
        return False
    toggle_set.make_toggle = _make_toggle  # type: ignore[method-assign]
    toggle_set.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    toggle_set.drop_toggles = _drop_toggles  # type: ignore[method-assign]
    setattr(toggle_set, _INSTALLED, True)
    return True
