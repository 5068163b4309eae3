"""The endpoints for the platform rather than for clients: the Prometheus scrape and the batching
settings, each on a listener of its own (see `app`), so that callers of the model never reach
them.

`GET /metrics` is what Prometheus scrapes; `GET /admin/batching` shows the batching settings in
force and `PUT /admin/batching` changes them while serving (the operator PUTs the batching
document, `live_settings`, to ready pods on their admin port). `GET /admin/metrics` is what
`/metrics` exposes, as JSON (`batchpilot.api.samples`): the operator reads it from the pods when
Prometheus does not answer. `GET` and `PUT /admin/access` do
the same for the access document (allowed key ids and quotas, `batchpilot.api.access`): the
operator sends each ready pod its share of the service's limits the moment the spec or the number
of serving replicas changes, rather than waiting a minute for the kubelet to deliver the
ConfigMap. `POST /admin/connections/retire` makes every open connection's next answer from 1 to
3 s on its last (`Connection: close`; `{"afterSeconds", "spreadSeconds"}` say otherwise): the
operator asks the serving pods for it when a replica joins them, so that clients who keep their
connections reconnect and the Service spreads them over the new one too. Each of these needs
the admin bearer token; without one configured, they are refused.
"""

from __future__ import annotations

import hmac

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from batchpilot.api.samples import samples_doc
from batchpilot.runtime.access.files import AccessWatcher
from batchpilot.runtime.access.policy import access_doc
from batchpilot.runtime.asgi_io import read_body
from batchpilot.runtime.errors import InvalidRequest, Unauthorized
from batchpilot.runtime.exposition import Exposition
from batchpilot.runtime.http_protocol import OpenConnections
from batchpilot.runtime.live_settings import batching_doc, parse_batching
from batchpilot.runtime.responses import json_response
from batchpilot.runtime.server import ModelServer

SETTINGS_BODY_LIMIT = 64 * 1024
"""Largest batching settings document `PUT /admin/batching` reads (bytes)."""
ACCESS_BODY_LIMIT = 1024 * 1024
"""Largest access document `PUT /admin/access` reads (bytes): a quota for each of 1,000 keys fits
ten times over."""
RETIRE_BODY_LIMIT = 1024
"""Largest body `POST /admin/connections/retire` reads (bytes)."""
RETIRE_AFTER_S = 1.0
"""By default no connection retires sooner than this after the operator asks: a Service's
endpoints follow a new replica's readiness by about a second (the EndpointSlice, then
kube-proxy's sync), and a client that reconnects before is placed among the old replicas again."""
RETIRE_SPREAD_S = 2.0
"""By default the connections retire at random within this much more: not all clients
reconnect, and hit the replicas, at once."""
RETIRE_MAX_S = 300.0
NO_KEYS_MESSAGE = (
    "this server checks no API keys (it was started without --api-keys): there is no access "
    "document to show or change"
)


def add_metrics_route(app: FastAPI, server: ModelServer) -> None:
    """`GET /metrics`."""
    exposition = Exposition(server.metrics.registry)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(exposition.render(), media_type=CONTENT_TYPE_LATEST)


def add_admin_routes(
    app: FastAPI,
    server: ModelServer,
    *,
    admin_token: str | None,
    access: AccessWatcher | None = None,
    connections: OpenConnections | None = None,
) -> None:
    """`GET` and `PUT /admin/batching` and `/admin/access`; `POST /admin/connections/retire`
    where the server keeps its `connections`. `access`: what keeps the API key gate current
    (None: the server checks no keys, and `/admin/access` says so)."""

    @app.get("/admin/batching")
    async def get_batching() -> Response:
        return json_response(batching_doc(server.batching))

    @app.put("/admin/batching")
    async def put_batching(request: Request) -> Response:
        _authorize(request, admin_token)
        body = await read_body(request, SETTINGS_BODY_LIMIT)
        settings = parse_batching(body, current=server.batching)
        server.set_batching(settings, source="admin endpoint")
        return json_response(batching_doc(settings))

    @app.get("/admin/metrics")
    async def get_metrics() -> Response:
        # What /metrics exposes, as JSON: read by the operator when Prometheus does not answer.
        return json_response(
            samples_doc(
                (sample.name, sample.labels, sample.value)
                for family in server.metrics.registry.collect()
                for sample in family.samples
            )
        )

    @app.get("/admin/access")
    async def get_access() -> Response:
        if access is None:
            raise InvalidRequest(NO_KEYS_MESSAGE)
        return json_response(access_doc(access.gate.policy))

    @app.put("/admin/access")
    async def put_access(request: Request) -> Response:
        _authorize(request, admin_token)
        if access is None:
            raise InvalidRequest(NO_KEYS_MESSAGE)
        body = await read_body(request, ACCESS_BODY_LIMIT)
        return json_response(access_doc(access.apply(body, source="admin")))

    if connections is not None:

        @app.post("/admin/connections/retire")
        async def retire_connections(request: Request) -> Response:
            _authorize(request, admin_token)
            after_s, spread_s = parse_retire(await read_body(request, RETIRE_BODY_LIMIT))
            retiring = connections.retire(after_s=after_s, spread_s=spread_s)
            return json_response(
                {"retiring": retiring, "afterSeconds": after_s, "spreadSeconds": spread_s}
            )


def parse_retire(body: bytes) -> tuple[float, float]:
    """`{"afterSeconds": A, "spreadSeconds": S}` (each optional; an empty body takes both
    defaults): each connection retires at A plus a uniform share of S seconds from now."""
    if not body.strip():
        return RETIRE_AFTER_S, RETIRE_SPREAD_S
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest('the body must be an object: {"afterSeconds": S, "spreadSeconds": S}')
    unknown = sorted(set(doc) - {"afterSeconds", "spreadSeconds"})
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}: afterSeconds, spreadSeconds")
    values = []
    for key, default in (("afterSeconds", RETIRE_AFTER_S), ("spreadSeconds", RETIRE_SPREAD_S)):
        value = doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(f"{key} must be a number of seconds")
        if not 0 <= value <= RETIRE_MAX_S:
            raise InvalidRequest(f"{key} must be from 0 to {RETIRE_MAX_S:g} s, not {value:g}")
        values.append(float(value))
    return values[0], values[1]


def _authorize(request: Request, token: str | None) -> None:
    if token is None:
        raise Unauthorized(
            "changing settings over HTTP is disabled: the server has no admin token configured"
        )
    sent = request.headers.get("authorization", "")
    scheme, _, value = sent.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
        raise Unauthorized("a valid 'Authorization: Bearer <token>' header is required")
