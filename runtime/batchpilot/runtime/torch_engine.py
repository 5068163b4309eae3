"""The PyTorch engine: a TorchScript (`.pt`) or `torch.export` (`.pt2`) program, on CUDA when
PyTorch sees a GPU, on the CPU otherwise.

It is the engine for GPUs where onnxruntime-gpu is not installed, and for the format most models
already come in. The contract is the other engines': the v2 signature, warm-up before the server
reports ready, one call per batch on the concatenated rows, outputs as numpy arrays by name. The
batcher times each call and counts the device busy, as for any engine; a call returns only once
its outputs are back in host memory, so on a GPU that time is the device's, copies included.

This module runs programs; `torch_program` loads them (which archive, which device, which
signature). The FP16 variant is the same program run under autocast: matrix products and
convolutions in float16, outputs cast back to the declared datatypes, so clients never notice.

Model instances (`--instances N`) share the one set of weights: each has its own thread (and on a
GPU its own CUDA stream), so N batches are in flight at once. On the CPU, N instances split the
cores between them (`threads_per_instance`), as the onnxruntime engine's sessions do.

Only this module and `torch_program` import torch (an import-linter contract says so); the server
imports the engine only when `--engine torch` is asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchpilot.runtime.device import DeviceChoice
from batchpilot.runtime.engine import EngineInfo, ModelSignature, Ran, example_inputs
from batchpilot.runtime.errors import first_line
from batchpilot.runtime.instances import Instances
from batchpilot.runtime.metrics import available_cores
from batchpilot.runtime.onnx_engine import ModelLoadError, threads_per_instance
from batchpilot.runtime.torch_program import (
    TORCH_TO_V2,
    V2_TO_TORCH,
    choose_device,
    load_program,
    program_format,
    signature_of,
)

WARM_UP_ROWS = (1, 1, 2)
"""Batches run before readiness: TorchScript's profiling executor specializes the graph on its
second call, and a batch of 2 proves dimension 0 is a batch axis the program accepts."""


def _writable(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """torch.from_numpy shares memory and warns on read-only arrays (a request's own buffer): those
    are copied, the concatenated batches the batcher forms are not."""
    return array if array.flags.writeable and array.flags.c_contiguous else array.copy()


class TorchEngine:
    def __init__(
        self,
        module: Callable[..., Any],
        *,
        signature: ModelSignature,
        info: EngineInfo,
        device: torch.device,
        fp16: bool = False,
    ) -> None:
        if info.instances < 1:
            raise ValueError(f"instances must be at least 1, got {info.instances}")
        self._module = module
        self._signature = signature
        self._info = info
        self._device = device
        self._fp16 = fp16
        self._output_dtypes = [V2_TO_TORCH[spec.datatype] for spec in signature.outputs]
        # One CUDA stream per instance (None on the CPU) over the one module's weights.
        streams: list[Any] = [
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # not annotated
            if device.type == "cuda"
            else None
            for _ in range(info.instances)
        ]
        self._instances = Instances(streams, thread_name="torch")

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        name: str,
        device: DeviceChoice = "auto",
        instances: int = 1,
        variant: str = "original",
        intra_op_threads: int = 0,
    ) -> TorchEngine:
        """Load the program, read its signature, and warm every instance up (blocking)."""
        if instances < 1:
            raise ValueError(f"instances must be at least 1, got {instances}")
        if variant not in ("original", "fp16"):
            raise ModelLoadError(
                f"variant {variant} is an ONNX file made by `batchpilot optimize`: the torch "
                "engine serves the original or fp16 (the same program under autocast)"
            )
        fmt = program_format(path)
        chosen = choose_device(device, cuda=torch.cuda.is_available())
        where = torch.device("cuda", torch.cuda.current_device()) if chosen == "gpu" else None
        target = where or torch.device("cpu")
        threads = intra_op_threads
        if chosen == "cpu" and instances > 1 and threads == 0:
            threads = threads_per_instance(instances=instances, cores=available_cores())
        if chosen == "cpu" and threads > 0:
            torch.set_num_threads(threads)
        program = load_program(path, target, fmt=fmt)
        signature = signature_of(program, path, name=name)
        placed = f"cuda:{target.index} {torch.cuda.get_device_name(target)}" if where else "cpu"
        layout = f", {instances} instances sharing the weights" if instances > 1 else ""
        threading = f", {threads} intra-op threads" if threads else ""
        info = EngineInfo(
            kind="torch",
            device=chosen,
            simulated=False,
            providers=(str(target),),
            detail=f"PyTorch {torch.__version__} {fmt} on {placed}"
            f"{', autocast FP16' if variant == 'fp16' else ''}{layout}{threading}",
            instances=instances,
            variant=variant,
        )
        engine = cls(
            program.module, signature=signature, info=info, device=target, fp16=variant == "fp16"
        )
        engine.warm_up()
        return engine

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def device(self) -> torch.device:
        return self._device

    @contextlib.contextmanager
    def _context(self, stream: Any) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if stream is not None:
                stack.enter_context(torch.cuda.stream(stream))
            if self._fp16:
                stack.enter_context(torch.autocast(self._device.type, dtype=torch.float16))
            yield

    def _outputs(self, result: Any) -> list[Any]:
        """The program's return value as one tensor per declared output, in order."""
        names = self._signature.output_names
        if isinstance(result, torch.Tensor):
            tensors = [result]
        elif isinstance(result, tuple | list):
            tensors = list(result)
        elif isinstance(result, dict):
            missing = [n for n in names if n not in result]
            if missing:
                raise ModelLoadError(
                    f"the program returns a dict with keys {sorted(result)}, without {missing}"
                )
            tensors = [result[n] for n in names]
        else:
            raise ModelLoadError(f"the program returns {type(result).__name__}, not tensors")
        if len(tensors) != len(names):
            raise ModelLoadError(
                f"the program returns {len(tensors)} outputs, the signature declares {len(names)}"
            )
        return tensors

    def _call(self, stream: Any, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        with self._context(stream):
            args = [
                torch.from_numpy(_writable(inputs[spec.name])).to(self._device)
                for spec in self._signature.inputs
            ]
            tensors = self._outputs(self._module(*args))
            # .cpu() waits for this stream's work: the call ends when the device is done.
            return {
                spec.name: tensor.to(dtype).cpu().numpy()
                for spec, tensor, dtype in zip(
                    self._signature.outputs, tensors, self._output_dtypes, strict=True
                )
            }

    def _check(self, stream: Any, rows: int) -> None:
        """One batch of `rows`, checked against the signature: what the program returns must be
        what clients were told they would get."""
        inputs = example_inputs(self._signature, rows=rows)
        with self._context(stream):
            args = [
                torch.from_numpy(inputs[s.name]).to(self._device) for s in self._signature.inputs
            ]
            tensors = self._outputs(self._module(*args))
        for spec, tensor in zip(self._signature.outputs, tensors, strict=True):
            if not isinstance(tensor, torch.Tensor):
                raise ModelLoadError(
                    f"output '{spec.name}' is {type(tensor).__name__}, not a tensor"
                )
            got = TORCH_TO_V2.get(tensor.dtype, str(tensor.dtype))
            if got != spec.datatype and not (self._fp16 and tensor.dtype == torch.float16):
                raise ModelLoadError(
                    f"output '{spec.name}' is {got}, the signature declares {spec.datatype}"
                )
            shape = tuple(tensor.shape)
            fits = len(shape) == len(spec.shape) and all(
                d == -1 or d == s for d, s in zip(spec.shape[1:], shape[1:], strict=True)
            )
            if not fits or shape[0] != rows:
                raise ModelLoadError(
                    f"output '{spec.name}' has shape {list(shape)} for a batch of {rows}, the "
                    f"signature declares {list(spec.shape)}"
                )

    def warm_up(self) -> None:
        """Run and check batches on every instance before the server reports ready, so the first
        caller pays no setup and a program that does not fit its signature never serves."""
        for stream in self._instances.handles:
            for rows in WARM_UP_ROWS:
                try:
                    self._check(stream, rows)
                except ModelLoadError:
                    raise
                except Exception as exc:
                    reason = first_line(exc)
                    if rows > 1:
                        raise ModelLoadError(
                            f"warm-up inference failed on a batch of {rows} rows (is dimension 0 "
                            f"a batch axis the program accepts?): {reason}"
                        ) from exc
                    raise ModelLoadError(f"warm-up inference failed: {reason}") from exc

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        """Run the batch on a free instance; with all of them busy, wait for one."""
        return await self._instances.run(lambda stream: self._call(stream, inputs))

    async def run_timed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Ran:
        """`run`, timed on the instance's thread (the outputs are on the host by then)."""
        outputs, seconds = await self._instances.run_timed(
            lambda stream: self._call(stream, inputs)
        )
        return Ran(outputs, seconds)

    async def close(self) -> None:
        self._instances.close()
