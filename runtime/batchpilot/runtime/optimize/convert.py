"""The conversions: onnx and onnxruntime's own tools, writing to temporary files.

FP16 uses onnxruntime.transformers.float16 with `keep_io_types`, so the variant's inputs and
outputs keep their original types and the serving signature does not change. INT8 uses
onnxruntime.quantization: shape inference and graph optimization first (`quant_pre_process`,
without the symbolic pass, which needs sympy), then `quantize_dynamic`, or `quantize_static` in
QDQ format with per-channel weights (onnxruntime's recommendation for CNNs) and ranges from the
user's calibration rows. Every file is written beside its target under a temporary name;
`commit` renames them all once every conversion has succeeded.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from batchpilot.runtime.optimize.plan import ConversionFailed, Job, OptimizeError

QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "DynamicQuantizeLSTM",
        "QAttention",
    }
)
CALIBRATION_CHUNK_ROWS = 16


def load_model(path: Path) -> onnx.ModelProto:
    """The model, or an OptimizeError that says why it is not one."""
    if not path.is_file():
        raise OptimizeError(f"{path} does not exist or is not a file")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # DecodeError, or onnx's own errors for external data
        raise OptimizeError(f"{path} is not an ONNX model: {exc}") from exc
    if not model.graph.node or not model.graph.input:
        raise OptimizeError(f"{path} is not an ONNX model: it has no graph")
    return model


def float_weight_count(model: onnx.ModelProto) -> int:
    """FP32 initializers and constants: what FP16 conversion halves."""
    count = sum(1 for t in model.graph.initializer if t.data_type == TensorProto.FLOAT)
    for node in model.graph.node:
        if node.op_type == "Constant":
            count += sum(
                1 for a in node.attribute if a.HasField("t") and a.t.data_type == TensorProto.FLOAT
            )
    return count


def quantized_op_count(model: onnx.ModelProto) -> int:
    return sum(1 for node in model.graph.node if node.op_type in QUANTIZED_OPS)


def check_writable(directory: Path) -> None:
    """Create `directory` if needed and prove a file can be written there (permission bits alone
    do not say, for root or on a read-only mount)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".batchpilot-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OptimizeError(f"output directory {directory} is not writable: {exc}") from exc


def temporary_beside(target: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp.onnx")
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def pending(targets: list[Path]) -> Iterator[dict[Path, Path]]:
    """Temporary files for `targets`, removed unless `commit` renamed them."""
    temps: dict[Path, Path] = {}
    try:
        yield temps
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def commit(temps: dict[Path, Path], *, mode: int) -> None:
    """Rename every temporary file to its target, with permission bits `mode` (the model's:
    mkstemp's owner-only 0600 would keep the server's user from reading a variant)."""
    for target, temp in temps.items():
        os.chmod(temp, mode)
        os.replace(temp, target)
    temps.clear()


def convert(
    job: Job,
    *,
    source: Path,
    model: onnx.ModelProto,
    into: Path,
    calibration: Mapping[str, np.ndarray[Any, Any]] | None,
) -> None:
    """Write `job`'s variant of `source` into the file `into`."""
    if job.method == "fp16":
        _fp16(model, into)
    elif job.method == "int8-dynamic":
        _int8(source, into, calibration=None)
    else:
        if calibration is None:
            raise OptimizeError("--int8 static needs --calibration FILE.npz")
        _int8(source, into, calibration=calibration)


def _fp16(model: onnx.ModelProto, into: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if not float_weight_count(model):
        raise OptimizeError(
            "the model has no FP32 weights (initializers or constants): FP16 would change nothing"
        )
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        converted = convert_float_to_float16(copy, keep_io_types=True)
    except Exception as exc:
        raise ConversionFailed(f"FP16 conversion failed: {exc}") from exc
    onnx.save(converted, str(into))


class _ArrayReader:
    """Calibration rows for quantize_static, a chunk at a time (a CalibrationDataReader)."""

    def __init__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> None:
        self._arrays = arrays
        self._rows = len(next(iter(arrays.values())))
        self._start = 0

    def get_next(self) -> dict[str, np.ndarray[Any, Any]] | None:
        if self._start >= self._rows:
            return None
        stop = min(self._start + CALIBRATION_CHUNK_ROWS, self._rows)
        chunk = {name: a[self._start : stop] for name, a in self._arrays.items()}
        self._start = stop
        return chunk

    def rewind(self) -> None:
        self._start = 0


def _int8(
    source: Path, into: Path, *, calibration: Mapping[str, np.ndarray[Any, Any]] | None
) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="batchpilot-int8-") as work:
        prepared = Path(work) / "prepared.onnx"
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        except Exception as exc:
            raise ConversionFailed(f"INT8 pre-processing (shape inference) failed: {exc}") from exc
        try:
            if calibration is None:
                quantize_dynamic(str(prepared), str(into))
            else:
                reader = _ArrayReader(calibration)
                assert isinstance(reader, CalibrationDataReader)  # by its subclass hook
                quantize_static(
                    str(prepared),
                    str(into),
                    reader,
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                )
        except Exception as exc:
            raise ConversionFailed(f"INT8 quantization failed: {exc}") from exc
    if not quantized_op_count(onnx.load(str(into))):
        raise OptimizeError(
            "nothing in the model can be quantized to INT8: onnxruntime found no Conv, MatMul, "
            "Gemm or similar operator with float weights"
        )
