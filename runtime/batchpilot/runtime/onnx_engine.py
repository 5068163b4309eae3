"""The onnxruntime engine: one InferenceSession per model instance, each on its own thread.

`session.run` releases the GIL, so running it on its own thread keeps the event loop free to
parse, queue and answer requests while the model computes. One instance means one batch at a time,
what an accelerator stream does anyway. With N instances (`--instances`) the engine holds N
sessions, each with its own executor thread (and, on a GPU, its own CUDA stream), so N batches
run at once: the cores (or the device) stay busy while the event loop forms the next batch and
splits the last one. Each session holds its own copy of the weights.

N sessions with onnxruntime's default thread count would each start one intra-op thread per
core and fight over them, so with N > 1 and `intra_op_threads=0` each session gets
`max(1, cores // N)` intra-op threads (`threads_per_instance`), cores being what this process
may use (affinity and cgroup quota).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from batchpilot.runtime.device import (
    TENSORRT,
    Accelerator,
    DeviceChoice,
    Provider,
    choose_accelerated_providers,
)
from batchpilot.runtime.engine import (
    EngineInfo,
    ModelSignature,
    Ran,
    TensorSpec,
    example_inputs,
)
from batchpilot.runtime.instances import Instances
from batchpilot.runtime.metrics import available_cores

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


def threads_per_instance(*, instances: int, cores: float) -> int:
    """Intra-op threads per session, so that `instances` sessions together use each core once."""
    return max(1, int(cores // instances))


def default_tensorrt_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "batchpilot-tensorrt"


def _with_cache_dir(providers: list[Provider]) -> list[Provider]:
    """Create TensorRT's engine cache directory; without one, TensorRT runs uncached (every
    start rebuilds its engines) rather than not at all."""
    out = list(providers)
    for i, provider in enumerate(out):
        if isinstance(provider, tuple) and provider[0] == TENSORRT:
            name, options = provider
            try:
                Path(options["trt_engine_cache_path"]).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.warning("TensorRT engine cache disabled: %s", exc)
                out[i] = (
                    name,
                    {
                        **options,
                        "trt_engine_cache_enable": "False",
                        "trt_timing_cache_enable": "False",
                    },
                )
    return out


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


def open_session(path: Path, *, providers: Sequence[Provider], config: SessionConfig) -> Any:
    import onnxruntime as ort

    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    try:
        return ort.InferenceSession(
            str(path), sess_options=config.session_options(), providers=list(providers)
        )
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime cannot load {path}: {exc}") from exc


class OnnxEngine:
    def __init__(
        self, session: Any | Sequence[Any], *, signature: ModelSignature, info: EngineInfo
    ) -> None:
        sessions = list(session) if isinstance(session, Sequence) else [session]
        if not sessions:
            raise ValueError("OnnxEngine needs at least one session")
        self._instances = Instances(sessions, thread_name="onnxruntime")
        self._signature = signature
        self._info = info
        self._output_names = list(signature.output_names)

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        name: str,
        device: DeviceChoice = "auto",
        gpu_present: bool = False,
        config: SessionConfig | None = None,
        instances: int = 1,
        variant: str = "original",
        accelerator: Accelerator = "default",
        tensorrt_cache_dir: Path | None = None,
    ) -> OnnxEngine:
        """Open the model (once per instance), check it can be batched, and warm every session
        up (blocking)."""
        import onnxruntime as ort

        if instances < 1:
            raise ValueError(f"instances must be at least 1, got {instances}")
        config = config or SessionConfig()
        if instances > 1 and config.intra_op_threads == 0:
            threads = threads_per_instance(instances=instances, cores=available_cores())
            config = dataclasses.replace(config, intra_op_threads=threads)
        choice = choose_accelerated_providers(
            device,
            gpu_present=gpu_present,
            available=ort.get_available_providers(),
            accelerator=accelerator,
            fp16=variant == "fp16",
            tensorrt_cache_dir=str(tensorrt_cache_dir or default_tensorrt_cache_dir()),
        )
        if choice.warning is not None:
            log.warning("%s", choice.warning)
        chosen, providers = choice.device, _with_cache_dir(choice.providers)
        sessions = [open_session(path, providers=providers, config=config)]
        session = sessions[0]
        if chosen == "gpu" and "CUDAExecutionProvider" not in session.get_providers():
            raise ModelLoadError(
                "the CUDA provider failed to load (see onnxruntime's log above): CUDA and cuDNN "
                "libraries are missing or do not match this onnxruntime-gpu"
            )
        trt_requested = any(isinstance(p, tuple) and p[0] == TENSORRT for p in providers)
        if trt_requested and TENSORRT not in session.get_providers():
            log.warning(
                "the TensorRT provider failed to load (see onnxruntime's log above): running on %s",
                ", ".join(session.get_providers()),
            )
        signature = signature_of(session, name=name, platform="onnxruntime_onnx")
        sessions += [
            open_session(path, providers=providers, config=config) for _ in range(instances - 1)
        ]
        layout = (
            f", {instances} instances, {config.intra_op_threads or 'default'} intra-op threads each"
            if instances > 1
            else ""
        )
        info = EngineInfo(
            kind="onnxruntime",
            device=chosen,
            simulated=False,
            providers=tuple(session.get_providers()),
            detail=f"onnxruntime {ort.__version__}{layout}",
            instances=instances,
            variant=variant,
        )
        engine = cls(sessions, signature=signature, info=info)
        engine.warm_up()
        return engine

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def instances(self) -> int:
        return len(self._instances)

    def warm_up(self) -> None:
        """Run a batch on every session before the server reports ready, so the first caller
        pays no setup."""
        try:
            for session in self._instances.handles:
                session.run(self._output_names, example_inputs(self._signature))
        except Exception as exc:
            raise ModelLoadError(f"warm-up inference failed: {exc}") from exc

    def _run_on(self, session: Any, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        results = session.run(self._output_names, dict(inputs))
        return dict(zip(self._output_names, results, strict=True))

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        """Run the batch on a free instance; with all of them busy, wait for one."""
        return await self._instances.run(lambda session: self._run_on(session, inputs))

    async def run_timed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Ran:
        """`run`, timed on the instance's thread."""
        outputs, seconds = await self._instances.run_timed(
            lambda session: self._run_on(session, inputs)
        )
        return Ran(outputs, seconds)

    async def close(self) -> None:
        self._instances.close()
