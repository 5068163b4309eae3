"""The onnxruntime engine: one InferenceSession, batches run on a dedicated thread.

`session.run` releases the GIL, so running it on its own thread keeps the event loop free to
parse, queue and answer requests while the model computes. One thread means one batch at a time,
which is what the batcher assumes and what an accelerator stream does anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from batchpilot.runtime.device import DeviceChoice, choose_providers
from batchpilot.runtime.engine import EngineInfo, ModelSignature, TensorSpec
from batchpilot.runtime.protocol import DATATYPES

log = logging.getLogger(__name__)

ONNX_TO_V2 = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
}

GraphOptimization = Literal["disabled", "basic", "extended", "all"]


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """onnxruntime session options; the same object configures the server and the benchmark.

    0 threads means onnxruntime's default (one per physical core).
    """

    intra_op_threads: int = 0
    inter_op_threads: int = 0
    graph_optimization: GraphOptimization = "all"

    def session_options(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Idle intra-op threads would spin between batches and take the event loop's core.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = {
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization]
        return options


class ModelLoadError(RuntimeError):
    """The model file cannot be served; the message says why."""


def _dims(shape: Any) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


def _spec(node: Any, what: str) -> TensorSpec:
    datatype = ONNX_TO_V2.get(node.type)
    if datatype is None:
        raise ModelLoadError(f"{what} '{node.name}' has type {node.type}, which is not supported")
    return TensorSpec(node.name, datatype, _dims(node.shape))


def signature_of(session: Any, *, name: str, platform: str) -> ModelSignature:
    """The v2 signature of an onnxruntime session. Dimension 0 must be the batch axis."""
    inputs = tuple(_spec(node, "input") for node in session.get_inputs())
    outputs = tuple(_spec(node, "output") for node in session.get_outputs())
    for spec in (*inputs, *outputs):
        if not spec.shape or spec.shape[0] != -1:
            raise ModelLoadError(
                f"'{spec.name}' has shape {list(spec.shape)}: dimension 0 must be a dynamic "
                "batch axis for the model to be batched"
            )
    return ModelSignature(name=name, platform=platform, inputs=inputs, outputs=outputs)


def open_session(path: Path, *, providers: list[str], config: SessionConfig) -> Any:
    import onnxruntime as ort

    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    try:
        return ort.InferenceSession(
            str(path), sess_options=config.session_options(), providers=providers
        )
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime cannot load {path}: {exc}") from exc


def example_inputs(signature: ModelSignature, *, rows: int = 1) -> dict[str, np.ndarray[Any, Any]]:
    """Zero-filled inputs with `rows` rows; other dynamic dimensions become 1."""
    return {
        spec.name: np.zeros(
            (rows, *(d if d >= 0 else 1 for d in spec.shape[1:])), dtype=DATATYPES[spec.datatype]
        )
        for spec in signature.inputs
    }


class OnnxEngine:
    def __init__(self, session: Any, *, signature: ModelSignature, info: EngineInfo) -> None:
        self._session = session
        self._signature = signature
        self._info = info
        self._output_names = list(signature.output_names)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxruntime")

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        name: str,
        device: DeviceChoice = "auto",
        gpu_present: bool = False,
        config: SessionConfig | None = None,
    ) -> OnnxEngine:
        """Open the model, check it can be batched, and warm it up (blocking)."""
        import onnxruntime as ort

        config = config or SessionConfig()
        chosen, providers = choose_providers(
            device, gpu_present=gpu_present, available=ort.get_available_providers()
        )
        session = open_session(path, providers=providers, config=config)
        if chosen == "gpu" and "CUDAExecutionProvider" not in session.get_providers():
            raise ModelLoadError(
                "the CUDA provider failed to load (see onnxruntime's log above): CUDA and cuDNN "
                "libraries are missing or do not match this onnxruntime-gpu"
            )
        signature = signature_of(session, name=name, platform="onnxruntime_onnx")
        info = EngineInfo(
            kind="onnxruntime",
            device=chosen,
            simulated=False,
            providers=tuple(session.get_providers()),
            detail=f"onnxruntime {ort.__version__}",
        )
        engine = cls(session, signature=signature, info=info)
        engine.warm_up()
        return engine

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def info(self) -> EngineInfo:
        return self._info

    def warm_up(self) -> None:
        """Run a batch before the server reports ready, so the first caller pays no setup."""
        try:
            self._session.run(self._output_names, example_inputs(self._signature))
        except Exception as exc:
            raise ModelLoadError(f"warm-up inference failed: {exc}") from exc

    def _run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        results = self._session.run(self._output_names, dict(inputs))
        return dict(zip(self._output_names, results, strict=True))

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, inputs)

    async def close(self) -> None:
        self._executor.shutdown(wait=True)
