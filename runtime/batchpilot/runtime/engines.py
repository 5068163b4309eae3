"""Which engine serves the model: onnxruntime (the default), the simulated accelerator, or
PyTorch — chosen by `--engine`, loaded from the file `--model` (or its variant) names. The torch
engine is imported only when asked for, so servers of ONNX models never import torch.
"""

from __future__ import annotations

from pathlib import Path

from batchpilot.runtime.device import Nvml
from batchpilot.runtime.engine import Engine
from batchpilot.runtime.onnx_engine import ModelLoadError, OnnxEngine, SessionConfig
from batchpilot.runtime.optimize.variants import missing_variant_message, variant_path
from batchpilot.runtime.settings import RuntimeSettings
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine


def model_file(settings: RuntimeSettings) -> Path:
    """The file to serve: the model, or its variant `<stem>.<variant>.onnx` beside it."""
    path = variant_path(settings.model_path, settings.model_variant)
    if not path.is_file() and settings.model_variant != "original":
        raise ModelLoadError(missing_variant_message(settings.model_path, settings.model_variant))
    return path


def torch_engine(settings: RuntimeSettings) -> Engine:
    """The PyTorch engine; imported here, so that only servers of PyTorch programs import torch."""
    try:
        from batchpilot.runtime.torch_engine import TorchEngine
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ModelLoadError(
            "--engine torch needs PyTorch, which is not installed here: pip install "
            "'batchpilot[runtime,torch]' (or a runtime image built with the torch extra)"
        ) from exc
    return TorchEngine.load(
        settings.model_path,
        name=settings.model_name,
        device=settings.device,
        instances=settings.instances,
        variant=settings.model_variant,
        intra_op_threads=settings.intra_op_threads,
    )


def build_engine(settings: RuntimeSettings, *, nvml: Nvml | None) -> Engine:
    if settings.engine == "torch":
        return torch_engine(settings)
    if settings.engine == "simulated":
        return SimulatedEngine.load(
            model_file(settings),
            name=settings.model_name,
            latency=LatencyModel.parse(settings.simulated_latency),
            instances=settings.instances,
        )
    return OnnxEngine.load(
        model_file(settings),
        name=settings.model_name,
        device=settings.device,
        gpu_present=nvml is not None,
        config=SessionConfig(
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            graph_optimization=settings.graph_optimization,
        ),
        instances=settings.instances,
        variant=settings.model_variant,
        accelerator=settings.accelerator,
        tensorrt_cache_dir=settings.tensorrt_cache_dir,
    )
