"""kopf's listings, told: every list that went to its end, with what it held and its version —
what the watch-fed cache compares its memory with (test_cache.py), and what
test_operator_api_faults.py shows end to end (a watch answered 410 Gone)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from kopf._cogs.clients import fetching

from batchpilot.operator import relists


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str


def chunks(*names: str, fail_after: int | None = None) -> Any:
    """A kopf listing function over one item per name, in chunks of one."""

    async def fetch_objs(**_: Any) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        for n, name in enumerate(names):
            if fail_after is not None and n == fail_after:
                raise ConnectionError("the list failed part way")
            yield [{"metadata": {"namespace": "ns", "name": name}}], "42"

    return fetch_objs


async def drain(listing: Any, resource: Resource, namespace: str | None) -> list[str]:
    got = []
    async for items, _ in listing(resource=resource, namespace=namespace, settings=None):
        got += [item["metadata"]["name"] for item in items]
    return got


@pytest.fixture
def heard() -> Any:
    told: list[tuple[Any, ...]] = []
    stop = relists.listen(lambda *listing: told.append(listing))
    yield told
    stop()


async def test_a_complete_listing_is_told_and_passed_through(heard: list[Any]) -> None:
    telling = relists._telling(chunks("a", "b"))
    assert await drain(telling, Resource("apps", "v1", "deployments"), None) == ["a", "b"]
    assert heard == [("apps/v1", "deployments", None, frozenset({("ns", "a"), ("ns", "b")}), "42")]
    await drain(telling, Resource("", "v1", "services"), "ns")
    assert heard[-1][:3] == ("v1", "services", "ns")


async def test_an_empty_listing_is_told_too(heard: list[Any]) -> None:
    await drain(relists._telling(chunks()), Resource("apps", "v1", "deployments"), None)
    assert heard == [("apps/v1", "deployments", None, frozenset(), None)]


async def test_a_listing_that_failed_part_way_is_not(heard: list[Any]) -> None:
    telling = relists._telling(chunks("a", "b", fail_after=1))
    with pytest.raises(ConnectionError):
        await drain(telling, Resource("apps", "v1", "deployments"), None)
    assert heard == []


async def test_kopfs_listing_function_is_wrapped_once_and_a_stopped_listener_hears_nothing() -> (
    None
):
    told: list[Any] = []
    stop = relists.listen(lambda *listing: told.append(listing))
    wrapped = fetching.fetch_objs
    assert getattr(wrapped, relists._WRAPPED)
    relists.listen(lambda *listing: None)()
    assert fetching.fetch_objs is wrapped  # not wrapped twice
    stop()
    await drain(relists._telling(chunks("a")), Resource("", "v1", "pods"), None)
    assert told == []
