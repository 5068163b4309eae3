"""BYTES tensors in the v2 codec: strings in JSON, 4-byte little-endian length prefixes in the
binary extension, both ways; bad BYTES data is a clear InvalidRequest."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.protocol.client_codec import decode_response, encode_request
from batchpilot.runtime.protocol.server_codec import decode_request, encode_response
from batchpilot.runtime.protocol.tensors import BYTES, Tensor


def objects(*elements: Any, shape: tuple[int, ...] | None = None) -> np.ndarray[Any, Any]:
    out = np.empty(len(elements), dtype=object)
    out[:] = elements
    return out.reshape(shape or (len(elements),))


PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\xff"  # not UTF-8


class TestBytesRoundTrip:
    @pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
    def test_request(self, binary: bool) -> None:
        data = objects(b"hello", b"", "caf\u00e9".encode(), b"x" * 300, shape=(2, 2))
        body, hl = encode_request([Tensor("t", BYTES, data)], binary=binary)
        (tensor,) = decode_request(body, header_length=hl).inputs
        assert tensor.datatype == BYTES
        assert tensor.data.shape == (2, 2)
        assert tensor.data.tolist() == data.tolist()

    def test_binary_request_carries_bytes_that_are_not_text(self) -> None:
        data = objects(PNG_HEAD, b"\x00\x01")
        body, hl = encode_request([Tensor("img", BYTES, data)])
        (tensor,) = decode_request(body, header_length=hl).inputs
        assert tensor.data.tolist() == [PNG_HEAD, b"\x00\x01"]

    def test_binary_layout_is_length_prefixed_little_endian(self) -> None:
        body, hl = encode_request([Tensor("t", BYTES, objects(b"ab", b"xyz"))])
        assert hl is not None
        header = orjson.loads(body[:hl])
        # 4 + 2 + 4 + 3 = 13 bytes: <02 00 00 00> "ab" <03 00 00 00> "xyz".
        assert header["inputs"][0]["parameters"]["binary_data_size"] == 13
        assert body[hl:] == b"\x02\x00\x00\x00ab\x03\x00\x00\x00xyz"

    def test_mixed_with_fixed_size_tensors(self) -> None:
        floats = np.arange(6, dtype=np.float32).reshape(2, 3)
        body, hl = encode_request(
            [
                Tensor("a", "FP32", floats),
                Tensor("s", BYTES, objects(b"p", b"q")),
                Tensor("b", "FP32", floats),
            ]
        )
        a, s, b = decode_request(body, header_length=hl).inputs
        np.testing.assert_array_equal(a.data, floats)
        assert s.data.tolist() == [b"p", b"q"]
        np.testing.assert_array_equal(b.data, floats)

    def test_response_in_json_and_binary(self) -> None:
        labels = objects(b"cat", b"dog", b"eel", b"", shape=(2, 2))
        outs = [Tensor("json", BYTES, labels), Tensor("bin", BYTES, labels)]
        body, hl = encode_response(
            model_name="m", model_version=None, request_id=None, outputs=outs, binary={"bin"}
        )
        assert hl is not None
        header = orjson.loads(body[:hl])
        assert header["outputs"][0]["data"] == ["cat", "dog", "eel", ""]
        assert header["outputs"][1]["parameters"]["binary_data_size"] == 4 * 4 + 9
        decoded = decode_response(body, header_length=hl)
        assert decoded["json"].data.tolist() == labels.tolist()
        assert decoded["bin"].data.tolist() == labels.tolist()

    def test_json_response_of_bytes_that_are_not_text_says_to_ask_for_binary(self) -> None:
        with pytest.raises(InvalidRequest, match="not UTF-8 text; ask for it as binary"):
            encode_response(
                model_name="m",
                model_version=None,
                request_id=None,
                outputs=[Tensor("o", BYTES, objects(PNG_HEAD))],
                binary=(),
            )

    def test_nested_json_strings(self) -> None:
        doc = {
            "inputs": [{"name": "t", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], ["b"]]}]
        }
        (tensor,) = decode_request(orjson.dumps(doc)).inputs
        assert tensor.data.tolist() == [[b"a"], [b"b"]]


def binary_request(shape: list[int], blob: bytes) -> tuple[bytes, int]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "t",
                    "datatype": "BYTES",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    )
    return header + blob, len(header)


class TestBytesRefusals:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ([3], "BYTES data must be strings, got int 3"),
            ([1.5], "BYTES data must be strings, got float"),
            ([None], "BYTES data must be strings, got NoneType"),
            ([{"b64": "aGk="}], "BYTES data must be strings, got dict"),
            (["a", "b"], "shape \\[1\\] needs 1 elements, data has 2"),
            ("abc", "data must be a list"),
        ],
    )
    def test_json(self, data: Any, message: str) -> None:
        doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": data}]}
        with pytest.raises(InvalidRequest, match=message):
            decode_request(orjson.dumps(doc))

    def test_element_longer_than_its_data(self) -> None:
        body, hl = binary_request([1], struct.pack("<I", 100) + b"abc")
        with pytest.raises(InvalidRequest, match="element 0 says 100 bytes but only 3 remain"):
            decode_request(body, header_length=hl)

    def test_cut_off_length_prefix(self) -> None:
        body, hl = binary_request([2], struct.pack("<I", 1) + b"a" + b"\x01\x00")
        with pytest.raises(InvalidRequest, match="element 1 has a cut-off length prefix"):
            decode_request(body, header_length=hl)

    def test_element_count_differs_from_shape(self) -> None:
        body, hl = binary_request([3], struct.pack("<I", 1) + b"a")
        with pytest.raises(
            InvalidRequest, match="shape needs 3 BYTES elements, the binary data holds 1"
        ):
            decode_request(body, header_length=hl)

    def test_binary_size_past_the_body(self) -> None:
        body, hl = binary_request([1], struct.pack("<I", 1) + b"a")
        with pytest.raises(InvalidRequest, match="only 4 bytes follow"):
            decode_request(body[:-1], header_length=hl)
