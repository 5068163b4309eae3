"""Triton's statistics extension: what the model did since the server started, in counts and
cumulative nanoseconds, for tools that read it between two moments and divide (Triton's
perf_analyzer prints the server's side of each measurement from it: queue, compute input,
compute infer, compute output, and the rest as overhead).

Prometheus has the same signals as histograms and rates (`metrics`); this is the other shape
Triton's clients expect: `GET /v2/models[/{name}[/versions/{version}]]/stats` and gRPC's
ModelStatistics give `snapshot()`. Pure: counters updated from the event loop, where requests
end and batches are answered.

What counts where, as Triton counts it:

- `success` / `fail`: requests the model took, by how they ended, with their time in the server
  (from the request's arrival to its answer). A request refused before it reached the model (an
  API key, a quota) is in neither; one refused by admission, timed out, invalid or cancelled by
  its client is a failure.
- `queue`, `compute_input`, `compute_infer`, `compute_output`: per request of a batch that ran,
  its wait from the queue to its batch, and its batch's time to gather the inputs, to run the
  engine and to hand each request its rows: every request of a batch is charged the batch's
  whole times, so their means are what one request saw.
- `batch_stats`: the same three times per batch that ran, by its rows.
- `inference_count`: rows answered (a request of 8 rows is 8 inferences); `execution_count`:
  batches run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchpilot.runtime.outcomes import BatchDone

NS = 1_000_000_000


@dataclass(slots=True)
class Duration:
    """A count and the nanoseconds summed over it (Triton's StatisticDuration)."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, times: int = 1) -> None:
        self.count += times
        self.ns += max(0, round(seconds * NS)) * times

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class _Batches:
    """The times of the batches of one size (Triton's InferBatchStatistics)."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class InferenceStatistics:
    """One model's statistics since start. `wall_clock` (seconds since the epoch) dates the last
    inference."""

    def __init__(self, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self._by_rows: dict[int, _Batches] = {}

    def request_ended(self, *, success: bool, duration_s: float | None) -> None:
        """A request the model took ended; `duration_s` is its time in the server (None where
        it is not known: a client that went away counts with none)."""
        (self.success if success else self.fail).add(duration_s or 0.0)
        self.last_inference_ms = int(self._wall_clock() * 1000)

    def batch_done(self, done: BatchDone) -> None:
        """A batch ran and answered its requests."""
        requests = done.requests
        self.inference_count += done.rows
        self.execution_count += 1
        for wait in (*done.queue_waits_s, *done.background_waits_s):
            self.queue.add(wait)
        times = (done.input_s, done.compute_s, done.output_s)
        sized = self._by_rows.get(done.rows)
        if sized is None:
            sized = self._by_rows[done.rows] = _Batches()
        for per_request, per_batch, seconds in zip(
            (self.compute_input, self.compute_infer, self.compute_output),
            (sized.compute_input, sized.compute_infer, sized.compute_output),
            times,
            strict=True,
        ):
            per_request.add(seconds, requests)
            per_batch.add(seconds)

    def snapshot(self, *, name: str, version: str) -> dict[str, Any]:
        """The model's entry of Triton's statistics response (`model_stats`' element), under
        its field names: the same document parses into gRPC's ModelStatistics."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                # No response cache: nothing is ever a hit or a miss.
                "cache_hit": Duration().as_json(),
                "cache_miss": Duration().as_json(),
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": sized.compute_input.as_json(),
                    "compute_infer": sized.compute_infer.as_json(),
                    "compute_output": sized.compute_output.as_json(),
                }
                for rows, sized in sorted(self._by_rows.items())
            ],
        }
