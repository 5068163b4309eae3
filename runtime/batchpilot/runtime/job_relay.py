"""Passes an async job's `GET` or `DELETE` on to the replica that holds the job, and its answer
back: what lets every replica behind a Service answer for every job (`job_routes` says which
replica an id names, and whether a replica of this service signed it).

One hop only: a passed-on request carries `FORWARDED_HEADER`, and a replica never passes on a
request that carries it. The holder decides who may read the job: where the id says its holder
takes it (`JobRoutes.signed_relay`), on a credential the passing replica signs with the service's
shared key, naming the caller's key id it checked (`RELAYED_FOR_HEADER`), and the holder signs
its answer (`ANSWER_SIGNATURE_HEADER`), which an answer without is taken for one from whatever
listens at a dead holder's reused address now: gone. The caller's API key itself travelled to
the holder's address before, and to another pod's listener once that address was reused; it
still does, for ids of older replicas, which take nothing else. A holder that refuses the connection
has stopped (scaled down, restarted): its results are gone, and the answer is the unknown id's
404 (`Gone`). A holder that takes no connection or does not answer in time (a lost node) is a
504 (`NotAnswering`): a retry may find it again.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import aiohttp
from fastapi.responses import Response

from batchpilot.runtime.job_routes import JobRoutes

FORWARDED_HEADER = "x-batchpilot-forwarded-by"
"""Set on a passed-on request (the address of the replica that passed it on)."""
RELAYED_FOR_HEADER = "x-batchpilot-relayed-for"
"""The passing replica's signed word for the caller (`JobRoutes.relay_credential`)."""
ANSWER_SIGNATURE_HEADER = "x-batchpilot-answer-signature"
"""The holder's signature of its answer to a signed relay (`JobRoutes.answer_signature`)."""
PASSED_ON = ("authorization", "x-api-key")
"""The caller's headers that travel: its API key, wherever it sent it."""
ANSWER_HEADERS = (
    "async-job-status",
    "content-type",
    "inference-header-content-length",
    "location",
    "retry-after",
    "www-authenticate",
)
"""The holder's answer headers the caller gets: the result's framing and what a client acts on."""
CONNECT_TIMEOUT_S = 2.0
"""A replica of the same service answers a connection at once, or is not there to answer."""
ANSWER_TIMEOUT_S = 5.0
"""Time for the holder's answer beyond the caller's own long poll."""


class Gone(Exception):
    """The holder refused the connection: it has stopped, and its results with it."""


class NotAnswering(Exception):
    """The holder did not take the connection or did not answer in time."""


class JobRelay:
    """Passes requests on from this replica, whose ids `routes` makes and reads; one connection
    pool, opened on first use in the serving loop, closed by `close()`."""

    def __init__(
        self,
        routes: JobRoutes,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self.routes = routes
        self._connect_timeout_s = connect_timeout_s
        self._answer_timeout_s = answer_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                # No pool limit of its own: each passed-on request holds one connection for
                # its long poll, and a pool limit would queue the rest behind those polls and
                # answer them 504. What bounds them is the server's own --max-connections: one
                # outgoing connection at most for each request taken in.
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(sock_connect=self._connect_timeout_s),
            )
        return self._session

    async def relay(
        self,
        method: str,
        address: str,
        path_and_query: str,
        headers: Iterable[tuple[str, str]],
        *,
        job_id: str,
        owner: str | None,
        wait_s: float = 0.0,
    ) -> Response:
        """`method path_and_query` of `job_id` at the replica at `address`, for the caller whose
        key id this replica checked (`owner`); its answer. Raises `Gone` (also for an answer not
        signed where the id says its holder signs) or `NotAnswering`."""
        signed = self.routes.signed_relay(job_id)
        if signed:
            sent = {RELAYED_FOR_HEADER: self.routes.relay_credential(method, job_id, owner)}
        else:
            sent = {name: value for name, value in headers if name.lower() in PASSED_ON}
        sent[FORWARDED_HEADER] = self.routes.address
        timeout = aiohttp.ClientTimeout(
            total=wait_s + self._answer_timeout_s, sock_connect=self._connect_timeout_s
        )
        try:
            async with self._client().request(
                method,
                f"http://{address}{path_and_query}",
                headers=sent,
                timeout=timeout,
                allow_redirects=False,
            ) as answer:
                body = await answer.read()
                if signed:
                    signature = answer.headers.get(ANSWER_SIGNATURE_HEADER, "")
                    expected = self.routes.answer_signature(job_id, answer.status, body)
                    if not hmac.compare_digest(signature.encode(), expected.encode()):
                        raise Gone(f"{address} answered, not as a replica of this service")
                kept = {
                    name: answer.headers[name] for name in ANSWER_HEADERS if name in answer.headers
                }
                return Response(content=body, status_code=answer.status, headers=kept)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                raise Gone(f"{address} refused the connection") from exc
            raise NotAnswering(f"{address}: {exc.os_error or exc}") from exc
        except TimeoutError as exc:
            raise NotAnswering(f"{address} did not answer in time") from exc
        except aiohttp.ClientError as exc:
            raise NotAnswering(f"{address}: {type(exc).__name__}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
