"""The pipeline config: the document users write under spec.pipeline, and how the runtime fits
it to a real model. A config that does not fit the model, or names a file that is missing, is
refused with one sentence that says what is wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from batchpilot.api.pipeline import PipelineConfig
from batchpilot.runtime.engine import ModelSignature, TensorSpec
from batchpilot.runtime.onnx_engine import OnnxEngine
from batchpilot.runtime.pipeline.pipeline import (
    PipelineConfigError,
    build_pipeline,
    load_pipeline,
)
from batchpilot.runtime.protocol.tensors import BYTES
from tests import onnx_models
from tests.test_pipeline_stages import encoded, word_tokenizer

IMAGE = {"image": {"input": "images", "mean": [0.5], "std": [0.5]}}


@pytest.fixture(scope="module")
def image_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelSignature]:
    path = onnx_models.image_signature(tmp_path_factory.mktemp("models") / "image.onnx", classes=3)
    engine = OnnxEngine.load(path, name="image", device="cpu")
    return path, engine.signature


def fit(doc: dict[str, Any], model: tuple[Path, ModelSignature]) -> Any:
    path, signature = model
    return build_pipeline(PipelineConfig.model_validate(doc), signature, model_dir=path.parent)


class TestDocument:
    def test_camel_case_keys_and_defaults(self) -> None:
        config = PipelineConfig.model_validate(
            {
                "preprocess": {"image": {"input": "x", "colorMode": "BGR", "maxPixels": 10}},
                "postprocess": {"softmax": {}, "topK": {"k": 3, "labels": "labels.txt"}},
            }
        )
        assert config.preprocess
        assert config.preprocess.image
        assert config.preprocess.image.color_mode == "BGR"
        assert config.preprocess.image.max_pixels == 10
        assert config.preprocess.image.layout == "NCHW"
        assert config.postprocess
        assert config.postprocess.top_k
        assert config.postprocess.top_k.k == 3

    def test_letterbox_and_box_coordinates(self) -> None:
        config = PipelineConfig.model_validate(
            {
                "preprocess": {"image": {"input": "x", "resize": "letterbox"}},
                "postprocess": {"nms": {"boxes": "b", "scores": "s"}},
            }
        )
        assert config.preprocess
        assert config.preprocess.image
        assert config.preprocess.image.resize == "letterbox"
        assert config.preprocess.image.pad_value == 114  # as YOLO pads
        assert config.postprocess
        assert config.postprocess.nms
        assert config.postprocess.nms.box_coordinates == "original"

    @pytest.mark.parametrize(
        ("doc", "message"),
        [
            ({}, "needs preprocess, postprocess or both"),
            ({"preprocess": {}}, "exactly one of image or text"),
            ({"preprocess": {"image": {"input": "x"}, "text": {"tokenizer": "t"}}}, "exactly one"),
            ({"preprocess": {"image": {"input": "x", "colourMode": "RGB"}}}, "Extra inputs"),
            ({"preprocess": {"image": {"input": "x", "colorMode": "CMYK"}}}, "RGB"),
            ({"preprocess": {"image": {"input": "x", "mean": [1, 2]}}}, "mean needs 1 or 3"),
            ({"preprocess": {"image": {"input": "x", "std": [0]}}}, "std must not contain 0"),
            ({"preprocess": {"image": {"input": "x", "size": [0, 4]}}}, "two positive"),
            ({"preprocess": {"image": {"input": "x", "shorterSide": 9}}}, "only applies to"),
            ({"preprocess": {"image": {"input": "x", "resize": "fit"}}}, "letterbox"),
            ({"preprocess": {"image": {"input": "x", "padValue": 256}}}, "less than or equal"),
            (
                {"postprocess": {"nms": {"boxes": "b", "scores": "s", "boxCoordinates": "input"}}},
                "'model' or 'original'",
            ),
            ({"postprocess": {"softmax": {}}}, "exactly one of topK or nms"),
            ({"postprocess": {"topK": {"k": 0}}}, "greater than 0"),
            (
                {"postprocess": {"softmax": {}, "nms": {"boxes": "b", "scores": "s"}}},
                "softmax applies to topK",
            ),
        ],
    )
    def test_refusals(self, doc: dict[str, Any], message: str) -> None:
        with pytest.raises(ValidationError, match=message):
            PipelineConfig.model_validate(doc)

    def test_the_document_module_imports_only_pydantic(self) -> None:
        """The operator validates spec.pipeline with these models and has no numpy or Pillow."""
        code = (
            "import sys; import batchpilot.api.pipeline; "
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'numpy', 'PIL', 'tokenizers', 'onnxruntime', 'orjson', 'fastapi'}); print(heavy)"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert result.stdout.strip() == "[]"


class TestFitToModel:
    def test_outer_signature(self, image_model: Any, tmp_path: Path) -> None:
        labels = tmp_path / "labels.txt"
        labels.write_text("cat\ndog\neel\n")
        pipeline = fit(
            {"preprocess": IMAGE, "postprocess": {"topK": {"k": 5, "labels": str(labels)}}},
            image_model,
        )
        assert pipeline.signature.inputs == (TensorSpec("images", BYTES, (-1,)),)
        # k = min(5, 3 classes) = 3.
        assert pipeline.signature.outputs == (
            TensorSpec("labels", BYTES, (-1, 3)),
            TensorSpec("scores", "FP32", (-1, 3)),
            TensorSpec("classes", "INT64", (-1, 3)),
        )
        assert pipeline.summary["preprocess"] == "image"
        assert pipeline.summary["model_inputs"][0]["shape"] == [-1, 3, 224, 224]

    def test_labels_relative_to_the_model_directory(self, image_model: Any) -> None:
        path, _ = image_model
        (path.parent / "three.txt").write_text("a\nb\nc\n")
        pipeline = fit({"postprocess": {"topK": {"labels": "three.txt"}}}, image_model)
        out = pipeline.postprocess({"probabilities": np.array([[0.1, 0.9, 0.0]])}, ["labels"], None)
        assert out[0].data.tolist() == [[b"b", b"a", b"c"]]

    @pytest.mark.parametrize(
        ("doc", "message"),
        [
            (
                {"preprocess": {"image": {"input": "pixels"}}},
                "names model input 'pixels', but the model's inputs are: images",
            ),
            (
                {"preprocess": {"image": {"input": "images", "colorMode": "L"}}},
                "has 3 channels in layout NCHW, colorMode L makes 1",
            ),
            (
                {"preprocess": {"image": {"input": "images", "layout": "NHWC"}}},
                "has 224 channels in layout NHWC",
            ),
            (
                {"preprocess": {"image": {"input": "images", "size": [100, 100]}}},
                r"size is \[100, 100\] but model input 'images' takes \[224, 224\]",
            ),
            (
                {"postprocess": {"topK": {"output": "logits"}}},
                "names model output 'logits', but the model's outputs are: probabilities",
            ),
            (
                {"postprocess": {"topK": {"labels": "absent.txt"}}},
                "postprocess.topK.labels: .*absent.txt cannot be read",
            ),
            (
                {"preprocess": {"text": {"tokenizer": "t.json"}}},
                "preprocess.text.inputIds names model input 'input_ids'",
            ),
            (
                {"postprocess": {"nms": {"boxes": "probabilities", "scores": "other"}}},
                "postprocess.nms.scores names model output 'other'",
            ),
        ],
    )
    def test_misfits(self, image_model: Any, doc: dict[str, Any], message: str) -> None:
        with pytest.raises(PipelineConfigError, match=message):
            fit(doc, image_model)

    def test_labels_count_must_match_the_classes(self, image_model: Any, tmp_path: Path) -> None:
        labels = tmp_path / "labels.txt"
        labels.write_text("cat\ndog\n")
        with pytest.raises(PipelineConfigError, match="has 2 labels but the model has 3 classes"):
            fit({"postprocess": {"topK": {"labels": str(labels)}}}, image_model)

    def test_file_errors_from_load_pipeline(self, image_model: Any, tmp_path: Path) -> None:
        path, signature = image_model
        with pytest.raises(PipelineConfigError, match="cannot be read"):
            load_pipeline(tmp_path / "absent.json", signature, model_dir=path.parent)
        bad = tmp_path / "bad.json"
        bad.write_bytes(orjson.dumps({"preprocess": {"image": {"input": "x", "scale": -1}}}))
        with pytest.raises(PipelineConfigError, match=r"preprocess.image.scale: Input should be"):
            load_pipeline(bad, signature, model_dir=path.parent)


class TestTextAndNmsFit:
    SIGNATURE = ModelSignature(
        name="bert",
        platform="onnx",
        inputs=(
            TensorSpec("input_ids", "INT64", (-1, 8)),
            TensorSpec("attention_mask", "INT64", (-1, 8)),
        ),
        outputs=(TensorSpec("logits", "FP32", (-1, 2)),),
    )

    def test_text_fills_every_model_input(self, tmp_path: Path) -> None:
        word_tokenizer(tmp_path / "tokenizer.json")
        doc = {"text": {"tokenizer": "tokenizer.json", "maxLength": 8}}
        with pytest.raises(PipelineConfigError, match="'attention_mask' would be left empty"):
            build_pipeline(
                PipelineConfig.model_validate({"preprocess": doc}),
                self.SIGNATURE,
                model_dir=tmp_path,
            )
        doc["text"]["attentionMask"] = "attention_mask"
        pipeline = build_pipeline(
            PipelineConfig.model_validate({"preprocess": doc}), self.SIGNATURE, model_dir=tmp_path
        )
        assert pipeline.signature.inputs == (TensorSpec("text", BYTES, (-1,)),)
        text = np.empty(1, dtype=object)
        text[:] = [b"world"]
        out, geometry = pipeline.preprocess({"text": text})
        np.testing.assert_array_equal(out["input_ids"], [[3, 0, 0, 0, 0, 0, 0, 0]])
        assert geometry is None  # only an image preprocess records geometry

    def test_text_max_length_must_fit_the_model(self, tmp_path: Path) -> None:
        word_tokenizer(tmp_path / "tokenizer.json")
        doc = {
            "text": {
                "tokenizer": "tokenizer.json",
                "maxLength": 16,
                "attentionMask": "attention_mask",
            }
        }
        with pytest.raises(PipelineConfigError, match=r"makes \[N, 16\] \(maxLength\)"):
            build_pipeline(
                PipelineConfig.model_validate({"preprocess": doc}),
                self.SIGNATURE,
                model_dir=tmp_path,
            )

    def test_nms_outputs(self, tmp_path: Path) -> None:
        detector = ModelSignature(
            name="det",
            platform="onnx",
            inputs=(TensorSpec("images", "FP32", (-1, 3, 64, 64)),),
            outputs=(
                TensorSpec("boxes", "FP32", (-1, 3, 4)),
                TensorSpec("scores", "FP32", (-1, 3, 2)),
            ),
        )
        (tmp_path / "labels.txt").write_text("person\nbike\n")
        config = PipelineConfig.model_validate(
            {"postprocess": {"nms": {"boxes": "boxes", "scores": "scores", "labels": "labels.txt"}}}
        )
        pipeline = build_pipeline(config, detector, model_dir=tmp_path)
        assert [s.name for s in pipeline.signature.outputs] == [
            "boxes",
            "scores",
            "classes",
            "labels",
            "num_detections",
        ]
        boxes = np.array([[[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30]]], np.float32)
        scores = np.array([[[0.9, 0.0], [0.8, 0.0], [0.0, 0.6]]], np.float32)
        labels, counts = pipeline.postprocess(
            {"boxes": boxes, "scores": scores}, ["labels", "num_detections"], None
        )
        # B overlaps A (IoU 0.818) in class 0 and goes; C is class 1.
        assert labels.data.tolist() == [[b"person", b"bike"]]
        assert counts.data.tolist() == [2]

    DETECTOR = ModelSignature(
        name="det",
        platform="onnx",
        inputs=(TensorSpec("images", "FP32", (-1, 3, 32, 32)),),
        outputs=(
            TensorSpec("boxes", "FP32", (-1, 2, 4)),
            TensorSpec("scores", "FP32", (-1, 2)),
        ),
    )

    @pytest.mark.parametrize(
        ("coordinates", "want"),
        [
            # 64x48 letterboxed into 32x32: scale 0.5, top (32 - 24) // 2 = 4. Box (2, 2, 12, 12):
            # x / 0.5 = 4, 24; y (2 - 4) / 0.5 = -4 → 0, (12 - 4) / 0.5 = 16. The 48x64 image:
            # scale 0.5, left 4: x (2 - 4) / 0.5 = -4 → 0, 16; y 4, 24. Row 1's second entry
            # is padding and stays zero.
            ("original", [[[4, 0, 24, 16], [40, 32, 60, 48]], [[0, 4, 16, 24], [0, 0, 0, 0]]]),
            ("model", [[[2, 2, 12, 12], [20, 20, 30, 30]], [[2, 2, 12, 12], [0, 0, 0, 0]]]),
        ],
    )
    def test_nms_boxes_follow_each_row_back_to_its_image(
        self, tmp_path: Path, coordinates: str, want: list[Any]
    ) -> None:
        config = PipelineConfig.model_validate(
            {
                "preprocess": {"image": {"input": "images", "resize": "letterbox"}},
                "postprocess": {
                    "nms": {"boxes": "boxes", "scores": "scores", "boxCoordinates": coordinates}
                },
            }
        )
        pipeline = build_pipeline(config, self.DETECTOR, model_dir=tmp_path)
        images = np.empty(2, dtype=object)
        images[:] = [
            encoded(np.zeros((48, 64, 3), np.uint8)),
            encoded(np.zeros((64, 48, 3), np.uint8)),
        ]
        inputs, geometry = pipeline.preprocess({"images": images})
        assert inputs["images"].shape == (2, 3, 32, 32)
        boxes = np.array([[[2, 2, 12, 12], [20, 20, 30, 30]]] * 2, np.float32)
        scores = np.array([[0.9, 0.8], [0.9, 0.1]], np.float32)  # row 1 keeps one box
        (got,) = pipeline.postprocess({"boxes": boxes, "scores": scores}, ["boxes"], geometry)
        np.testing.assert_array_equal(got.data, want)
        assert got.data.dtype == np.float32


@pytest.mark.parametrize(
    "postprocess",
    [
        {"topK": {"labels": "../../etc/labels.txt"}},
        {"nms": {"boxes": "b", "scores": "s", "labels": "a/../b"}},
    ],
)
def test_a_file_with_a_parent_segment_is_refused(postprocess: dict[str, Any]) -> None:
    doc = {"preprocess": {"image": {}}, "postprocess": postprocess}
    with pytest.raises(ValidationError, match=r"no '\.\.' in it"):
        PipelineConfig.model_validate(doc)
    tokenizer = {"preprocess": {"text": {"tokenizer": ".."}}, "postprocess": {"topK": {}}}
    with pytest.raises(ValidationError, match=r"no '\.\.' in it"):
        PipelineConfig.model_validate(tokenizer)
