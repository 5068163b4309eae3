"""A simulated accelerator: per-batch time α + β·batch, no computation, no CPU burnt.

It lets the batcher, the metrics and the autopilot's control loop run on any laptop as they would
on a GPU, where a batch of b rows takes about α + β·b. The model file still defines the inputs and
outputs (so requests are validated exactly as for the real model); outputs are zeros. The engine
says it is simulated in the model metadata, in its `batchpilot_engine_info` metric and in the log.
The batch "runs" on a loop timer, so a simulated replica costs nothing while it computes.

Model instances (`--instances N`) on a simulated accelerator are N instances on one device, never
N devices: the device runs one batch at a time, so batches of different instances queue for it
(first come, first served) and the device's throughput is still at most max over b of b / t(b).
What N instances overlap is the host side: while one batch holds the device, the next is formed,
concatenated and waiting, and the last one's rows are handed back. This is the conservative
reading of a real GPU, where two streams can overlap only when a batch leaves the device
partly idle. With N > 1 the per-batch duration the batcher measures includes the wait for the
device, as it would include contention on a real one.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.runtime.engine import EngineInfo, ModelSignature, Ran
from batchpilot.runtime.onnx_engine import SessionConfig, open_session, signature_of
from batchpilot.runtime.protocol.tensors import DATATYPES

_PART = r"(alpha_ms|beta_ms|cv)=([0-9]*\.?[0-9]+)|(memory_rows)=([0-9]+)"
MAX_CV = 2.0
"""The most a simulated batch's time may vary (its coefficient of variation)."""


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Per-batch compute time t(b) = α + β·b, how much it varies, and how many rows the device
    has memory for."""

    alpha_s: float
    beta_s: float
    memory_rows: int | None = None
    """A batch of more rows fails as a GPU's would, out of memory; None: no such limit."""
    cv: float = 0.0
    """Each batch takes t(b) times a log-normal draw of mean 1 and this coefficient of
    variation, as a real device's batches vary (0: exactly t(b))."""

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or self.beta_s < 0:
            raise ValueError("alpha and beta must not be negative")
        if self.memory_rows is not None and self.memory_rows < 1:
            raise ValueError("memory_rows must be at least 1")
        if not 0 <= self.cv <= MAX_CV:
            raise ValueError(f"cv must be between 0 and {MAX_CV:g}")

    def seconds(self, rows: int) -> float:
        return self.alpha_s + self.beta_s * rows

    @classmethod
    def parse(cls, text: str) -> LatencyModel:
        """Parse `alpha_ms=A,beta_ms=B[,memory_rows=N][,cv=C]` (the CLI form)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(_PART, part)
            if match is None:
                raise ValueError(
                    f"expected alpha_ms=A,beta_ms=B[,memory_rows=N][,cv=C], got {text!r}"
                )
            values[match[1] or match[3]] = float(match[2] or match[4])
        if not {"alpha_ms", "beta_ms"} <= set(values):
            raise ValueError(f"expected both alpha_ms and beta_ms, got {text!r}")
        memory = values.get("memory_rows")
        return cls(
            alpha_s=values["alpha_ms"] / 1e3,
            beta_s=values["beta_ms"] / 1e3,
            memory_rows=None if memory is None else int(memory),
            cv=values.get("cv", 0.0),
        )


THROTTLED_PACE = 2.0
"""A throttled pretend device's batches take twice their time."""


class SimulatedEngine:
    def __init__(
        self, signature: ModelSignature, latency: LatencyModel, *, instances: int = 1
    ) -> None:
        if instances < 1:
            raise ValueError(f"instances must be at least 1, got {instances}")
        self._signature = signature
        self._latency = latency
        self._device = asyncio.Lock()
        """The one simulated device: a batch holds it for t(b); asyncio.Lock is FIFO."""
        self._pace = 1.0
        """Every batch takes this many times t(b): more than 1 once the device throttles."""
        sigma = math.sqrt(math.log1p(latency.cv * latency.cv))
        self._variation = (np.random.default_rng(), sigma) if latency.cv > 0 else None
        """Where batch times vary: the generator of their log-normal factors, and its σ."""
        self._info = EngineInfo(
            kind="simulated",
            device="gpu",
            simulated=True,
            detail=(
                f"simulated accelerator: t(b) = {latency.alpha_s * 1e3:g} ms + "
                f"{latency.beta_s * 1e3:g} ms x b"
                + (f" ± {latency.cv:.0%}" if latency.cv else "")
                + (f", memory for {latency.memory_rows} rows" if latency.memory_rows else "")
                + (f"; {instances} instances sharing one device" if instances > 1 else "")
            ),
            instances=instances,
        )

    @classmethod
    def load(
        cls, path: Path, *, name: str, latency: LatencyModel, instances: int = 1
    ) -> SimulatedEngine:
        """Read the model's signature from its file; the model itself never runs."""
        session = open_session(path, providers=["CPUExecutionProvider"], config=SessionConfig())
        signature = signature_of(session, name=name, platform="simulated")
        return cls(signature, latency, instances=instances)

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def latency(self) -> LatencyModel:
        return self._latency

    def throttle(self, factor: float = THROTTLED_PACE) -> None:
        """The pretend device throttles from now on, as a GPU at its power or thermal limit
        does: every batch takes `factor` times t(b). `runtime serve` calls it on SIGUSR1 (the
        sandbox's `--throttle-pod`: a replica slower than its peers)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"a throttled device's pace is a positive factor, not {factor}")
        self._pace = factor

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        return (await self.run_timed(inputs)).outputs

    async def run_timed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Ran:
        """The batch takes the latency model's time on the pretend device: that is its compute
        time, however late the event loop wakes from the sleep that stands for it."""
        rows = next(iter(inputs.values())).shape[0]
        memory = self._latency.memory_rows
        if memory is not None and rows > memory:
            raise RuntimeError(
                f"CUDA out of memory (simulated): a batch of {rows} rows, memory for {memory}"
            )
        seconds = self._latency.seconds(rows) * self._pace
        if self._variation is not None:
            rng, sigma = self._variation
            seconds *= float(rng.lognormal(-sigma * sigma / 2, sigma))
        async with self._device:
            await asyncio.sleep(seconds)
        outputs = {
            spec.name: np.zeros(
                (rows, *(d if d >= 0 else 1 for d in spec.shape[1:])),
                dtype=DATATYPES[spec.datatype],
            )
            for spec in self._signature.outputs
        }
        return Ran(outputs, seconds)

    async def close(self) -> None:
        return None
