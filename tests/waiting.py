"""Waiting on a condition with a deadline: how tests wait for other processes, never by sleeping
a guessed amount."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], *, timeout: float = 20, what: str, every: float = 0.1
) -> T:
    """Poll `condition()` until it returns something truthy, and return that; fail the test
    with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
