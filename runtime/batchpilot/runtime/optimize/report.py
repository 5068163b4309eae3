"""How each variant compares with the original: size, speed and output agreement.

Pure: the numbers come in (file sizes, rows/s, output arrays), the comparison, the table and the
JSON go out. Top-1 agreement is reported only for outputs that look like class scores (2-D
float [N, C] with C >= 2); elsewhere it would mean nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchpilot.runtime.optimize.plan import EvalSource, Method

EVAL_NOTES: dict[EvalSource, str] = {
    "eval-inputs": "outputs compared on the --eval-inputs rows",
    "calibration": "outputs compared on the --calibration rows (the data INT8 was calibrated "
    "on: pass --eval-inputs with held-out rows for an unbiased measure)",
    "random": "outputs compared on random inputs: accuracy is then only agreement on noise "
    "(pass --eval-inputs FILE.npz with real rows)",
}


@dataclass(frozen=True, slots=True)
class OutputAgreement:
    name: str
    max_abs_diff: float
    mean_abs_diff: float
    top1_agreement: float | None
    """Share of rows whose highest score is the same class; None if not class scores."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff,
            "top1_agreement": self.top1_agreement,
        }


@dataclass(frozen=True, slots=True)
class Measured:
    """One model file as measured: the original or a variant."""

    variant: str
    path: str
    size_bytes: int
    rows_per_s: Mapping[int, float]
    """Throughput by batch size."""
    method: Method | None = None
    outputs: tuple[OutputAgreement, ...] = ()


@dataclass(frozen=True, slots=True)
class Report:
    model: str
    original: Measured
    variants: tuple[Measured, ...]
    eval_source: EvalSource
    eval_rows: int
    session: Mapping[str, Any]
    skipped: tuple[str, ...] = field(default=())
    """Variants not made, with the reason (only those no flag asked for)."""

    @property
    def note(self) -> str:
        return EVAL_NOTES[self.eval_source]


def looks_like_class_scores(array: np.ndarray[Any, Any]) -> bool:
    return array.ndim == 2 and array.shape[1] >= 2 and array.dtype.kind == "f"


def compare_outputs(
    reference: Mapping[str, np.ndarray[Any, Any]], candidate: Mapping[str, np.ndarray[Any, Any]]
) -> tuple[OutputAgreement, ...]:
    """Per output: max and mean absolute difference (in float64) and top-1 agreement."""
    agreements = []
    for name, ref in reference.items():
        got = candidate[name]
        if ref.shape != got.shape:
            raise ValueError(f"output '{name}' has shape {got.shape}, the original {ref.shape}")
        if ref.dtype.kind in "fiub" and ref.size:
            diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
            max_diff, mean_diff = float(diff.max()), float(diff.mean())
        else:
            max_diff = mean_diff = 0.0
        top1 = None
        if looks_like_class_scores(ref) and ref.shape[0]:
            top1 = float(np.mean(ref.argmax(axis=1) == got.argmax(axis=1)))
        agreements.append(OutputAgreement(name, max_diff, mean_diff, top1))
    return tuple(agreements)


def ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def as_json(report: Report) -> dict[str, Any]:
    original = report.original

    def entry(m: Measured) -> dict[str, Any]:
        return {
            "variant": m.variant,
            "method": m.method,
            "path": m.path,
            "size_bytes": m.size_bytes,
            "size_ratio": ratio(m.size_bytes, original.size_bytes),
            "rows_per_s": {str(b): r for b, r in m.rows_per_s.items()},
            "speed_ratio": {
                str(b): ratio(r, original.rows_per_s.get(b)) for b, r in m.rows_per_s.items()
            },
            "outputs": [o.as_dict() for o in m.outputs],
        }

    return {
        "model": report.model,
        "original": {
            "path": original.path,
            "size_bytes": original.size_bytes,
            "rows_per_s": {str(b): r for b, r in original.rows_per_s.items()},
        },
        "variants": [entry(m) for m in report.variants],
        "skipped": list(report.skipped),
        "evaluation": {
            "source": report.eval_source,
            "rows": report.eval_rows,
            "note": report.note,
        },
        "session": dict(report.session),
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(report: Report) -> str:
    """The report as a fixed-width table, one row per model file."""
    original = report.original
    batches = sorted(original.rows_per_s)
    head = ["variant", "method", "size", "size x"]
    for b in batches:
        head += [f"rows/s b{b}", f"speed x b{b}"]
    head += ["max |diff|", "mean |diff|", "top-1 agree"]
    rows = []
    for m in (original, *report.variants):
        row = [
            m.variant,
            m.method or "-",
            _size(m.size_bytes),
            _num(ratio(m.size_bytes, original.size_bytes), ".2f"),
        ]
        for b in batches:
            rate = m.rows_per_s.get(b)
            row += [_num(rate, ".0f"), _num(ratio(rate, original.rows_per_s.get(b)), ".2f")]
        if m is original:
            row += ["-", "-", "-"]
        else:
            row += [
                _num(max((o.max_abs_diff for o in m.outputs), default=None), ".3g"),
                _num(max((o.mean_abs_diff for o in m.outputs), default=None), ".3g"),
                _top1(m.outputs),
            ]
        rows.append(row)
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in (head, *rows)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"{report.model}: {report.note}; {report.eval_rows} rows.")
    if len({o.name for m in report.variants for o in m.outputs}) > 1:
        lines.append("max/mean |diff| and top-1: the worst over the model's outputs.")
    lines.extend(f"skipped: {reason}" for reason in report.skipped)
    return "\n".join(lines)


def _size(size_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.2f} {unit}"
    return f"{size_bytes} B"


def _top1(outputs: tuple[OutputAgreement, ...]) -> str:
    scores = [o.top1_agreement for o in outputs if o.top1_agreement is not None]
    return "-" if not scores else f"{100 * min(scores):.1f}%"
