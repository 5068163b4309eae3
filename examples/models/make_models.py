"""Regenerate the sandbox's model files (needs `onnx`, a dev dependency):

    .venv/bin/python examples/models/make_models.py

`resnet50-signature.onnx` has ResNet-50's signature — FP32 images [N, 3, 224, 224] in, FP32
probabilities [N, 1000] out — and almost no weights (global average pooling and one 3×1000
dense layer). The simulated engine reads only the signature and never runs it; committed so the
sandbox needs neither `onnx` nor a download.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def image_signature(path: Path, *, classes: int = 1000) -> Path:
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["probabilities"]),
    ]
    graph = helper.make_graph(
        nodes,
        "resnet50_signature",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        [numpy_helper.from_array(rng.standard_normal((3, classes)).astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


if __name__ == "__main__":
    print(image_signature(HERE / "resnet50-signature.onnx"))
