"""The HTTP edge of the load generator: the only module that talks to the server.

It reads the model's metadata, opens one pooled aiohttp session per target, and sends the
prepared request: one `session.post` per request (and one per retry of a refused one, where the
clients retry), the body read but not decoded unless verifying, so the client stays cheap.
Every way a send can fail comes back as an error kind, never an exception; a target that cannot
be used raises TargetError.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping

import aiohttp
import orjson
from yarl import URL

from batchpilot.runtime.attempts import ENVOY_ATTEMPT_COUNT
from batchpilot.runtime.loadgen.config import Retries, Target
from batchpilot.runtime.loadgen.errors import (
    CONNECTION,
    INVALID_RESPONSE,
    SHED_KINDS,
    TIMEOUT,
    TargetError,
)
from batchpilot.runtime.loadgen.request import (
    ModelMetadata,
    PreparedRequest,
    prepare_request,
    random_inputs,
    response_is_valid,
)


async def fetch_metadata(
    session: aiohttp.ClientSession, url: str, model: str, *, timeout_s: float = 10.0
) -> ModelMetadata:
    """GET the v2 model metadata; TargetError says why the target can't be used."""
    where = URL(url) / "v2" / "models" / model
    try:
        async with session.get(where, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await resp.read()
            if resp.status != 200:
                text = body[:300].decode(errors="replace")
                raise TargetError(f"GET {where} answered {resp.status}: {text}")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TargetError(f"cannot reach {where}: {str(exc) or type(exc).__name__}") from None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise TargetError(f"GET {where} did not answer JSON: {exc}") from None
    return ModelMetadata.from_json(doc)


async def send_once(
    session: aiohttp.ClientSession, request: PreparedRequest, *, verify: bool = False
) -> str:
    """Send the request once; "" on success, else the error kind. The body is read (the latency
    includes receiving it) but decoded only when verifying."""
    kind, _ = await _post(session, request, verify=verify)
    return kind


async def send_retrying(
    session: aiohttp.ClientSession,
    request: PreparedRequest,
    *,
    verify: bool = False,
    retries: Retries,
    on_retry: Callable[[], None],
) -> str:
    """Send the request, and send it again when it is refused (503/429) — after the server's
    `Retry-After` or `retries.delay_s` — up to `retries.attempts` more times; the last answer's
    kind. `on_retry` is called before each repeat. Where `retries.marked`, every try carries
    its number in `x-envoy-attempt-count`."""

    def headers(attempt: int) -> Mapping[str, str]:
        if not retries.marked:
            return request.headers
        return {**request.headers, ENVOY_ATTEMPT_COUNT: str(attempt)}

    kind, retry_after = await _post(session, request, verify=verify, headers=headers(1))
    for attempt in range(2, retries.attempts + 2):
        if kind not in SHED_KINDS:
            break
        await asyncio.sleep(retries.wait_s(retry_after))
        on_retry()
        kind, retry_after = await _post(session, request, verify=verify, headers=headers(attempt))
    return kind


async def send_hedged(
    session: aiohttp.ClientSession,
    request: PreparedRequest,
    *,
    verify: bool = False,
    hedge_s: float,
    marked: bool = False,
    on_hedge: Callable[[], None],
) -> str:
    """Send the request, and once more where no answer came within `hedge_s` (`on_hedge` is
    called then); "" as soon as either succeeds, the other send cancelled — its connection
    closed, as a client that hedges does — else the kind of the last to fail. Where `marked`,
    the copy says it is the second try in `x-envoy-attempt-count`."""
    first = asyncio.ensure_future(_post(session, request, verify=verify))
    sends = {first}
    try:
        done, _ = await asyncio.wait(sends, timeout=hedge_s)
        if not done:
            on_hedge()
            copy = {**request.headers, ENVOY_ATTEMPT_COUNT: "2"} if marked else None
            sends.add(asyncio.ensure_future(_post(session, request, verify=verify, headers=copy)))
        kind = ""
        while sends:
            done, sends = await asyncio.wait(sends, return_when=asyncio.FIRST_COMPLETED)
            for send in done:
                kind, _ = send.result()
                if not kind:
                    return kind
        return kind
    finally:
        for send in sends:
            send.cancel()
        if sends:
            await asyncio.wait(sends)


async def _post(
    session: aiohttp.ClientSession,
    request: PreparedRequest,
    *,
    verify: bool,
    headers: Mapping[str, str] | None = None,
) -> tuple[str, float | None]:
    """One send (with `headers` in place of the request's own, where given): its kind, and the
    seconds its `Retry-After` asks for (None: none)."""
    sent = request.headers if headers is None else headers
    try:
        async with session.post(request.url, data=request.body, headers=sent) as resp:
            body = await resp.read()
            if not 200 <= resp.status < 300:
                return str(resp.status), retry_after_s(resp.headers.get("Retry-After"))
            if verify and not response_is_valid(request, body, resp.headers):
                return INVALID_RESPONSE, None
            return "", None
    except TimeoutError:  # before ClientConnectionError: aiohttp's timeouts subclass both
        return TIMEOUT, None
    except (aiohttp.ClientConnectionError, OSError):
        return CONNECTION, None
    except aiohttp.ClientError as exc:
        return type(exc).__name__, None


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` in seconds; None where absent or not a number of seconds (an HTTP date
    is read as none: the client's own delay applies)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 and seconds == seconds else None


class TargetSession:
    """An HTTP session plus the prepared request for one target; shared by the probes of a
    find-max search so that connections are reused between them."""

    def __init__(self, target: Target, *, pool_size: int) -> None:
        self.target = target
        self._pool_size = pool_size
        self._stack = contextlib.AsyncExitStack()
        self.session: aiohttp.ClientSession | None = None
        self.request: PreparedRequest | None = None
        """The request of the target's first size (the one every send reuses, where the target
        has one size: `pick`)."""
        self._requests: tuple[PreparedRequest, ...] = ()
        self._picks = random.Random(target.seed)

    async def __aenter__(self) -> TargetSession:
        connector = aiohttp.TCPConnector(limit=self._pool_size)
        self.session = await self._stack.enter_async_context(
            aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.target.timeout_s),
                headers=dict(self.target.headers),
            )
        )
        try:
            metadata = await fetch_metadata(
                self.session, self.target.url, self.target.model, timeout_s=self.target.timeout_s
            )
            mix = self.target.row_mix
            sizes = mix.rows if mix is not None else (self.target.rows,)
            self._requests = tuple(
                prepare_request(
                    self.target.url,
                    metadata,
                    random_inputs(
                        metadata, rows=rows, shapes=self.target.shapes, seed=self.target.seed
                    ),
                    binary=not self.target.json_tensors,
                )
                for rows in sizes
            )
            self.request = self._requests[0]
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def pick(self) -> PreparedRequest:
        """The request to send next: the one prepared, or one of the mix's sizes, drawn by its
        weights (each size encoded once, up front)."""
        mix = self.target.row_mix
        if mix is None or len(self._requests) == 1:
            assert self.request is not None, "use `async with`"
            return self.request
        return self._requests[mix.pick(self._picks)]
