"""A simulated accelerator: per-batch time α + β·batch, no computation, no CPU burnt.

It lets the batcher, the metrics and the autopilot's control loop run on any laptop as they would
on a GPU, where a batch of b rows takes about α + β·b. The model file still defines the inputs and
outputs (so requests are validated exactly as for the real model); outputs are zeros. The engine
says it is simulated in the model metadata, in its `batchpilot_engine_info` metric and in the log.
The batch "runs" on a loop timer, so a simulated replica costs nothing while it computes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.runtime.engine import EngineInfo, ModelSignature
from batchpilot.runtime.onnx_engine import SessionConfig, open_session, signature_of
from batchpilot.runtime.protocol import DATATYPES


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Per-batch compute time t(b) = α + β·b."""

    alpha_s: float
    beta_s: float

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or self.beta_s < 0:
            raise ValueError("alpha and beta must not be negative")

    def seconds(self, rows: int) -> float:
        return self.alpha_s + self.beta_s * rows

    @classmethod
    def parse(cls, text: str) -> LatencyModel:
        """Parse `alpha_ms=A,beta_ms=B` (the CLI form)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(r"(alpha_ms|beta_ms)=([0-9]*\.?[0-9]+)", part)
            if match is None:
                raise ValueError(f"expected alpha_ms=A,beta_ms=B, got {text!r}")
            values[match[1]] = float(match[2])
        if set(values) != {"alpha_ms", "beta_ms"}:
            raise ValueError(f"expected both alpha_ms and beta_ms, got {text!r}")
        return cls(alpha_s=values["alpha_ms"] / 1e3, beta_s=values["beta_ms"] / 1e3)


class SimulatedEngine:
    def __init__(self, signature: ModelSignature, latency: LatencyModel) -> None:
        self._signature = signature
        self._latency = latency
        self._info = EngineInfo(
            kind="simulated",
            device="gpu",
            simulated=True,
            detail=(
                f"simulated accelerator: t(b) = {latency.alpha_s * 1e3:g} ms + "
                f"{latency.beta_s * 1e3:g} ms x b"
            ),
        )

    @classmethod
    def load(cls, path: Path, *, name: str, latency: LatencyModel) -> SimulatedEngine:
        """Read the model's signature from its file; the model itself never runs."""
        session = open_session(path, providers=["CPUExecutionProvider"], config=SessionConfig())
        signature = signature_of(session, name=name, platform="simulated")
        return cls(signature, latency)

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def latency(self) -> LatencyModel:
        return self._latency

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        rows = next(iter(inputs.values())).shape[0]
        await asyncio.sleep(self._latency.seconds(rows))
        return {
            spec.name: np.zeros(
                (rows, *(d if d >= 0 else 1 for d in spec.shape[1:])),
                dtype=DATATYPES[spec.datatype],
            )
            for spec in self._signature.outputs
        }

    async def close(self) -> None:
        return None
