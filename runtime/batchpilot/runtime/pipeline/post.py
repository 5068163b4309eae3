"""Model outputs → what a person wants: probabilities, the k best labels, deduplicated boxes.

Pure numpy, no I/O: softmax, top-k with labels and per-class non-maximum suppression, each on a
batch of rows, so one call serves every row of a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


def softmax(logits: Array, *, axis: int = -1) -> Array:
    """exp(x) / sum(exp(x)) along `axis`, computed stably (the row's max is subtracted first)."""
    x = np.asarray(logits, dtype=np.float32)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)  # type: ignore[no-any-return]


def top_k(scores: Array, k: int) -> tuple[Array, Array]:
    """The k highest scores of each row [N, C], best first: (classes INT64 [N, k'], scores
    FP32 [N, k']) with k' = min(k, C). Ties keep the lower class index first."""
    scores = np.asarray(scores, dtype=np.float32)
    k = min(k, scores.shape[1])
    # A stable sort of the negated scores: equal scores stay in class order.
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order.astype(np.int64), np.take_along_axis(scores, order, axis=1)


def label_array(classes: Array, labels: Sequence[str] | None) -> Array:
    """Labels of class indices, as a BYTES (object) array of the same shape; without a labels
    file a class's label is its index; a padding index (-1) gets an empty label."""
    out = np.empty(classes.shape, dtype=object)
    flat = out.reshape(-1)
    for i, index in enumerate(classes.reshape(-1).tolist()):
        if index < 0:
            flat[i] = b""
        elif labels is None:
            flat[i] = str(index).encode()
        else:
            flat[i] = labels[index].encode()
    return out


def to_xyxy(boxes: Array, box_format: str) -> Array:
    """Boxes [..., 4] as (x1, y1, x2, y2)."""
    b = np.asarray(boxes, dtype=np.float32)
    if box_format == "xyxy":
        return b
    if box_format == "xywh":
        x, y, w, h = np.moveaxis(b, -1, 0)
        return np.stack([x, y, x + w, y + h], axis=-1)
    cx, cy, w, h = np.moveaxis(b, -1, 0)  # cxcywh
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def iou(box: Array, others: Array) -> Array:
    """Intersection over union of one xyxy box with each of `others` [M, 4]."""
    x1 = np.maximum(box[0], others[:, 0])
    y1 = np.maximum(box[1], others[:, 1])
    x2 = np.minimum(box[2], others[:, 2])
    y2 = np.minimum(box[3], others[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = max(box[2] - box[0], 0) * max(box[3] - box[1], 0)
    areas = np.clip(others[:, 2] - others[:, 0], 0, None) * np.clip(
        others[:, 3] - others[:, 1], 0, None
    )
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


@dataclass(frozen=True, slots=True)
class Detections:
    """Per request: boxes FP32 [N, D, 4] (xyxy), scores FP32 [N, D], classes INT64 [N, D] and
    counts INT64 [N]. D is the most detections any row kept; shorter rows are padded with zero
    boxes, score 0 and class -1."""

    boxes: Array
    scores: Array
    classes: Array
    counts: Array


def nms_row(
    boxes: Array,
    scores: Array,
    *,
    iou_threshold: float,
    score_threshold: float,
    max_detections: int,
) -> tuple[Array, Array, Array]:
    """One image: boxes [B, 4] xyxy, scores [B, C] → kept (boxes, scores, classes), best first.

    Greedy, per class: a box suppresses boxes of the same class whose IoU with it is above
    `iou_threshold`. A box may be kept for several classes when it scores above the threshold
    for each (as torchvision's batched_nms does with one box per class score).
    """
    box_idx, cls_idx = np.nonzero(scores > score_threshold)
    cand_scores = scores[box_idx, cls_idx]
    order = np.argsort(-cand_scores, kind="stable")
    box_idx, cls_idx, cand_scores = box_idx[order], cls_idx[order], cand_scores[order]
    alive = np.ones(len(order), dtype=bool)
    kept: list[int] = []
    for i in range(len(order)):
        if not alive[i]:
            continue
        kept.append(i)
        if len(kept) == max_detections:
            break
        rest = np.arange(i + 1, len(order))
        rest = rest[alive[rest] & (cls_idx[rest] == cls_idx[i])]
        if rest.size:
            overlap = iou(boxes[box_idx[i]], boxes[box_idx[rest]])
            alive[rest[overlap > iou_threshold]] = False
    k = np.asarray(kept, dtype=np.int64)
    return boxes[box_idx[k]], cand_scores[k], cls_idx[k].astype(np.int64)


def nms(
    boxes: Array,
    scores: Array,
    *,
    box_format: str = "xyxy",
    iou_threshold: float,
    score_threshold: float,
    max_detections: int,
) -> Detections:
    """Per-class NMS on every row: boxes [N, B, 4], scores [N, B, C] or [N, B] (one class)."""
    boxes = to_xyxy(boxes, box_format)
    scores = np.asarray(scores, dtype=np.float32)
    if scores.ndim == 2:
        scores = scores[:, :, np.newaxis]
    rows = [
        nms_row(
            boxes[n],
            scores[n],
            iou_threshold=iou_threshold,
            score_threshold=score_threshold,
            max_detections=max_detections,
        )
        for n in range(len(boxes))
    ]
    width = max((len(r[1]) for r in rows), default=0)
    out_boxes = np.zeros((len(rows), width, 4), dtype=np.float32)
    out_scores = np.zeros((len(rows), width), dtype=np.float32)
    out_classes = np.full((len(rows), width), -1, dtype=np.int64)
    counts = np.zeros(len(rows), dtype=np.int64)
    for n, (b, s, c) in enumerate(rows):
        counts[n] = len(s)
        out_boxes[n, : len(s)] = b
        out_scores[n, : len(s)] = s
        out_classes[n, : len(s)] = c
    return Detections(out_boxes, out_scores, out_classes, counts)
