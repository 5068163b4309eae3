"""Encoded image bytes → the tensor an image model takes.

Each element of a request's BYTES input is one image: its size is checked before anything is
decoded (bytes, then the pixel count from the header, which is how decompression bombs are
caught), then it is decoded with Pillow, converted to the colour mode, resized, scaled,
normalized and laid out as the model wants. Everything a client can get wrong is an
InvalidRequest or RequestTooLarge naming the row, never a crash.

Alongside the tensor, `ImageStage.prepare` records each row's geometry (`ImageGeometry`): the
original size and how the resize placed it in the model input, so that boxes the model finds
can be mapped back onto the original image.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from batchpilot.api.pipeline import ImagePreprocess
from batchpilot.runtime.errors import InvalidRequest, RequestTooLarge

_RESAMPLING: Final = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one original image lands in the model input: a point (x, y) of the original is at
    (x * scale_x + offset_x, y * scale_y + offset_y) there. Scales are per axis, as the resize
    made them (rounding included); an offset is the letterbox padding before the image (> 0) or
    the part of the scaled image a centre crop cut off (< 0)."""

    width: int
    height: int
    scale_x: float
    scale_y: float
    offset_x: float = 0.0
    offset_y: float = 0.0


@dataclass(frozen=True, slots=True)
class ImageGeometry:
    """The placement of every row of one request, in row order."""

    rows: tuple[Placement, ...]

    def to_original(self, boxes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Boxes [N, D, 4] (x1 y1 x2 y2, model input pixels) → the same boxes on each row's
        original image, clipped to it; FP32."""
        b = np.asarray(boxes, dtype=np.float64)
        if b.shape[0] != len(self.rows):
            raise ValueError(f"{b.shape[0]} rows of boxes for {len(self.rows)} images")
        table = np.array(
            [(p.scale_x, p.scale_y, p.offset_x, p.offset_y, p.width, p.height) for p in self.rows],
            dtype=np.float64,
        ).reshape(len(self.rows), 6)[:, np.newaxis, :]
        sx, sy, ox, oy, w, h = (table[..., i] for i in range(6))
        out = np.empty_like(b)
        out[..., 0] = np.clip((b[..., 0] - ox) / sx, 0, w)
        out[..., 2] = np.clip((b[..., 2] - ox) / sx, 0, w)
        out[..., 1] = np.clip((b[..., 1] - oy) / sy, 0, h)
        out[..., 3] = np.clip((b[..., 3] - oy) / sy, 0, h)
        return out.astype(np.float32)


@dataclass(frozen=True, slots=True)
class ImageStage:
    """One image config fitted to a model input: its size, dtype and layout are settled."""

    config: ImagePreprocess
    height: int
    width: int
    dtype: np.dtype[Any]

    @property
    def channels(self) -> int:
        return 1 if self.config.color_mode == "L" else 3

    @property
    def row_shape(self) -> tuple[int, int, int]:
        """Shape of one image tensor, without the batch axis."""
        if self.config.layout == "NCHW":
            return (self.channels, self.height, self.width)
        return (self.height, self.width, self.channels)

    def __call__(self, elements: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """A batch [N, …] from N encoded images."""
        return self.prepare(elements)[0]

    def prepare(self, elements: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], ImageGeometry]:
        """A batch [N, …] from N encoded images, and where each image landed in its row."""
        out = np.empty((len(elements), *self.row_shape), dtype=self.dtype)
        placements = []
        for row, element in enumerate(elements):
            image, placement = self.resize(self.decode(element, row=row))
            out[row] = self.tensor(image)
            placements.append(placement)
        return out, ImageGeometry(tuple(placements))

    def decode(self, element: Any, *, row: int = 0) -> Image.Image:
        """The row's image, checked and decoded, in the configured colour mode, original size."""
        config = self.config
        if not isinstance(element, bytes):
            raise InvalidRequest(f"image row {row} must be bytes, got {type(element).__name__}")
        if len(element) > config.max_bytes:
            raise RequestTooLarge(
                f"image row {row} is {len(element)} bytes; the limit is {config.max_bytes} bytes"
            )
        if not element:
            raise InvalidRequest(f"image row {row} is empty")
        try:
            # open() reads only the header: the pixel count is known before any decoding.
            image: Image.Image = Image.open(io.BytesIO(element), formats=list(config.formats))
        except UnidentifiedImageError:
            raise InvalidRequest(
                f"image row {row} is not an image in an accepted format "
                f"({', '.join(config.formats)})"
            ) from None
        except Image.DecompressionBombError:
            raise RequestTooLarge(
                f"image row {row} has too many pixels; the limit is {config.max_pixels}"
            ) from None
        except Exception as exc:  # a malformed header can raise almost anything in a plugin
            raise InvalidRequest(f"image row {row} cannot be read: {exc}") from None
        width, height = image.size
        if width * height > config.max_pixels:
            raise RequestTooLarge(
                f"image row {row} is {width}x{height} = {width * height} pixels; the limit is "
                f"{config.max_pixels}"
            )
        try:
            image.load()
            if config.exif_transpose:
                image = ImageOps.exif_transpose(image)
            image = image.convert("L" if config.color_mode == "L" else "RGB")
        except Exception as exc:  # truncated or corrupt pixel data
            raise InvalidRequest(f"image row {row} is corrupt: {exc}") from None
        return image

    def resize(self, image: Image.Image) -> tuple[Image.Image, Placement]:
        """The decoded image at the model's size, and where the original landed in it."""
        config, size = self.config, (self.width, self.height)
        resample = _RESAMPLING[config.interpolation]
        width, height = image.size
        if config.resize == "stretch":
            placement = Placement(width, height, self.width / width, self.height / height)
            return (image if image.size == size else image.resize(size, resample)), placement
        if config.resize == "letterbox":
            # the largest scale at which the whole image fits, the rest padded around its centre
            factor = min(self.width / width, self.height / height)
            scaled = (
                min(self.width, max(1, round(width * factor))),
                min(self.height, max(1, round(height * factor))),
            )
            left, top = (self.width - scaled[0]) // 2, (self.height - scaled[1]) // 2
            fill = config.pad_value if image.mode == "L" else (config.pad_value,) * 3
            canvas = Image.new(image.mode, size, fill)
            canvas.paste(
                image if scaled == image.size else image.resize(scaled, resample), (left, top)
            )
            placement = Placement(
                width, height, scaled[0] / width, scaled[1] / height, float(left), float(top)
            )
            return canvas, placement
        if config.shorter_side is not None:
            factor = config.shorter_side / min(width, height)
        else:  # the smallest scale at which the image covers the target
            factor = max(self.width / width, self.height / height)
        scaled = (max(self.width, round(width * factor)), max(self.height, round(height * factor)))
        if scaled != image.size:
            image = image.resize(scaled, resample)
        left, top = (scaled[0] - self.width) // 2, (scaled[1] - self.height) // 2
        placement = Placement(
            width, height, scaled[0] / width, scaled[1] / height, float(-left), float(-top)
        )
        return image.crop((left, top, left + self.width, top + self.height)), placement

    def tensor(self, image: Image.Image) -> np.ndarray[Any, Any]:
        """Pixels → one row: colour order, scale, mean/std, layout, dtype."""
        config = self.config
        pixels = np.asarray(image)
        if pixels.ndim == 2:
            pixels = pixels[:, :, np.newaxis]
        if config.color_mode == "BGR":
            pixels = pixels[:, :, ::-1]
        if self.dtype == np.uint8:
            values: np.ndarray[Any, Any] = pixels
        else:
            mean = np.asarray(config.mean, dtype=np.float32)
            std = np.asarray(config.std, dtype=np.float32)
            values = (pixels.astype(np.float32) / np.float32(config.scale) - mean) / std
        if config.layout == "NCHW":
            values = values.transpose(2, 0, 1)
        return values.astype(self.dtype, copy=False)
