"""Bad infer requests: each gets its exact status code and an error message that names the problem,
and none of them hurts the server.

Everything runs against one real server process (uvicorn's HTTP parser, uvloop, the real
onnxruntime engine), so what is checked is what a client sees. A plain stdlib HTTP client sends
the requests: it sends bodies and header bytes exactly as given, which the bad cases need. The
table runs first; the fuzz test then throws generated documents and bytes at the same server and
checks that nothing a client sends is answered with a 5xx; finally the server must still be ready
and serve a good request correctly.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import onnx_models
from tests.onnx_models import MULTI_IO_INPUTS
from tests.runtime_process import Reply, RuntimeProcess, runtime_process, send

MODEL = "multi_io"
MAX_BODY_BYTES = 4096
INFER = f"/v2/models/{MODEL}/infer"

Doc = dict[str, Any]


@dataclass(frozen=True)
class BadRequest:
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    path: str = INFER


def good_inputs(rows: int = 1) -> list[Doc]:
    """One JSON input entry per model input, `rows` rows of valid data."""
    arrays = onnx_models.random_multi_io(rows, seed=rows)
    return [
        {
            "name": name,
            "datatype": datatype,
            "shape": list(arrays[name].shape),
            "data": arrays[name].reshape(-1).tolist(),
        }
        for name, (_, datatype, _, _) in MULTI_IO_INPUTS.items()
    ]


def good_doc() -> Doc:
    return {"inputs": good_inputs()}


def with_input(target: str, /, **changes: Any) -> Doc:
    """The good document with input `target` changed (a value of None removes the key)."""
    doc = good_doc()
    for entry in doc["inputs"]:
        if entry["name"] == target:
            for key, value in changes.items():
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = value
    return doc


def binary_f32(*, declared: int, sent: int, header_length_delta: int = 0) -> BadRequest:
    """Input f32 sent as binary: `declared` in binary_data_size, `sent` bytes after the header."""
    doc = with_input("f32", data=None, parameters={"binary_data_size": declared})
    header = orjson.dumps(doc)
    blob = np.arange(sent, dtype=np.uint8).tobytes()
    return BadRequest(
        body=header + blob,
        headers={"Inference-Header-Content-Length": str(len(header) + header_length_delta)},
    )


def binary_flag(flag_bytes: bytes) -> BadRequest:
    """Input flag (BOOL, one row of 2) sent as binary: these bytes, one per element."""
    doc = with_input("flag", data=None, parameters={"binary_data_size": len(flag_bytes)})
    header = orjson.dumps(doc)
    return BadRequest(
        body=header + flag_bytes, headers={"Inference-Header-Content-Length": str(len(header))}
    )


def json_body(doc: Any) -> BadRequest:
    return BadRequest(body=orjson.dumps(doc))


def header_length(value: str | bytes) -> BadRequest:
    return BadRequest(
        body=orjson.dumps(good_doc()), headers={"Inference-Header-Content-Length": value}
    )


def zero_rows() -> Doc:
    doc = good_doc()
    for entry in doc["inputs"]:
        entry["shape"][0] = 0
        entry["data"] = []
    return doc


def disagreeing_batch_dims() -> Doc:
    doc = good_doc()
    doc["inputs"][0] = good_inputs(rows=2)[0]  # f32 with 2 rows, the others with 1
    return doc


# (id, request, status, words the error message must contain)
BAD_REQUESTS: list[tuple[str, BadRequest, int, tuple[str, ...]]] = [
    # --- the request does not match the model
    ("wrong-tensor-name", json_body(with_input("f32", name="f33")), 400, ("no input 'f33'",)),
    (
        "missing-input",
        json_body({"inputs": good_inputs()[:-1]}),
        400,
        ("'flag'", "missing"),
    ),
    ("wrong-datatype", json_body(with_input("f32", datatype="FP64")), 400, ("must be FP32",)),
    (
        "shape-beyond-any-body",
        json_body(with_input("f32", shape=[10**18] * 3)),
        400,
        ("input 'f32'.shape declares more than", "elements"),
    ),
    (
        "shape-beyond-any-body-async",
        BadRequest(body=orjson.dumps(with_input("f32", shape=[10**18] * 3)), path=f"{INFER}/async"),
        400,
        ("declares more than",),
    ),
    (
        "shape-of-33-dimensions",
        json_body(with_input("f32", shape=[1] * 33)),
        400,
        ("33 dimensions", "32 at most"),
    ),
    (
        "unsupported-datatype-bytes",
        json_body(with_input("f32", datatype="BYTES", data=["a", "b", "c", "d"])),
        400,
        ("must be FP32", "sent BYTES"),
    ),
    (
        "wrong-rank",
        json_body(with_input("f32", shape=[4])),
        400,
        ("'f32' has shape [4]", "expects [-1, 4]"),
    ),
    (
        "wrong-non-batch-dim",
        json_body(with_input("f32", shape=[1, 5], data=[1.0] * 5)),
        400,
        ("'f32' has shape [1, 5]", "expects [-1, 4]"),
    ),
    (
        "batch-dims-disagree",
        json_body(disagreeing_batch_dims()),
        400,
        ("disagree on the batch dimension",),
    ),
    ("zero-rows", json_body(zero_rows()), 400, ("no rows",)),
    (
        "unknown-requested-output",
        json_body({**good_doc(), "outputs": [{"name": "nope"}]}),
        400,
        ("no output 'nope'",),
    ),
    (
        "unknown-model",
        BadRequest(body=orjson.dumps(good_doc()), path="/v2/models/other/infer"),
        404,
        ("'other' is not served here",),
    ),
    (
        "unknown-version",
        BadRequest(body=orjson.dumps(good_doc()), path=f"/v2/models/{MODEL}/versions/zz/infer"),
        404,
        ("model 'multi_io' has no version 'zz'",),
    ),
    # --- JSON tensor data
    (
        "data-length-not-matching-shape",
        json_body(with_input("f32", data=[1.0, 2.0, 3.0])),
        400,
        ("needs 4 elements, data has 3",),
    ),
    (
        "ragged-nested-data",
        json_body(with_input("f32", data=[[1.0, 2.0], [3.0]])),
        400,
        ("'f32'", "does not fit datatype FP32"),
    ),
    (
        "strings-in-fp32-data",
        json_body(with_input("f32", data=["one", "two", "three", "four"])),
        400,
        ("'f32'", "does not fit datatype FP32"),
    ),
    (
        "object-in-fp32-data",
        json_body(with_input("f32", data=[{}, 1, 2, 3])),
        400,
        ("'f32'", "does not fit datatype FP32"),
    ),
    (
        "uint8-above-range",
        json_body(with_input("u8", data=[1, 2, 300])),
        400,
        ("'u8'", "UINT8", "300"),
    ),
    (
        "uint8-below-range",
        json_body(with_input("u8", data=[1, 2, -1])),
        400,
        ("'u8'", "UINT8", "-1"),
    ),
    (
        "int32-above-range",
        json_body(with_input("i32", data=[1, 2, 2**40])),
        400,
        ("'i32'", "INT32"),
    ),
    (
        "numbers-in-bool-data",
        json_body(with_input("flag", data=[1, 0])),
        400,
        ("'flag'", "BOOL data must be true or false"),
    ),
    (
        "nesting-contradicts-the-shape",
        json_body(with_input("f32", shape=[2, 4], data=[[1.0, 2.0]] * 4)),
        400,
        ("'f32'", "nested as [4, 2] but the shape is [2, 4]"),
    ),
    (
        "bool-among-numbers",
        json_body(with_input("u8", data=[True, 2, 3])),
        400,
        ("'u8'", "UINT8 data must be numbers, not true or false"),
    ),
    (
        "bool-among-floats",
        json_body(with_input("f32", data=[1, True, 1, 1])),
        400,
        ("'f32'", "FP32 data must be numbers, not true or false"),
    ),
    (
        "int64-above-range-with-a-negative",
        # orjson writes no integer past 64 bits: 2**63 goes into the bytes by hand
        BadRequest(
            body=orjson.dumps(with_input("i64", data=[-1, 0])).replace(
                b"[-1,0]", b"[9223372036854775808,-1]"
            )
        ),
        400,
        ("'i64'", "9223372036854775808 is out of range for INT64"),
    ),
    (
        "binary-bool-bytes-not-0-or-1",
        binary_flag(b"\x02\xff"),
        400,
        ("'flag'", "BOOL elements must be 0 or 1; element 0 is 2"),
    ),
    ("data-not-a-list", json_body(with_input("f32", data=1.5)), 400, ("data must be a list",)),
    (
        "neither-data-nor-binary",
        json_body(with_input("f32", data=None)),
        400,
        ("neither data nor parameters.binary_data_size",),
    ),
    # --- the document's structure
    ("malformed-json", BadRequest(body=b'{"inputs": ['), 400, ("not valid JSON",)),
    ("empty-body", BadRequest(body=b""), 400, ("not valid JSON",)),
    ("body-not-an-object", json_body([1, 2, 3]), 400, ("must be a JSON object",)),
    ("inputs-missing", json_body({"id": "1"}), 400, ("inputs must be a non-empty list",)),
    ("inputs-empty", json_body({"inputs": []}), 400, ("inputs must be a non-empty list",)),
    (
        "inputs-not-a-list",
        json_body({"inputs": {"f32": [1, 2, 3, 4]}}),
        400,
        ("inputs must be a non-empty list",),
    ),
    ("input-not-an-object", json_body({"inputs": [7]}), 400, ("inputs[0] must be a JSON object",)),
    (
        "input-without-name",
        json_body(with_input("f32", name="")),
        400,
        ("inputs[0].name must be a non-empty string",),
    ),
    (
        "duplicate-input",
        json_body({"inputs": [*good_inputs(), good_inputs()[0]]}),
        400,
        ("'f32' appears more than once",),
    ),
    ("datatype-missing", json_body(with_input("f32", datatype=None)), 400, ("datatype None",)),
    (
        "negative-shape-dim",
        json_body(with_input("f32", shape=[-1, 4])),
        400,
        ("must not have negative dimensions",),
    ),
    (
        "shape-not-a-list-of-integers",
        json_body(with_input("f32", shape=[1, "4"])),
        400,
        ("shape must be a list of integers",),
    ),
    (
        # 65 dimensions: more than any numpy array can have
        "shape-with-too-many-dimensions",
        json_body(with_input("f32", shape=[1] * 65, data=[1.0])),
        400,
        ("'f32'", "shape"),
    ),
    (
        # no elements, so the data "fits", but no array can have this shape
        "shape-with-impossible-dimension",
        json_body(with_input("f32", shape=[0, 2**63], data=[])),
        400,
        ("'f32'", "shape"),
    ),
    ("id-not-a-string", json_body({**good_doc(), "id": 7}), 400, ("id must be a string",)),
    (
        "parameters-not-an-object",
        json_body({**good_doc(), "parameters": [1]}),
        400,
        ("parameters must be a JSON object",),
    ),
    (
        "binary-data-output-not-a-bool",
        json_body({**good_doc(), "parameters": {"binary_data_output": "yes"}}),
        400,
        ("binary_data_output must be true or false",),
    ),
    (
        "outputs-not-a-list",
        json_body({**good_doc(), "outputs": {"name": "f32_out"}}),
        400,
        ("outputs must be a list",),
    ),
    (
        "classification-extension",
        json_body(
            {**good_doc(), "outputs": [{"name": "f32_out", "parameters": {"classification": 2}}]}
        ),
        400,
        ("classification extension is not supported",),
    ),
    # --- the timeout parameter (µs)
    (
        "timeout-zero",
        json_body({**good_doc(), "parameters": {"timeout": 0}}),
        400,
        ("parameters.timeout must be a positive integer",),
    ),
    (
        "timeout-not-an-integer",
        json_body({**good_doc(), "parameters": {"timeout": "10ms"}}),
        400,
        ("parameters.timeout must be a positive integer",),
    ),
    (
        "timeout-fractional",
        json_body({**good_doc(), "parameters": {"timeout": 1.5}}),
        400,
        ("parameters.timeout must be a positive integer",),
    ),
    # --- the binary tensor extension
    (
        "binary-size-not-matching-shape",
        binary_f32(declared=12, sent=12),
        400,
        ("binary_data_size is 12 bytes but shape [1, 4] of FP32 needs 16",),
    ),
    (
        "binary-data-shorter-than-declared",
        binary_f32(declared=16, sent=8),
        400,
        ("binary data ends at byte 16 but only 8 bytes follow the JSON header",),
    ),
    (
        "extra-trailing-binary-bytes",
        binary_f32(declared=16, sent=20),
        400,
        ("4 bytes of binary data follow the inputs that no input claims",),
    ),
    (
        "binary-size-negative",
        json_body(with_input("f32", data=None, parameters={"binary_data_size": -16})),
        400,
        ("binary_data_size must be a non-negative integer",),
    ),
    (
        "both-data-and-binary-data-size",
        json_body(with_input("f32", parameters={"binary_data_size": 16})),
        400,
        ("both binary_data_size and JSON data",),
    ),
    (
        "header-length-larger-than-body",
        binary_f32(declared=16, sent=16, header_length_delta=100),
        400,
        ("Inference-Header-Content-Length is",),
    ),
    (
        "header-length-not-a-number",
        header_length("twelve"),
        400,
        ("Inference-Header-Content-Length 'twelve' is not a number",),
    ),
    ("header-length-negative", header_length("-5"), 400, ("is not a number",)),
    (
        # a Latin-1 superscript two: str.isdigit() says yes, int() says no
        "header-length-superscript-digit",
        header_length(b"\xb2"),
        400,
        ("is not a number",),
    ),
    (
        # int() refuses past 4,300 digits
        "header-length-of-5000-digits",
        header_length("9" * 5000),
        400,
        ("Inference-Header-Content-Length has 5000 digits",),
    ),
    (
        "header-length-of-5000-digits-async",
        BadRequest(
            body=orjson.dumps(good_doc()),
            headers={"Inference-Header-Content-Length": "9" * 5000},
            path=f"{INFER}/async",
        ),
        400,
        ("5000 digits",),
    ),
    # --- the body's encoding
    (
        "brotli-content-encoding",
        BadRequest(body=b"\x0b\x02\x80{}\x03", headers={"Content-Encoding": "br"}),
        415,
        ("Content-Encoding 'br' is not supported: send the body uncompressed, or in one of",),
    ),
    (
        "brotli-content-encoding-async",
        BadRequest(
            body=b"\x0b\x02\x80{}\x03", headers={"Content-Encoding": "br"}, path=f"{INFER}/async"
        ),
        415,
        ("Content-Encoding 'br' is not supported",),
    ),
    (
        "codings-stacked",
        BadRequest(
            body=gzip.compress(orjson.dumps(good_doc())),
            headers={"Content-Encoding": "gzip, deflate"},
        ),
        415,
        ("Content-Encoding 'gzip, deflate' is not supported",),
    ),
    (
        "gzip-header-on-a-plain-body",
        BadRequest(body=orjson.dumps(good_doc()), headers={"Content-Encoding": "gzip"}),
        400,
        ("the body is not valid gzip data",),
    ),
    (
        "gzip-cut-short",
        BadRequest(
            body=gzip.compress(orjson.dumps(good_doc()))[:-12], headers={"Content-Encoding": "gzip"}
        ),
        400,
        ("the body is not whole gzip data: it ends early",),
    ),
    (
        "gzip-then-bytes-that-are-no-member",
        BadRequest(
            body=gzip.compress(orjson.dumps(good_doc())) + b"trailing",
            headers={"Content-Encoding": "gzip"},
        ),
        400,
        ("the body has bytes after its gzip data ends",),
    ),
    (
        # two members, each within the limit, together past it
        "gzip-members-that-inflate-past-the-limit",
        BadRequest(
            body=gzip.compress(b" " * 4000) + gzip.compress(orjson.dumps(good_doc())),
            headers={"Content-Encoding": "gzip"},
        ),
        413,
        ("the body decodes from gzip to more than the limit of 4096 bytes",),
    ),
    (
        # 4 KiB of zeros and more, sent as a few dozen bytes: decoded no further than the limit
        "gzip-that-inflates-past-the-limit",
        BadRequest(
            body=gzip.compress(b"0" * (64 * MAX_BODY_BYTES)), headers={"Content-Encoding": "gzip"}
        ),
        413,
        ("the body decodes from gzip to more than the limit of 4096 bytes",),
    ),
    # --- size
    (
        "body-over-the-limit",
        json_body({**good_doc(), "id": "x" * MAX_BODY_BYTES}),
        413,
        ("the limit is 4096 bytes",),
    ),
]


@pytest.fixture(scope="module")
def server(
    multi_io_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    """One server for the whole module: every bad request, then the fuzz, hit the same process."""
    with runtime_process(
        multi_io_model,
        "--max-batch-size",
        "8",
        "--max-queue-delay-ms",
        "0",
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        log_dir=tmp_path_factory.mktemp("bad-inputs"),
    ) as running:
        yield running


def json_request(inputs: dict[str, np.ndarray[Any, Any]]) -> bytes:
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": dt,
                    "shape": list(inputs[n].shape),
                    "data": inputs[n].ravel().tolist(),
                }
                for n, (_, dt, _, _) in MULTI_IO_INPUTS.items()
            ]
        }
    )


def assert_ready_and_serving_correctly(server: RuntimeProcess) -> None:
    assert send(server, "GET", "/v2/health/ready").status == 200
    inputs = onnx_models.random_multi_io(3, seed=11)
    reply = send(server, "POST", INFER, json_request(inputs))
    assert reply.status == 200, reply.body
    outputs = {out["name"]: out for out in reply.json()["outputs"]}
    for name, want in onnx_models.multi_io_expected(inputs).items():
        got = np.asarray(outputs[name]["data"], dtype=want.dtype).reshape(outputs[name]["shape"])
        np.testing.assert_array_equal(got, want, err_msg=name)
    metrics = send(server, "GET", "/metrics").body.decode()
    errors = re.search(r'batchpilot_requests_total\{[^}]*outcome="error"\} (\S+)', metrics)
    assert errors is not None
    assert float(errors[1]) == 0
    assert "Traceback" not in server.log()


class TestBadRequestsGetTheirStatusAndAReason:
    @pytest.mark.parametrize(
        ("request_", "status", "words"),
        [pytest.param(r, s, w, id=i) for i, r, s, w in BAD_REQUESTS],
    )
    def test_bad_request(
        self, server: RuntimeProcess, request_: BadRequest, status: int, words: tuple[str, ...]
    ) -> None:
        reply = send(server, "POST", request_.path, request_.body, request_.headers)
        assert reply.status == status, reply.body
        assert reply.headers["content-type"] == "application/json"
        error = reply.json()["error"]
        for word in words:
            assert word in error, error

    @pytest.mark.parametrize("path", ["/versions/7", "/versions/7/ready"])
    def test_a_version_the_model_does_not_have_is_not_found(
        self, server: RuntimeProcess, path: str
    ) -> None:
        # a model whose file names no version is its version 1
        assert send(server, "GET", f"/v2/models/{MODEL}").json()["versions"] == ["1"]
        reply = send(server, "GET", f"/v2/models/{MODEL}{path}")
        assert reply.status == 404, reply.body
        assert reply.json()["error"] == (
            f"model '{MODEL}' has no version '7'; its one version is '1' (or leave the version out)"
        )
        # version 1, or no version at all, is the model
        for served in ("/versions/1", ""):
            model_path = f"/v2/models/{MODEL}{path.replace('/versions/7', served)}"
            assert send(server, "GET", model_path).status == 200, model_path

    def test_nan_and_infinity_outputs_must_be_asked_for_in_binary(
        self, server: RuntimeProcess
    ) -> None:
        # f32_out = f32 + 1: NaN, inf and -inf in, the same out; JSON input has no NaN, binary has
        doc = with_input("f32", data=None, parameters={"binary_data_size": 16})
        doc["outputs"] = [{"name": "f32_out"}]
        header = orjson.dumps(doc)
        blob = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32).tobytes()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        reply = send(server, "POST", INFER, header + blob, headers)
        assert reply.status == 400, reply.body
        assert reply.json()["error"] == (
            "output 'f32_out' holds NaN or infinity, which JSON cannot carry; ask for it as "
            "binary data (parameters.binary_data_output, or the output's binary_data)"
        )
        doc["outputs"] = [{"name": "f32_out", "parameters": {"binary_data": True}}]
        header = orjson.dumps(doc)
        headers = {"Inference-Header-Content-Length": str(len(header))}
        reply = send(server, "POST", INFER, header + blob, headers)
        assert reply.status == 200, reply.body
        length = int(reply.headers["inference-header-content-length"])
        got = np.frombuffer(reply.body[length:], np.float32)
        np.testing.assert_array_equal(got, [np.nan, np.inf, -np.inf, 2.0])

    def test_content_encoding_identity_is_no_encoding(self, server: RuntimeProcess) -> None:
        reply = send(
            server, "POST", INFER, orjson.dumps(good_doc()), {"Content-Encoding": "identity"}
        )
        assert reply.status == 200, reply.body

    @pytest.mark.parametrize(
        ("coding", "compress"),
        [
            ("gzip", gzip.compress),
            ("x-gzip", gzip.compress),
            # several members, as concatenated gzip files or a parallel compressor make them
            ("gzip", lambda data: gzip.compress(data[:10]) + gzip.compress(data[10:])),
            ("deflate", zlib.compress),
            ("Deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some send it
        ],
    )
    def test_a_compressed_body_is_decoded(
        self, server: RuntimeProcess, coding: str, compress: Any
    ) -> None:
        plain = send(server, "POST", INFER, orjson.dumps(good_doc()))
        reply = send(
            server, "POST", INFER, compress(orjson.dumps(good_doc())), {"Content-Encoding": coding}
        )
        assert reply.status == 200, reply.body
        assert reply.json()["outputs"] == plain.json()["outputs"]

    def test_server_still_serves_after_the_table(self, server: RuntimeProcess) -> None:
        assert_ready_and_serving_correctly(server)


class TestARequestTheModelFailsOn:
    """A value the model cannot take (an id past its table) fails onnxruntime's whole run: the
    requests batched with it are answered all the same, and it alone is refused with 400."""

    def test_it_is_refused_and_its_batch_is_answered(self, tmp_path: Path) -> None:
        model = onnx_models.embedding(tmp_path / "embedding.onnx", vocabulary=10, width=4)
        flags = ["--max-batch-size", "8", "--max-queue-delay-ms", "2000", "--no-early-start"]
        with runtime_process(model, *flags, log_dir=tmp_path) as server:
            ids = [[n, n, n] for n in range(7)] + [[1, 20, 3]]  # the last: 20 of 10 rows

            def infer(row: list[int]) -> Reply:
                doc = {
                    "inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": row}]
                }
                return send(server, "POST", "/v2/models/embedding/infer", orjson.dumps(doc))

            with ThreadPoolExecutor(len(ids)) as pool:  # one batch of eight: it fills, then runs
                replies = list(pool.map(infer, ids))
            for n, reply in enumerate(replies[:-1]):
                assert reply.status == 200, reply.body
                vectors = orjson.loads(reply.body)["outputs"][0]["data"]
                assert vectors == list(range(4 * n, 4 * n + 4)) * 3
            refused = replies[-1]
            assert refused.status == 400
            error = orjson.loads(refused.body)["error"]
            assert error.startswith(
                "the model failed on this request's inputs, while 7 of the 7 requests batched "
                "with it ran: "
            )
            assert "indices element out of data bounds, idx=20" in error
            stats = send(server, "GET", "/v2/models/embedding/stats").json()["model_stats"][0]
            assert stats["inference_count"] == 7  # rows answered
            metrics = send(server, "GET", "/metrics").body.decode()
            outcomes = dict(
                re.findall(r'batchpilot_requests_total\{[^}]*outcome="(\w+)"\} (\S+)', metrics)
            )
            assert (float(outcomes["success"]), float(outcomes["invalid"])) == (7, 1)
            assert float(outcomes.get("error", 0)) == 0
            assert send(server, "GET", "/v2/health/ready").status == 200


# --- Fuzzing a real server process ------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)

shapes = st.one_of(
    st.lists(st.integers(min_value=-2, max_value=4), max_size=4),
    # dimensions and ranks that no numpy array can have
    st.lists(st.sampled_from([0, 1, 2**31, 2**63, 2**64 - 1]), max_size=4),
    st.lists(st.integers(min_value=0, max_value=1), min_size=60, max_size=70),
)

INPUT_NAMES = [*MULTI_IO_INPUTS, "x"]
OUTPUT_NAMES = [f"{name}_out" for name in MULTI_IO_INPUTS]
DATATYPE_NAMES = [dt for _, dt, _, _ in MULTI_IO_INPUTS.values()] + [
    "FP64",
    "INT8",
    "BYTES",
    "fp32",
]
KEYS = ["name", "datatype", "shape", "data", "parameters"]


@st.composite
def mutated_requests(draw: st.DrawFn) -> tuple[Doc, bytes]:
    """A valid request, each input in JSON or in binary, then a few edits that may break it.

    Returns the JSON document and the binary data that follows it.
    """
    arrays = onnx_models.random_multi_io(
        draw(st.integers(min_value=1, max_value=3)), seed=draw(st.integers(0, 3))
    )
    inputs: list[Doc] = []
    chunks: list[bytes] = []
    for name, (_, datatype, _, _) in MULTI_IO_INPUTS.items():
        entry: Doc = {"name": name, "datatype": datatype, "shape": list(arrays[name].shape)}
        if draw(st.booleans()):
            chunks.append(arrays[name].tobytes())
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = arrays[name].ravel().tolist()
        inputs.append(entry)
    doc: Doc = {"inputs": inputs}
    if draw(st.booleans()):
        doc["outputs"] = [
            {
                "name": draw(st.sampled_from([*OUTPUT_NAMES, "nope"])),
                "parameters": {"binary_data": draw(st.booleans())},
            }
            for _ in range(draw(st.integers(min_value=0, max_value=3)))
        ]
    if draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": draw(st.booleans())}
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        entry = draw(st.sampled_from(inputs))
        key = draw(st.sampled_from(KEYS))
        if draw(st.integers(min_value=0, max_value=5)) == 0:
            entry.pop(key, None)
        elif key == "name":
            entry[key] = draw(st.sampled_from(INPUT_NAMES))
        elif key == "datatype":
            entry[key] = draw(st.sampled_from(DATATYPE_NAMES))
        elif key == "shape":
            entry[key] = draw(shapes)
        elif key == "parameters":
            entry[key] = {"binary_data_size": draw(st.integers(min_value=-1, max_value=64))}
        else:
            entry[key] = draw(json_values)
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["id", "parameters", "outputs", "inputs"]))] = draw(json_values)
    return doc, b"".join(chunks)


@st.composite
def fuzz_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A body and its headers: raw bytes, any JSON, or a mutated v2 request, with or without the
    binary extension's header (whose value may be right, wrong, or not a number)."""
    kind = draw(st.sampled_from(["bytes", "json", "request", "request"]))
    if kind == "bytes":
        header, blob = b"", draw(st.binary(max_size=256))
    elif kind == "json":
        header, blob = orjson.dumps(draw(json_values)), b""
    else:
        doc, blob = draw(mutated_requests())
        header = orjson.dumps(doc)
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            blob += draw(st.binary(min_size=1, max_size=16))
    body = header + blob
    if not blob and draw(st.booleans()):
        return body, {}
    length = draw(
        st.one_of(
            st.just(str(len(header))),
            st.just(str(len(header))),
            st.integers(min_value=0, max_value=len(body) + 8).map(str),
            st.text(alphabet="0123456789 -+x²", max_size=4),
        )
    )
    return body, {"Inference-Header-Content-Length": length}


class TestNothingAClientSendsIsAServerError:
    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(request_=fuzz_requests())
    def test_fuzzed_requests_get_200_or_a_4xx_with_a_reason(
        self, server: RuntimeProcess, request_: tuple[bytes, dict[str, str]]
    ) -> None:
        body, headers = request_
        reply = send(server, "POST", INFER, body, headers)
        # A deadline the request itself set may pass: 504 is then the right answer.
        allowed_5xx = {504} if b'"timeout"' in body else set()
        assert reply.status in {200, *allowed_5xx} or 400 <= reply.status < 500, (
            reply.status,
            reply.body,
        )
        if reply.status != 200:
            assert reply.headers["content-type"] == "application/json"
            assert isinstance(reply.json()["error"], str)

    def test_server_still_serves_after_the_fuzz(self, server: RuntimeProcess) -> None:
        assert_ready_and_serving_correctly(server)
