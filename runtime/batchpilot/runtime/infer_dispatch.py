"""`RuntimeApp`: FastAPI, with the sync infer requests handed straight to their endpoint.

A request otherwise passes through a dozen ASGI layers (error, telemetry, body-limit and
exception middleware, the exit stack, route matching against every route), each one a coroutine
frame resumed at every await of the request: a large share of a request's cost when the model is
cheap. This module is the one place that bypasses them, and the one place that relies on a
private Starlette function to do it (`route_path`).
"""

from __future__ import annotations

import re

from fastapi import FastAPI

# Private: Starlette has no public way to get the path its routes match against (see route_path).
from starlette._utils import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
"""The sync infer endpoint's paths, as its two routes match them."""


def route_path(scope: Scope) -> str:
    """The path routes match against: the request's path less the app's root path, if it starts
    with it.

    Starlette has no public function for this. Its router (`starlette.routing`) and FastAPI's
    (`fastapi.routing`) compute it with the private `starlette._utils.get_route_path`, and the
    direct dispatch must take exactly the requests the infer routes would match, so it calls the
    same function rather than a copy that could drift from it. What it relies on: that function
    exists under that name, takes the scope, and is what both routers match paths with.
    tests/test_infer_dispatch.py checks all three and fails if a Starlette upgrade changes any.
    """
    return get_route_path(scope)


class RuntimeApp(FastAPI):
    """FastAPI, with `POST /v2/models/{name}[/versions/{version}]/infer` handed straight to its
    endpoint.

    The endpoint answers every error itself, so the layers it skips have nothing to do for it.
    Anything they would do differently goes the usual way: other methods and paths, apps with
    user middleware, and apps with FastAPI's OpenTelemetry instrumentation switched on. That last
    is decided once, at the first infer request, with the check `FastAPI.__call__` makes
    (OpenTelemetry providers are set once, at process start).
    """

    infer_endpoint: ASGIApp | None = None
    _telemetry_on: bool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.infer_endpoint
        if (
            endpoint is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and not self.user_middleware
        ):
            if self.root_path:
                scope["root_path"] = self.root_path
            match = INFER_PATH.fullmatch(route_path(scope))
            if match is not None and not self._telemetry_enabled():
                scope["app"] = self
                params = match.groupdict()
                if params["version"] is None:
                    del params["version"]
                scope["path_params"] = params
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _telemetry_enabled(self) -> bool:
        if self._telemetry_on is None:
            telemetry = getattr(self, "_native_telemetry", None)
            self._telemetry_on = telemetry is not None and bool(telemetry.enabled())
        return self._telemetry_on
