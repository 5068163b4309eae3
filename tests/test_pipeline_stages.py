"""The pipeline's stages on hand-made inputs: exact arrays for image decoding, resizing,
normalization and layout; token ids from a tokenizer built here; softmax, top-k and NMS on cases
small enough to compute by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers

from batchpilot.api.pipeline import ImagePreprocess, TextPreprocess
from batchpilot.runtime.errors import InvalidRequest, RequestTooLarge
from batchpilot.runtime.pipeline import post
from batchpilot.runtime.pipeline.image import ImageGeometry, ImageStage, Placement
from batchpilot.runtime.pipeline.text import TextStage, TokenizerLoadError, load_tokenizer

Array = np.ndarray[Any, Any]

# A 2x2 RGB image: red, green / blue, white.
QUAD = np.array([[[255, 0, 0], [0, 255, 0]], [[0, 0, 255], [255, 255, 255]]], np.uint8)


def encoded(pixels: Array, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def objects(*elements: Any) -> Array:
    out = np.empty(len(elements), dtype=object)
    out[:] = elements
    return out


def image_stage(
    size: tuple[int, int] = (2, 2), dtype: Any = np.float32, **config: Any
) -> ImageStage:
    return ImageStage(ImagePreprocess(input="x", **config), size[0], size[1], np.dtype(dtype))


class TestImage:
    def test_scale_mean_std_in_nchw(self) -> None:
        stage = image_stage(mean=[0.5], std=[0.5])
        (row,) = stage(objects(encoded(QUAD)))
        # (p / 255 - 0.5) / 0.5: 255 → 1, 0 → -1.
        np.testing.assert_array_equal(
            row,
            [
                [[1, -1], [-1, 1]],  # R: red, green / blue, white
                [[-1, 1], [-1, 1]],  # G
                [[-1, -1], [1, 1]],  # B
            ],
        )
        assert row.dtype == np.float32

    def test_per_channel_mean_and_std(self) -> None:
        stage = image_stage(scale=1, mean=[0, 100, 200], std=[1, 2, 5])
        (row,) = stage(objects(encoded(QUAD)))
        # R: p; G: (p - 100) / 2 → 0: -50, 255: 77.5; B: (p - 200) / 5 → 0: -40, 255: 11.
        np.testing.assert_array_equal(row[0], [[255, 0], [0, 255]])
        np.testing.assert_array_equal(row[1], [[-50, 77.5], [-50, 77.5]])
        np.testing.assert_array_equal(row[2], [[-40, -40], [11, 11]])

    def test_bgr_swaps_the_channels(self) -> None:
        (row,) = image_stage(scale=255, color_mode="BGR")(objects(encoded(QUAD)))
        np.testing.assert_array_equal(row[0], [[0, 0], [1, 1]])  # B first: only blue, white
        np.testing.assert_array_equal(row[2], [[1, 0], [0, 1]])  # R last: red, white

    def test_nhwc_layout(self) -> None:
        (row,) = image_stage(scale=1, layout="NHWC")(objects(encoded(QUAD)))
        assert row.shape == (2, 2, 3)
        np.testing.assert_array_equal(row, QUAD.astype(np.float32))

    def test_grayscale_uses_pillow_luma(self) -> None:
        (row,) = image_stage(scale=1, color_mode="L")(objects(encoded(QUAD)))
        # L = (19595 R + 38470 G + 7471 B + 2^15) >> 16: red 76, green 150, blue 29, white 255.
        np.testing.assert_array_equal(row, [[[76, 150], [29, 255]]])

    def test_uint8_model_gets_raw_pixels(self) -> None:
        (row,) = image_stage(dtype=np.uint8)(objects(encoded(QUAD)))
        assert row.dtype == np.uint8
        np.testing.assert_array_equal(row, QUAD.transpose(2, 0, 1))

    # A 4-wide, 2-high image whose red channel counts 10..80 row by row.
    STRIP = np.stack([np.array([[10, 20, 30, 40], [50, 60, 70, 80]], np.uint8)] * 3, axis=-1)

    def test_stretch_resizes_ignoring_aspect_ratio(self) -> None:
        stage = image_stage(scale=1, interpolation="nearest")
        (row,) = stage(objects(encoded(self.STRIP)))
        # Nearest, 4 → 2 columns: output column x samples source column floor((x + 0.5) * 2),
        # i.e. 1 and 3.
        np.testing.assert_array_equal(row[0], [[20, 40], [60, 80]])

    def test_center_crop_keeps_the_middle(self) -> None:
        stage = image_stage(scale=1, resize="center-crop", interpolation="nearest")
        (row,) = stage(objects(encoded(self.STRIP)))
        # Covering 2x2 needs scale max(2/4, 2/2) = 1: no resize; crop left (4 - 2) // 2 = 1.
        np.testing.assert_array_equal(row[0], [[20, 30], [60, 70]])

    def test_center_crop_after_scaling_the_shorter_side(self) -> None:
        stage = image_stage(
            size=(1, 1), scale=1, resize="center-crop", shorter_side=2, interpolation="nearest"
        )
        (row,) = stage(objects(encoded(self.STRIP)))
        # Shorter side 2 → 2: factor 1, 4x2 stays; 1x1 crop at left 3 // 2 = 1, top 1 // 2 = 0.
        np.testing.assert_array_equal(row[0], [[20]])

    def test_letterbox_pads_above_and_below_a_wide_image(self) -> None:
        stage = image_stage(size=(4, 4), scale=1, resize="letterbox", interpolation="nearest")
        (row,) = stage(objects(encoded(self.STRIP)))
        # Fitting 4x2 inside 4x4: scale min(4/4, 4/2) = 1, no resize; top (4 - 2) // 2 = 1, the
        # rest padded with the default padValue 114 in every channel.
        for channel in row:
            np.testing.assert_array_equal(
                channel,
                [[114, 114, 114, 114], [10, 20, 30, 40], [50, 60, 70, 80], [114, 114, 114, 114]],
            )

    def test_letterbox_scales_down_to_fit(self) -> None:
        stage = image_stage(
            size=(3, 2), scale=1, resize="letterbox", pad_value=7, interpolation="nearest"
        )
        (row,) = stage(objects(encoded(self.STRIP)))
        # Fitting 4x2 inside 2 wide, 3 high: scale min(2/4, 3/2) = 0.5 → 2x1. Nearest samples
        # source columns floor((x + 0.5) * 2) = 1, 3 of source row floor(0.5 * 2) = 1: 60, 80.
        # Top (3 - 1) // 2 = 1: one padding row above, one below.
        np.testing.assert_array_equal(row[0], [[7, 7], [60, 80], [7, 7]])

    def test_letterbox_pads_left_and_right_in_every_channel(self) -> None:
        stage = image_stage(
            size=(2, 4), dtype=np.uint8, resize="letterbox", pad_value=0, layout="NHWC"
        )
        (row,) = stage(objects(encoded(QUAD)))
        # 2x2 inside 4 wide, 2 high: scale min(4/2, 2/2) = 1; left (4 - 2) // 2 = 1.
        black = [0, 0, 0]
        np.testing.assert_array_equal(
            row,
            [
                [black, [255, 0, 0], [0, 255, 0], black],
                [black, [0, 0, 255], [255, 255, 255], black],
            ],
        )

    def test_letterbox_pads_a_grey_image_with_one_value(self) -> None:
        stage = image_stage(size=(4, 2), scale=1, resize="letterbox", pad_value=9, color_mode="L")
        (row,) = stage(objects(encoded(np.full((2, 2, 3), 200, np.uint8))))
        # 2x2 inside 2 wide, 4 high: scale 1, top (4 - 2) // 2 = 1.
        np.testing.assert_array_equal(row, [[[9, 9], [200, 200], [200, 200], [9, 9]]])

    def test_rows_of_a_request_become_one_batch(self) -> None:
        batch = image_stage(scale=1)(objects(encoded(QUAD), encoded(QUAD[::-1], "BMP")))
        assert batch.shape == (2, 3, 2, 2)
        np.testing.assert_array_equal(batch[1, 0], [[0, 255], [255, 0]])  # rows swapped

    def test_jpeg_decodes(self) -> None:
        gray = np.full((8, 8, 3), 128, np.uint8)
        (row,) = image_stage(scale=1)(objects(encoded(gray, "JPEG")))
        assert np.abs(row - 128).max() <= 2  # lossy, but flat grey stays grey

    @pytest.mark.parametrize(
        ("element", "error", "message"),
        [
            (b"", InvalidRequest, "image row 0 is empty"),
            (b"hello, world", InvalidRequest, "not an image in an accepted format"),
            (encoded(QUAD)[:40], InvalidRequest, "image row 0"),  # truncated pixel data
            ("text", InvalidRequest, "must be bytes, got str"),
        ],
    )
    def test_bad_images(self, element: Any, error: type[Exception], message: str) -> None:
        with pytest.raises(error, match=message):
            image_stage()(objects(element))

    def test_format_outside_the_allowed_list(self) -> None:
        with pytest.raises(InvalidRequest, match=r"accepted format \(PNG\)"):
            image_stage(formats=["png"])(objects(encoded(QUAD, "BMP")))

    def test_over_max_bytes_is_refused_before_decoding(self) -> None:
        data = encoded(QUAD)
        with pytest.raises(RequestTooLarge, match=f"is {len(data)} bytes; the limit is 10"):
            image_stage(max_bytes=10)(objects(data))

    def test_over_max_pixels_is_refused_from_the_header(self) -> None:
        # 3000 x 3000 = 9,000,000 pixels of black compress to a few kB.
        bomb = encoded(np.zeros((3000, 3000, 3), np.uint8))
        assert len(bomb) < 100_000
        with pytest.raises(RequestTooLarge, match="3000x3000 = 9000000 pixels; the limit is 1000"):
            image_stage(max_pixels=1000)(objects(bomb))


def word_tokenizer(path: Path, *, pad: bool = True) -> Path:
    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3}
    if not pad:
        del vocab["[PAD]"]
        vocab["[UNK]"] = 0
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def text_stage(path: Path, **config: Any) -> TextStage:
    cfg = TextPreprocess(tokenizer=str(path), max_length=4, attention_mask="mask", **config)
    dtypes = {"input_ids": np.dtype(np.int64), "mask": np.dtype(np.int64)}
    return TextStage(cfg, load_tokenizer(path, cfg), dtypes)


class TestText:
    def test_ids_and_mask_padded_to_max_length(self, tmp_path: Path) -> None:
        stage = text_stage(word_tokenizer(tmp_path / "tokenizer.json"))
        out = stage(objects(b"hello world", b"world nonsense"))
        # hello=2 world=3, padded with [PAD]=0 to 4; unknown words are [UNK]=1.
        np.testing.assert_array_equal(out["input_ids"], [[2, 3, 0, 0], [3, 1, 0, 0]])
        np.testing.assert_array_equal(out["mask"], [[1, 1, 0, 0], [1, 1, 0, 0]])
        assert out["input_ids"].dtype == np.int64

    def test_long_text_is_truncated(self, tmp_path: Path) -> None:
        stage = text_stage(word_tokenizer(tmp_path / "tokenizer.json"))
        out = stage(objects(b"hello hello hello world world"))
        np.testing.assert_array_equal(out["input_ids"], [[2, 2, 2, 3]])

    def test_long_text_is_refused_when_truncation_is_off(self, tmp_path: Path) -> None:
        stage = text_stage(word_tokenizer(tmp_path / "tokenizer.json"), truncate=False)
        with pytest.raises(InvalidRequest, match="text row 1 is longer than 4 tokens"):
            stage(objects(b"hello", b"hello hello hello world world"))

    @pytest.mark.parametrize(
        ("element", "error", "message"),
        [
            (b"", InvalidRequest, "text row 0 is empty"),
            (b"  \n", InvalidRequest, "text row 0 is empty"),
            (b"\xff\xfe", InvalidRequest, "not UTF-8"),
            (b"hello " * 20_000, RequestTooLarge, "the limit is 65536"),
        ],
    )
    def test_bad_texts(
        self, tmp_path: Path, element: bytes, error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            text_stage(word_tokenizer(tmp_path / "tokenizer.json"))(objects(element))

    def test_missing_pad_token(self, tmp_path: Path) -> None:
        path = word_tokenizer(tmp_path / "tokenizer.json", pad=False)
        with pytest.raises(TokenizerLoadError, match=r"no token '\[PAD\]'; set padToken"):
            text_stage(path)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(TokenizerLoadError, match="cannot be loaded"):
            text_stage(tmp_path / "absent.json")


class TestSoftmaxAndTopK:
    def test_softmax(self) -> None:
        # softmax(0, ln 3) = (1, 3) / (1 + 3) = (0.25, 0.75); softmax(5, 5) = (0.5, 0.5).
        out = post.softmax(np.array([[0, math.log(3)], [5, 5]]))
        np.testing.assert_allclose(out, [[0.25, 0.75], [0.5, 0.5]], rtol=1e-6)

    def test_softmax_is_stable_for_large_logits(self) -> None:
        # exp(1000) overflows; shifted by the max, (1000, 1000 - ln 3) → exp(0, -ln 3) =
        # (1, 1/3), / (4/3) = (0.75, 0.25). FP32 holds 1000 - ln 3 to about 6e-5.
        out = post.softmax(np.array([[1000, 1000 - math.log(3)]]))
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out, [[0.75, 0.25]], atol=1e-4)

    def test_top_k_best_first(self) -> None:
        classes, scores = post.top_k(np.array([[0.1, 0.7, 0.2], [0.5, 0.1, 0.4]]), 2)
        np.testing.assert_array_equal(classes, [[1, 2], [0, 2]])
        np.testing.assert_allclose(scores, [[0.7, 0.2], [0.5, 0.4]])

    def test_ties_keep_class_order_and_k_is_capped(self) -> None:
        classes, _ = post.top_k(np.array([[0.5, 0.5, 0.1]]), 10)
        np.testing.assert_array_equal(classes, [[0, 1, 2]])

    def test_labels(self) -> None:
        labels = post.label_array(np.array([[2, 0], [-1, 1]]), ["cat", "dog", "eel"])
        assert labels.tolist() == [[b"eel", b"cat"], [b"", b"dog"]]
        assert post.label_array(np.array([[7]]), None).tolist() == [[b"7"]]


class TestNms:
    # A = (0, 0, 10, 10), B = A moved right by 1, C far away.
    # IoU(A, B) = overlap 9 x 10 = 90 / union (100 + 100 - 90 = 110) = 0.818.
    BOXES = np.array([[[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30]]], np.float32)

    def test_overlapping_box_of_the_same_class_is_suppressed(self) -> None:
        found = post.nms(
            self.BOXES,
            np.array([[0.9, 0.8, 0.7]]),  # one class, [N, B]
            iou_threshold=0.5,
            score_threshold=0.3,
            max_detections=10,
        )
        np.testing.assert_array_equal(found.boxes, [[[0, 0, 10, 10], [20, 20, 30, 30]]])
        np.testing.assert_allclose(found.scores, [[0.9, 0.7]])
        np.testing.assert_array_equal(found.classes, [[0, 0]])
        np.testing.assert_array_equal(found.counts, [2])

    def test_iou_below_threshold_keeps_both(self) -> None:
        found = post.nms(
            self.BOXES,
            np.array([[0.9, 0.8, 0.7]]),
            iou_threshold=0.85,  # 0.818 < 0.85
            score_threshold=0.3,
            max_detections=10,
        )
        np.testing.assert_array_equal(found.counts, [3])

    def test_classes_are_suppressed_separately(self) -> None:
        scores = np.array([[[0.9, 0.0], [0.0, 0.8], [0.1, 0.2]]])  # A: class 0, B: class 1
        found = post.nms(
            self.BOXES, scores, iou_threshold=0.5, score_threshold=0.3, max_detections=10
        )
        # C scores 0.1 / 0.2, under the 0.3 threshold; A and B differ in class, both stay.
        np.testing.assert_array_equal(found.classes, [[0, 1]])
        np.testing.assert_allclose(found.scores, [[0.9, 0.8]])

    def test_max_detections_and_padding_across_rows(self) -> None:
        boxes = np.concatenate([self.BOXES, self.BOXES])
        scores = np.array([[0.9, 0.1, 0.7], [0.2, 0.2, 0.2]])
        found = post.nms(boxes, scores, iou_threshold=0.5, score_threshold=0.3, max_detections=1)
        # Row 0 keeps its best (A, 0.9) only; row 1 has nothing over 0.3: padded.
        np.testing.assert_array_equal(found.counts, [1, 0])
        np.testing.assert_array_equal(found.boxes, [[[0, 0, 10, 10]], [[0, 0, 0, 0]]])
        np.testing.assert_array_equal(found.classes, [[0], [-1]])

    def test_box_formats(self) -> None:
        # xywh (1, 2, 3, 4) → (1, 2, 4, 6); cxcywh (5, 5, 2, 4) → (4, 3, 6, 7).
        np.testing.assert_array_equal(post.to_xyxy(np.array([1, 2, 3, 4]), "xywh"), [1, 2, 4, 6])
        np.testing.assert_array_equal(post.to_xyxy(np.array([5, 5, 2, 4]), "cxcywh"), [4, 3, 6, 7])


def blank(width: int, height: int) -> bytes:
    return encoded(np.zeros((height, width, 3), np.uint8))


class TestBoxesOnTheOriginal:
    """Each row's placement from `ImageStage.prepare`, and model-input boxes mapped back through
    it: original = (model - offset) / scale per axis, clipped to the original image."""

    # Two boxes in 32x32 model input pixels, x1 y1 x2 y2.
    BOXES = np.array([[[2, 2, 12, 12], [20, 20, 30, 30]]], np.float32)

    def geometry(self, width: int, height: int, **config: Any) -> ImageGeometry:
        _, geometry = image_stage(size=(32, 32), **config).prepare(objects(blank(width, height)))
        return geometry

    def test_stretch_scales_each_axis(self) -> None:
        geometry = self.geometry(64, 48)
        # 64x48 → 32x32: scale x 32/64 = 0.5, y 32/48 = 2/3, no offset.
        assert geometry.rows == (Placement(64, 48, 0.5, 32 / 48),)
        # x / 0.5: 2 → 4, 12 → 24, 20 → 40, 30 → 60; y / (2/3): 2 → 3, 12 → 18, 20 → 30, 30 → 45.
        np.testing.assert_array_equal(
            geometry.to_original(self.BOXES), [[[4, 3, 24, 18], [40, 30, 60, 45]]]
        )

    def test_center_crop_adds_back_the_cut_off_part(self) -> None:
        geometry = self.geometry(128, 64, resize="center-crop")
        # Covering 32x32: scale max(32/128, 32/64) = 0.5 → 64x32; crop left (64 - 32) // 2 = 16.
        assert geometry.rows == (Placement(128, 64, 0.5, 0.5, -16.0, 0.0),)
        # x: (2 + 16) / 0.5 = 36, (12 + 16) / 0.5 = 56, (20 + 16) / 0.5 = 72, (30 + 16) / 0.5 = 92;
        # y: 2 / 0.5 = 4, 24, 40, 60.
        np.testing.assert_array_equal(
            geometry.to_original(self.BOXES), [[[36, 4, 56, 24], [72, 40, 92, 60]]]
        )

    def test_center_crop_after_the_shorter_side(self) -> None:
        geometry = self.geometry(40, 20, resize="center-crop", shorter_side=40)
        # Shorter side 20 → 40: scale 2, 80x40; crop left (80 - 32) // 2 = 24, top (40 - 32) // 2
        # = 4. Box 0: x (2 + 24) / 2 = 13, (12 + 24) / 2 = 18; y (2 + 4) / 2 = 3, (12 + 4) / 2 = 8.
        # Box 1: x (20 + 24) / 2 = 22, (30 + 24) / 2 = 27; y (20 + 4) / 2 = 12, (30 + 4) / 2 = 17,
        # clipped to the height 20: unchanged.
        assert geometry.rows == (Placement(40, 20, 2.0, 2.0, -24.0, -4.0),)
        np.testing.assert_array_equal(
            geometry.to_original(self.BOXES), [[[13, 3, 18, 8], [22, 12, 27, 17]]]
        )

    def test_letterbox_removes_the_padding_and_clips(self) -> None:
        geometry = self.geometry(64, 48, resize="letterbox")
        # Fitting 32x32: scale min(32/64, 32/48) = 0.5 → 32x24; top (32 - 24) // 2 = 4.
        assert geometry.rows == (Placement(64, 48, 0.5, 0.5, 0.0, 4.0),)
        # x / 0.5: 4, 24, 40, 60; y: (2 - 4) / 0.5 = -4 → 0 (in the padding), (12 - 4) / 0.5 = 16,
        # (20 - 4) / 0.5 = 32, (30 - 4) / 0.5 = 52 → 48 (the image's height).
        np.testing.assert_array_equal(
            geometry.to_original(self.BOXES), [[[4, 0, 24, 16], [40, 32, 60, 48]]]
        )

    def test_each_row_has_its_own_placement(self) -> None:
        stage = image_stage(size=(32, 32), resize="letterbox")
        _, geometry = stage.prepare(objects(blank(64, 48), blank(16, 32)))
        # Row 1, 16x32: scale min(32/16, 32/32) = 1; left (32 - 16) // 2 = 8. Box 0: x 2 - 8 =
        # -6 → 0, 12 - 8 = 4; y 2, 12. Box 1: x 12, 22 → 16 (the width); y 20, 30.
        assert geometry.rows[1] == Placement(16, 32, 1.0, 1.0, 8.0, 0.0)
        mapped = geometry.to_original(np.concatenate([self.BOXES, self.BOXES]))
        np.testing.assert_array_equal(mapped[0], [[4, 0, 24, 16], [40, 32, 60, 48]])
        np.testing.assert_array_equal(mapped[1], [[0, 2, 4, 12], [12, 20, 16, 30]])
        assert mapped.dtype == np.float32
