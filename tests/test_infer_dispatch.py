"""The infer endpoint answers the same through its direct dispatch and through FastAPI's usual
stack (taken when the app has user middleware): same status, headers and body, for successes and
for every kind of error. Driven in-process over ASGI, with a simulated engine at zero latency."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import starlette.routing
from fastapi import routing as fastapi_routing
from starlette import _utils as starlette_utils  # what RuntimeApp's route_path relies on
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from batchpilot.runtime.app import create_app
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.infer_dispatch import RuntimeApp, route_path
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.protocol.tensors import HEADER_LENGTH
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


def model_server(model: Path) -> ModelServer:
    engine = SimulatedEngine.load(model, name="mlp", latency=LatencyModel(alpha_s=0.0, beta_s=0.0))
    metrics = RuntimeMetrics(model="mlp", service="", namespace="", engine=engine.info, nvml=None)
    return ModelServer(
        engine,
        batching=BatchSettings(max_batch_size=4, max_queue_delay_s=0.0),
        queue_capacity=16,
        metrics=metrics,
    )


def post_scope(path: str, headers: dict[str, str], *, root_path: str = "") -> dict[str, Any]:
    """The ASGI scope of an HTTP/1.1 POST to `path` with `headers`."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": root_path,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }


async def call(
    app: RuntimeApp, path: str, body: bytes, headers: dict[str, str], *, root_path: str = ""
) -> Answer:
    """One HTTP request through the app's ASGI interface; the client stays connected until the
    answer is complete. With a `root_path`, `path` includes it, as ASGI servers send it."""
    scope = post_scope(path, headers, root_path=root_path)
    sent_body = False
    answered: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        answered.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    start = next(m for m in answered if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in answered if m["type"] == "http.response.body")
    return start["status"], list(start["headers"]), content


@pytest.fixture
async def apps(tmp_path: Path) -> AsyncIterator[tuple[RuntimeApp, RuntimeApp]]:
    """The same app twice: as created (direct dispatch), and with a pass-through middleware."""
    model = onnx_models.mlp(tmp_path / "mlp.onnx", features=4, hidden=8, classes=3)
    servers = [model_server(model), model_server(model)]
    direct, stacked = (create_app(s) for s in servers)
    assert isinstance(direct, RuntimeApp)
    assert isinstance(stacked, RuntimeApp)

    async def passthrough(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        stacked.state.through_middleware += 1
        return await call_next(request)

    stacked.state.through_middleware = 0

    stacked.add_middleware(BaseHTTPMiddleware, dispatch=passthrough)
    for server in servers:
        server.start()
    yield direct, stacked
    for server in servers:
        await server.close()


def json_request(rows: int, **extra: Any) -> bytes:
    data = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4).tolist()
    return orjson.dumps(
        {
            "id": "r1",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": data}],
        }
        | extra
    )


def binary_request() -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2, 4],
                    "parameters": {"binary_data_size": 32},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    body = header + np.ones((2, 4), np.float32).tobytes()
    return body, {HEADER_LENGTH: str(len(header)), "content-length": str(len(body))}


CASES: dict[str, tuple[str, bytes, dict[str, str], int]] = {
    "json": ("/v2/models/mlp/infer", json_request(2), {}, 200),
    # the model is its version 1 (as is no version at all); any other is not found
    "unknown-version": ("/v2/models/mlp/versions/2/infer", json_request(1), {}, 404),
    "version-1": ("/v2/models/mlp/versions/1/infer", json_request(1), {}, 200),
    "binary": ("/v2/models/mlp/infer", *binary_request(), 200),
    "malformed": ("/v2/models/mlp/infer", b"{not json", {}, 400),
    "wrong-shape": (
        "/v2/models/mlp/infer",
        orjson.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
        ),
        {},
        400,
    ),
    "unknown-model": ("/v2/models/other/infer", json_request(1), {}, 404),
    "too-large": ("/v2/models/mlp/infer", b"x", {"content-length": str(1 << 40)}, 413),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
async def test_direct_dispatch_answers_exactly_as_the_usual_stack(
    apps: tuple[RuntimeApp, RuntimeApp], case: str
) -> None:
    path, body, headers, status = CASES[case]
    headers = {"content-type": "application/json", **headers}
    direct, stacked = apps
    fast = await call(direct, path, body, headers)
    usual = await call(stacked, path, body, headers)
    assert stacked.state.through_middleware == 1  # the usual stack did run
    assert fast[0] == status, fast
    assert fast == usual
    if status >= 400:
        assert orjson.loads(fast[2])["error"]


async def test_direct_dispatch_takes_requests_under_a_root_path(
    apps: tuple[RuntimeApp, RuntimeApp],
) -> None:
    direct, stacked = apps
    endpoint = direct.infer_endpoint
    assert endpoint is not None
    dispatched: list[str] = []

    async def counting(scope: Scope, receive: Receive, send: Send) -> None:
        dispatched.append(scope["path"])
        await endpoint(scope, receive, send)

    direct.infer_endpoint = counting
    path, body = "/api/v2/models/mlp/infer", json_request(1)
    headers = {"content-type": "application/json"}
    fast = await call(direct, path, body, headers, root_path="/api")
    usual = await call(stacked, path, body, headers, root_path="/api")
    assert dispatched == [path]
    assert fast[0] == 200, fast
    assert fast == usual


class TestTheOnePrivateStarletteFunction:
    """`infer_dispatch.route_path` calls Starlette's private `_utils.get_route_path`, so the
    direct dispatch takes exactly the paths the routers would match. A Starlette upgrade that
    moves, changes or stops using it fails here, not in production."""

    def test_both_routers_match_paths_with_it(self) -> None:
        assert starlette.routing.get_route_path is starlette_utils.get_route_path
        assert fastapi_routing.get_route_path is starlette_utils.get_route_path

    @pytest.mark.parametrize(
        ("path", "root_path", "expected"),
        [
            ("/v2/models/m/infer", "", "/v2/models/m/infer"),
            ("/api/v2/models/m/infer", "/api", "/v2/models/m/infer"),
            ("/api", "/api", ""),
            ("/apix/v2/models/m/infer", "/api", "/apix/v2/models/m/infer"),
            ("/v2/models/m/infer", "/api", "/v2/models/m/infer"),
        ],
    )
    def test_it_strips_the_root_path_as_the_dispatch_expects(
        self, path: str, root_path: str, expected: str
    ) -> None:
        scope = {"type": "http", "path": path, "root_path": root_path}
        assert route_path(scope) == expected
        assert starlette_utils.get_route_path(scope) == expected


async def test_a_large_answer_is_encoded_off_the_event_loop(
    apps: tuple[RuntimeApp, RuntimeApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 classes a row: 30,000 rows answer 360 KB of FP32, encoded in a thread; 2 rows, on the
    # loop (a thread's hop costs more than their encoding).
    from batchpilot.runtime import responses

    threads: list[str] = []
    encode = responses.encode_result

    def recorded(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return encode(*args)

    monkeypatch.setattr(responses, "encode_result", recorded)
    direct, _ = apps
    path = "/v2/models/mlp/infer"
    headers = {"content-type": "application/json"}
    small = await call(direct, path, json_request(2), headers)
    large = await call(direct, path, json_request(30_000), headers)
    assert (small[0], large[0]) == (200, 200)
    assert len(orjson.loads(large[2])["outputs"][0]["data"]) == 90_000
    loop_thread = threading.current_thread().name
    assert threads[0] == loop_thread
    assert threads[1] != loop_thread
