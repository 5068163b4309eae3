"""Non-maximum suppression end to end: a real `batchpilot runtime serve` process serves a
detector-shaped model (`onnx_models.detector`) behind an image preprocess and an `nms`
postprocess. Clients send PNG/JPEG bytes as a v2 BYTES tensor and get back boxes, scores,
classes, labels and num_detections, padded per request.

The model's outputs are simple enough to predict by hand: the same four boxes for every image,
and per-class scores equal to fixed base scores times the image's mean pixel value (pixels are
divided by 255, so a white image has mean 1). Solid-colour images therefore give exactly known
detections; the arithmetic is in the comments below. Boxes come back on each original image
(`boxCoordinates: original`, the default): the model's boxes mapped back through that image's
resize. Responses are decoded here with numpy and orjson, not with the runtime's own codec.
"""

from __future__ import annotations

import asyncio
import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from PIL import Image

from tests import onnx_models
from tests.runtime_process import Reply, RuntimeProcess, Scrape, runtime_process, send

pytestmark = pytest.mark.slow

Array = np.ndarray[Any, Any]
Row = dict[str, list[Any]]
"""One image's detections: boxes, scores, classes and labels, best first."""

MODEL = "detector"
OUTPUTS = ["boxes", "scores", "classes", "labels", "num_detections"]
CONFIG = {
    "preprocess": {"image": {"input": "images"}},  # size 32x32 from the model, stretch, /255
    # boxCoordinates: original (the default) maps boxes back onto each image
    "postprocess": {
        "nms": {
            "boxes": "boxes",
            "scores": "scores",
            "iouThreshold": 0.5,
            "scoreThreshold": 0.3,
            "maxDetections": 4,
            "labels": "labels.txt",
        }
    },
}
LABELS = ["cat", "dog"]

# The model's boxes (x1 y1 x2 y2) and base scores (cat, dog), from onnx_models:
#   b0 [ 2,  2, 12, 12]   0.9   0.1
#   b1 [ 3,  3, 13, 13]   0.8   0.6
#   b2 [20, 20, 30, 30]   0.2   0.7
#   b3 [ 2,  8, 12, 18]   0.5   0.45
# Every box is 10x10 = 100 px². Overlaps:
#   b0-b1: [3, 3, 12, 12] = 9x9 = 81, IoU 81 / (200 - 81) = 0.68 > 0.5: suppressed, same class
#   b0-b3: [2, 8, 12, 12] = 10x4 = 40, IoU 40 / 160 = 0.25: neither suppresses the other
#   b1-b3: [3, 8, 12, 13] = 9x5 = 45, IoU 45 / 155 = 0.29: neither suppresses the other
#   b2 overlaps nothing.
#
# White image, mean 1: the scores are the base scores. Above 0.3, best first:
#   b0 cat 0.9, b1 cat 0.8, b2 dog 0.7, b1 dog 0.6, b3 cat 0.5, b3 dog 0.45
#   b0 cat kept; b1 cat suppressed by it (IoU 0.68); b2 dog kept; b1 dog kept (suppression is
#   per class, and its IoU with b2 is 0); b3 cat kept (IoU 0.25 with b0): that makes
#   maxDetections = 4, so b3 dog (0.45) is cut although nothing suppresses it.
WHITE: Row = {
    "boxes": [[2, 2, 12, 12], [20, 20, 30, 30], [3, 3, 13, 13], [2, 8, 12, 18]],
    "scores": [0.9, 0.7, 0.6, 0.5],
    "classes": [0, 1, 1, 0],
    "labels": ["cat", "dog", "dog", "cat"],
}
# Grey 102 image, mean 102 / 255 = 0.4: cat 0.36 0.32 0.08 0.20, dog 0.04 0.24 0.28 0.18.
# Above 0.3: b0 cat 0.36 and b1 cat 0.32; b0 suppresses b1 (IoU 0.68): one detection.
# The image is 64x48, stretched to 32x32 (x scale 32/64 = 0.5, y scale 32/48 = 2/3), so b0
# [2, 2, 12, 12] is, on the image: x 2 / 0.5 = 4, 12 / 0.5 = 24; y 2 / (2/3) = 3, 12 / (2/3) = 18.
# (The white image is 32x32: its boxes are the model's.)
GREY_VALUE = 102
GREY: Row = {"boxes": [[4, 3, 24, 18]], "scores": [0.36], "classes": [0], "labels": ["cat"]}
# Black image, mean 0: every score is 0, nothing is above 0.3: no detection.
BLACK: Row = {"boxes": [], "scores": [], "classes": [], "labels": []}


def solid(value: int, fmt: str, size: tuple[int, int] = (32, 32)) -> bytes:
    """A one-colour image, encoded. Solid grey survives JPEG (and the stretch to 32x32) exactly,
    which `test_images_decode_to_their_solid_value` checks independently of the server."""
    buffer = io.BytesIO()
    Image.new("RGB", size, (value, value, value)).save(
        buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {})
    )
    return buffer.getvalue()


WHITE_PNG = solid(255, "PNG")
GREY_JPEG = solid(GREY_VALUE, "JPEG", (64, 48))  # stretched to 32x32 by the pipeline
BLACK_PNG = solid(0, "PNG", (40, 40))


def expected(*rows: Row) -> dict[str, Array]:
    """One request's outputs for `rows`: D is the longest row; shorter rows are padded with zero
    boxes, score 0, class -1 and an empty label."""
    width = max(len(r["scores"]) for r in rows)

    def pad(values: list[Any], filler: Any) -> list[Any]:
        return values + [filler] * (width - len(values))

    return {
        "boxes": np.array([pad(r["boxes"], [0, 0, 0, 0]) for r in rows], np.float32).reshape(
            len(rows), width, 4
        ),
        "scores": np.array([pad(r["scores"], 0) for r in rows], np.float32).reshape(
            len(rows), width
        ),
        "classes": np.array([pad(r["classes"], -1) for r in rows], np.int64).reshape(
            len(rows), width
        ),
        "labels": np.array([pad(r["labels"], "") for r in rows], object).reshape(len(rows), width),
        "num_detections": np.array([len(r["scores"]) for r in rows], np.int64),
    }


# --- A small, independent v2 codec ------------------------------------------------------------

DTYPES: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8")}
DATATYPES = {
    "boxes": "FP32",
    "scores": "FP32",
    "classes": "INT64",
    "labels": "BYTES",
    "num_detections": "INT64",
}


def bytes_request(
    elements: list[bytes], *, binary_outputs: bool, outputs: list[str] | None = None
) -> tuple[bytes, dict[str, str]]:
    """Images as one binary BYTES tensor "images" of shape [N] (4-byte little-endian length, then
    the bytes); outputs as JSON or binary, all of them or those named."""
    blob = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [len(elements)],
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "parameters": {"binary_data_output": binary_outputs},
    }
    if outputs is not None:
        doc["outputs"] = [{"name": n} for n in outputs]
    header = orjson.dumps(doc)
    return header + blob, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


@dataclass(frozen=True)
class Output:
    array: Array
    datatype: str
    binary: bool


def decode_bytes(data: bytes, count: int) -> list[str]:
    values, offset = [], 0
    for _ in range(count):
        (length,) = struct.unpack_from("<I", data, offset)
        values.append(data[offset + 4 : offset + 4 + length].decode())
        offset += 4 + length
    assert offset == len(data), "bytes after the last BYTES element"
    return values


def outputs_of(reply: Reply) -> dict[str, Output]:
    """The outputs of a 200 reply, JSON or binary, in the order the reply lists them."""
    assert reply.status == 200, reply.body
    header_length = reply.headers.get("inference-header-content-length")
    end = len(reply.body) if header_length is None else int(header_length)
    doc = orjson.loads(reply.body[:end])
    assert doc["model_name"] == MODEL
    offset, outputs = end, {}
    for out in doc["outputs"]:
        shape, datatype = tuple(out["shape"]), out["datatype"]
        count = int(np.prod(shape))
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is None:
            data = out["data"]
            assert len(data) == count
            array = np.array(data, object if datatype == "BYTES" else DTYPES[datatype])
        else:
            chunk = reply.body[offset : offset + size]
            offset += size
            if datatype == "BYTES":
                array = np.array(decode_bytes(chunk, count), object)
            else:
                array = np.frombuffer(chunk, DTYPES[datatype])
        outputs[out["name"]] = Output(array.reshape(shape), datatype, size is not None)
    assert offset == len(reply.body), "binary data after the last output"
    return outputs


def assert_detections(got: dict[str, Array], want: dict[str, Array]) -> None:
    """Every output, its shape and every value, padding included."""
    assert list(got) == OUTPUTS
    for name in OUTPUTS:
        assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
    np.testing.assert_array_equal(got["boxes"], want["boxes"])
    # grey scores are 0.4 x base in float32, through a mean over 3072 pixels: last-bit noise
    np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got["classes"], want["classes"])
    assert got["labels"].tolist() == want["labels"].tolist()
    np.testing.assert_array_equal(got["num_detections"], want["num_detections"])


def arrays(outputs: dict[str, Output]) -> dict[str, Array]:
    return {name: out.array for name, out in outputs.items()}


def infer(server: RuntimeProcess, request: tuple[bytes, dict[str, str]]) -> Reply:
    return send(server, "POST", f"/v2/models/{MODEL}/infer", *request)


def batch_sizes(server: RuntimeProcess) -> tuple[float, float]:
    """(batches run, rows in them) so far, from /metrics."""
    scrape = Scrape(server)
    return (
        scrape.value("batchpilot_batch_size_count"),
        scrape.value("batchpilot_batch_size_sum"),
    )


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """The detector behind the nms pipeline. Batches hold at most 2 rows and wait up to 10 s to
    fill, so two concurrent one-image requests share a batch by construction; every request
    here is 2 images, or one of two concurrent ones, so no batch ever waits that long."""
    folder = tmp_path_factory.mktemp("detector")
    model = onnx_models.detector(folder / f"{MODEL}.onnx")
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    config = folder / "pipeline.json"
    config.write_bytes(orjson.dumps(CONFIG))
    with runtime_process(
        model,
        "--pipeline-config",
        str(config),
        "--pipeline-threads",
        "2",
        "--device",
        "cpu",
        "--max-batch-size",
        "2",
        "--max-queue-delay-ms",
        "10000",
        "--no-early-start",  # a pair's first request waits for the second, whatever came before
        log_dir=folder,
    ) as server:
        yield server


def test_images_decode_to_their_solid_value() -> None:
    """The premise of every expectation here, checked with Pillow alone."""
    for data, value in ((WHITE_PNG, 255), (GREY_JPEG, GREY_VALUE), (BLACK_PNG, 0)):
        image = Image.open(io.BytesIO(data)).convert("RGB")
        stretched = np.asarray(image.resize((32, 32), Image.Resampling.BILINEAR))
        assert np.all(stretched == value), (image.format, value)


def test_metadata_describes_the_detections(detector: RuntimeProcess) -> None:
    doc = send(detector, "GET", f"/v2/models/{MODEL}").json()
    assert doc["inputs"] == [{"name": "images", "datatype": "BYTES", "shape": [-1]}]
    assert doc["outputs"] == [
        {"name": "boxes", "datatype": "FP32", "shape": [-1, -1, 4]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "classes", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "labels", "datatype": "BYTES", "shape": [-1, -1]},
        {"name": "num_detections", "datatype": "INT64", "shape": [-1]},
    ]
    pipeline = doc["parameters"]["pipeline"]
    assert pipeline["postprocess"] == "nms"
    assert pipeline["model_outputs"] == [
        {"name": "boxes", "datatype": "FP32", "shape": [-1, 4, 4]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, 4, 2]},
    ]


@pytest.mark.parametrize("binary_outputs", [False, True], ids=["json", "binary"])
class TestOneRequest:
    def test_rows_keep_their_own_detections_padded_to_the_longest(
        self, detector: RuntimeProcess, binary_outputs: bool
    ) -> None:
        reply = infer(
            detector, bytes_request([GREY_JPEG, WHITE_PNG], binary_outputs=binary_outputs)
        )
        outputs = outputs_of(reply)
        assert {n: o.datatype for n, o in outputs.items()} == DATATYPES
        assert {o.binary for o in outputs.values()} == {binary_outputs}
        # D = 4 (white); the grey row's one detection is followed by 3 padding entries
        assert_detections(arrays(outputs), expected(GREY, WHITE))

    def test_an_image_without_detections_is_all_padding(
        self, detector: RuntimeProcess, binary_outputs: bool
    ) -> None:
        reply = infer(
            detector, bytes_request([WHITE_PNG, BLACK_PNG], binary_outputs=binary_outputs)
        )
        got = arrays(outputs_of(reply))
        assert_detections(got, expected(WHITE, BLACK))
        assert got["labels"][1].tolist() == ["", "", "", ""]

    def test_requested_outputs_come_alone_in_the_order_asked(
        self, detector: RuntimeProcess, binary_outputs: bool
    ) -> None:
        names = ["num_detections", "labels"]
        request = bytes_request(
            [WHITE_PNG, GREY_JPEG], binary_outputs=binary_outputs, outputs=names
        )
        outputs = outputs_of(infer(detector, request))
        assert list(outputs) == names
        want = expected(WHITE, GREY)
        np.testing.assert_array_equal(outputs["num_detections"].array, [4, 1])
        assert outputs["labels"].array.tolist() == want["labels"].tolist()


async def post_concurrently(
    server: RuntimeProcess, requests: list[tuple[bytes, dict[str, str]]]
) -> list[Reply]:
    async def post(session: aiohttp.ClientSession, body: bytes, headers: dict[str, str]) -> Reply:
        url = f"{server.url}/v2/models/{MODEL}/infer"
        async with session.post(url, data=body, headers=headers) as response:
            return Reply(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                await response.read(),
            )

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        return list(await asyncio.gather(*(post(session, *r) for r in requests)))


class TestConcurrentRequestsShareABatch:
    @pytest.mark.parametrize(
        ("images", "rows"),
        [
            ((WHITE_PNG, GREY_JPEG), (WHITE, GREY)),
            ((GREY_JPEG, WHITE_PNG), (GREY, WHITE)),
            ((BLACK_PNG, GREY_JPEG), (BLACK, GREY)),
        ],
        ids=["white+grey", "grey+white", "black+grey"],
    )
    async def test_each_request_gets_its_own_rows_padded_to_its_own_longest(
        self,
        detector: RuntimeProcess,
        images: tuple[bytes, bytes],
        rows: tuple[Row, Row],
    ) -> None:
        batches, batch_rows = batch_sizes(detector)
        # one client asks for JSON outputs, the other for binary ones
        replies = await post_concurrently(
            detector,
            [bytes_request([image], binary_outputs=i == 1) for i, image in enumerate(images)],
        )
        after = batch_sizes(detector)
        # both rows ran in one batch of 2 (max batch 2, and a lone row would wait 10 s)
        assert after == (batches + 1, batch_rows + 2)
        for i, (reply, row) in enumerate(zip(replies, rows, strict=True)):
            outputs = outputs_of(reply)
            assert {o.binary for o in outputs.values()} == {i == 1}
            # D is this request's own: 4 for white, 1 for grey, 0 for black (shape [1, 0, 4])
            assert_detections(arrays(outputs), expected(row))


def test_tritonclient_unmodified(detector: RuntimeProcess) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{detector.port}")
    try:
        images = triton.InferInput("images", [2], "BYTES")
        images.set_data_from_numpy(np.array([GREY_JPEG, WHITE_PNG], np.object_), binary_data=True)
        result = client.infer(
            MODEL,
            [images],
            outputs=[
                triton.InferRequestedOutput("boxes", binary_data=True),
                triton.InferRequestedOutput("scores", binary_data=False),
                triton.InferRequestedOutput("classes", binary_data=True),
                triton.InferRequestedOutput("labels", binary_data=True),
                triton.InferRequestedOutput("num_detections", binary_data=False),
            ],
        )
    finally:
        client.close()
    got = {name: result.as_numpy(name) for name in OUTPUTS}
    got["labels"] = np.vectorize(bytes.decode, otypes=[object])(got["labels"])
    assert_detections(got, expected(GREY, WHITE))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (GREY_JPEG[: len(GREY_JPEG) // 2], "image row 1 cannot be read: Truncated File Read"),
        (GREY_JPEG[:-20], "image row 1 is corrupt: image file is truncated"),
        (WHITE_PNG[:60], "image row 1 is corrupt: image file is truncated"),
        (b"\x00\x01 not image bytes", "image row 1 is not an image in an accepted format"),
    ],
    ids=["jpeg-cut-in-header", "jpeg-cut-in-pixels", "png-cut-in-pixels", "not-an-image"],
)
def test_corrupt_image_is_a_clear_400_and_the_server_keeps_serving(
    detector: RuntimeProcess, bad: bytes, message: str
) -> None:
    reply = infer(detector, bytes_request([WHITE_PNG, bad], binary_outputs=False))
    assert reply.status == 400, reply.body
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error.startswith(message), error
    again = infer(detector, bytes_request([WHITE_PNG, GREY_JPEG], binary_outputs=True))
    assert_detections(arrays(outputs_of(again)), expected(WHITE, GREY))


# --- Letterbox: boxes back on images of other shapes ------------------------------------------

# Padding with 255 keeps a white image's mean at exactly 1 after the letterbox, so its
# detections are WHITE's, in the same order; only the boxes move.
LETTERBOX_CONFIG = {
    "preprocess": {"image": {"input": "images", "resize": "letterbox", "padValue": 255}},
    "postprocess": CONFIG["postprocess"],
}
WIDE_PNG = solid(255, "PNG", (64, 48))
TALL_PNG = solid(255, "PNG", (48, 64))
# 64x48 into 32x32: scale min(32/64, 32/48) = 0.5 → 32x24, top (32 - 24) // 2 = 4. On the image:
# x = x' / 0.5, y = (y' - 4) / 0.5, clipped to [0, 64] x [0, 48]:
#   b0 [ 2,  2, 12, 12] → [ 4, -4 → 0, 24, 16]
#   b2 [20, 20, 30, 30] → [40, 32, 60, 52 → 48]
#   b1 [ 3,  3, 13, 13] → [ 6, -2 → 0, 26, 18]
#   b3 [ 2,  8, 12, 18] → [ 4,  8, 24, 28]
WIDE: Row = {
    **WHITE,
    "boxes": [[4, 0, 24, 16], [40, 32, 60, 48], [6, 0, 26, 18], [4, 8, 24, 28]],
}
# 48x64 into 32x32: scale 0.5 → 24x32, left (32 - 24) // 2 = 4. On the image:
# x = (x' - 4) / 0.5, y = y' / 0.5, clipped to [0, 48] x [0, 64]:
#   b0 [ 2,  2, 12, 12] → [-4 → 0,  4, 16, 24]
#   b2 [20, 20, 30, 30] → [32, 40, 52 → 48, 60]
#   b1 [ 3,  3, 13, 13] → [-2 → 0,  6, 18, 26]
#   b3 [ 2,  8, 12, 18] → [-4 → 0, 16, 16, 36]
TALL: Row = {
    **WHITE,
    "boxes": [[0, 4, 16, 24], [32, 40, 48, 60], [0, 6, 18, 26], [0, 16, 16, 36]],
}


@pytest.fixture(scope="module")
def letterboxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """The same detector behind a letterbox preprocess; batching as for `detector`."""
    folder = tmp_path_factory.mktemp("letterboxed")
    model = onnx_models.detector(folder / f"{MODEL}.onnx")
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    config = folder / "pipeline.json"
    config.write_bytes(orjson.dumps(LETTERBOX_CONFIG))
    with runtime_process(
        model,
        "--pipeline-config",
        str(config),
        "--pipeline-threads",
        "2",
        "--device",
        "cpu",
        "--max-batch-size",
        "2",
        "--max-queue-delay-ms",
        "10000",
        "--no-early-start",  # a pair's first request waits for the second, whatever came before
        log_dir=folder,
    ) as server:
        yield server


class TestLetterbox:
    def test_each_row_maps_back_onto_its_own_image(self, letterboxed: RuntimeProcess) -> None:
        reply = infer(letterboxed, bytes_request([WIDE_PNG, TALL_PNG], binary_outputs=True))
        assert_detections(arrays(outputs_of(reply)), expected(WIDE, TALL))

    def test_an_image_of_the_model_size_keeps_the_model_boxes(
        self, letterboxed: RuntimeProcess
    ) -> None:
        # 32x32 into 32x32: scale 1, no padding.
        reply = infer(letterboxed, bytes_request([WHITE_PNG, WIDE_PNG], binary_outputs=False))
        assert_detections(arrays(outputs_of(reply)), expected(WHITE, WIDE))

    async def test_requests_sharing_a_batch_keep_their_own_geometry(
        self, letterboxed: RuntimeProcess
    ) -> None:
        batches, batch_rows = batch_sizes(letterboxed)
        replies = await post_concurrently(
            letterboxed,
            [bytes_request([image], binary_outputs=False) for image in (WIDE_PNG, TALL_PNG)],
        )
        assert batch_sizes(letterboxed) == (batches + 1, batch_rows + 2)
        for reply, row in zip(replies, (WIDE, TALL), strict=True):
            assert_detections(arrays(outputs_of(reply)), expected(row))
