"""Large request bodies are decoded off the event loop, one at a time, and a queue of them is
bounded: the loop keeps answering (health checks, other requests) while a body of tens of
megabytes of JSON numbers is turned into arrays, and a flood of such bodies is refused with 503
rather than held in memory while their deadlines pass."""

from __future__ import annotations

import asyncio
import gzip
import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from batchpilot.runtime.app import create_app
from batchpilot.runtime.body_decoding import LARGE_JSON_BYTES, WAITING_MAX, BodyDecoder
from batchpilot.runtime.errors import Overloaded, RequestTooLarge
from batchpilot.runtime.infer_dispatch import RuntimeApp
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.responses import CLIENT_CLOSED_REQUEST
from batchpilot.runtime.server import ModelServer
from tests import onnx_models
from tests.test_infer_dispatch import call, json_request, model_server, post_scope


def body_of(values: int) -> bytes:
    data = [1.25] * values
    return orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [values // 4, 4], "data": data}]}
    )


async def test_a_large_body_is_decoded_while_the_loop_goes_on() -> None:
    body = body_of(2_000_000)  # 12 MiB of JSON
    assert len(body) > LARGE_JSON_BYTES
    decoder = BodyDecoder(max_body_bytes=1 << 30)
    decoding = asyncio.Event()
    ticks_during = 0

    async def ticker() -> None:
        nonlocal ticks_during
        while True:
            await asyncio.sleep(0)
            if decoding.is_set():
                ticks_during += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    decoding.set()
    request = await decoder.decode(body, None, None)
    decoding.clear()
    task.cancel()
    decoder.close()
    assert request.inputs[0].data.shape == (500_000, 4)
    # Inline, the loop would not have run the ticker once until the decode was over.
    assert ticks_during > 0


async def test_a_compressed_body_is_inflated_off_the_loop_within_the_limit() -> None:
    decoder = BodyDecoder(max_body_bytes=64 << 10)
    small = body_of(8)
    request = await decoder.decode(gzip.compress(small), "gzip", None)
    assert request.inputs[0].data.shape == (2, 4)
    # a few kilobytes that inflate past the limit: refused as before, from the thread
    with pytest.raises(RequestTooLarge, match="decodes from gzip to more than the limit"):
        await decoder.decode(gzip.compress(body_of(100_000)), "gzip", None)
    decoder.close()


async def test_large_bodies_beyond_those_waiting_are_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    decoded = body_of(8)
    decode = BodyDecoder._decode

    def held(self: BodyDecoder, *args: object) -> InferRequest:
        release.wait(timeout=10)
        return decode(self, decoded, None, None)

    monkeypatch.setattr(BodyDecoder, "_decode", held)
    decoder = BodyDecoder(max_body_bytes=1 << 30)
    large = b" " * (LARGE_JSON_BYTES + 1)
    waiting = [asyncio.create_task(decoder.decode(large, None, None)) for _ in range(WAITING_MAX)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match=f"decoding {WAITING_MAX} large requests") as full:
        await decoder.decode(large, None, None)
    assert full.value.reason == "queue_full"
    # a small body is not kept waiting behind them
    assert (await decoder.decode(decoded, None, None)).inputs[0].data.shape == (2, 4)
    release.set()
    assert len(await asyncio.gather(*waiting)) == WAITING_MAX
    # the queue empty again, a large body is taken
    assert await decoder.decode(large, None, None)
    decoder.close()


async def test_binary_tensor_data_behind_a_small_json_header_is_decoded_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the header's length, not the body's, says how much JSON there is to parse
    def thread(*args: object) -> InferRequest:
        raise AssertionError("decoded in the thread")

    monkeypatch.setattr(BodyDecoder, "_decode", thread)
    rows = 200_000  # 3.2 MB of FP32
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [rows, 4],
                    "parameters": {"binary_data_size": rows * 16},
                }
            ]
        }
    )
    body = header + np.ones((rows, 4), np.float32).tobytes()
    assert len(body) > LARGE_JSON_BYTES
    decoder = BodyDecoder(max_body_bytes=1 << 30)
    request = await decoder.decode(body, None, len(header))
    assert request.inputs[0].data.shape == (rows, 4)
    decoder.close()


async def test_a_deadline_counts_from_arrival_not_from_the_end_of_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body waits for the decoder's one thread behind the large ones before it: a request
    with 100 ms to live that spent 250 ms there is expired (504), not answered 200 late."""
    decode = BodyDecoder.decode

    async def behind_others(self: BodyDecoder, *args: Any) -> InferRequest:
        await asyncio.sleep(0.25)  # the large bodies ahead of it in the decoder's line
        return await decode(self, *args)

    monkeypatch.setattr(BodyDecoder, "decode", behind_others)
    model = onnx_models.mlp(tmp_path / "mlp.onnx", features=4, hidden=8, classes=3)
    server = model_server(model)
    app = create_app(server)
    assert isinstance(app, RuntimeApp)
    server.start()
    try:
        status, _, body = await call(
            app, "/v2/models/mlp/infer", json_request(1, parameters={"timeout": 100_000}), {}
        )
        fresh, _, _ = await call(app, "/v2/models/mlp/infer", json_request(1), {})
    finally:
        await server.close()
    assert status == 504
    assert "deadline passed while its body was decoded" in orjson.loads(body)["error"]
    assert fresh == 200  # the default deadline (1 s) leaves it time


async def gone_after_sending(
    app: RuntimeApp, path: str, body: bytes, headers: dict[str, str]
) -> int:
    """One request whose client goes away as soon as its body is sent (an HTTP client's timeout
    shorter than the decode): the status the app answered it with, to no one."""
    scope = post_scope(path, headers)
    sent_body = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


def counted(server: ModelServer, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in server.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("path", ["/v2/models/mlp/infer", "/v2/models/mlp/infer/async"])
async def test_clients_gone_while_their_bodies_wait_for_the_decoder_leave_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A compressed body goes to the decoder's one thread. The clients of the one it decodes
    and of the `WAITING_MAX` waiting behind it go away: each is answered at once (499, counted
    cancelled, never an arrival nor a job), the waiting ones are never decoded, and a client
    that waits is taken into the line they left — not refused 503 for work done for nobody."""
    release = threading.Event()
    in_thread = threading.Event()
    decoded = 0
    decode = BodyDecoder._decode

    def held(self: BodyDecoder, *args: Any) -> InferRequest:
        nonlocal decoded
        decoded += 1
        in_thread.set()
        release.wait(timeout=10)
        return decode(self, *args)

    monkeypatch.setattr(BodyDecoder, "_decode", held)
    model = onnx_models.mlp(tmp_path / "mlp.onnx", features=4, hidden=8, classes=3)
    server = model_server(model)
    app = create_app(server)
    assert isinstance(app, RuntimeApp)
    body = gzip.compress(json_request(1))
    headers = {"content-encoding": "gzip", "content-length": str(len(body))}
    server.start()
    try:
        gone = [asyncio.create_task(gone_after_sending(app, path, body, headers))]
        assert await asyncio.to_thread(in_thread.wait, 5)
        gone += [
            asyncio.create_task(gone_after_sending(app, path, body, headers))
            for _ in range(WAITING_MAX)
        ]
        _, pending = await asyncio.wait(gone, timeout=5)
        assert not pending, "requests whose clients had gone still wait for the decoder"
        assert [task.result() for task in gone] == [CLIENT_CLOSED_REQUEST] * (WAITING_MAX + 1)
        waiting = asyncio.create_task(call(app, path, body, headers))
        # The thread still holds the first body: the client that waits is in line, not refused.
        finished, _ = await asyncio.wait({waiting}, timeout=0.2)
        assert not finished, waiting.result()
        release.set()
        status, _, answer = await waiting
        if jobs := [job.work for job in app.state.async_jobs.pending() if job.work is not None]:
            await asyncio.wait(jobs, timeout=5)  # the job of the 202: its arrival counted
    finally:
        release.set()
        await server.close()
    assert status in (200, 202), answer
    assert decoded == 2  # the body already in the thread when its client went, and the last
    assert counted(server, "batchpilot_requests_total", outcome="cancelled") == WAITING_MAX + 1
    assert counted(server, "batchpilot_arrivals_total") == 1
    assert len(app.state.async_jobs) == (1 if path.endswith("async") else 0)
