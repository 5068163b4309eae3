"""The runtime as a real process: `batchpilot runtime serve` on a loopback port, real onnxruntime
(or the simulated accelerator where a test needs controlled timing), real HTTP clients.

What a deployment depends on is checked end to end: answers equal onnxruntime's own, existing
Triton clients work unmodified, concurrent clients each get their own rows while batches really
form, the metrics add up to the traffic, overload is shed at once, batching settings change while
serving, SIGTERM loses no accepted request, and a model that cannot be served never half-starts.

Requests and responses are encoded and decoded here with numpy and orjson, not with the runtime's
own codec, so a codec bug cannot cancel itself out.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests import onnx_models
from tests.onnx_models import MULTI_IO_INPUTS
from tests.runtime_process import (
    Reply,
    RuntimeProcess,
    Scrape,
    outcomes,
    refused_start,
    runtime_process,
    send,
)

pytestmark = pytest.mark.slow

Doc = dict[str, Any]
Array = np.ndarray[Any, Any]

DTYPES: dict[str, np.dtype[Any]] = {
    "FP32": np.dtype("<f4"),
    "FP16": np.dtype("<f2"),
    "INT64": np.dtype("<i8"),
    "INT32": np.dtype("<i4"),
    "UINT8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
V2_NAME = {dtype: name for name, dtype in DTYPES.items()}
MULTI_IO_OUTPUTS = [f"{name}_out" for name in MULTI_IO_INPUTS]
ON_CPU = ("--device", "cpu")
"""Answers are compared with onnxruntime on the CPU, so the servers run there too, GPU or not."""


# --- A small, independent v2 client -----------------------------------------------------------


def v2_request(
    inputs: Mapping[str, Array],
    *,
    binary_inputs: Collection[str] = (),
    outputs: list[Doc] | None = None,
    parameters: Doc | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Body and headers of an infer request; inputs named in `binary_inputs` go as binary."""
    entries, chunks = [], []
    for name, array in inputs.items():
        entry: Doc = {"name": name, "datatype": V2_NAME[array.dtype], "shape": list(array.shape)}
        if name in binary_inputs:
            chunks.append(np.ascontiguousarray(array).tobytes())
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    doc: Doc = {"inputs": entries}
    if outputs is not None:
        doc["outputs"] = outputs
    if parameters is not None:
        doc["parameters"] = parameters
    header = orjson.dumps(doc)
    if not chunks:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(chunks), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


@dataclass(frozen=True)
class Output:
    array: Array
    datatype: str
    binary: bool


def v2_outputs(body: bytes, header_length: str | None) -> dict[str, Output]:
    """Outputs of an infer response, in the order the response lists them."""
    end = len(body) if header_length is None else int(header_length)
    doc = orjson.loads(body[:end])
    offset = end
    outputs = {}
    for out in doc["outputs"]:
        dtype, shape = DTYPES[out["datatype"]], tuple(out["shape"])
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is None:
            array = np.array(out["data"], dtype=dtype).reshape(shape)
        else:
            array = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        outputs[out["name"]] = Output(array, out["datatype"], size is not None)
    assert offset == len(body), "binary data after the last output"
    return outputs


def outputs_of(reply: Reply) -> dict[str, Output]:
    assert reply.status == 200, reply.body
    return v2_outputs(reply.body, reply.headers.get("inference-header-content-length"))


async def post(
    session: aiohttp.ClientSession,
    server: RuntimeProcess,
    path: str,
    request: tuple[bytes, dict[str, str]],
) -> Reply:
    body, headers = request
    async with session.post(f"{server.url}{path}", data=body, headers=headers) as response:
        return Reply(
            response.status,
            {k.lower(): v for k, v in response.headers.items()},
            await response.read(),
        )


def wait_until(condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(0.02)


def error_of(reply: Reply) -> str:
    assert reply.headers["content-type"] == "application/json", reply.headers
    message = reply.json()["error"]
    assert isinstance(message, str)
    return message


# --- Servers and reference sessions -----------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_server(
    mlp_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    with runtime_process(
        mlp_model, *ON_CPU, "--max-queue-delay-ms", "1", log_dir=tmp_path_factory.mktemp("mlp")
    ) as running:
        yield running


@pytest.fixture(scope="module")
def multi_io_server(
    multi_io_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    with runtime_process(
        multi_io_model,
        *ON_CPU,
        "--max-queue-delay-ms",
        "1",
        log_dir=tmp_path_factory.mktemp("multi_io"),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def mlp_session(mlp_model: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(mlp_model), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def multi_io_session(multi_io_model: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(multi_io_model), providers=["CPUExecutionProvider"])


def run_directly(session: ort.InferenceSession, inputs: Mapping[str, Array]) -> dict[str, Array]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs)), strict=True))


def mlp_rows(rows: int, *, seed: int) -> dict[str, Array]:
    return {"x": np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)}


# --- Answers equal onnxruntime's --------------------------------------------------------------


class TestAnswersEqualOnnxruntime:
    @pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
    def test_mlp_rows(
        self, mlp_server: RuntimeProcess, mlp_session: ort.InferenceSession, binary: bool
    ) -> None:
        inputs = mlp_rows(5, seed=1)
        reply = send(
            mlp_server,
            "POST",
            "/v2/models/mlp/infer",
            *v2_request(
                inputs,
                binary_inputs={"x"} if binary else (),
                parameters={"binary_data_output": binary},
            ),
        )
        outputs = outputs_of(reply)
        assert list(outputs) == ["logits"]
        assert outputs["logits"].datatype == "FP32"
        assert outputs["logits"].binary is binary
        np.testing.assert_array_equal(
            outputs["logits"].array, run_directly(mlp_session, inputs)["logits"]
        )

    @pytest.mark.parametrize(
        ("binary_inputs", "binary_data_output"),
        [
            pytest.param((), False, id="json-in-json-out"),
            pytest.param(tuple(MULTI_IO_INPUTS), True, id="binary-in-binary-out"),
            pytest.param((), True, id="json-in-binary-out"),
            pytest.param(tuple(MULTI_IO_INPUTS), False, id="binary-in-json-out"),
            pytest.param(("f32", "i64", "u8"), True, id="mixed-in-binary-out"),
        ],
    )
    def test_every_datatype(
        self,
        multi_io_server: RuntimeProcess,
        multi_io_session: ort.InferenceSession,
        binary_inputs: tuple[str, ...],
        binary_data_output: bool,
    ) -> None:
        inputs = onnx_models.random_multi_io(4, seed=2)
        reply = send(
            multi_io_server,
            "POST",
            "/v2/models/multi_io/infer",
            *v2_request(
                inputs,
                binary_inputs=binary_inputs,
                parameters={"binary_data_output": binary_data_output},
            ),
        )
        outputs = outputs_of(reply)
        expected = run_directly(multi_io_session, inputs)
        assert list(outputs) == MULTI_IO_OUTPUTS
        for name, want in expected.items():
            got = outputs[name]
            assert got.datatype == V2_NAME[want.dtype], name
            assert got.binary is binary_data_output, name
            np.testing.assert_array_equal(got.array, want, err_msg=name)

    def test_requested_outputs_come_in_the_order_asked_with_their_own_binary_flag(
        self, multi_io_server: RuntimeProcess, multi_io_session: ort.InferenceSession
    ) -> None:
        inputs = onnx_models.random_multi_io(3, seed=3)
        reply = send(
            multi_io_server,
            "POST",
            "/v2/models/multi_io/infer",
            *v2_request(
                inputs,
                binary_inputs={"f16", "flag"},
                parameters={"binary_data_output": True},
                outputs=[
                    {"name": "flag_out", "parameters": {"binary_data": False}},
                    {"name": "i64_out"},  # takes binary_data_output
                    {"name": "f16_out", "parameters": {"binary_data": True}},
                ],
            ),
        )
        outputs = outputs_of(reply)
        expected = run_directly(multi_io_session, inputs)
        assert list(outputs) == ["flag_out", "i64_out", "f16_out"]
        assert [o.binary for o in outputs.values()] == [False, True, True]
        for name, got in outputs.items():
            np.testing.assert_array_equal(got.array, expected[name], err_msg=name)

    def test_an_empty_outputs_list_means_every_output(
        self, multi_io_server: RuntimeProcess, multi_io_session: ort.InferenceSession
    ) -> None:
        inputs = onnx_models.random_multi_io(2, seed=6)
        reply = send(
            multi_io_server,
            "POST",
            "/v2/models/multi_io/infer",
            *v2_request(inputs, outputs=[], parameters={"binary_data_output": True}),
        )
        outputs = outputs_of(reply)
        assert list(outputs) == MULTI_IO_OUTPUTS
        assert all(o.binary for o in outputs.values())
        for name, want in run_directly(multi_io_session, inputs).items():
            np.testing.assert_array_equal(outputs[name].array, want, err_msg=name)

    def test_json_outputs_when_no_binary_is_asked_for(
        self, multi_io_server: RuntimeProcess
    ) -> None:
        inputs = onnx_models.random_multi_io(2, seed=4)
        reply = send(
            multi_io_server,
            "POST",
            "/v2/models/multi_io/infer",
            *v2_request(inputs, outputs=[{"name": "u8_out"}]),
        )
        assert reply.headers["content-type"] == "application/json"
        assert "inference-header-content-length" not in reply.headers
        assert [o["name"] for o in reply.json()["outputs"]] == ["u8_out"]
        np.testing.assert_array_equal(outputs_of(reply)["u8_out"].array, inputs["u8"])


# --- Existing Triton clients work -------------------------------------------------------------


@pytest.fixture
def triton_client(multi_io_server: RuntimeProcess) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(url=f"127.0.0.1:{multi_io_server.port}")
    try:
        yield client
    finally:
        client.close()


class TestTritonClientWorksUnmodified:
    def test_health_and_metadata(self, triton_client: triton.InferenceServerClient) -> None:
        assert triton_client.is_server_live()
        assert triton_client.is_server_ready()
        assert triton_client.is_model_ready("multi_io")
        assert not triton_client.is_model_ready("other")
        assert "binary_tensor_data" in triton_client.get_server_metadata()["extensions"]
        metadata = triton_client.get_model_metadata("multi_io")
        assert metadata["name"] == "multi_io"
        assert metadata["platform"] == "onnxruntime_onnx"
        assert metadata["inputs"] == [
            {"name": name, "datatype": datatype, "shape": [-1, *shape]}
            for name, (_, datatype, _, shape) in MULTI_IO_INPUTS.items()
        ]
        assert [o["name"] for o in metadata["outputs"]] == MULTI_IO_OUTPUTS

    @pytest.mark.parametrize(
        ("binary_inputs", "binary_outputs"),
        [
            pytest.param(True, True, id="binary-in-binary-out"),
            pytest.param(False, False, id="json-in-json-out"),
            pytest.param(True, False, id="binary-in-json-out"),
            pytest.param(False, True, id="json-in-binary-out"),
            pytest.param(True, None, id="binary-in-default-out"),
        ],
    )
    def test_infer(
        self,
        triton_client: triton.InferenceServerClient,
        multi_io_session: ort.InferenceSession,
        binary_inputs: bool,
        binary_outputs: bool | None,
    ) -> None:
        data = onnx_models.random_multi_io(3, seed=5)
        inputs = []
        for name, (_, datatype, _, _) in MULTI_IO_INPUTS.items():
            tensor = triton.InferInput(name, list(data[name].shape), datatype)
            tensor.set_data_from_numpy(data[name], binary_data=binary_inputs)
            inputs.append(tensor)
        outputs = (
            None  # the client then asks for every output, in binary
            if binary_outputs is None
            else [
                triton.InferRequestedOutput(n, binary_data=binary_outputs) for n in MULTI_IO_OUTPUTS
            ]
        )
        result = triton_client.infer("multi_io", inputs, outputs=outputs, request_id="r-1")
        assert result.get_response()["id"] == "r-1"
        for name, want in run_directly(multi_io_session, data).items():
            got = result.as_numpy(name)
            assert got is not None, name
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want, err_msg=name)

    @pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
    def test_compressed_requests(
        self,
        triton_client: triton.InferenceServerClient,
        multi_io_session: ort.InferenceSession,
        algorithm: str,
    ) -> None:
        # tritonclient compresses the whole body, binary tensors included; the header length
        # it sends is the uncompressed JSON's
        data = onnx_models.random_multi_io(2, seed=9)
        inputs = []
        for name, (_, datatype, _, _) in MULTI_IO_INPUTS.items():
            tensor = triton.InferInput(name, list(data[name].shape), datatype)
            tensor.set_data_from_numpy(data[name], binary_data=True)
            inputs.append(tensor)
        result = triton_client.infer("multi_io", inputs, request_compression_algorithm=algorithm)
        for name, want in run_directly(multi_io_session, data).items():
            np.testing.assert_array_equal(result.as_numpy(name), want, err_msg=name)

    def test_server_errors_reach_the_client_as_exceptions(
        self, triton_client: triton.InferenceServerClient
    ) -> None:
        tensor = triton.InferInput("f32", [1, 5], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 5), np.float32))
        with pytest.raises(InferenceServerException) as raised:
            triton_client.infer("multi_io", [tensor])
        assert raised.value.status() == "400"
        assert "input 'f16', 'flag', 'i32', 'i64', 'u8' of model 'multi_io' is missing" in (
            raised.value.message()
        )


# --- Concurrent clients and batching ----------------------------------------------------------


class TestConcurrentClientsGetTheirOwnRows:
    CLIENTS = 32

    async def test_each_client_gets_its_own_rows_from_shared_batches(
        self, mlp_model: Path, mlp_session: ort.InferenceSession, tmp_path: Path
    ) -> None:
        with runtime_process(
            mlp_model,
            *ON_CPU,
            "--max-batch-size",
            "16",
            "--max-queue-delay-ms",
            "20",
            log_dir=tmp_path,
        ) as server:
            inputs = [mlp_rows(1 + i % 4, seed=100 + i) for i in range(self.CLIENTS)]
            requests = [
                v2_request(
                    x,
                    binary_inputs={"x"} if i % 2 else (),
                    parameters={"binary_data_output": bool(i % 2)},
                )
                for i, x in enumerate(inputs)
            ]
            connector = aiohttp.TCPConnector(limit=self.CLIENTS)
            timeout = aiohttp.ClientTimeout(total=20)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                replies = await asyncio.gather(
                    *(post(session, server, "/v2/models/mlp/infer", r) for r in requests)
                )
            for i, (x, reply) in enumerate(zip(inputs, replies, strict=True)):
                got = outputs_of(reply)["logits"].array
                want = run_directly(mlp_session, x)["logits"]
                # rows computed inside a bigger batch may differ from a lone run in the last bit
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"client {i}")

            scrape = Scrape(server)
            rows = sum(len(x["x"]) for x in inputs)
            batches = scrape.value("batchpilot_batch_size_count")
            assert scrape.value("batchpilot_batch_size_sum") == rows
            assert scrape.value("batchpilot_batch_rows_total") == rows
            assert scrape.value("batchpilot_requests_total", outcome="success") == self.CLIENTS
            # batching happened: fewer batches than requests, and some batch had several rows
            assert batches < self.CLIENTS
            assert scrape.value("batchpilot_batch_size_bucket", le="1.0") < batches
            assert scrape.value("batchpilot_batch_size_bucket", le="16.0") == batches


# --- Metrics follow the traffic ---------------------------------------------------------------

BUCKETED = (
    "batchpilot_batches_total",
    "batchpilot_batch_rows_total",
    "batchpilot_batch_compute_seconds_total",
)


class TestMetricsFollowTheTraffic:
    def test_counts_match_what_was_sent(self, mlp_model: Path, tmp_path: Path) -> None:
        with runtime_process(
            mlp_model,
            *ON_CPU,
            "--max-batch-size",
            "8",
            "--max-queue-delay-ms",
            "1",
            log_dir=tmp_path,
            env={"BATCHPILOT_ISVC_NAME": "classifier", "BATCHPILOT_ISVC_NAMESPACE": "vision"},
        ) as server:
            # Before the first batch, every bucket a batch of at most 8 rows falls in is there at
            # zero: Prometheus sees each count from the first, and its rate() misses none.
            before = Scrape(server)
            for name in BUCKETED:
                assert {
                    s.labels["batch_bucket"]: s.value for s in before.samples if s.name == name
                } == {"1": 0, "2": 0, "4": 0, "8": 0}
            sizes = [1, 2, 3, 4, 5]  # one request at a time: one batch each
            for rows in sizes:
                reply = send(
                    server, "POST", "/v2/models/mlp/infer", *v2_request(mlp_rows(rows, seed=rows))
                )
                assert reply.status == 200
            invalid = [
                ("/v2/models/mlp/infer", v2_request({"y": np.zeros((1, 64), np.float32)})),
                ("/v2/models/mlp/infer", (b"{", {})),
                ("/v2/models/mlp/infer", v2_request({"x": np.zeros((1, 63), np.float32)})),
                ("/v2/models/other/infer", v2_request(mlp_rows(1, seed=0))),
            ]
            for path, request in invalid:
                assert send(server, "POST", path, *request).status in {400, 404}

            scrape = Scrape(server)
            labels = {"model": "mlp", "isvc": "classifier", "namespace": "vision"}
            assert outcomes(scrape) == {
                "success": len(sizes),
                "invalid": len(invalid),
                "rejected": 0,
                "timeout": 0,
                "cancelled": 0,
                "error": 0,
            }
            # the latency of requests the server took on: invalid ones are not timed
            assert scrape.value("batchpilot_request_duration_seconds_count", **labels) == len(sizes)
            # every valid request is an arrival, admitted into the queue
            assert scrape.value("batchpilot_arrivals_total", **labels) == len(sizes)
            assert scrape.value("batchpilot_admitted_total", **labels) == len(sizes)
            # with their rows and the rows' squares: how much the sizes vary (invalid: none)
            assert scrape.value("batchpilot_arrival_rows_total", **labels) == sum(sizes)
            assert scrape.value("batchpilot_arrival_rows_squared_total", **labels) == sum(
                r * r for r in sizes
            )
            # and counts in the last seconds' rate (its arithmetic: tests/test_arrival_rate.py)
            assert scrape.value("batchpilot_recent_arrivals_per_second", **labels) >= 0
            assert scrape.value("batchpilot_request_duration_seconds_sum", **labels) > 0
            # their time in the batcher is part of their duration, and the rest is outside it
            in_batcher = scrape.value("batchpilot_batcher_seconds_total", **labels)
            assert (
                0 < in_batcher < scrape.value("batchpilot_request_duration_seconds_sum", **labels)
            )
            assert scrape.value("batchpilot_batch_size_count", **labels) == len(sizes)
            assert scrape.value("batchpilot_batch_size_sum", **labels) == sum(sizes)
            assert scrape.value("batchpilot_batch_rows_total", **labels) == sum(sizes)
            assert scrape.value("batchpilot_batches_total", **labels) == len(sizes)
            # power-of-two buckets: 1 -> "1", 2 -> "2", 3 and 4 -> "4", 5 -> "8"
            for bucket, batches in {"1": 1, "2": 1, "4": 2, "8": 1}.items():
                assert scrape.value("batchpilot_batches_total", batch_bucket=bucket) == batches
            assert scrape.value("batchpilot_batch_rows_total", batch_bucket="4") == 7
            assert scrape.value("batchpilot_queue_wait_seconds_count") == len(sizes)
            assert scrape.value("batchpilot_batch_duration_seconds_count") == len(sizes)
            busy = scrape.value("batchpilot_device_busy_seconds_total")
            assert busy > 0
            # one instance: each batch computes within its span, and the spans never overlap
            assert 0 < scrape.value("batchpilot_batch_compute_seconds_total") <= busy
            assert (
                scrape.value(
                    "batchpilot_engine_info",
                    engine="onnxruntime",
                    device="cpu",
                    simulated="false",
                    **labels,
                )
                == 1
            )
            assert scrape.value("batchpilot_batching_max_batch_size") == 8
            assert scrape.value("batchpilot_batching_max_queue_delay_seconds") == 0.001
            assert scrape.value("batchpilot_queue_depth") == 0
            assert scrape.value("batchpilot_inflight_requests") == 0

    def test_clients_that_go_away_are_counted_as_cancelled(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=300,beta_ms=0",
            log_dir=tmp_path,
        ) as server:
            request_head, body, headers = raw_infer_request()
            # gone while sending the body, then gone while its request is being computed
            for sent, cancelled in ((request_head + body[:10], 1), (request_head + body, 2)):
                with socket.create_connection(("127.0.0.1", server.port)) as raw:
                    raw.sendall(sent)
                wait_cancelled(server, cancelled)
            assert send(server, "POST", "/v2/models/mlp/infer", body, headers).status == 200
            scrape = Scrape(server)
            assert outcomes(scrape)["success"] == 1
            assert outcomes(scrape)["error"] == 0
            assert scrape.value("batchpilot_inflight_requests") == 0
            # the one that arrived went away within its 1 s deadline (no SLA here): withdrawn;
            # the one cut short never arrived
            assert scrape.value("batchpilot_arrivals_total", attempt="first") == 2
            assert scrape.value("batchpilot_withdrawn_total") == 1
            assert "Traceback" not in server.log()

    def test_a_client_gone_before_the_sla_withdraws_its_request_and_after_it_misses(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        config = tmp_path / "batching.json"
        config.write_text(
            '{"maxBatchSize": 1, "maxQueueDelayMs": 0, "deadlineMs": 5000, "slaMs": 250}'
        )
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=1200,beta_ms=0",
            "--batching-config",
            str(config),
            log_dir=tmp_path,
        ) as server:
            request_head, body, _ = raw_infer_request()
            # gone at once (a hedged request whose twin was answered elsewhere), then gone after
            # waiting 0.5 s, twice the SLA, while its 1.2 s batch still ran (a caller that gave up)
            for patience_s, cancelled in ((0.0, 1), (0.5, 2)):
                with socket.create_connection(("127.0.0.1", server.port)) as raw:
                    raw.sendall(request_head + body)
                    wait_until(
                        lambda: Scrape(server).value("batchpilot_inflight_requests") == 1,
                        timeout_s=10,
                        what="the request in the server",
                    )
                    time.sleep(patience_s)  # the client's own patience, not a wait for the server
                wait_cancelled(server, cancelled)
            scrape = Scrape(server)
            assert scrape.value("batchpilot_arrivals_total", attempt="first") == 2
            assert scrape.value("batchpilot_withdrawn_total") == 1
            assert outcomes(scrape)["success"] == 0


def raw_infer_request() -> tuple[bytes, bytes, dict[str, str]]:
    """A one-row infer request for the MLP as raw HTTP/1.1: its head, its body, and the headers
    the head carries (beside Host and Content-Length)."""
    body, headers = v2_request(mlp_rows(1, seed=0))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request_head = (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return request_head, body, headers


def wait_cancelled(server: RuntimeProcess, count: int) -> None:
    """Until the server has counted `count` requests cancelled by their clients."""
    wait_until(
        lambda: Scrape(server).value("batchpilot_requests_total", outcome="cancelled") == count,
        timeout_s=10,
        what=f"{count} cancelled",
    )


# --- The simulated accelerator ----------------------------------------------------------------


def image_request() -> tuple[bytes, dict[str, str]]:
    return v2_request(
        {"images": np.zeros((1, 3, 224, 224), np.float32)},
        binary_inputs={"images"},
        parameters={"binary_data_output": True},
    )


class TestSimulatedEngine:
    async def test_says_it_is_simulated_and_batches_like_an_accelerator(
        self, image_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(
            image_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=20,beta_ms=1",
            "--max-batch-size",
            "8",
            # long enough that the batch can only form by filling up
            "--max-queue-delay-ms",
            "5000",
            log_dir=tmp_path,
        ) as server:
            metadata = send(server, "GET", "/v2/models/image").json()
            assert metadata["platform"] == "simulated"
            assert metadata["parameters"]["simulated"] is True
            assert metadata["parameters"]["engine"] == "simulated"
            assert "SIMULATED" in server.log()
            scrape = Scrape(server)
            assert scrape.value("batchpilot_engine_info", engine="simulated", simulated="true") == 1
            # timed at start-up: 1 row and the batch limit, t(1) = 21 ms and t(8) = 28 ms (the
            # simulated batch may end up to 1 ms early by the server's clock)
            assert 0.020 <= scrape.value("batchpilot_startup_batch_seconds", rows="1") < 0.2
            assert 0.027 <= scrape.value("batchpilot_startup_batch_seconds", rows="8") < 0.2

            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
                replies = await asyncio.gather(
                    *(
                        post(session, server, "/v2/models/image/infer", image_request())
                        for _ in range(8)
                    )
                )
            for reply in replies:
                probabilities = outputs_of(reply)["probabilities"]
                assert probabilities.array.shape == (1, 1000)

            scrape = Scrape(server)
            # the start-up batches are no traffic: not in the batch counts
            assert scrape.value("batchpilot_batch_size_count") == 1
            assert scrape.value("batchpilot_batch_size_sum") == 8
            # t(8) = 20 ms + 1 ms x 8 = 28 ms; uvloop's timers tick in whole milliseconds, so the
            # simulated batch may end up to 1 ms early by the server's perf_counter clock
            compute = scrape.value("batchpilot_batch_duration_seconds_sum")
            assert 0.027 <= compute < 0.5, compute

    async def test_sigusr1_throttles_the_device_and_the_server_keeps_serving(
        self, image_model: Path, tmp_path: Path
    ) -> None:
        # The pretend device's fault (the sandbox's --throttle-pod): t(1) = 40 ms, then 80 ms.
        with runtime_process(
            image_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=39,beta_ms=1",
            "--max-batch-size",
            "1",
            log_dir=tmp_path,
        ) as server:

            async def one_batch() -> float:
                """The compute time of one more batch of 1, as the server counts it."""
                before = Scrape(server).value("batchpilot_batch_duration_seconds_sum")
                async with aiohttp.ClientSession() as session:
                    await post(session, server, "/v2/models/image/infer", image_request())
                return Scrape(server).value("batchpilot_batch_duration_seconds_sum") - before

            assert 0.039 <= await one_batch() < 0.07
            server.process.send_signal(signal.SIGUSR1)
            assert 0.079 <= await one_batch() < 0.14
            assert send(server, "GET", "/v2/health/ready").status == 200

    def test_times_the_largest_batch_limit_allowed_at_start_up(
        self, image_model: Path, tmp_path: Path
    ) -> None:
        # the batch limit in force is 1; it may be raised to 200, which is timed as 64 rows
        with runtime_process(
            image_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=5,beta_ms=1",
            "--max-batch-size",
            "1",
            "--calibration-rows",
            "200",
            log_dir=tmp_path,
        ) as server:
            scrape = Scrape(server)
        timed = {
            s.labels["rows"]: s.value
            for s in scrape.samples
            if s.name == "batchpilot_startup_batch_seconds"
        }
        assert set(timed) == {"1", "64"}
        assert 0.005 <= timed["1"] < timed["64"]
        assert 0.068 <= timed["64"] < 0.5  # t(64) = 5 + 64 ms
        assert "t(b) = " in server.log()  # what admission predicts from, logged


class TestABacklogRunsInOneBatch:
    async def test_what_waits_behind_a_running_batch_runs_together_up_to_the_burst_size(
        self, image_model: Path, tmp_path: Path
    ) -> None:
        # t(b) = 800 + 1·b ms, a batch limit of 2 and a burst size of 32: 20 requests sent
        # while the first runs alone are one batch of 20 after it, not ten of 2.
        with runtime_process(
            image_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=800,beta_ms=1",
            "--max-batch-size",
            "2",
            "--burst-batch-size",
            "32",
            "--calibration-rows",
            "2",
            "--max-queue-delay-ms",
            "0",
            "--deadline-ms",
            "10000",
            log_dir=tmp_path,
        ) as server:
            assert Scrape(server).value("batchpilot_batching_burst_batch_size") == 32
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                first = asyncio.ensure_future(
                    post(session, server, "/v2/models/image/infer", image_request())
                )
                # the first request's batch runs: the rest arrive behind it (bounded wait,
                # the loop free to send it)
                for _ in range(1000):
                    if Scrape(server).value("batchpilot_inflight_requests") == 1:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the first request never reached the server")
                replies = await asyncio.gather(
                    first,
                    *(
                        post(session, server, "/v2/models/image/infer", image_request())
                        for _ in range(20)
                    ),
                )
            assert [reply.status for reply in replies] == [200] * 21
            scrape = Scrape(server)
            assert scrape.value("batchpilot_batch_size_count") == 2
            assert scrape.value("batchpilot_batch_size_sum") == 21


# --- Overload ---------------------------------------------------------------------------------


class TestOverloadIsShedAtOnce:
    async def test_a_full_queue_answers_503_with_retry_after_without_waiting(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=500,beta_ms=0",
            "--max-batch-size",
            "1",
            "--max-queue-delay-ms",
            "0",
            "--queue-capacity",
            "2",
            # the queue bound alone, what deadline admission keeps as a last resort
            "--admission",
            "queue",
            "--deadline-ms",
            "0",
            log_dir=tmp_path,
        ) as server:
            loop = asyncio.get_running_loop()
            request = v2_request(mlp_rows(1, seed=0))

            async def timed(session: aiohttp.ClientSession) -> tuple[Reply, float, float]:
                started = loop.time()
                reply = await post(session, server, "/v2/models/mlp/infer", request)
                return reply, loop.time() - started, loop.time()

            connector = aiohttp.TCPConnector(limit=8)
            async with aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=20)
            ) as session:
                results = await asyncio.gather(*(timed(session) for _ in range(8)))

            served = [(took, at) for reply, took, at in results if reply.status == 200]
            shed = [(reply, at) for reply, _, at in results if reply.status != 200]
            # One request runs for 500 ms and two wait; a third gets in if the batcher took the
            # first one off the queue before all eight had arrived.
            assert len(served) in {2, 3}, [r.status for r, _, _ in results]
            # (the simulated 500 ms may end up to 1 ms early: uvloop's timers tick in whole ms)
            assert all(took >= 0.49 for took, _ in served), served
            first_served_at = min(at for _, at in served)
            for reply, at in shed:
                assert reply.status == 503
                assert int(reply.headers["retry-after"]) >= 1
                assert "queue is full" in error_of(reply)
                # shed at once: answered before the first batch (500 ms) was done
                assert at < first_served_at

            counts = outcomes(Scrape(server))
            assert counts["rejected"] == len(shed)
            assert counts["success"] == len(served)


# --- Batching settings change while serving ---------------------------------------------------


class TestBatchingChangesWhileServing:
    TOKEN = "s3cret-token"

    async def test_admin_endpoint_changes_settings_with_the_token_only(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        token_file = tmp_path / "token"
        token_file.write_text(self.TOKEN + "\n")
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=1,beta_ms=0",
            "--max-batch-size",
            "8",
            "--max-queue-delay-ms",
            "5000",
            "--admin-token-file",
            str(token_file),
            log_dir=tmp_path,
        ) as server:

            def put(body: bytes, authorization: str | None = f"Bearer {self.TOKEN}") -> Reply:
                headers = {} if authorization is None else {"Authorization": authorization}
                return send(server, "PUT", "/admin/batching", body, headers, port=server.admin_port)

            def in_force() -> Any:
                return send(server, "GET", "/admin/batching", port=server.admin_port).json()

            assert in_force() == {
                "maxBatchSize": 8,
                "maxQueueDelayMs": 5000.0,
                "deadlineMs": 1000.0,
            }
            change = b'{"maxBatchSize": 2}'
            for authorization in (None, "Bearer wrong", f"Basic {self.TOKEN}", self.TOKEN):
                reply = put(change, authorization)
                assert reply.status == 401, authorization
                assert "Bearer" in error_of(reply)
            for bad in (
                b"not json",
                b"[2]",
                b'{"maxBatchSize": 0}',
                b'{"maxBatchSize": "2"}',
                b'{"maxQueueDelayMs": -1}',
                b'{"maxQueueDelayMs": 60000}',
                b'{"batchSize": 2}',
            ):
                reply = put(bad)
                assert reply.status == 400, bad
                error_of(reply)
            assert in_force() == {
                "maxBatchSize": 8,
                "maxQueueDelayMs": 5000.0,
                "deadlineMs": 1000.0,
            }

            reply = put(change)  # an absent key keeps its value
            assert reply.status == 200
            assert reply.json() == {
                "maxBatchSize": 2,
                "maxQueueDelayMs": 5000.0,
                "deadlineMs": 1000.0,
            }
            assert in_force() == reply.json()
            assert send(server, "GET", "/v2/models/mlp").json()["parameters"]["max_batch_size"] == 2
            scrape = Scrape(server)
            assert scrape.value("batchpilot_batching_max_batch_size") == 2
            assert scrape.value("batchpilot_batching_max_queue_delay_seconds") == 5.0
            assert "batching changed by admin endpoint: max_batch_size 8 -> 2" in server.log()

            # the next batches use it: 4 one-row requests, a 5 s delay: two batches of 2
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
                replies = await asyncio.gather(
                    *(
                        post(
                            session, server, "/v2/models/mlp/infer", v2_request(mlp_rows(1, seed=i))
                        )
                        for i in range(4)
                    )
                )
            assert [r.status for r in replies] == [200] * 4
            scrape = Scrape(server)
            assert scrape.value("batchpilot_batch_size_count") == 2
            assert scrape.value("batchpilot_batch_size_sum") == 4

            reply = put(b'{"maxQueueDelayMs": 2.5}')
            assert reply.json() == {"maxBatchSize": 2, "maxQueueDelayMs": 2.5, "deadlineMs": 1000.0}
            meta = send(server, "GET", "/v2/models/mlp").json()["parameters"]
            assert meta["max_queue_delay_ms"] == 2.5
            assert Scrape(server).value("batchpilot_batching_max_queue_delay_seconds") == 0.0025

            # the default deadline is live too (the operator keeps it at the SLA)
            reply = put(b'{"deadlineMs": 80}')
            assert reply.json()["deadlineMs"] == 80.0
            assert send(server, "GET", "/v2/models/mlp").json()["parameters"]["deadline_ms"] == 80
            assert Scrape(server).value("batchpilot_deadline_seconds") == 0.08
            assert "default deadline changed by admin endpoint: 1000 ms -> 80 ms" in server.log()

    def test_without_a_configured_token_changes_are_refused(
        self, mlp_server: RuntimeProcess
    ) -> None:
        reply = send(
            mlp_server,
            "PUT",
            "/admin/batching",
            b'{"maxBatchSize": 2}',
            {"Authorization": "Bearer x"},
            port=mlp_server.admin_port,
        )
        assert reply.status == 401
        assert "no admin token configured" in error_of(reply)

    def test_mounted_config_file_is_followed_and_a_broken_one_ignored(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        mount = tmp_path / "config"
        mount.mkdir()
        configmap = ConfigMapVolume(mount, "batching.json")
        configmap.write('{"maxBatchSize": 4, "maxQueueDelayMs": 2}')
        with runtime_process(
            mlp_model,
            "--max-batch-size",
            "8",
            "--max-queue-delay-ms",
            "5",
            "--batching-config",
            str(configmap.path),
            log_dir=tmp_path,
            env={"BATCHPILOT_CONFIG_POLL_S": "0.05"},
        ) as server:

            def in_force() -> Any:
                return send(server, "GET", "/admin/batching", port=server.admin_port).json()

            # the file wins over the flags, from the first request on
            assert in_force() == {"maxBatchSize": 4, "maxQueueDelayMs": 2.0, "deadlineMs": 1000.0}
            assert send(server, "GET", "/v2/models/mlp").json()["parameters"]["max_batch_size"] == 4

            configmap.write('{"maxBatchSize": 16, "maxQueueDelayMs": 7}')
            wanted = {"maxBatchSize": 16, "maxQueueDelayMs": 7.0, "deadlineMs": 1000.0}
            wait_until(lambda: in_force() == wanted, timeout_s=10, what="new file in force")
            scrape = Scrape(server)
            assert scrape.value("batchpilot_batching_max_batch_size") == 16
            assert scrape.value("batchpilot_batching_max_queue_delay_seconds") == 0.007

            report = f"batching config {configmap.path} ignored"
            for reports, broken in enumerate(("{not json", '{"maxBatchSize": 0}'), start=1):
                configmap.write(broken)

                def reported(expected: int = reports) -> bool:
                    return server.log().count(report) == expected

                wait_until(
                    reported,
                    timeout_s=10,
                    what="broken file reported",
                )
                assert in_force() == wanted
                assert send(server, "GET", "/v2/health/ready").status == 200

            configmap.write('{"maxBatchSize": 3}')  # an absent key keeps its value
            wait_until(
                lambda: (
                    in_force() == {"maxBatchSize": 3, "maxQueueDelayMs": 7.0, "deadlineMs": 1000.0}
                ),
                timeout_s=10,
                what="repaired file in force",
            )


class ConfigMapVolume:
    """A directory laid out the way kubelet mounts a ConfigMap: `key` -> `..data/key`, and
    `..data` -> a timestamped directory; an update swaps `..data` atomically (rename)."""

    def __init__(self, mount: Path, key: str) -> None:
        self.mount = mount
        self.path = mount / key
        self._key = key
        self._version = 0
        self._current: Path | None = None

    def write(self, text: str) -> None:
        self._version += 1
        target = self.mount / f"..2024_01_01_00_00_{self._version:02d}"
        target.mkdir()
        (target / self._key).write_text(text)
        staged = self.mount / "..data_tmp"
        staged.symlink_to(target.name)
        os.replace(staged, self.mount / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to(f"..data/{self._key}")
        if self._current is not None:
            (self._current / self._key).unlink()
            self._current.rmdir()
        self._current = target


# --- SIGTERM drains ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One request a client tried to send, and what became of it."""

    status: int | None  # None: no HTTP response at all
    error: str = ""
    answered_at: float = 0.0
    body: bytes = b""


class TestSigtermLosesNothing:
    CLIENTS = 12

    async def test_every_accepted_request_is_answered(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=30,beta_ms=1",
            # 12 closed-loop clients, batches of 4: at any moment about 8 requests are queued
            "--max-batch-size",
            "4",
            "--max-queue-delay-ms",
            "5",
            "--drain-grace-s",
            "10",
            log_dir=tmp_path,
        ) as server:
            loop = asyncio.get_running_loop()
            request = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
            attempts: list[Attempt] = []
            enough_served = asyncio.Event()
            deadline = loop.time() + 20

            async def client() -> None:
                # Its own connection, like a separate client process; it stops once the
                # server says it is shutting down or no longer accepts connections.
                async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=15)
                ) as session:
                    for _ in range(500):
                        if loop.time() > deadline:
                            return
                        try:
                            reply = await post(session, server, "/v2/models/mlp/infer", request)
                        except aiohttp.ClientConnectorError as exc:
                            attempts.append(Attempt(None, f"refused: {exc}"))
                            return
                        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                            attempts.append(Attempt(None, f"disconnected: {exc!r}"))
                            continue
                        attempts.append(Attempt(reply.status, "", loop.time(), reply.body))
                        if sum(a.status == 200 for a in attempts) >= 40:
                            enough_served.set()
                        if reply.status != 200:
                            return

            clients = [loop.create_task(client()) for _ in range(self.CLIENTS)]
            await asyncio.wait_for(enough_served.wait(), timeout=15)
            signalled_at = loop.time()
            server.process.send_signal(signal.SIGTERM)
            exit_code = await asyncio.to_thread(server.process.wait, 20)
            await asyncio.wait_for(asyncio.gather(*clients), timeout=20)

        log = server.log()
        assert exit_code == 0, log
        statuses = Counter(a.status for a in attempts)
        assert set(statuses) <= {200, 503, None}, statuses
        for attempt in attempts:
            if attempt.status == 503:
                assert b"shutting down" in attempt.body, attempt.body
            elif attempt.status == 200:
                assert orjson.loads(attempt.body)["outputs"][0]["shape"] == [1, 16]

        # requests were queued when the signal came, and were served after it
        draining = re.search(r"signal 15: draining (\d+) queued requests", log)
        assert draining is not None, log
        queued_at_signal = int(draining[1])
        assert queued_at_signal >= 1
        served_after = sum(1 for a in attempts if a.status == 200 and a.answered_at > signalled_at)
        assert served_after >= queued_at_signal

        # The server's own tally of answered requests equals what the clients received: every
        # request it accepted was answered and the answer arrived. A client that got no response
        # at all (refused, or an idle keep-alive connection closed under it) was never accepted,
        # or the server's count would be higher than the clients'.
        tally = re.search(r"stopped; requests by outcome: (.*)", log)
        assert tally is not None, log
        counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", tally[1])}
        assert counts["success"] == statuses[200], (counts, statuses)
        assert counts["rejected"] == statuses[503], (counts, statuses)
        assert counts["invalid"] == counts["timeout"] == counts["cancelled"] == counts["error"] == 0
        assert "timeout graceful shutdown exceeded" not in log
        assert "still queued" not in log


# --- Models that cannot be served -------------------------------------------------------------


class TestModelThatCannotLoad:
    @pytest.mark.parametrize(
        ("model", "engine", "reason"),
        [
            pytest.param("missing", "onnx", "does not exist", id="missing-file"),
            pytest.param("corrupt", "onnx", "onnxruntime cannot load", id="corrupt-file"),
            pytest.param(
                "fixed_batch", "onnx", "dimension 0 must be a dynamic batch axis", id="fixed-batch"
            ),
            pytest.param(
                "fixed_batch",
                "simulated",
                "dimension 0 must be a dynamic batch axis",
                id="fixed-batch-simulated",
            ),
        ],
    )
    def test_exits_nonzero_with_the_reason_and_never_listens(
        self, model: str, engine: str, reason: str, fixed_batch_model: Path, tmp_path: Path
    ) -> None:
        if model == "missing":
            path = tmp_path / "absent.onnx"
        elif model == "corrupt":
            path = tmp_path / "corrupt.onnx"
            path.write_bytes(np.random.default_rng(0).bytes(4096))
        else:
            path = fixed_batch_model
        text = refused_start(
            "--model", str(path), "--engine", engine, log_path=tmp_path / "runtime.log"
        )
        assert f"model {path} cannot be served" in text
        assert reason in text
        assert "Uvicorn running" not in text


# --- A model this server does not serve -------------------------------------------------------


class TestUnknownModel:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/v2/models/other"),
            ("GET", "/v2/models/other/ready"),
            ("POST", "/v2/models/other/infer"),
        ],
    )
    def test_is_404_with_a_json_reason(
        self, mlp_server: RuntimeProcess, method: str, path: str
    ) -> None:
        body, headers = v2_request(mlp_rows(1, seed=0)) if method == "POST" else (b"", {})
        reply = send(mlp_server, method, path, body, headers)
        assert reply.status == 404
        error = error_of(reply)
        assert "'other' is not served here" in error
        assert "'mlp'" in error
