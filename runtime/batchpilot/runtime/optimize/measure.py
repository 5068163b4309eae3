"""Running the original and its variants on the same rows, and timing them side by side.

Every session is opened with the same `SessionConfig` and providers. Throughput is measured in
interleaved rounds (each model gets a short burst per round, in turn) so that whatever else the
machine does meanwhile falls on every model alike; each burst is bounded in time and in calls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.runtime.onnx_engine import SessionConfig, open_session
from batchpilot.runtime.optimize.plan import take_rows

EVAL_CHUNK_ROWS = 8


def open_sessions(
    paths: Mapping[str, Path], *, providers: Sequence[str], config: SessionConfig
) -> dict[str, Any]:
    return {
        name: open_session(path, providers=list(providers), config=config)
        for name, path in paths.items()
    }


def run_rows(
    session: Any, inputs: Mapping[str, np.ndarray[Any, Any]]
) -> dict[str, np.ndarray[Any, Any]]:
    """Every output for every row of `inputs`, computed a few rows at a time."""
    names = [out.name for out in session.get_outputs()]
    total = len(next(iter(inputs.values())))
    parts: list[list[np.ndarray[Any, Any]]] = [[] for _ in names]
    for start in range(0, total, EVAL_CHUNK_ROWS):
        feeds = {k: v[start : start + EVAL_CHUNK_ROWS] for k, v in inputs.items()}
        for part, result in zip(parts, session.run(names, feeds), strict=True):
            part.append(np.asarray(result))
    return {name: np.concatenate(part) for name, part in zip(names, parts, strict=True)}


def side_by_side(
    sessions: Mapping[str, Any],
    rows: Mapping[str, np.ndarray[Any, Any]],
    *,
    batches: Sequence[int],
    seconds: float,
    rounds: int = 5,
    max_calls_per_burst: int = 20_000,
) -> dict[str, dict[int, float]]:
    """Rows per second of each session at each batch size; `seconds` per session and batch."""
    burst_s = seconds / rounds
    result: dict[str, dict[int, float]] = {name: {} for name in sessions}
    for batch in batches:
        feeds = take_rows(rows, 0, batch)
        elapsed = dict.fromkeys(sessions, 0.0)
        calls = dict.fromkeys(sessions, 0)
        names = {name: [o.name for o in s.get_outputs()] for name, s in sessions.items()}
        for name, session in sessions.items():
            session.run(names[name], feeds)  # warm-up: allocations for this shape
        for _ in range(rounds):
            for name, session in sessions.items():
                n, start = 0, time.perf_counter()
                deadline = start + burst_s
                while n < max_calls_per_burst:
                    session.run(names[name], feeds)
                    n += 1
                    if time.perf_counter() >= deadline:
                        break
                elapsed[name] += time.perf_counter() - start
                calls[name] += n
        for name in sessions:
            result[name][batch] = batch * calls[name] / elapsed[name]
    return result
