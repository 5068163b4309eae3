"""A pipeline config fitted to one model: the stages to run, and the signature clients see.

`load_pipeline` reads the config file, checks it against the model's inputs and outputs, and
loads the files it names (labels, tokenizer.json, relative to the model's directory). Anything
that does not fit is a PipelineConfigError with one sentence that says what and where, and the
server refuses to start, as it does for a model that cannot be loaded.

Once built, `Pipeline.preprocess` turns a request's outer inputs into the model's inputs and
`Pipeline.postprocess` turns the model's outputs into the outer outputs. Both are plain
functions of arrays, run by the server in a thread pool, off the event loop. Preprocess also
returns a side record of the request (an image preprocess: each row's `ImageGeometry`), which
the server hands to that same request's postprocess, so detections can be mapped back onto the
images the client sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from batchpilot.api.pipeline import (
    ImagePreprocess,
    Nms,
    PipelineConfig,
    TextPreprocess,
    TopK,
)
from batchpilot.runtime.engine import ModelSignature, TensorSpec
from batchpilot.runtime.errors import EngineFailure
from batchpilot.runtime.pipeline import post
from batchpilot.runtime.pipeline.image import ImageGeometry, ImageStage
from batchpilot.runtime.pipeline.text import TextStage, TokenizerLoadError, load_tokenizer
from batchpilot.runtime.protocol.tensors import BYTES, DATATYPES, Tensor

Array = np.ndarray[Any, Any]

IMAGE_DATATYPES = ("FP32", "FP16", "FP64", "UINT8")
TOKEN_DATATYPES = ("INT64", "INT32")

# Outer output names.
LABELS, SCORES, CLASSES, BOXES, COUNTS = "labels", "scores", "classes", "boxes", "num_detections"


PreprocessFn = Callable[[Mapping[str, Array]], tuple[dict[str, Array], ImageGeometry | None]]
"""A request's outer inputs → the model's inputs, and the request's geometry (image preprocess
only; None otherwise)."""
PostprocessFn = Callable[[Mapping[str, Any], Sequence[str], ImageGeometry | None], list[Tensor]]
"""A request's model outputs, the outer output names wanted, and the geometry its preprocess
returned (None without one) → the outer outputs."""


class PipelineConfigError(ValueError):
    """The pipeline config is invalid, does not fit the model, or names a file that is missing."""


@dataclass(frozen=True)
class Pipeline:
    config: PipelineConfig
    model: ModelSignature
    signature: ModelSignature
    """What clients send and get back: the model's signature with the pipeline's ends."""
    preprocess: PreprocessFn | None = None
    postprocess: PostprocessFn | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    """For the metadata endpoint and the startup log."""
    row_bytes: int = 0
    """The bytes `preprocess` makes of one row of a request, for all the model's inputs (0:
    no preprocess). The server bounds a request's rows with it before preprocessing."""


def load_pipeline(path: Path, model: ModelSignature, *, model_dir: Path) -> Pipeline:
    """Read and fit the config file at `path` (JSON)."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise PipelineConfigError(f"pipeline config {path} cannot be read: {exc}") from None
    try:
        config = PipelineConfig.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise PipelineConfigError(f"pipeline config {path} is invalid: {problems}") from None
    return build_pipeline(config, model, model_dir=model_dir)


def build_pipeline(config: PipelineConfig, model: ModelSignature, *, model_dir: Path) -> Pipeline:
    """Fit `config` to `model`; files it names are read relative to `model_dir`."""
    inputs, outputs = model.inputs, model.outputs
    preprocess = postprocess = None
    row_bytes = 0
    summary: dict[str, Any] = {
        "model_inputs": [s.as_metadata() for s in model.inputs],
        "model_outputs": [s.as_metadata() for s in model.outputs],
    }
    if config.preprocess is not None:
        if config.preprocess.image is not None:
            spec, preprocess, row_bytes = _image(config.preprocess.image, model)
            summary["preprocess"] = "image"
        else:
            assert config.preprocess.text is not None
            spec, preprocess, row_bytes = _text(config.preprocess.text, model, model_dir)
            summary["preprocess"] = "text"
        inputs = (spec,)
    if config.postprocess is not None:
        post_cfg = config.postprocess
        if post_cfg.top_k is not None:
            outputs, postprocess = _top_k(
                post_cfg.top_k, model, model_dir, softmax=post_cfg.softmax is not None
            )
            summary["postprocess"] = "topK"
        else:
            assert post_cfg.nms is not None
            outputs, postprocess = _nms(post_cfg.nms, model, model_dir)
            summary["postprocess"] = "nms"
    signature = ModelSignature(
        name=model.name,
        platform=model.platform,
        inputs=inputs,
        outputs=outputs,
        version=model.version,
    )
    return Pipeline(config, model, signature, preprocess, postprocess, summary, row_bytes)


def _fail(message: str) -> PipelineConfigError:
    return PipelineConfigError(message)


def _model_input(model: ModelSignature, name: str, where: str) -> TensorSpec:
    spec = model.input(name)
    if spec is None:
        raise _fail(
            f"{where} names model input {name!r}, but the model's inputs are: "
            + ", ".join(s.name for s in model.inputs)
        )
    return spec


def _model_output(model: ModelSignature, name: str | None, where: str) -> TensorSpec:
    if name is None:
        if len(model.outputs) != 1:
            raise _fail(
                f"{where}.output must name one of the model's outputs: "
                + ", ".join(model.output_names)
            )
        return model.outputs[0]
    for spec in model.outputs:
        if spec.name == name:
            return spec
    raise _fail(
        f"{where} names model output {name!r}, but the model's outputs are: "
        + ", ".join(model.output_names)
    )


def _only_input(model: ModelSignature, filled: Sequence[str], where: str) -> None:
    if rest := [s.name for s in model.inputs if s.name not in filled]:
        raise _fail(
            f"model input {', '.join(repr(n) for n in rest)} would be left empty: {where} fills "
            f"only {', '.join(repr(n) for n in filled)}"
        )


def _image(config: ImagePreprocess, model: ModelSignature) -> tuple[TensorSpec, PreprocessFn, int]:
    where = "preprocess.image.input"
    spec = _model_input(model, config.input, where)
    _only_input(model, [config.input], "preprocess.image")
    if spec.datatype not in IMAGE_DATATYPES:
        raise _fail(
            f"model input {spec.name!r} is {spec.datatype}; an image input must be one of "
            + ", ".join(IMAGE_DATATYPES)
        )
    if len(spec.shape) != 4:
        raise _fail(
            f"model input {spec.name!r} has shape {list(spec.shape)}; an image input needs 4 "
            f"dimensions ({config.layout})"
        )
    if config.layout == "NCHW":
        channels, height, width = spec.shape[1:]
    else:
        height, width, channels = spec.shape[1:]
    want = 1 if config.color_mode == "L" else 3
    if channels not in (-1, want):
        raise _fail(
            f"model input {spec.name!r} has {channels} channels in layout {config.layout}, "
            f"colorMode {config.color_mode} makes {want}"
        )
    if config.size is not None:
        size = config.size
        if any(m not in (-1, s) for m, s in zip((height, width), size, strict=True)):
            raise _fail(
                f"preprocess.image.size is {list(size)} but model input {spec.name!r} takes "
                f"[{height}, {width}] images (layout {config.layout})"
            )
    elif height > 0 and width > 0:
        size = (height, width)
    else:
        raise _fail(
            f"model input {spec.name!r} takes images of any size: set preprocess.image.size"
        )
    if spec.datatype == "UINT8" and (
        config.scale != 255 or set(config.mean) != {0} or set(config.std) != {1}
    ):
        raise _fail(
            f"model input {spec.name!r} is UINT8: it takes raw pixels, so scale, mean and std "
            "cannot be set"
        )
    stage = ImageStage(config, size[0], size[1], DATATYPES[spec.datatype])

    def preprocess(inputs: Mapping[str, Array]) -> tuple[dict[str, Array], ImageGeometry]:
        tensor, geometry = stage.prepare(inputs[spec.name])
        return {spec.name: tensor}, geometry

    row_bytes = math.prod(stage.row_shape) * stage.dtype.itemsize
    return TensorSpec(spec.name, BYTES, (-1,)), preprocess, row_bytes


def _file(model_dir: Path, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() else model_dir / path


def _text(
    config: TextPreprocess, model: ModelSignature, model_dir: Path
) -> tuple[TensorSpec, PreprocessFn, int]:
    names = {
        "inputIds": config.input_ids,
        "attentionMask": config.attention_mask,
        "tokenTypeIds": config.token_type_ids,
    }
    dtypes: dict[str, np.dtype[Any]] = {}
    for key, name in names.items():
        if name is None:
            continue
        spec = _model_input(model, name, f"preprocess.text.{key}")
        if spec.datatype not in TOKEN_DATATYPES:
            raise _fail(
                f"model input {name!r} is {spec.datatype}; token inputs must be INT64 or INT32"
            )
        if len(spec.shape) != 2 or spec.shape[1] not in (-1, config.max_length):
            raise _fail(
                f"model input {name!r} has shape {list(spec.shape)}; preprocess.text makes "
                f"[N, {config.max_length}] (maxLength)"
            )
        dtypes[name] = DATATYPES[spec.datatype]
    _only_input(model, list(dtypes), "preprocess.text")
    if config.input in dtypes:
        pass  # the outer input may reuse a model input's name: it replaces it
    elif model.input(config.input) is not None:
        raise _fail(f"preprocess.text.input {config.input!r} is a model input it does not fill")
    path = _file(model_dir, config.tokenizer)
    try:
        tokenizer = load_tokenizer(path, config)
    except TokenizerLoadError as exc:
        raise _fail(str(exc)) from None
    stage = TextStage(config, tokenizer, dtypes)

    def preprocess(inputs: Mapping[str, Array]) -> tuple[dict[str, Array], None]:
        return stage(inputs[config.input]), None

    row_bytes = config.max_length * sum(dtype.itemsize for dtype in dtypes.values())
    return TensorSpec(config.input, BYTES, (-1,)), preprocess, row_bytes


def _labels(model_dir: Path, name: str | None, classes: int, where: str) -> list[str] | None:
    if name is None:
        return None
    path = _file(model_dir, name)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"{where}.labels: {path} cannot be read: {exc}") from None
    labels = text.splitlines()
    while labels and not labels[-1].strip():
        labels.pop()
    if not labels:
        raise _fail(f"{where}.labels: {path} has no labels")
    if classes > 0 and len(labels) != classes:
        raise _fail(
            f"{where}.labels: {path} has {len(labels)} labels but the model has {classes} classes"
        )
    return labels


def _check_classes(labels: list[str] | None, classes: int) -> None:
    """At run time, for models whose class count is dynamic."""
    if labels is not None and classes != len(labels):
        raise EngineFailure(
            f"the model produced {classes} classes but the labels file has {len(labels)}"
        )


def _top_k(
    config: TopK, model: ModelSignature, model_dir: Path, *, softmax: bool
) -> tuple[tuple[TensorSpec, ...], PostprocessFn]:
    where = "postprocess.topK"
    spec = _model_output(model, config.output, where)
    if len(spec.shape) != 2:
        raise _fail(
            f"model output {spec.name!r} has shape {list(spec.shape)}; topK needs [N, classes]"
        )
    classes = spec.shape[1]
    labels = _labels(model_dir, config.labels, classes, where)
    k = min(config.k, classes) if classes > 0 else config.k
    outputs = (
        TensorSpec(LABELS, BYTES, (-1, k)),
        TensorSpec(SCORES, "FP32", (-1, k)),
        TensorSpec(CLASSES, "INT64", (-1, k)),
    )

    def postprocess(
        raw: Mapping[str, Any], names: Sequence[str], geometry: ImageGeometry | None
    ) -> list[Tensor]:
        scores = np.asarray(raw[spec.name], dtype=np.float32)
        _check_classes(labels, scores.shape[1])
        if softmax:
            scores = post.softmax(scores, axis=1)
        best, best_scores = post.top_k(scores, config.k)
        made = {
            LABELS: Tensor(LABELS, BYTES, post.label_array(best, labels)),
            SCORES: Tensor(SCORES, "FP32", best_scores),
            CLASSES: Tensor(CLASSES, "INT64", best),
        }
        return [made[n] for n in names]

    return outputs, postprocess


def _nms(
    config: Nms, model: ModelSignature, model_dir: Path
) -> tuple[tuple[TensorSpec, ...], PostprocessFn]:
    where = "postprocess.nms"
    boxes = _model_output(model, config.boxes, f"{where}.boxes")
    scores = _model_output(model, config.scores, f"{where}.scores")
    if len(boxes.shape) != 3 or boxes.shape[2] not in (-1, 4):
        raise _fail(
            f"model output {boxes.name!r} has shape {list(boxes.shape)}; nms boxes need [N, B, 4]"
        )
    if len(scores.shape) not in (2, 3):
        raise _fail(
            f"model output {scores.name!r} has shape {list(scores.shape)}; nms scores need "
            "[N, B, classes] or [N, B]"
        )
    if -1 not in (boxes.shape[1], scores.shape[1]) and boxes.shape[1] != scores.shape[1]:
        raise _fail(
            f"nms boxes {boxes.name!r} have {boxes.shape[1]} boxes per image but scores "
            f"{scores.name!r} have {scores.shape[1]}"
        )
    classes = scores.shape[2] if len(scores.shape) == 3 else 1
    labels = _labels(model_dir, config.labels, classes, where)
    outputs = (
        TensorSpec(BOXES, "FP32", (-1, -1, 4)),
        TensorSpec(SCORES, "FP32", (-1, -1)),
        TensorSpec(CLASSES, "INT64", (-1, -1)),
        TensorSpec(LABELS, BYTES, (-1, -1)),
        TensorSpec(COUNTS, "INT64", (-1,)),
    )

    def postprocess(
        raw: Mapping[str, Any], names: Sequence[str], geometry: ImageGeometry | None
    ) -> list[Tensor]:
        box_array = np.asarray(raw[boxes.name], dtype=np.float32)
        score_array = np.asarray(raw[scores.name], dtype=np.float32)
        if box_array.shape[:2] != score_array.shape[:2] or box_array.shape[2:] != (4,):
            raise EngineFailure(
                f"the model produced boxes {list(box_array.shape)} and scores "
                f"{list(score_array.shape)}, which do not match"
            )
        _check_classes(labels, score_array.shape[2] if score_array.ndim == 3 else 1)
        found = post.nms(
            box_array,
            score_array,
            box_format=config.box_format,
            iou_threshold=config.iou_threshold,
            score_threshold=config.score_threshold,
            max_detections=config.max_detections,
        )
        found_boxes = found.boxes
        if config.box_coordinates == "original" and geometry is not None:
            if len(geometry.rows) != len(found_boxes):
                raise EngineFailure(
                    f"the model produced {len(found_boxes)} rows of boxes for "
                    f"{len(geometry.rows)} images"
                )
            found_boxes = geometry.to_original(found_boxes)
            # padding stays all zeros, wherever zero maps to on the original
            found_boxes[np.arange(found_boxes.shape[1]) >= found.counts[:, np.newaxis]] = 0
        made = {
            BOXES: Tensor(BOXES, "FP32", found_boxes),
            SCORES: Tensor(SCORES, "FP32", found.scores),
            CLASSES: Tensor(CLASSES, "INT64", found.classes),
            LABELS: Tensor(LABELS, BYTES, post.label_array(found.classes, labels)),
            COUNTS: Tensor(COUNTS, "INT64", found.counts),
        }
        return [made[n] for n in names]

    return outputs, postprocess
