"""The operator's event loop closes quietly: a watch stream that refuses to close at SIGTERM is
no error (kopf's, now and then), while anything else still is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from batchpilot.operator.run import close


@contextlib.asynccontextmanager
async def stubborn() -> AsyncIterator[None]:
    """Yields once more when told to stop, as a stream cut mid-read may."""
    with contextlib.suppress(GeneratorExit):
        yield
    yield


async def watch() -> AsyncIterator[int]:
    async with stubborn():
        yield 1


async def first(stream: AsyncIterator[int]) -> int:
    """Its first item, taken on the loop (which then knows it, and closes it at the end)."""
    return await anext(stream)


def test_a_stream_that_will_not_close_is_logged_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    stream = watch()
    assert loop.run_until_complete(first(stream)) == 1  # left open, as kopf leaves its watches
    with caplog.at_level(logging.DEBUG):
        close(loop)
    assert loop.is_closed()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    said = [r.getMessage() for r in caplog.records if r.name == "batchpilot.operator.run"]
    assert any("closing of asynchronous generator" in text for text in said), said


def test_other_errors_at_close_are_still_errors(caplog: pytest.LogCaptureFixture) -> None:
    async def failing() -> AsyncIterator[int]:
        try:
            yield 1
        finally:
            raise ValueError("lost")

    loop = asyncio.new_event_loop()
    stream = failing()
    loop.run_until_complete(first(stream))
    with caplog.at_level(logging.DEBUG):
        close(loop)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["asyncio"]
