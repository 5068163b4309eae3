"""The Open Inference Protocol v2 gRPC service, against a real runtime process.

Clients are Triton's own, unmodified: `tritonclient.grpc` for what its API can express, and its
generated `GRPCInferenceService` stub with its own message classes for requests that API will
not build (bad ones, typed contents). Answers are checked against numpy (`multi_io_expected`) and
the REST endpoint of the same process; metrics are read from /metrics, as Prometheus would.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as tc
import tritonclient.http
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2 as ours
from batchpilot.runtime.grpc_api.codec import decode_infer_request, encode_infer_response
from batchpilot.runtime.grpc_api.service import STREAM_IN_FLIGHT, _costly
from tests.onnx_models import MULTI_IO_INPUTS, multi_io_expected, random_multi_io
from tests.runtime_process import (
    RuntimeProcess,
    Scrape,
    free_port,
    metric,
    outcomes,
    runtime_process,
    send,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

Array = np.ndarray[Any, Any]
REPO = Path(__file__).resolve().parent.parent
GRPC_API = REPO / "runtime" / "batchpilot" / "runtime" / "grpc_api"


# --- Helpers ---------------------------------------------------------------------------------


@pytest.fixture
def channel_to() -> Iterator[Any]:
    """Opens channels to servers and closes them at the end of the test."""
    channels: list[grpc.Channel] = []

    def open_channel(server: RuntimeProcess) -> pb_grpc.GRPCInferenceServiceStub:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        channels.append(channel)
        return pb_grpc.GRPCInferenceServiceStub(channel)

    yield open_channel
    for channel in channels:
        channel.close()


def client(server: RuntimeProcess) -> tc.InferenceServerClient:
    return tc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def triton_inputs(arrays: dict[str, Array]) -> list[tc.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = tc.InferInput(name, list(array.shape), MULTI_IO_INPUTS[name][1])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def raw_request(model: str, arrays: dict[str, Array], datatypes: dict[str, str]) -> Any:
    """A ModelInferRequest with every input in raw_input_contents."""
    request = pb.ModelInferRequest(model_name=model)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=datatypes[name], shape=array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return request


def mlp_rows(rows: int, seed: int = 0) -> Array:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def mlp_body(rows: int) -> bytes:
    """A REST request of `rows` rows for the MLP."""
    return orjson.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [rows, 64], "data": [0.0] * 64 * rows}
            ]
        }
    )


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value


# --- Servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi_server(
    multi_io_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    """Real onnxruntime, six inputs of six datatypes."""
    with runtime_process(
        multi_io_model,
        "--name",
        "multi",
        "--device",
        "cpu",
        "--max-queue-delay-ms",
        "1",
        grpc=True,
        log_dir=tmp_path_factory.mktemp("multi"),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def mlp_server(
    mlp_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    """Real onnxruntime with the MLP, and a small message limit."""
    with runtime_process(
        mlp_model,
        "--device",
        "cpu",
        "--max-queue-delay-ms",
        "1",
        "--max-body-bytes",
        "16384",
        grpc=True,
        log_dir=tmp_path_factory.mktemp("mlp"),
    ) as server:
        yield server


SECOND_PER_BATCH = (
    "--engine",
    "simulated",
    "--simulated-latency",
    "alpha_ms=1000,beta_ms=0",
    "--max-batch-size",
    "1",
    "--max-queue-delay-ms",
    "0",
)
"""A simulated accelerator that takes a second per batch of one row."""


@pytest.fixture
def slow_server(mlp_model: Path, tmp_path: Path) -> Iterator[RuntimeProcess]:
    """A second per batch and a queue of one; the queue bound alone decides admission
    (`deadline_server` below has deadline admission)."""
    queue_only = ("--queue-capacity", "1", "--admission", "queue", "--deadline-ms", "0")
    with runtime_process(
        mlp_model, *SECOND_PER_BATCH, *queue_only, grpc=True, log_dir=tmp_path
    ) as server:
        yield server


@pytest.fixture
def deadline_server(mlp_model: Path, tmp_path: Path) -> Iterator[RuntimeProcess]:
    """A second per batch, deadline admission (the default)."""
    with runtime_process(mlp_model, *SECOND_PER_BATCH, grpc=True, log_dir=tmp_path) as server:
        yield server


# --- Every RPC, with tritonclient.grpc -------------------------------------------------------


class TestHealthAndMetadata:
    def test_health(self, multi_server: RuntimeProcess) -> None:
        with client(multi_server) as triton:
            assert triton.is_server_live()
            assert triton.is_server_ready()
            assert triton.is_model_ready("multi")
            with pytest.raises(InferenceServerException) as caught:
                triton.is_model_ready("resnet")
            assert caught.value.status() == "StatusCode.NOT_FOUND"
            assert "model 'resnet' is not served here; this server serves 'multi'" in str(
                caught.value
            )

    def test_server_metadata(self, multi_server: RuntimeProcess) -> None:
        rest = send(multi_server, "GET", "/v2").json()
        with client(multi_server) as triton:
            metadata = triton.get_server_metadata(as_json=True)
        assert metadata["name"] == rest["name"] == "batchpilot"
        assert metadata["version"] == rest["version"]
        assert metadata["extensions"] == rest["extensions"]

    def test_model_metadata_matches_rest(self, multi_server: RuntimeProcess) -> None:
        rest = send(multi_server, "GET", "/v2/models/multi").json()
        with client(multi_server) as triton:
            metadata = triton.get_model_metadata("multi", as_json=True)
            with pytest.raises(InferenceServerException) as caught:
                triton.get_model_metadata("resnet")
            assert caught.value.status() == "StatusCode.NOT_FOUND"
            # a model whose file names no version is its version 1 ("versions": ["1"]): 1 or
            # none is the model, any other unknown
            assert triton.is_model_ready("multi", model_version="1")
            with pytest.raises(InferenceServerException) as caught:
                triton.get_model_metadata("multi", model_version="7")
            assert caught.value.status() == "StatusCode.NOT_FOUND"
            assert "has no version '7'" in str(caught.value)
            with pytest.raises(InferenceServerException) as caught:
                triton.is_model_ready("multi", model_version="7")
            assert caught.value.status() == "StatusCode.NOT_FOUND"
            assert triton.is_model_ready("multi", model_version="")
        assert metadata["name"] == "multi"
        assert metadata["platform"] == rest["platform"]
        for side in ("inputs", "outputs"):
            # JSON from protobuf writes int64 as strings.
            got = [{**t, "shape": [int(d) for d in t["shape"]]} for t in metadata[side]]
            assert got == rest[side]

    def test_model_config_as_triton_gives_it_over_both_protocols(
        self, multi_server: RuntimeProcess
    ) -> None:
        # What perf_analyzer and Model Analyzer read before they send (Triton's model
        # configuration extension), through Triton's own clients.
        with tritonclient.http.InferenceServerClient(f"127.0.0.1:{multi_server.port}") as rest:
            over_http = rest.get_model_config("multi")
            with pytest.raises(InferenceServerException) as caught:
                rest.get_model_config("resnet")
            assert caught.value.status() == "404"
        with client(multi_server) as triton:
            over_grpc = triton.get_model_config("multi", as_json=True)["config"]
            with pytest.raises(InferenceServerException) as caught:
                triton.get_model_config("resnet")
            assert caught.value.status() == "StatusCode.NOT_FOUND"
        metadata = send(multi_server, "GET", "/v2/models/multi").json()
        for config in (over_http, over_grpc):
            assert config["name"] == "multi"
            assert config["platform"] == "onnxruntime_onnx"
            assert config["backend"] == "onnxruntime"
            assert int(config["max_batch_size"]) == metadata["parameters"]["max_batch_size"]
            inputs = {t["name"]: t for t in config["input"]}
            assert set(inputs) == set(MULTI_IO_INPUTS)
            for spec in metadata["inputs"]:
                tensor = inputs[spec["name"]]
                # The batch dimension is max_batch_size's; BYTES is Triton's TYPE_STRING.
                assert [int(d) for d in tensor["dims"]] == spec["shape"][1:]
                assert tensor["data_type"] == (
                    "TYPE_STRING" if spec["datatype"] == "BYTES" else f"TYPE_{spec['datatype']}"
                )
            assert [o["name"] for o in config["output"]] == [o["name"] for o in metadata["outputs"]]
            assert config["instance_group"][0]["kind"] == "KIND_CPU"
            assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1000


def test_statistics_as_triton_gives_them_over_both_protocols(
    mlp_model: Path, tmp_path: Path
) -> None:
    """Triton's statistics extension, read with Triton's own clients after known traffic on a
    fresh server: 5 ms a batch, requests one after another (each its own batch), one refused."""
    with runtime_process(
        mlp_model,
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=5,beta_ms=0",
        "--max-queue-delay-ms",
        "0",
        grpc=True,
        log_dir=tmp_path,
    ) as server:
        before_ms = time.time() * 1000
        rows = [1, 2, 3, 1]
        for count in rows:
            assert send(server, "POST", "/v2/models/mlp/infer", mlp_body(count)).status == 200
        with client(server) as triton:
            for _ in range(2):
                tensor = tc.InferInput("x", [1, 64], "FP32")
                tensor.set_data_from_numpy(mlp_rows(1))
                triton.infer("mlp", [tensor])
        bad = send(server, "POST", "/v2/models/mlp/infer", mlp_body(1).replace(b"64", b"65"))
        assert bad.status == 400
        after_ms = time.time() * 1000
        with tritonclient.http.InferenceServerClient(f"127.0.0.1:{server.port}") as rest:
            over_http = rest.get_inference_statistics("mlp")
            every_model = rest.get_inference_statistics()
            with pytest.raises(InferenceServerException) as caught:
                rest.get_inference_statistics("resnet")
            assert caught.value.status() == "404"
            assert "statistics" in rest.get_server_metadata()["extensions"]
        with client(server) as triton:
            over_grpc = triton.get_inference_statistics("mlp", as_json=True)
            with pytest.raises(InferenceServerException) as caught:
                triton.get_inference_statistics("resnet")
            assert caught.value.status() == "StatusCode.NOT_FOUND"
            assert "statistics" in triton.get_server_metadata().extensions
    assert every_model == over_http
    (entry,) = over_http["model_stats"]
    assert (entry["name"], entry["version"]) == ("mlp", "1")
    assert before_ms <= entry["last_inference"] <= after_ms + 1
    inference = entry["inference_stats"]
    assert inference["success"]["count"] == 6
    assert inference["fail"]["count"] == 1
    assert entry["inference_count"] == sum(rows) + 2  # rows, not requests
    assert entry["execution_count"] == 6
    batches = entry["batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == sum(rows) + 2
    assert {b["batch_size"] for b in batches} == {1, 2, 3}
    for part in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[part]["count"] == 6, part
    assert inference["compute_infer"]["ns"] >= 6 * 5_000_000  # 5 ms a batch, one a request
    # Each request's time in the server holds its wait and its batch's times.
    inside = sum(inference[part]["ns"] for part in ("queue", "compute_input", "compute_infer"))
    assert inference["success"]["ns"] >= inside
    # The same document over gRPC (protobuf's JSON writes uint64 as strings).
    (grpc_entry,) = over_grpc["model_stats"]
    assert int(grpc_entry["inference_count"]) == entry["inference_count"]
    assert int(grpc_entry["inference_stats"]["success"]["ns"]) >= inference["success"]["ns"]
    assert int(grpc_entry["inference_stats"]["compute_infer"]["count"]) == 6


class TestInfer:
    @pytest.mark.parametrize("rows", [1, 5])
    def test_every_datatype_several_rows(self, multi_server: RuntimeProcess, rows: int) -> None:
        arrays = random_multi_io(rows, seed=rows)
        with client(multi_server) as triton:
            result = triton.infer("multi", triton_inputs(arrays), request_id=f"req-{rows}")
        response = result.get_response()
        assert response.model_name == "multi"
        assert response.id == f"req-{rows}"
        assert [o.name for o in response.outputs] == [f"{n}_out" for n in MULTI_IO_INPUTS]
        for name, expected in multi_io_expected(arrays).items():
            got = result.as_numpy(name)
            assert got.dtype == expected.dtype, name
            np.testing.assert_array_equal(got, expected, err_msg=name)

    def test_requested_outputs_in_their_order(self, multi_server: RuntimeProcess) -> None:
        arrays = random_multi_io(2, seed=3)
        wanted = ["flag_out", "f16_out"]
        with client(multi_server) as triton:
            result = triton.infer(
                "multi",
                triton_inputs(arrays),
                outputs=[tc.InferRequestedOutput(name) for name in wanted],
            )
        assert [o.name for o in result.get_response().outputs] == wanted
        expected = multi_io_expected(arrays)
        for name in wanted:
            np.testing.assert_array_equal(result.as_numpy(name), expected[name])

    def test_same_answer_as_rest(self, mlp_server: RuntimeProcess) -> None:
        x = mlp_rows(3)
        body = orjson.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 64], "data": x.ravel()}]},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        rest = send(mlp_server, "POST", "/v2/models/mlp/infer", body).json()["outputs"][0]
        tensor = tc.InferInput("x", [3, 64], "FP32")
        tensor.set_data_from_numpy(x)
        with client(mlp_server) as triton:
            logits = triton.infer("mlp", [tensor]).as_numpy("logits")
        assert logits.shape == (3, 16) == tuple(rest["shape"])
        np.testing.assert_array_equal(logits.ravel(), np.asarray(rest["data"], np.float32))

    def test_typed_contents(self, mlp_server: RuntimeProcess, channel_to: Any) -> None:
        """Data in InferTensorContents instead of raw bytes gets the same answer."""
        x = mlp_rows(2, seed=5)
        stub = channel_to(mlp_server)
        typed = pb.ModelInferRequest(model_name="mlp")
        tensor = typed.inputs.add(name="x", datatype="FP32", shape=[2, 64])
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        raw = raw_request("mlp", {"x": x}, {"x": "FP32"})
        from_typed, from_raw = stub.ModelInfer(typed), stub.ModelInfer(raw)
        assert from_typed.outputs[0].shape == [2, 16]
        assert from_typed.raw_output_contents == from_raw.raw_output_contents

    def test_typed_contents_of_integer_and_bool_datatypes(
        self, multi_server: RuntimeProcess, channel_to: Any
    ) -> None:
        """Every input but FP16 (which has no typed field) in contents; FP16 is refused with a
        message that says to send it raw."""
        arrays = random_multi_io(2, seed=9)
        request = pb.ModelInferRequest(model_name="multi")
        fields = {
            "f32": "fp32_contents",
            "i64": "int64_contents",
            "i32": "int_contents",
            "u8": "uint_contents",
            "flag": "bool_contents",
        }
        for name, field in fields.items():
            tensor = request.inputs.add(
                name=name, datatype=MULTI_IO_INPUTS[name][1], shape=arrays[name].shape
            )
            getattr(tensor.contents, field).extend(arrays[name].ravel().tolist())
        request.inputs.add(name="f16", datatype="FP16", shape=arrays["f16"].shape)
        error = rpc_error(channel_to(multi_server).ModelInfer, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "FP16 has no typed contents field; send it in raw_input_contents" in (
            error.details()
        )


# --- REST and gRPC share one data plane ------------------------------------------------------


def test_rest_and_grpc_requests_batch_together(
    mlp_model: Path, tmp_path: Path, channel_to: Any
) -> None:
    """A batch needs two rows or waits 10 s: one REST and one gRPC request fill it at once."""
    with runtime_process(
        mlp_model,
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=1,beta_ms=0",
        "--max-batch-size",
        "2",
        "--max-queue-delay-ms",
        "10000",
        grpc=True,
        log_dir=tmp_path,
    ) as server:
        stub = channel_to(server)
        pending = stub.ModelInfer.future(raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"}))
        wait_until(
            lambda: metric(server, "batchpilot_queue_depth") == 1,
            timeout=10,
            what="the gRPC request to be queued",
        )
        body = orjson.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
        )
        started = time.monotonic()
        rest = send(server, "POST", "/v2/models/mlp/infer", body)
        grpc_reply = pending.result(timeout=10)
        assert time.monotonic() - started < 5, "the batch waited out its delay: no mixed batch"
        assert rest.status == 200, rest.body
        assert list(grpc_reply.outputs[0].shape) == [1, 16]
        assert metric(server, "batchpilot_batch_size_count") == 1
        assert metric(server, "batchpilot_batch_size_sum") == 2
        assert outcomes(Scrape(server))["success"] == 2
        assert metric(server, "batchpilot_inflight_requests") == 0


# --- Bad input -------------------------------------------------------------------------------


def _multi_request(edit: Callable[[Any], None] | None = None) -> Any:
    """A good request for the multi_io model, changed by `edit`."""
    arrays = random_multi_io(2, seed=1)
    datatypes = {name: spec[1] for name, spec in MULTI_IO_INPUTS.items()}
    request = raw_request("multi", arrays, datatypes)
    if edit is not None:
        edit(request)
    return request


def _unknown_model(request: Any) -> None:
    request.model_name = "resnet"


def _no_inputs(request: Any) -> None:
    del request.inputs[:]
    del request.raw_input_contents[:]


def _rename_first(request: Any) -> None:
    request.inputs[0].name = "pixels"


def _reshape_first(request: Any) -> None:
    request.inputs[0].shape[1] = 5
    request.raw_input_contents[0] = b"\0" * (2 * 5 * 4)


def _wrong_datatype(request: Any) -> None:
    request.inputs[0].datatype = "FP64"
    request.raw_input_contents[0] = b"\0" * (2 * 4 * 8)


def _unknown_datatype(request: Any) -> None:
    request.inputs[0].datatype = "BF16"


def _short_raw(request: Any) -> None:
    request.raw_input_contents[0] = request.raw_input_contents[0][:-4]


def _missing_raw(request: Any) -> None:
    del request.raw_input_contents[-1]


def _both_contents(request: Any) -> None:
    request.inputs[0].contents.fp32_contents.extend([0.0] * 8)


def _negative_shape(request: Any) -> None:
    request.inputs[0].shape[0] = -2


def _bad_timeout(request: Any) -> None:
    request.parameters["timeout"].string_param = "soon"


def _classification(request: Any) -> None:
    request.outputs.add(name="f32_out").parameters["classification"].int64_param = 3


def _unknown_output(request: Any) -> None:
    request.outputs.add(name="probabilities")


def _duplicate_input(request: Any) -> None:
    request.inputs[1].name = request.inputs[0].name


def _bool_bytes_not_0_or_1(request: Any) -> None:
    # flag, 2 rows of 2: numpy would view 0x02 and 0xff as true; the model would NOT the bytes
    request.raw_input_contents[-1] = b"\x01\x02\xff\x00"


def _unknown_version(request: Any) -> None:
    request.model_version = "99"


BAD_REQUESTS = [
    pytest.param(
        _unknown_model,
        grpc.StatusCode.NOT_FOUND,
        "model 'resnet' is not served here; this server serves 'multi'",
        id="unknown-model",
    ),
    pytest.param(
        _rename_first,
        grpc.StatusCode.INVALID_ARGUMENT,
        "model 'multi' has no input 'pixels'; its inputs are: ",
        id="wrong-tensor-name",
    ),
    pytest.param(
        _reshape_first,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32' has shape [2, 5], the model expects [-1, 4]",
        id="wrong-shape",
    ),
    pytest.param(
        _wrong_datatype,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32' must be FP32, the request sent FP64",
        id="wrong-datatype",
    ),
    pytest.param(
        _unknown_datatype,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32': datatype 'BF16' is not supported; use one of BOOL",
        id="unknown-datatype",
    ),
    pytest.param(
        _short_raw,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32' (raw_input_contents): raw data is 28 bytes but shape [2, 4] of FP32 needs 32",
        id="raw-contents-wrong-length",
    ),
    pytest.param(
        _missing_raw,
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents has 5 entries for 6 inputs",
        id="raw-contents-missing-entry",
    ),
    pytest.param(
        _both_contents,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32' has contents, but the request also has raw_input_contents",
        id="contents-and-raw-contents",
    ),
    pytest.param(
        _negative_shape,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32'.shape must not have negative dimensions, got [-2, 4]",
        id="negative-shape",
    ),
    pytest.param(
        _duplicate_input,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'f32' appears more than once",
        id="duplicate-input",
    ),
    pytest.param(
        _bad_timeout,
        grpc.StatusCode.INVALID_ARGUMENT,
        "parameters.timeout must be a positive integer (µs), got 'soon'",
        id="bad-timeout-parameter",
    ),
    pytest.param(
        _classification,
        grpc.StatusCode.INVALID_ARGUMENT,
        "the classification extension is not supported",
        id="classification",
    ),
    pytest.param(
        _unknown_output,
        grpc.StatusCode.INVALID_ARGUMENT,
        "model 'multi' has no output 'probabilities'",
        id="unknown-output",
    ),
    pytest.param(
        _no_inputs,
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs must be a non-empty list",
        id="no-inputs",
    ),
    pytest.param(
        _bool_bytes_not_0_or_1,
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'flag' (raw_input_contents): BOOL elements must be 0 or 1; element 1 is 2",
        id="bool-bytes-not-0-or-1",
    ),
    pytest.param(
        _unknown_version,
        grpc.StatusCode.NOT_FOUND,
        "model 'multi' has no version '99'",
        id="unknown-version",
    ),
]


class TestBadInput:
    @pytest.mark.parametrize(("edit", "code", "message"), BAD_REQUESTS)
    def test_refused_with_status_and_message(
        self,
        multi_server: RuntimeProcess,
        channel_to: Any,
        edit: Callable[[Any], None],
        code: grpc.StatusCode,
        message: str,
    ) -> None:
        stub = channel_to(multi_server)
        before = outcomes(Scrape(multi_server))
        error = rpc_error(stub.ModelInfer, _multi_request(edit), timeout=10)
        assert error.code() == code, error.details()
        assert message in error.details()
        after = outcomes(Scrape(multi_server))
        assert after["invalid"] == before["invalid"] + 1
        # and the server still serves
        good = stub.ModelInfer(_multi_request(), timeout=10)
        assert len(good.raw_output_contents) == len(MULTI_IO_INPUTS)

    def test_out_of_range_typed_contents(
        self, multi_server: RuntimeProcess, channel_to: Any
    ) -> None:
        request = pb.ModelInferRequest(model_name="multi")
        tensor = request.inputs.add(name="u8", datatype="UINT8", shape=[1, 3])
        tensor.contents.uint_contents.extend([1, 300, 2])
        error = rpc_error(channel_to(multi_server).ModelInfer, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            "input 'u8': contents do not fit datatype UINT8: 300 is out of range for UINT8 (0..255)"
            in (error.details())
        )

    def test_too_large_message(self, mlp_server: RuntimeProcess) -> None:
        """Over --max-body-bytes (16 KiB here): RESOURCE_EXHAUSTED, and the next one is served."""
        with client(mlp_server) as triton:
            big = tc.InferInput("x", [100, 64], "FP32")  # 25.6 kB
            big.set_data_from_numpy(mlp_rows(100))
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("mlp", [big])
            assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert "larger than max" in str(caught.value)
            small = tc.InferInput("x", [2, 64], "FP32")
            small.set_data_from_numpy(mlp_rows(2))
            assert triton.infer("mlp", [small]).as_numpy("logits").shape == (2, 16)


# --- Overload, deadlines, cancellation --------------------------------------------------------


class TestStream:
    """ModelStreamInfer, through tritonclient's own streaming API (`start_stream`,
    `async_stream_infer`) and its stub."""

    def test_each_request_gets_the_answer_model_infer_gives(
        self, mlp_server: RuntimeProcess
    ) -> None:
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        xs = [mlp_rows(1 + i % 3, seed=i) for i in range(24)]
        with client(mlp_server) as triton:
            triton.start_stream(callback=lambda result, error: answers.put((result, error)))
            try:
                for i, x in enumerate(xs):
                    tensor = tc.InferInput("x", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    triton.async_stream_infer("mlp", [tensor], request_id=f"r{i}")
                streamed = {}
                for _ in xs:
                    result, error = answers.get(timeout=10)
                    assert error is None, error
                    streamed[result.get_response().id] = result.as_numpy("logits")
            finally:
                triton.stop_stream()
            for i, x in enumerate(xs):
                tensor = tc.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                unary = triton.infer("mlp", [tensor]).as_numpy("logits")
                np.testing.assert_array_equal(streamed[f"r{i}"], unary)

    def test_a_bad_request_is_an_error_on_the_stream_and_the_stream_goes_on(
        self, multi_server: RuntimeProcess, channel_to: Any
    ) -> None:
        stub = channel_to(multi_server)
        requests = [_multi_request(), _multi_request(_rename_first), _multi_request()]
        for n, request in enumerate(requests):
            request.id = f"s{n}"
        before = outcomes(Scrape(multi_server))
        answers = list(stub.ModelStreamInfer(iter(requests), timeout=20))
        assert sorted(a.infer_response.id for a in answers) == ["s0", "s1", "s2"]
        by_id = {a.infer_response.id: a for a in answers}
        bad = by_id["s1"]
        assert bad.error_message.startswith("INVALID_ARGUMENT: "), bad.error_message
        assert "model 'multi' has no input 'pixels'" in bad.error_message, bad
        assert bad.infer_response.model_name == "multi"
        for good in (by_id["s0"], by_id["s2"]):
            assert good.error_message == ""
            assert len(good.infer_response.raw_output_contents) == len(MULTI_IO_INPUTS)
        after = outcomes(Scrape(multi_server))
        assert after["invalid"] == before["invalid"] + 1
        assert after["success"] == before["success"] + 2

    def test_requests_of_one_stream_batch_together(
        self, mlp_model: Path, tmp_path: Path, channel_to: Any
    ) -> None:
        # 100 ms a batch: 16 requests sent at once ride in a few batches, not 16.
        with runtime_process(
            mlp_model,
            "--engine", "simulated", "--simulated-latency", "alpha_ms=100,beta_ms=0",
            "--max-batch-size", "16", "--max-queue-delay-ms", "20",
            grpc=True, log_dir=tmp_path,
        ) as server:  # fmt: skip
            requests = []
            for n in range(16):
                request = pb.ModelInferRequest(model_name="mlp", id=f"b{n}")
                request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
                request.raw_input_contents.append(mlp_rows(1, seed=n).tobytes())
                requests.append(request)
            answers = list(channel_to(server).ModelStreamInfer(iter(requests), timeout=20))
            assert all(a.error_message == "" for a in answers), answers
            assert len(answers) == 16
            batches = metric(server, "batchpilot_batch_size_count")
            assert batches <= 4, batches

    def test_a_stream_whose_responses_are_not_read_holds_a_bounded_number_of_them(
        self, multi_server: RuntimeProcess, channel_to: Any
    ) -> None:
        """Before, answers waited in an unbounded queue and the server read on: 10,000 requests
        with 60 kB ids grew it by 580 MB. Now it reads no further than `STREAM_IN_FLIGHT`
        answers the stream has not taken (and the few megabytes gRPC's flow control holds), and
        loses none of them once the client reads."""
        sent = 1_000

        def requests() -> Iterator[Any]:
            for n in range(sent):  # answered at once, with an error that echoes the 60 kB id
                yield pb.ModelInferRequest(model_name="nope", id=f"{n:05d}" + "x" * 60_000)

        before = outcomes(Scrape(multi_server))["invalid"]
        stream = channel_to(multi_server).ModelStreamInfer(requests(), timeout=60)

        def taken() -> float:
            return outcomes(Scrape(multi_server))["invalid"] - before

        wait_until(lambda: taken() >= STREAM_IN_FLIGHT, timeout=20, what="the stream's room")
        time.sleep(1.0)  # long enough to take every one of them, as it did (10,000 in 2 s)
        assert taken() < sent / 2
        answers = [answer.infer_response.id[:5] for answer in stream]
        assert answers == [f"{n:05d}" for n in range(sent)]

    def test_bytes_that_are_no_request_are_invalid_and_the_stream_goes_on(
        self, multi_server: RuntimeProcess
    ) -> None:
        """gRPC's own deserializer failed the call UNKNOWN, logged a traceback each time, and on
        a stream took the whole stream down with the requests it had taken (counted as
        withdrawn by their client)."""
        garbage = b"\x0a\xff\xff\xff\xff\x0f"  # a string field whose length runs past the end
        good = raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
        good.model_name = "multi"  # the MLP's input for the multi model: refused at once, in-band
        before = outcomes(Scrape(multi_server))
        with grpc.insecure_channel(f"127.0.0.1:{multi_server.grpc_port}") as channel:
            method = "/inference.GRPCInferenceService/"
            unary = channel.unary_unary(method + "ModelInfer")
            with pytest.raises(grpc.RpcError) as caught:
                unary(garbage, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith(
                "the message is not a ModelInferRequest: Error parsing message"
            )
            stream = channel.stream_stream(method + "ModelStreamInfer")
            messages = [good.SerializeToString()] * 3 + [garbage] + [good.SerializeToString()] * 3
            answers = [
                pb.ModelStreamInferResponse.FromString(raw)
                for raw in stream(iter(messages), timeout=20)
            ]
        assert len(answers) == 7
        refused = [a.error_message for a in answers if "not a ModelInferRequest" in a.error_message]
        assert len(refused) == 1
        assert refused[0].startswith("INVALID_ARGUMENT: the message is not a ModelInferRequest")
        after = outcomes(Scrape(multi_server))
        assert after["invalid"] - before["invalid"] == 8  # the garbage twice, the 6 by name
        assert after["cancelled"] == before["cancelled"]
        assert "Traceback" not in multi_server.log()


def _one_computing(server: RuntimeProcess, stub: Any) -> tuple[Any, Any]:
    """One request sent and in a batch (a second on the device); the request and its future."""
    request = raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
    first = stub.ModelInfer.future(request, timeout=20)
    wait_until(
        lambda: (
            metric(server, "batchpilot_batch_size_count") == 0
            and metric(server, "batchpilot_inflight_requests") == 1
            and metric(server, "batchpilot_queue_depth") == 0
        ),
        timeout=10,
        what="the first request to be in a batch",
    )
    return request, first


def _fill(server: RuntimeProcess, stub: Any) -> list[Any]:
    """One request computing (1 s) and one waiting: the queue of one is full."""
    request, first = _one_computing(server, stub)
    second = stub.ModelInfer.future(request, timeout=20)
    wait_until(
        lambda: metric(server, "batchpilot_queue_depth") == 1,
        timeout=10,
        what="the second request to be queued",
    )
    return [first, second]


class TestLoad:
    def test_overload_is_unavailable_at_once(
        self, slow_server: RuntimeProcess, channel_to: Any
    ) -> None:
        stub = channel_to(slow_server)
        accepted = _fill(slow_server, stub)
        started = time.monotonic()
        error = rpc_error(
            stub.ModelInfer, raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"}), timeout=10
        )
        assert time.monotonic() - started < 0.5
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "queue" in error.details()
        trailers = dict(error.trailing_metadata() or ())
        assert int(trailers["retry-after"]) >= 1
        assert int(trailers["grpc-retry-pushback-ms"]) >= 0
        for future in accepted:
            assert list(future.result(timeout=10).outputs[0].shape) == [1, 16]
        counts = outcomes(Scrape(slow_server))
        assert counts["rejected"] == 1
        assert counts["success"] == 2

    def test_grpc_deadline_is_the_request_timeout(
        self, slow_server: RuntimeProcess, channel_to: Any
    ) -> None:
        with client(slow_server) as triton:
            tensor = tc.InferInput("x", [1, 64], "FP32")
            tensor.set_data_from_numpy(mlp_rows(1))
            started = time.monotonic()
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("mlp", [tensor], client_timeout=0.2)
            assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            assert time.monotonic() - started < 0.9
            # Triton's server-side `timeout` parameter (µs) works too, with the REST message.
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("mlp", [tensor], timeout=200_000)
            assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            assert "not served within its 200 ms deadline" in str(caught.value)
        wait_until(
            lambda: outcomes(Scrape(slow_server))["timeout"] == 2,
            timeout=10,
            what="both requests to count as timed out",
        )

    def test_a_request_predicted_late_is_unavailable_at_once(
        self, deadline_server: RuntimeProcess, channel_to: Any
    ) -> None:
        stub = channel_to(deadline_server)
        request, first = _one_computing(deadline_server, stub)
        # a 1.2 s RPC deadline behind a batch of a second, needing a second itself: refused at
        # once (unless the wait above took 0.8 s, the first batch's remaining time is enough)
        started = time.monotonic()
        error = rpc_error(stub.ModelInfer, request, timeout=1.2)
        assert time.monotonic() - started < 0.5
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot answer within the request's deadline" in error.details()
        trailers = dict(error.trailing_metadata() or ())
        assert int(trailers["retry-after"]) >= 1
        assert list(first.result(timeout=10).outputs[0].shape) == [1, 16]
        assert Scrape(deadline_server).value("batchpilot_shed_total", reason="predicted_late") == 1

    def test_an_rpc_deadline_shorter_than_a_batch_is_load_a_timeout_parameter_is_not(
        self, deadline_server: RuntimeProcess, channel_to: Any
    ) -> None:
        """What is left of an RPC's deadline is spent in part waiting to be taken up (under a
        burst, most of it): refused for now or expired, and counted as load. A `timeout`
        parameter shorter than any batch the server has run (1 s) is the client's to change:
        refused for good, an invalid request."""
        stub = channel_to(deadline_server)
        request = raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
        error = rpc_error(stub.ModelInfer, request, timeout=0.3)
        assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert outcomes(Scrape(deadline_server))["invalid"] == 0
        request.parameters["timeout"].int64_param = 300_000
        error = rpc_error(stub.ModelInfer, request, timeout=10)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shorter than any batch this server has run" in error.details()
        counts = outcomes(Scrape(deadline_server))
        assert counts["invalid"] == 1
        assert counts["rejected"] + counts["timeout"] == 1

    def test_a_datatype_the_model_does_not_take_is_refused_before_its_data_is_read(
        self, deadline_server: RuntimeProcess, channel_to: Any
    ) -> None:
        """2 million empty BYTES elements (8 MB) for the FP32 input: splitting them would hold
        the event loop for seconds before validation said the datatype is wrong."""
        stub = channel_to(deadline_server)
        request = pb.ModelInferRequest(model_name="mlp")
        request.inputs.add(name="x", datatype="BYTES", shape=[31_250, 64])
        request.raw_input_contents.append(bytes(4 * 2_000_000))
        error = rpc_error(stub.ModelInfer, request, timeout=30)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "input 'x' must be FP32, the request sent BYTES"

    def test_cancelled_rpc_leaves_the_queue(
        self, slow_server: RuntimeProcess, channel_to: Any
    ) -> None:
        stub = channel_to(slow_server)
        first, second = _fill(slow_server, stub)
        assert second.cancel()
        wait_until(
            lambda: metric(slow_server, "batchpilot_queue_depth") == 0,
            timeout=5,
            what="the cancelled request to leave the queue",
        )
        scrape = Scrape(slow_server)
        assert outcomes(scrape)["cancelled"] == 1
        # no SLA, no deadline: nothing was promised, so it was withdrawn, not missed
        assert scrape.value("batchpilot_withdrawn_total") == 1
        # its place is free again before the first request is done
        third = stub.ModelInfer.future(raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"}))
        assert list(first.result(timeout=10).outputs[0].shape) == [1, 16]
        assert list(third.result(timeout=10).outputs[0].shape) == [1, 16]
        assert metric(slow_server, "batchpilot_batch_size_count") == 2


# --- SIGTERM ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age_s", "kept"),
    [("30", True), ("0", False)],
    ids=["connections-kept-until-their-age", "no-connection-age"],
)
def test_sigterm_finishes_accepted_rpcs(
    mlp_model: Path, tmp_path: Path, channel_to: Any, age_s: str, kept: bool
) -> None:
    """With a connection age (30 s, at most half the drain's grace: 5 s here) the draining
    server goes on taking its connections' RPCs until their age retires them, so their clients
    lose none (tests/test_grpc_drain.py), while REST requests get 503 from the signal on; with
    none, it sends GOAWAY at once and what comes after is UNAVAILABLE. Either way the RPCs it took
    are answered and it exits 0."""
    with runtime_process(
        mlp_model,
        "--engine",
        "simulated",
        "--simulated-latency",
        "alpha_ms=300,beta_ms=0",
        "--max-batch-size",
        "2",
        "--max-queue-delay-ms",
        "0",
        "--drain-grace-s",
        "10",
        "--max-connection-age-s",
        age_s,
        grpc=True,
        log_dir=tmp_path,
    ) as server:
        stub = channel_to(server)
        request = raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
        # A stream open across the signal.
        to_stream: queue.Queue[Any] = queue.Queue()
        stream = stub.ModelStreamInfer(iter(to_stream.get, None), timeout=20)
        to_stream.put(request)
        assert next(stream).error_message == ""
        accepted = [stub.ModelInfer.future(request, timeout=20) for _ in range(6)]
        wait_until(
            lambda: metric(server, "batchpilot_inflight_requests") == 6,
            timeout=10,
            what="six RPCs in flight",
        )
        # A kept connection's client goes on sending (one RPC every 0.2 s, as a client with
        # traffic would): the drain serves it until no RPC has come for half a second.
        trickled: list[Any] = []
        stop_trickle = threading.Event()

        def trickle() -> None:
            while not stop_trickle.wait(0.2):
                trickled.append(stub.ModelInfer.future(request, timeout=20))

        trickler = threading.Thread(target=trickle, daemon=True)
        if kept:
            trickler.start()
        server.process.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                return not stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
            except grpc.RpcError as exc:
                return bool(exc.code() == grpc.StatusCode.UNAVAILABLE)

        wait_until(refused, timeout=10, what="readiness to fail after SIGTERM")
        to_stream.put(request)
        if kept:
            # The kept connection's RPCs are still taken, the stream's too; REST's are not.
            late = stub.ModelInfer(request, timeout=10)
            assert list(late.outputs[0].shape) == [1, 16]
            assert next(stream).error_message == ""
            assert send(server, "POST", "/v2/models/mlp/infer", mlp_body(1)).status == 503
            stop_trickle.set()
            trickler.join(timeout=5)
            for future in trickled:
                assert list(future.result(timeout=15).outputs[0].shape) == [1, 16]
        else:
            assert rpc_error(stub.ModelInfer, request, timeout=10).code() == (
                grpc.StatusCode.UNAVAILABLE
            )
            streamed_late = next(stream)
            assert streamed_late.error_message.startswith("UNAVAILABLE: "), streamed_late
        to_stream.put(None)  # the client ends its stream
        assert list(stream) == []
        for future in accepted:
            assert list(future.result(timeout=15).outputs[0].shape) == [1, 16]
        assert server.process.wait(timeout=20) == 0
    log = server.log()
    tally = re.search(r"stopped; requests by outcome: (.*)", log)
    assert tally is not None, log
    counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", tally[1])}
    assert counts["success"] == (9 + len(trickled) if kept else 7), log
    assert counts["cancelled"] == counts["error"] == counts["timeout"] == 0, log
    assert ("drain: gRPC connections served for" in log) == kept, log


# --- Startup ---------------------------------------------------------------------------------


def test_address_logged_and_busy_port_fails_startup(mlp_model: Path, tmp_path: Path) -> None:
    with runtime_process(mlp_model, "--device", "cpu", grpc=True, log_dir=tmp_path) as server:
        assert f"listening on 127.0.0.1:{server.grpc_port}" in server.log()
        busy = server.grpc_port
        assert busy is not None
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "batchpilot.runtime.cli",
                "runtime",
                "serve",
                "--model",
                str(mlp_model),
                "--port",
                str(free_port()),
                "--grpc-port",
                str(busy),
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert result.returncode != 0
    assert f"gRPC cannot listen on 127.0.0.1:{busy}" in result.stderr.decode()


# --- Generated code --------------------------------------------------------------------------


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    """hack/gen-grpc.sh regenerates exactly the committed modules."""
    subprocess.run(
        ["bash", str(REPO / "hack" / "gen-grpc.sh"), str(tmp_path)],
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        timeout=60,
    )
    fresh = tmp_path / "batchpilot" / "runtime" / "grpc_api"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == [
        "grpc_predict_v2_pb2.py",
        "grpc_predict_v2_pb2.pyi",
        "grpc_predict_v2_pb2_grpc.py",
        "grpc_predict_v2_pb2_grpc.pyi",
    ]
    stale = [n for n in names if (fresh / n).read_text() != (GRPC_API / n).read_text()]
    assert not stale, f"run hack/gen-grpc.sh: {stale} differ from the .proto"


# --- The codec, in process (its messages live in their own descriptor pool, so this module can
# --- import them beside tritonclient's) --------------------------------------------------------


class TestCodec:
    def test_bytes_raw_and_typed(self) -> None:
        words = [b"cat", b"", "\u00e9t\u00e9".encode()]
        raw = b"".join(len(w).to_bytes(4, "little") + w for w in words)
        for typed in (False, True):
            message = ours.ModelInferRequest(model_name="m")
            tensor = message.inputs.add(name="text", datatype="BYTES", shape=[3, 1])
            if typed:
                tensor.contents.bytes_contents.extend(words)
            else:
                message.raw_input_contents.append(raw)
            decoded = decode_infer_request(message).inputs[0]
            assert decoded.data.shape == (3, 1)
            assert list(decoded.data.ravel()) == words
        response = encode_infer_response(
            model_name="m", model_version=None, request_id="7", outputs=[decoded]
        )
        assert response.raw_output_contents == [raw]
        assert response.id == "7"

    @pytest.mark.parametrize(
        ("shape", "said"),
        [
            ([10**18] * 250, "250 dimensions"),  # its product: more digits than Python prints
            ([2**62] * 3, "declares more than"),
        ],
    )
    @pytest.mark.parametrize("raw", [False, True])
    def test_a_shape_beyond_any_message_is_refused_before_its_product(
        self, shape: list[int], said: str, raw: bool
    ) -> None:
        message = ours.ModelInferRequest(model_name="m")
        message.inputs.add(name="x", datatype="FP32", shape=shape)
        if raw:
            message.raw_input_contents.append(b"")
        with pytest.raises(InvalidRequest, match=said):
            decode_infer_request(message)

    def test_the_earlier_of_deadline_and_timeout_parameter_wins(self) -> None:
        message = ours.ModelInferRequest(model_name="m")
        message.inputs.add(name="x", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
        assert decode_infer_request(message).timeout_s is None
        assert decode_infer_request(message, deadline_s=2.0).timeout_s == 2.0
        message.parameters["timeout"].int64_param = 500_000
        assert decode_infer_request(message).timeout_s == 0.5
        assert decode_infer_request(message, deadline_s=0.1).timeout_s == 0.1
        assert decode_infer_request(message, deadline_s=0.0).timeout_s == pytest.approx(1e-6)

    def test_typed_contents_must_use_the_datatypes_field(self) -> None:
        message = ours.ModelInferRequest(model_name="m")
        message.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp64_contents.extend(
            [1.0, 2.0]
        )
        with pytest.raises(InvalidRequest, match=r"takes its data in contents.fp32_contents"):
            decode_infer_request(message)
        message.inputs[0].ClearField("contents")
        with pytest.raises(InvalidRequest, match=r"input 'x' has no data"):
            decode_infer_request(message)


class TestWhatIsDecodedOffTheLoop:
    """A large message whose data is costly to turn into arrays goes to the decode thread; raw
    numeric data, read in place, never waits behind it."""

    @staticmethod
    def message(datatype: str, *, raw: bool, elements: int) -> Any:
        request = pb.ModelInferRequest(model_name="m")
        tensor = request.inputs.add(name="x", datatype=datatype, shape=[elements])
        if raw:
            request.raw_input_contents.append(bytes(4 * elements))
        else:
            tensor.contents.fp32_contents.extend([0.5] * elements)
        return request

    @pytest.mark.parametrize(
        ("datatype", "raw", "elements", "costly"),
        [
            ("FP32", True, 1_000_000, False),  # 4 MB, read in place
            ("FP32", False, 1_000_000, True),  # 4 MB of typed contents, copied from a list
            ("BYTES", True, 1_000_000, True),  # a million elements split one by one
            ("FP32", False, 1_000, False),  # small
        ],
    )
    def test_which(self, datatype: str, raw: bool, elements: int, costly: bool) -> None:
        assert _costly(self.message(datatype, raw=raw, elements=elements)) is costly
