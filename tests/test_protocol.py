"""The v2 codec: what goes in as bytes comes out as the same arrays, both ways."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import pytest

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.protocol.client_codec import decode_response, encode_request
from batchpilot.runtime.protocol.model_config import TRITON_DATATYPES, model_config
from batchpilot.runtime.protocol.server_codec import decode_request, encode_response
from batchpilot.runtime.protocol.tensors import (
    DATATYPES,
    MAX_ELEMENTS,
    Tensor,
    datatype_of,
    element_count,
    split_bytes,
)


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(1)
    dtype = DATATYPES[datatype]
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


class TestRoundTrip:
    @pytest.mark.parametrize("datatype", list(DATATYPES))
    @pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
    def test_request_tensors_survive_encoding(self, datatype: str, binary: bool) -> None:
        data = sample(datatype)
        body, header_length = encode_request([Tensor("x", datatype, data)], binary=binary)
        assert (header_length is not None) == binary
        decoded = decode_request(body, header_length=header_length)
        (tensor,) = decoded.inputs
        assert tensor.datatype == datatype
        assert tensor.data.dtype == DATATYPES[datatype]
        np.testing.assert_array_equal(tensor.data, data)

    @pytest.mark.parametrize("datatype", list(DATATYPES))
    def test_response_tensors_survive_encoding_in_json_and_binary(self, datatype: str) -> None:
        outs = [Tensor("a", datatype, sample(datatype)), Tensor("b", datatype, sample(datatype))]
        body, header_length = encode_response(
            model_name="m", model_version=None, request_id="r1", outputs=outs, binary={"b"}
        )
        assert header_length is not None
        header = orjson.loads(body[:header_length])
        assert header["id"] == "r1"
        assert "data" in header["outputs"][0]
        assert header["outputs"][1]["parameters"]["binary_data_size"] == outs[1].data.nbytes
        decoded = decode_response(body, header_length=header_length)
        for out in outs:
            np.testing.assert_array_equal(decoded[out.name].data, out.data)

    def test_all_json_response_has_no_binary_header(self) -> None:
        body, header_length = encode_response(
            model_name="m",
            model_version="2",
            request_id=None,
            outputs=[Tensor("a", "FP32", np.ones((1, 2), np.float32))],
            binary=(),
        )
        assert header_length is None
        assert orjson.loads(body) == {
            "model_name": "m",
            "model_version": "2",
            "outputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 1.0]}],
        }

    @pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
    def test_nan_and_infinity_go_back_in_binary_and_never_as_json(self, datatype: str) -> None:
        values = np.array([[np.nan, np.inf, -np.inf, 1.0]], dtype=DATATYPES[datatype])
        out = [Tensor("y", datatype, values)]
        with pytest.raises(InvalidRequest, match="output 'y' holds NaN or infinity, which JSON"):
            encode_response(
                model_name="m", model_version=None, request_id=None, outputs=out, binary=()
            )
        body, hl = encode_response(
            model_name="m", model_version=None, request_id=None, outputs=out, binary={"y"}
        )
        np.testing.assert_array_equal(decode_response(body, header_length=hl)["y"].data, values)

    def test_several_binary_inputs_are_read_in_order(self) -> None:
        a, b = sample("FP32", (2, 2)), sample("INT64", (2, 5))
        body, hl = encode_request([Tensor("a", "FP32", a), Tensor("b", "INT64", b)])
        decoded = decode_request(body, header_length=hl)
        np.testing.assert_array_equal(decoded.inputs[0].data, a)
        np.testing.assert_array_equal(decoded.inputs[1].data, b)

    def test_nested_json_data_is_accepted_like_flat_data(self) -> None:
        doc = {
            "inputs": [
                {"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}
            ]
        }
        (tensor,) = decode_request(orjson.dumps(doc)).inputs
        np.testing.assert_array_equal(tensor.data, [[1, 2], [3, 4]])

    def test_binary_inputs_are_views_of_the_body_not_copies(self) -> None:
        body, hl = encode_request([Tensor("x", "FP32", sample("FP32", (64, 64)))])
        (tensor,) = decode_request(body, header_length=hl).inputs
        assert not tensor.data.flags.owndata


class TestRequestOptions:
    def test_output_selection_and_binary_flags(self) -> None:
        doc = {
            "id": "7",
            "parameters": {"binary_data_output": True, "timeout": 250_000},
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
            "outputs": [{"name": "a"}, {"name": "b", "parameters": {"binary_data": False}}],
        }
        request = decode_request(orjson.dumps(doc))
        assert request.id == "7"
        assert request.requested_outputs == ("a", "b")
        assert request.binary_outputs == {"a"}
        assert request.timeout_s == pytest.approx(0.25)

    def test_defaults(self) -> None:
        doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}
        request = decode_request(orjson.dumps(doc))
        assert request.requested_outputs is None
        assert not request.binary_default
        assert request.timeout_s is None


class TestRefusals:
    @pytest.mark.parametrize(
        ("doc", "message"),
        [
            ([], "must be a JSON object"),
            ({}, "inputs must be a non-empty list"),
            ({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, "name must be"),
            (
                {"inputs": [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1]}]},
                "datatype 'BF16' is not supported",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]},
                "needs 2 elements, data has 1",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]},
                "negative",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": ["a", "b"]}]},
                "does not fit datatype FP32",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]}]},
                "does not fit datatype UINT8",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "BOOL", "shape": [1], "data": [2]}]},
                "BOOL data must be true or false",
            ),
            (
                {
                    "inputs": [
                        {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1], [2, 3]]}
                    ]
                },
                "does not fit",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]},
                "neither data nor parameters.binary_data_size",
            ),
            (
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}] * 2},
                "appears more than once",
            ),
            (
                {
                    "parameters": {"timeout": -5},
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                },
                "timeout must be a positive integer",
            ),
        ],
    )
    def test_malformed_json_requests(self, doc: Any, message: str) -> None:
        with pytest.raises(InvalidRequest, match=message):
            decode_request(orjson.dumps(doc))

    @pytest.mark.parametrize(
        ("datatype", "data", "message"),
        [
            ("FP32", ["1.5"], "FP32 data must be numbers"),
            ("FP32", [None], "FP32 data must be numbers"),
            ("FP32", [True], "FP32 data must be numbers"),
            ("INT64", [1.5], "INT64 data must be integers"),
            ("INT64", [1.0], "INT64 data must be integers"),
            ("UINT8", [-1], r"-1 is out of range for UINT8 \(0..255\)"),
            ("INT64", [2**63], "9223372036854775808 is out of range for INT64"),
            ("FP16", [1e6], "values overflow FP16"),
            # numpy reads true as 1 among numbers: refused wherever it is, as an all-bool list is
            ("UINT8", [True, 2, 3], "UINT8 data must be numbers, not true or false"),
            ("FP32", [1, True, 1, 1], "FP32 data must be numbers, not true or false"),
            ("FP32", [[1.5, 2.5], [0, False]], "FP32 data must be numbers, not true or false"),
            # numpy reads 64-bit integers of both signs together as floats
            ("INT64", [2**63, -1], "9223372036854775808 is out of range for INT64"),
            ("UINT64", [2**63, -1], "-1 is out of range for UINT64"),
        ],
    )
    def test_json_data_numpy_would_silently_convert(
        self, datatype: str, data: list[Any], message: str
    ) -> None:
        doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}]}
        with pytest.raises(InvalidRequest, match=message):
            decode_request(orjson.dumps(doc))

    @pytest.mark.parametrize("datatype", ["INT64", "INT32"])
    def test_integers_past_64_bits_are_out_of_range(self, datatype: str) -> None:
        # orjson reads an integer past 64 bits as a float: still out of range, not "a fraction"
        body = b'{"inputs": [{"name": "x", "datatype": "%s", "shape": [2], "data": [%d, 1]}]}'
        with pytest.raises(InvalidRequest, match=f"{2**64} is out of range for {datatype}"):
            decode_request(body % (datatype.encode(), 2**64))

    @pytest.mark.parametrize(
        ("datatype", "shape", "data", "nested"),
        [
            ("FP32", [2, 64], [[1.0, 2.0]] * 64, "as [64, 2] but the shape is [2, 64]"),
            ("INT32", [4], [[1, 2], [3, 4]], "as [2, 2] but the shape is [4]"),
            ("BOOL", [2, 1], [[True, False]], "as [1, 2] but the shape is [2, 1]"),
            ("BYTES", [1], [["a"]], "as [1, 1] but the shape is [1]"),
            ("BYTES", [2, 2], [["a", "b"], ["c"]], "unevenly; the shape is [2, 2]"),
            ("BYTES", [2], ["a", ["b"]], "unevenly; the shape is [2]"),
        ],
    )
    def test_nested_data_must_nest_as_the_shape(
        self, datatype: str, shape: list[int], data: list[Any], nested: str
    ) -> None:
        doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}
        with pytest.raises(InvalidRequest, match=f"input 'x': data is nested {re.escape(nested)}"):
            decode_request(orjson.dumps(doc))

    @pytest.mark.parametrize(
        ("datatype", "shape", "data"),
        [
            ("FP32", [2, 64], [1.0] * 128),  # flat data fits any shape of its size
            ("FP32", [2, 64], [[1.0] * 64] * 2),
            ("BYTES", [2, 2], ["a", "b", "c", "d"]),
            ("BYTES", [2, 2], [["a", "b"], ["c", "d"]]),
            ("FP32", [1, 0], [[]]),
        ],
    )
    def test_flat_data_or_data_nested_as_the_shape_is_taken(
        self, datatype: str, shape: list[int], data: list[Any]
    ) -> None:
        doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}
        (tensor,) = decode_request(orjson.dumps(doc)).inputs
        assert tensor.data.shape == tuple(shape)

    @pytest.mark.parametrize("byte", [2, 255])
    def test_binary_bool_elements_other_than_0_or_1(self, byte: int) -> None:
        body, hl = encode_request([Tensor("x", "BOOL", np.array([[True, False]]))])
        bad = body[:-1] + bytes([byte])
        with pytest.raises(
            InvalidRequest, match=f"BOOL elements must be 0 or 1; element 1 is {byte}"
        ):
            decode_request(bad, header_length=hl)

    def test_not_json(self) -> None:
        with pytest.raises(InvalidRequest, match="not valid JSON"):
            decode_request(b"{nope")

    def test_binary_size_that_does_not_match_the_shape(self) -> None:
        body, hl = encode_request([Tensor("x", "FP32", sample("FP32", (2, 3)))])
        bad = body.replace(b'"binary_data_size":24', b'"binary_data_size":20')
        with pytest.raises(InvalidRequest, match="binary_data_size is 20 bytes but shape"):
            decode_request(bad, header_length=hl)

    def test_binary_data_shorter_than_declared(self) -> None:
        body, hl = encode_request([Tensor("x", "FP32", sample("FP32", (2, 3)))])
        with pytest.raises(InvalidRequest, match="only 20 bytes follow"):
            decode_request(body[:-4], header_length=hl)

    def test_binary_bytes_that_no_input_claims(self) -> None:
        body, hl = encode_request([Tensor("x", "FP32", sample("FP32", (2, 3)))])
        with pytest.raises(InvalidRequest, match="4 bytes of binary data"):
            decode_request(body + b"\0\0\0\0", header_length=hl)

    def test_header_length_past_the_body(self) -> None:
        with pytest.raises(InvalidRequest, match="Inference-Header-Content-Length is 99"):
            decode_request(b"{}", header_length=99)


def test_datatype_names_of_numpy_dtypes() -> None:
    assert datatype_of(np.dtype(np.float32)) == "FP32"
    assert datatype_of(np.dtype(">i8")) == "INT64"
    assert datatype_of(np.dtype(np.bool_)) == "BOOL"
    with pytest.raises(InvalidRequest):
        datatype_of(np.dtype("U3"))


class TestModelConfig:
    """Triton's model configuration form of a signature (`protocol.model_config`)."""

    def test_dims_leave_out_the_batch_and_datatypes_take_tritons_names(self) -> None:
        config = model_config(
            name="m",
            platform="onnxruntime_onnx",
            backend="onnxruntime",
            inputs=[("image", "UINT8", (-1, 3, 224, 224)), ("text", "BYTES", (-1,))],
            outputs=[("scores", "FP16", (-1, 1000))],
            max_batch_size=16,
            max_queue_delay_s=0.0025,
            instances=2,
            gpu=True,
        )
        assert config["max_batch_size"] == 16
        assert config["input"] == [
            {"name": "image", "data_type": "TYPE_UINT8", "dims": [3, 224, 224]},
            {"name": "text", "data_type": "TYPE_STRING", "dims": []},
        ]
        assert config["output"] == [{"name": "scores", "data_type": "TYPE_FP16", "dims": [1000]}]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2500
        assert config["instance_group"] == [
            {"name": "m", "kind": "KIND_GPU", "count": 2, "gpus": [0]}
        ]
        assert set(TRITON_DATATYPES) == {*DATATYPES, "BYTES"}


class TestShapesAndElements:
    def test_a_shape_counts_its_elements_up_to_what_a_body_could_hold(self) -> None:
        assert element_count((2, 3, 4), "x") == 24
        assert element_count((), "x") == 1
        assert element_count((0, 10**18, 10**18), "x") == 0
        assert element_count((MAX_ELEMENTS,), "x") == MAX_ELEMENTS
        with pytest.raises(InvalidRequest, match="declares more than"):
            element_count((MAX_ELEMENTS, 2), "x")
        with pytest.raises(InvalidRequest, match=r"x\.shape has 33 dimensions"):
            element_count((1,) * 33, "x")

    def test_bytes_beyond_the_shape_are_refused_without_splitting_the_rest(self) -> None:
        one = (1).to_bytes(4, "little") + b"a"
        assert split_bytes(memoryview(one * 2), 2, "x") == [b"a", b"a"]
        # The rest here is no valid element at all: refused for being there, not for its form.
        with pytest.raises(InvalidRequest, match="the binary data holds more"):
            split_bytes(memoryview(one * 2 + b"\xff"), 2, "x")
        with pytest.raises(InvalidRequest, match="holds 1"):
            split_bytes(memoryview(one), 2, "x")
