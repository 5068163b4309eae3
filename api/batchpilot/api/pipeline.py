"""The pipeline document: `spec.pipeline` of an InferenceService, which the operator validates
and writes into the service's ConfigMap, and the JSON file the runtime reads with
`--pipeline-config` — the contract between the operator and the runtime for pre- and
post-processing.

Keys are camelCase, as in every Kubernetes spec; unknown keys are refused so a typo never turns
into a silently ignored setting. Only pydantic is imported here: the operator validates specs
with these same models, without numpy, Pillow or tokenizers installed. Checks that need the
model (input names, class counts) or the files it names happen when the runtime loads it
(`batchpilot.runtime.pipeline`).
"""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ImagePreprocess(_Spec):
    """Encoded images (JPEG, PNG, …) → one model input, a float (or uint8) image tensor."""

    input: str = Field(description="model input the image tensor fills; clients send BYTES to it")
    size: tuple[int, int] | None = Field(
        default=None,
        description="[height, width] fed to the model; default: the model input's fixed size",
    )
    resize: Literal["stretch", "center-crop", "letterbox"] = Field(
        default="stretch",
        description="stretch: resize to size, ignoring aspect ratio; center-crop: scale to "
        "cover size (or to shorterSide), then cut the centre; letterbox: scale to fit inside "
        "size keeping the aspect ratio, centred, the rest padded with padValue",
    )
    shorter_side: int | None = Field(
        default=None, gt=0, description="center-crop: scale the shorter side to this first"
    )
    pad_value: int = Field(
        default=114,
        ge=0,
        le=255,
        description="letterbox: the pixel value (every channel) of the padding, before scaling",
    )
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear"
    color_mode: Literal["RGB", "BGR", "L"] = "RGB"
    scale: float = Field(default=255.0, gt=0, description="pixel values are divided by this")
    mean: tuple[float, ...] = Field(default=(0.0,), description="subtracted after scaling")
    std: tuple[float, ...] = Field(default=(1.0,), description="divided by, after the mean")
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    formats: tuple[str, ...] = Field(
        default=("JPEG", "PNG", "WEBP", "BMP", "GIF"),
        min_length=1,
        description="Pillow image formats accepted; anything else is refused",
    )
    exif_transpose: bool = Field(default=True, description="apply the EXIF orientation tag")
    max_bytes: int = Field(default=16 * 1024 * 1024, gt=0, description="per encoded image")
    max_pixels: int = Field(
        default=40_000_000, gt=0, description="per decoded image; checked before decoding"
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.size is not None and min(self.size) <= 0:
            raise ValueError(f"size must be two positive integers [height, width], got {self.size}")
        if self.shorter_side is not None and self.resize != "center-crop":
            raise ValueError("shorterSide only applies to resize: center-crop")
        channels = 1 if self.color_mode == "L" else 3
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, channels):
                raise ValueError(
                    f"{name} needs 1 or {channels} values for colorMode {self.color_mode}, "
                    f"got {len(values)}"
                )
        if any(s == 0 for s in self.std):
            raise ValueError("std must not contain 0")
        return self

    @field_validator("formats")
    @classmethod
    def _upper(cls, formats: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f.upper() for f in formats)


PARENT_SEGMENT = re.compile(r"(^|/)[.][.](/|$)")
"""A '..' segment: a file named so would be fetched outside the models' folder."""


def beside_the_model(name: str | None) -> str | None:
    """A file the pipeline reads: beside the model, or an absolute path in the image; never one
    with a '..' segment (the CRD refuses it too)."""
    if name is not None and PARENT_SEGMENT.search(name):
        raise ValueError(
            f"{name!r}: a file beside the model or an absolute path in the image; no '..' in it"
        )
    return name


class TextPreprocess(_Spec):
    """UTF-8 text → token ids (and masks) from a Hugging Face `tokenizer.json`."""

    input: str = Field(default="text", description="name of the BYTES input clients send")
    tokenizer: str = Field(
        max_length=1024, description="tokenizer.json, relative to the model's directory"
    )

    max_length: int = Field(default=128, gt=0, le=65536, description="tokens per row, padded")
    truncate: bool = Field(
        default=True, description="cut longer texts to maxLength; false: refuse them (400)"
    )
    input_ids: str = Field(default="input_ids", description="model input for the token ids")
    attention_mask: str | None = Field(
        default=None, description="model input for the attention mask, if the model has one"
    )
    token_type_ids: str | None = Field(
        default=None, description="model input for the token type ids, if the model has one"
    )
    pad_token: str = Field(
        default="[PAD]", description="padding token when tokenizer.json defines no padding"
    )
    max_bytes: int = Field(default=64 * 1024, gt=0, description="per text, UTF-8 encoded")

    @model_validator(mode="after")
    def _check(self) -> Self:
        names = [n for n in (self.input_ids, self.attention_mask, self.token_type_ids) if n]
        if len(set(names)) != len(names):
            raise ValueError(f"inputIds, attentionMask and tokenTypeIds must differ, got {names}")
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_beside_the_model(cls, value: str | None) -> str | None:
        return beside_the_model(value)


class Preprocess(_Spec):
    image: ImagePreprocess | None = None
    text: TextPreprocess | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.image is None) == (self.text is None):
            raise ValueError("preprocess takes exactly one of image or text")
        return self


class Softmax(_Spec):
    """Turn the topK output's logits into probabilities (over the class axis) first."""


class TopK(_Spec):
    """The k best classes of each row, with their labels."""

    output: str | None = Field(
        default=None, description="model output with [N, classes] scores; default: the only one"
    )
    k: int = Field(default=5, gt=0, le=1000)
    labels: str | None = Field(
        default=None, max_length=1024, description="text file, one label per line, in class order"
    )

    @field_validator("labels")
    @classmethod
    def _labels_beside_the_model(cls, value: str | None) -> str | None:
        return beside_the_model(value)


class Nms(_Spec):
    """Non-maximum suppression of a detector's boxes, per class."""

    boxes: str = Field(description="model output with [N, B, 4] boxes")
    scores: str = Field(description="model output with [N, B, classes] (or [N, B]) scores")
    box_format: Literal["xyxy", "xywh", "cxcywh"] = "xyxy"
    iou_threshold: float = Field(default=0.5, ge=0, le=1)
    score_threshold: float = Field(default=0.3, ge=0)
    max_detections: int = Field(default=100, gt=0, le=10_000)
    labels: str | None = Field(
        default=None, max_length=1024, description="text file, one label per line"
    )
    box_coordinates: Literal["model", "original"] = Field(
        default="original",
        description="original: boxes mapped back through the image preprocess onto each "
        "original image, clipped to it; model: boxes in the model input's pixels",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.boxes == self.scores:
            raise ValueError("nms boxes and scores must be different outputs")
        return self

    @field_validator("labels")
    @classmethod
    def _labels_beside_the_model(cls, value: str | None) -> str | None:
        return beside_the_model(value)


class Postprocess(_Spec):
    softmax: Softmax | None = None
    top_k: TopK | None = None
    nms: Nms | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.top_k is None) == (self.nms is None):
            raise ValueError("postprocess takes exactly one of topK or nms")
        if self.softmax is not None and self.top_k is None:
            raise ValueError("softmax applies to topK; nms reads scores as the model gives them")
        return self


class PipelineConfig(_Spec):
    """What clients send and get back, around the model."""

    preprocess: Preprocess | None = None
    postprocess: Postprocess | None = None

    @model_validator(mode="after")
    def _some(self) -> Self:
        if self.preprocess is None and self.postprocess is None:
            raise ValueError("a pipeline needs preprocess, postprocess or both")
        return self
