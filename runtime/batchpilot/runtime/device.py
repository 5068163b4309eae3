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
