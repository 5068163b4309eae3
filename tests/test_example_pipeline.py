"""The pipeline in examples/orientation-cpu.yaml fits the model it names (the pretrained
orientation classifier) with the labels file shipped beside it, and labels a real photo."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.onnx_engine import OnnxEngine
from batchpilot.runtime.pipeline.pipeline import build_pipeline
from tests import onnx_models

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "orientation-cpu.yaml"
LABELS = ROOT / "examples" / "models" / "orientation-labels.txt"


async def test_the_example_pipeline_fits_the_classifier_and_labels_an_image(
    tmp_path: Path,
) -> None:
    spec = InferenceServiceSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])
    assert spec.pipeline is not None
    top_k = spec.pipeline.postprocess.top_k if spec.pipeline.postprocess else None
    assert top_k is not None
    assert top_k.labels == LABELS.name
    model = tmp_path / "model.onnx"  # the pod's layout: the model and its labels side by side
    shutil.copy(onnx_models.pretrained_classifier(), model)
    shutil.copy(LABELS, tmp_path / LABELS.name)
    engine = OnnxEngine.load(model, name="orientation", device="cpu")
    pipeline = build_pipeline(spec.pipeline, engine.signature, model_dir=tmp_path)
    assert pipeline.preprocess is not None
    assert pipeline.postprocess is not None

    photo = io.BytesIO()
    Image.new("RGB", (640, 480), (230, 230, 230)).save(photo, format="JPEG")
    tensors, geometry = pipeline.preprocess({"x": np.array([photo.getvalue()], dtype=object)})
    outputs = await engine.run(tensors)  # the batch the server would run, without the server
    await engine.close()
    labels, scores, *_ = pipeline.postprocess(outputs, pipeline.signature.output_names, geometry)
    assert labels.data.shape == (1, 2)
    assert {label.decode() for label in labels.data[0]} <= {"0", "90", "180", "270"}
    assert 0.0 <= float(scores.data[0, 1]) <= float(scores.data[0, 0]) <= 1.0
