"""What the server needs from an engine, and the model signature it serves.

The batching core and the HTTP layer talk to an `Engine` and nothing else, so the onnxruntime
engine and the simulated accelerator are interchangeable, and tests can hand in their own.
An engine declares in `EngineInfo.instances` how many batches it can run at once (model instances,
like Triton's instance_group count); the batcher calls `run` concurrently at most that many times,
and with one instance never concurrently. An engine called more often than it has instances must
queue the extra calls, never fail them.

An engine that can time its batches where they run (its own thread, its device) says so with
`run_timed` (`TimedEngine`): the batcher's clock reads the batch's end only when the event loop
gets to it, and a loop busy reading a burst of requests would add its stall to the batch's time —
to the fit t(b) admission predicts from, and to the compute time the autopilot learns from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from batchpilot.runtime.protocol.tensors import DATATYPES


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output as the model declares it; -1 marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def as_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


DEFAULT_VERSION = "1"
"""The version of a model whose file names none, as a Triton model repository's one version
directory would make it: Triton's tools read versions as numbers (perf_analyzer parses the
statistics' version to find the latest) and some clients name version 1 outright."""


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """The model as the v2 metadata endpoint describes it. Dimension 0 is the batch axis."""

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    version: str | None = None
    """The model's own version, where its file names one."""

    @property
    def served_version(self) -> str:
        """The version clients see and name: the model's own, or `DEFAULT_VERSION`."""
        return self.version or DEFAULT_VERSION

    def input(self, name: str) -> TensorSpec | None:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """How the engine runs, for metadata, logs and the `batchpilot_engine_info` metric."""

    kind: str
    """"onnxruntime" or "simulated"."""
    device: str
    """"gpu" or "cpu"; for the simulated engine, the accelerator it pretends to be."""
    simulated: bool
    providers: tuple[str, ...] = ()
    detail: str = ""
    instances: int = 1
    """Batches the engine runs at once; the batcher runs this many workers."""
    variant: str = "original"
    """Which file of the model is served: "original", "fp16" or "int8" (`batchpilot optimize`)."""


class Engine(Protocol):
    """Runs batches. Arrays in and out have the batch on axis 0."""

    @property
    def signature(self) -> ModelSignature: ...

    @property
    def info(self) -> EngineInfo: ...

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        """Run one batch; returns every output of the model by name. Up to `info.instances`
        calls may be in flight at once."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Ran:
    """One batch's outputs and its compute time, measured where the batch ran."""

    outputs: dict[str, Any]
    seconds: float


@runtime_checkable
class TimedEngine(Engine, Protocol):
    """An engine that times its batches itself (see the module's note)."""

    async def run_timed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Ran:
        """`run`, with the seconds the batch computed: from its start on a free instance to its
        outputs, without the wait for an instance or for the event loop."""
        ...


def example_inputs(signature: ModelSignature, *, rows: int = 1) -> dict[str, np.ndarray[Any, Any]]:
    """Zero-filled inputs with `rows` rows; other dynamic dimensions become 1."""
    return {
        spec.name: np.zeros(
            (rows, *(d if d >= 0 else 1 for d in spec.shape[1:])), dtype=DATATYPES[spec.datatype]
        )
        for spec in signature.inputs
    }
