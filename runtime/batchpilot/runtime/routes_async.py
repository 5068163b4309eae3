"""The async inference REST endpoints: submit now (202 + job id), fetch the result later, or
discard it.

A job runs through `ModelServer.infer`, the same batcher as a sync request, from a background
task, and its result waits in the `JobStore` (`async_jobs`) until it is fetched, discarded or
expires. Its outcome is counted in the request metrics like a sync request's, with its latency
from submit to completion. The routes are plain Starlette routes: like the sync infer endpoint
they read the body themselves and answer every error themselves.

With API keys on, a job belongs to the id of the key that submitted it: reading or discarding
it with another key answers 404, exactly as for an id never submitted, so a job id that leaks
(a log, a shared Location) neither reads the result nor tells that the job exists. Each allowed
key holds at most its share of the store (`JobStore.submit`), so one key cannot fill it for the
others.

Behind a Service, the fetch of a job seldom reaches the replica that took it. With `routes` (ids
that name their replica, `job_routes`) a `GET` or `DELETE` of another replica's job is passed on to
it (`job_relay`) once the caller's key is known to be allowed here, and its answer comes back as
the holder gave it; the holder decides, by the key that travels with the request, who may read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from batchpilot.runtime.access import AccessGate
from batchpilot.runtime.asgi_io import (
    body_coding,
    read_body,
    request_header_length,
    until_disconnected,
)
from batchpilot.runtime.async_jobs import (
    HolderNotAnswering,
    Job,
    JobNotFound,
    JobState,
    JobStore,
)
from batchpilot.runtime.attempts import is_retry_raw
from batchpilot.runtime.body_decoding import BodyDecoder
from batchpilot.runtime.errors import (
    EngineFailure,
    Forbidden,
    InferenceError,
    InvalidRequest,
    ShuttingDown,
    Unauthorized,
)
from batchpilot.runtime.job_relay import (
    ANSWER_SIGNATURE_HEADER,
    FORWARDED_HEADER,
    RELAYED_FOR_HEADER,
    Gone,
    JobRelay,
    NotAnswering,
)
from batchpilot.runtime.outcomes import RequestOutcome, disconnected, status_of
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.responses import (
    CLIENT_CLOSED_REQUEST,
    EncodedResult,
    encoded,
    error_response,
    json_response,
    result_response,
)
from batchpilot.runtime.server import ModelServer

log = logging.getLogger(__name__)

JOB_STATUS_HEADER = "Async-Job-Status"
"""On the answer of a failed job's fetch: "failed" — a 503 or 504 with it is the job's own answer,
kept, not the fetch's (resubmit rather than fetch again)."""

ASYNC_MAX_WAIT_S = 30.0
"""Longest long poll (`?wait_s=`) of an async result."""


def _wait_s(request: Request) -> float:
    text = request.query_params.get("wait_s")
    if text is None:
        return 0.0
    try:
        wait_s = float(text)
    except ValueError:
        wait_s = math.nan
    if not 0 <= wait_s <= ASYNC_MAX_WAIT_S:  # NaN fails this too
        raise InvalidRequest(
            f"wait_s must be a number of seconds from 0 to {ASYNC_MAX_WAIT_S:g}, got {text!r}"
        )
    return wait_s


def add_async_routes(
    app: FastAPI,
    server: ModelServer,
    *,
    jobs: JobStore[EncodedResult],
    max_body_bytes: int,
    decoder: BodyDecoder,
    access: AccessGate | None = None,
    relay: JobRelay | None = None,
) -> None:
    """`POST .../infer/async`, `GET` and `DELETE .../infer/async/{job_id}`, on `jobs`. With
    `access`, each needs an allowed API key, a submit is within quota, and a job is read or
    discarded only with the key id that submitted it. With `relay` (the store's ids made by its
    routes), another replica's job is read or discarded by passing the request on to it."""
    metrics = server.metrics
    model_name = server.signature.name
    check_model = server.check_model

    async def run_job(
        job: Job[EncodedResult],
        parsed: InferRequest,
        started: float,
        *,
        retry: bool,
        arrived: float,
    ) -> None:
        metrics.inflight.inc()
        try:
            # Owed an answer (its 202 was given): a drain that began while its body was decoded
            # or its inputs preprocessed still queues it, as it does a kept connection's.
            # In the background lane: behind the SLA's requests, with a deadline of its own.
            outputs = await server.infer(
                parsed, retry=retry, arrived=arrived, kept=True, background=True
            )
            result = await encoded(server, parsed, outputs)
        except InferenceError as exc:
            finished(status_of(exc)[1], started)
            jobs.fail(job, exc)
            return
        except asyncio.CancelledError:
            finished(RequestOutcome.CANCELLED, None)
            raise
        except Exception:
            log.exception("async infer job %s failed unexpectedly", job.id)
            finished(RequestOutcome.ERROR, started)
            jobs.fail(job, EngineFailure("internal server error; see the server log"))
            return
        finally:
            metrics.inflight.dec()
        finished(RequestOutcome.SUCCESS, started)
        jobs.succeed(job, result)

    def finished(outcome: RequestOutcome, started: float | None) -> None:
        """A job's end, its time in `batchpilot_async_job_duration_seconds` (not the SLA's)."""
        took = None if started is None else time.perf_counter() - started
        metrics.request_finished(outcome, took, background=True)

    def location(job_id: str) -> str:
        return f"/v2/models/{model_name}/infer/async/{job_id}"

    owned_by_key = (
        "; with API keys, a job is read or deleted only with the key that submitted it"
        if access is not None
        else ""
    )

    def not_found(job_id: str) -> JobNotFound:
        # The same answer whether or not another key's job has this id: it confirms nothing.
        return JobNotFound(
            f"no async job '{job_id}' for model '{model_name}': it was never submitted, was "
            f"deleted, its result expired (results are kept {jobs.ttl_s:g} s after they "
            f"finish), or the replica that took it has stopped{owned_by_key}"
        )

    async def passed_on(
        request: Request, job_id: str, owner: str | None, *, wait_s: float = 0.0
    ) -> Response | None:
        """The holder's answer when `job_id` is another replica's and this request has not been
        passed on already; None when the job is looked up here. `owner`: the caller's key id,
        checked here (what a signed relay tells the holder in place of the key)."""
        if relay is None or FORWARDED_HEADER in request.headers:
            return None
        address = relay.routes.elsewhere(job_id)
        if address is None:
            return None
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            return await relay.relay(
                request.method,
                address,
                path,
                request.headers.items(),
                job_id=job_id,
                owner=owner,
                wait_s=wait_s,
            )
        except Gone as exc:
            log.debug("async job %s: its replica is gone (%s)", job_id, exc)
            raise not_found(job_id) from exc
        except NotAnswering as exc:
            log.debug("async job %s: its replica did not answer (%s)", job_id, exc)
            if relay.routes.lapsed(job_id):
                # No replica holds a job this old: a holder deleted with its pod takes no
                # connection, and its clients were told to retry for ever.
                raise not_found(job_id) from exc
            raise HolderNotAnswering(
                f"the replica holding async job '{job_id}' did not answer in time; retry"
            ) from exc

    def owner_of(request: Request, job_id: str) -> str | None:
        """The caller's key id with API keys on (raises 401/403 as a submit would), else None.
        A request another replica passed on with a signed credential (`job_relay`) names the
        key id that replica checked: still allowed here, it is the caller's."""
        credential = relayed_for(request)
        if credential is not None:
            assert relay is not None
            who = relay.routes.relayed_for(credential, request.method, job_id)
            if who is None:
                raise Unauthorized(
                    "the relayed request's credential is not valid here", error="invalid_token"
                )
            if access is None:
                return None
            if not access.allows(who):
                raise Forbidden(f"key {who!r} may not call model {model_name!r}")
            return who
        return None if access is None else access.identify(request.headers.items())

    def relayed_for(request: Request) -> str | None:
        """The signed credential of a request another replica passed on, if it carries one."""
        if relay is None or FORWARDED_HEADER not in request.headers:
            return None
        return request.headers.get(RELAYED_FOR_HEADER)

    def signed(request: Request, job_id: str, answer: Response) -> Response:
        """`answer`, signed for the replica that passed on `request` with a signed credential
        (`JobRoutes.answer_signature`): it takes no answer from a reused address without."""
        if relayed_for(request) is not None:
            assert relay is not None
            answer.headers[ANSWER_SIGNATURE_HEADER] = relay.routes.answer_signature(
                job_id, answer.status_code, bytes(answer.body)
            )
        return answer

    async def decoded_while_connected(
        request: Request, decoding: Coroutine[Any, Any, InferRequest]
    ) -> InferRequest:
        """The request `decoding` makes; raises `ClientDisconnect` once its client has gone
        (the body is in): a large body waits for the decoder's one thread, and one nobody waits
        for leaves its line undecoded rather than holding a place there, then becoming a job
        for nobody (a decode already running finishes in its thread, for no one)."""
        handler = asyncio.current_task()
        assert handler is not None
        watcher = asyncio.get_running_loop().create_task(
            until_disconnected(request.receive, handler)
        )
        try:
            return await decoding
        except asyncio.CancelledError:
            if not (watcher.done() and handler.uncancel() == 0):
                raise
            raise ClientDisconnect() from None
        finally:
            watcher.cancel()

    async def submit(request: Request) -> Response:
        owner: str | None = None
        if access is not None:
            try:
                owner = access.admit(request.headers.items())
            except InferenceError as exc:
                return error_response(exc)
        started = time.perf_counter()
        try:
            check_model(request.path_params["name"], request.path_params.get("version"))
            if not server.ready:
                raise ShuttingDown()
            coding = body_coding(request.scope["headers"])
            body = await read_body(request, max_body_bytes)
            arrived = time.perf_counter()  # its deadline counts from here (as the sync route's)
            parsed = await decoded_while_connected(
                request, decoder.decode(body, coding, request_header_length(request))
            )
            server.validate(parsed, background=True)  # a bad request fails now, not in its job
            job = jobs.submit(owner=owner, owners=1 if access is None else access.callers())
        except InferenceError as exc:
            metrics.request_finished(status_of(exc)[1], time.perf_counter() - started)
            return error_response(exc)
        except ClientDisconnect:
            metrics.request_finished(disconnected(request.scope))
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception:
            # A bug, not the client's fault: one JSON answer as the synchronous route gives,
            # counted as an error.
            log.exception("async infer submit failed unexpectedly")
            metrics.request_finished(RequestOutcome.ERROR, time.perf_counter() - started)
            return json_response({"error": "internal server error; see the server log"}, status=500)
        retry = is_retry_raw(request.scope["headers"])
        # Owed from its 202 on: a drain that begins before its work does still lets it in.
        answered = server.owe()
        job.work = asyncio.get_running_loop().create_task(
            run_job(job, parsed, started, retry=retry, arrived=arrived),
            name=f"async-job-{job.id}",
        )
        job.work.add_done_callback(lambda _: answered())
        return json_response(
            {"id": job.id, "model_name": model_name, "status": "queued"},
            status=202,
            headers={"Location": location(job.id)},
        )

    async def fetch(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        return signed(request, job_id, await fetched(request, job_id))

    async def fetched(request: Request, job_id: str) -> Response:
        try:
            owner = owner_of(request, job_id)
            check_model(request.path_params["name"])
            wait_s = _wait_s(request)
            if (answer := await passed_on(request, job_id, owner, wait_s=wait_s)) is not None:
                return answer
            job = jobs.get(job_id, owner=owner)
            if job is not None and not job.done and wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(job.finished.wait(), wait_s)
                job = jobs.get(job_id, owner=owner)
            if job is None:
                raise not_found(job_id)
        except InferenceError as exc:
            return error_response(exc)
        if job.state is JobState.PENDING:
            return json_response(
                {"id": job.id, "model_name": model_name, "status": "pending"},
                status=202,
                headers={"Location": location(job.id), "Retry-After": "1"},
            )
        job.fetched = True
        if job.state is JobState.FAILED:
            assert isinstance(job.error, InferenceError)
            # The job's answer, kept: the same on every fetch. Its Retry-After (a 503 of
            # admission, of a drain) had clients fetch it again and again, each time told to
            # retry shortly; the header says the job failed — submit it again.
            answer = error_response(job.error)
            for name in ("retry-after", "connection"):
                if name in answer.headers:
                    del answer.headers[name]
            answer.headers[JOB_STATUS_HEADER] = "failed"
            return answer
        assert job.result is not None
        return result_response(job.result)

    async def discard(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        return signed(request, job_id, await discarded(request, job_id))

    async def discarded(request: Request, job_id: str) -> Response:
        try:
            owner = owner_of(request, job_id)
            check_model(request.path_params["name"])
            if (answer := await passed_on(request, job_id, owner)) is not None:
                return answer
            job = jobs.discard(job_id, owner=owner)
            if job is None:
                raise not_found(job_id)
        except InferenceError as exc:
            return error_response(exc)
        status = "deleted" if job.done else "cancelled"
        return json_response({"id": job_id, "model_name": model_name, "status": status})

    routes = app.router.routes
    for path in (
        "/v2/models/{name}/infer/async",
        "/v2/models/{name}/versions/{version}/infer/async",
    ):
        routes.append(Route(path, submit, methods=["POST"]))
    routes.append(Route("/v2/models/{name}/infer/async/{job_id}", fetch, methods=["GET"]))
    routes.append(Route("/v2/models/{name}/infer/async/{job_id}", discard, methods=["DELETE"]))
