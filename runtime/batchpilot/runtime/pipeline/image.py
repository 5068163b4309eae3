"""Encoded image bytes → the tensor an image model takes.

Each element of a request's BYTES input is one image: its size is checked before anything is
decoded (bytes, then the pixel count from the header, which is how decompression bombs are
caught), then it is decoded with Pillow, converted to the colour mode, resized, scaled,
normalized and laid out as the model wants. Everything a client can get wrong is an
InvalidRequest or RequestTooLarge naming the row, never a crash.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from batchpilot.runtime.errors import InvalidRequest, RequestTooLarge
from batchpilot.runtime.pipeline.config import ImagePreprocess

_RESAMPLING: Final = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


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
        out = np.empty((len(elements), *self.row_shape), dtype=self.dtype)
        for row, element in enumerate(elements):
            out[row] = self.tensor(self.decode(element, row=row))
        return out

    def decode(self, element: Any, *, row: int = 0) -> Image.Image:
        """The row's image, checked and decoded, in the configured colour mode and size."""
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
        return self._resized(image)

    def _resized(self, image: Image.Image) -> Image.Image:
        config, size = self.config, (self.width, self.height)
        resample = _RESAMPLING[config.interpolation]
        if config.resize == "stretch":
            return image if image.size == size else image.resize(size, resample)
        width, height = image.size
        if config.shorter_side is not None:
            factor = config.shorter_side / min(width, height)
        else:  # the smallest scale at which the image covers the target
            factor = max(self.width / width, self.height / height)
        scaled = (max(self.width, round(width * factor)), max(self.height, round(height * factor)))
        if scaled != image.size:
            image = image.resize(scaled, resample)
        left, top = (scaled[0] - self.width) // 2, (scaled[1] - self.height) // 2
        return image.crop((left, top, left + self.width, top + self.height))

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
