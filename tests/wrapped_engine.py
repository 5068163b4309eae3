"""An engine around another, for tests that make it fail, hang or record what it ran: the
signature, info and close are the inner engine's; a subclass overrides `run`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from batchpilot.runtime.engine import Engine, EngineInfo, ModelSignature


class Wrapped:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def signature(self) -> ModelSignature:
        return self._engine.signature

    @property
    def info(self) -> EngineInfo:
        return self._engine.info

    async def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        return await self._engine.run(inputs)

    async def close(self) -> None:
        await self._engine.close()
