"""Which accelerator is here, decided before onnxruntime is asked for anything.

onnxruntime-gpu lists the CUDA provider even on machines without a GPU, then fails to load it and
falls back to the CPU with a loud error. So the device is decided first, from NVML, and the engine
asks only for providers that can work. NVML is also the source of the GPU utilization and memory
gauges; without a GPU they are absent, never faked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

DeviceChoice = Literal["auto", "cpu", "gpu"]
Accelerator = Literal["default", "tensorrt"]
Provider = str | tuple[str, dict[str, str]]
"""An onnxruntime provider: its name, or its name and provider options."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    name: str
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


class Nvml:
    """A live NVML handle over the GPUs this process can see."""

    def __init__(self, module: Any, handles: list[Any]) -> None:
        self._nvml = module
        self._handles = handles

    @classmethod
    def probe(cls) -> Nvml | None:
        """NVML with at least one GPU, or None (no driver, no library, no device)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # NVMLError, OSError, ImportError: all mean "no usable GPU"
            log.info("no NVIDIA GPU visible through NVML (%s)", exc)
            return None
        if not handles:
            return None
        return cls(pynvml, handles)

    @property
    def count(self) -> int:
        return len(self._handles)

    def names(self) -> list[str]:
        return [_text(self._nvml.nvmlDeviceGetName(h)) for h in self._handles]

    def sample(self) -> list[GpuSample]:
        """One reading per GPU; a GPU that fails to answer is left out of this reading."""
        samples = []
        for index, handle in enumerate(self._handles):
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                name = _text(self._nvml.nvmlDeviceGetName(handle))
            except Exception as exc:
                log.warning("NVML reading of GPU %d failed: %s", index, exc)
                continue
            samples.append(
                GpuSample(
                    index=index,
                    name=name,
                    utilization_pct=float(util.gpu),
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                )
            )
        return samples


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class DeviceUnavailable(RuntimeError):
    """The requested device cannot be used here."""


def choose_providers(
    choice: DeviceChoice, *, gpu_present: bool, available: list[str]
) -> tuple[Literal["gpu", "cpu"], list[str]]:
    """The device to run on and the onnxruntime providers to ask for, in order.

    `auto` takes the GPU when NVML sees one and the CUDA provider is installed, the CPU otherwise.
    `gpu` insists, and fails with the reason rather than quietly running on the CPU.
    """
    has_cuda = "CUDAExecutionProvider" in available
    if choice == "cpu" or (choice == "auto" and not (gpu_present and has_cuda)):
        return "cpu", ["CPUExecutionProvider"]
    if not gpu_present:
        raise DeviceUnavailable("device gpu was requested but NVML sees no NVIDIA GPU")
    if not has_cuda:
        raise DeviceUnavailable(
            "device gpu was requested but this onnxruntime has no CUDAExecutionProvider "
            "(install onnxruntime-gpu, the runtime-gpu extra)"
        )
    return "gpu", ["CUDAExecutionProvider", "CPUExecutionProvider"]


TENSORRT = "TensorrtExecutionProvider"


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """Where the model runs and the providers to ask for, in order of preference."""

    device: Literal["gpu", "cpu"]
    providers: list[Provider]
    warning: str | None = None
    """Why the accelerator that was asked for is not used (log it as a warning)."""


def choose_accelerated_providers(
    choice: DeviceChoice,
    *,
    gpu_present: bool,
    available: list[str],
    accelerator: Accelerator,
    fp16: bool,
    tensorrt_cache_dir: str,
) -> ProviderChoice:
    """`choose_providers`, with TensorRT first when it was asked for and can work here.

    TensorRT takes the subgraphs it supports; CUDA then the CPU run the rest. FP16 kernels are
    allowed only for an FP16 variant, so a model's numbers never change behind its back. Built
    engines are cached in `tensorrt_cache_dir`, so a restart does not rebuild them. When TensorRT
    cannot work (no GPU, the CPU was chosen, no TensorRT provider in this onnxruntime), this is the
    usual CUDA/CPU choice plus a warning that says why: an accelerator is an optimization, never
    a reason not to serve.
    """
    device, providers = choose_providers(choice, gpu_present=gpu_present, available=available)
    plain: list[Provider] = list(providers)
    if accelerator == "default":
        return ProviderChoice(device, plain)
    reason = None
    if device == "cpu":
        if choice == "cpu":
            reason = "device cpu was chosen"
        elif not gpu_present:
            reason = "NVML sees no NVIDIA GPU"
        else:
            reason = "this onnxruntime has no CUDAExecutionProvider (the runtime-gpu extra)"
    elif TENSORRT not in available:
        reason = (
            "this onnxruntime has no TensorrtExecutionProvider (onnxruntime-gpu built with "
            "TensorRT, and the TensorRT libraries)"
        )
    if reason is not None:
        return ProviderChoice(
            device,
            plain,
            warning=f"accelerator tensorrt was requested but {reason}: running on {device} with "
            f"{', '.join(providers)}",
        )
    options = {
        "trt_fp16_enable": "True" if fp16 else "False",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": tensorrt_cache_dir,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": tensorrt_cache_dir,
    }
    return ProviderChoice("gpu", [(TENSORRT, options), *plain])
