"""Load generator for any Open Inference Protocol v2 endpoint: `batchpilot loadgen`.

Sizing a service the textbook way needs a client that does not lie. Three things make load
generators lie, and this one is built around avoiding them:

- **Coordinated omission.** A closed loop (fixed concurrency) slows down when the server does,
  so it never offers the load that would hurt. The open loop here schedules every arrival in
  advance (Poisson or evenly spaced, from a rate or a piecewise-constant rate schedule) and sends
  each at its scheduled time whatever is outstanding; latency is measured from the *scheduled*
  send time (the service latency from the actual send time is kept too).
- **A client that is the bottleneck.** It shares a small machine with the server under test, so
  the request body is encoded once and reused, responses are read but not decoded (unless
  `--verify`), and each request costs one `session.post`.
- **Averages.** The report gives exact nearest-rank percentiles from every recorded sample,
  errors by kind (load shed with 503/429 counted apart from real failures), and per-window
  time series for plotting.

`--find-max --sla-ms 100` searches the highest constant rate whose P99 stays within the SLA with
no errors: exponential ramp, then bisection, each probe stopping early once it can no longer
pass. Schedules, arrival times, statistics and the search steps are pure functions, so the tests
check them without a server; the HTTP part is a thin layer around them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import dataclasses
import math
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypedDict, TypeVar

import aiohttp
import numpy as np
import orjson
from yarl import URL

from batchpilot.runtime.protocol import (
    DATATYPES,
    HEADER_LENGTH,
    Tensor,
    decode_response,
    encode_request,
)

ArrivalProcess = Literal["poisson", "uniform"]

MAX_DURATION_S: Final = 24 * 3600.0
"""The longest run the generator accepts; every run also stops at duration + timeout."""
MAX_ARRIVALS: Final = 10_000_000
"""Arrivals are scheduled in advance; this bounds the memory that takes (~80 MB of floats)."""
MAX_RATE_RPS: Final = 1_000_000.0
SHED_KINDS: Final = frozenset({"503", "429"})
"""Statuses a healthy server answers with when it sheds load: expected under overload, so the
report counts them apart from failures."""
DROPPED_CLIENT: Final = "dropped_client"
TIMEOUT: Final = "timeout"
CONNECTION: Final = "connection"
UNFINISHED: Final = "unfinished"
"""A request still outstanding when the run stopped (hard time cap, or a probe stopped early)."""
INVALID_RESPONSE: Final = "invalid_response"
_HARD_CAP_GRACE_S: Final = 1.0
_YIELD_EVERY: Final = 64
"""When the scheduler is behind, it launches due arrivals back to back; it yields to the loop
every this many so the requests it started get to run."""

_T = TypeVar("_T")

Clock = Callable[[], float]
PRECISE_CLOCK: Final[Clock] = time.perf_counter
"""Timestamps come from this clock, not the loop's: uvloop's `loop.time()` has millisecond
resolution and is cached per loop iteration, which would quantize every latency to 1 ms."""


class TargetError(Exception):
    """The target cannot be load-tested: unreachable, unknown model, or metadata we can't use."""


# --- Rate schedules and arrival times (pure) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """A piecewise-constant offered rate: `points[i] = (t_seconds, rate_rps)` holds from its time
    until the next point's; the rate before the first point is 0."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a rate schedule needs at least one point")
        last = -math.inf
        for t, rate in self.points:
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"schedule time {t} must be a finite number of seconds >= 0")
            if t <= last:
                raise ValueError(f"schedule times must increase strictly; {t} follows {last}")
            if not (math.isfinite(rate) and 0 <= rate <= MAX_RATE_RPS):
                raise ValueError(f"schedule rate {rate} must be between 0 and {MAX_RATE_RPS:g}")
            last = t

    @classmethod
    def constant(cls, rate_rps: float) -> RateSchedule:
        return cls(((0.0, float(rate_rps)),))

    @classmethod
    def parse(cls, text: str) -> RateSchedule:
        """Parse ``"0:50,20:400,40:100"`` (t_seconds:rate_rps pairs)."""
        points: list[tuple[float, float]] = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            t_text, sep, rate_text = item.partition(":")
            if not sep:
                raise ValueError(f"schedule item {item!r} is not t_seconds:rate_rps")
            try:
                points.append((float(t_text), float(rate_text)))
            except ValueError:
                raise ValueError(f"schedule item {item!r} is not t_seconds:rate_rps") from None
        return cls(tuple(points))

    @classmethod
    def from_csv(cls, path: str | Path) -> RateSchedule:
        """Read the project's traffic-trace CSV: a ``t_seconds,rate_rps`` header, then rows.
        Other columns are ignored; blank lines and lines starting with ``#`` are skipped."""
        with open(path, newline="") as f:
            lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
        reader = csv.DictReader(lines)
        fields = [name.strip() for name in reader.fieldnames or ()]
        if "t_seconds" not in fields or "rate_rps" not in fields:
            raise ValueError(f"{path}: the header must name t_seconds and rate_rps, got {fields}")
        reader.fieldnames = fields
        points: list[tuple[float, float]] = []
        for row_no, row in enumerate(reader, start=2):
            try:
                points.append((float(row["t_seconds"]), float(row["rate_rps"])))
            except (TypeError, ValueError):
                raise ValueError(f"{path}: row {row_no} is not numeric: {row}") from None
        return cls(tuple(points))

    def rate_at(self, t: float) -> float:
        rate = 0.0
        for start, r in self.points:
            if start > t:
                break
            rate = r
        return rate

    def segments(self, duration_s: float) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Segment start times within [0, duration) and their rates (a 0-rate lead-in if the
        schedule starts after 0)."""
        points = self.points if self.points[0][0] == 0 else ((0.0, 0.0), *self.points)
        kept = [(t, r) for t, r in points if t < duration_s] or [points[0]]
        starts = np.array([t for t, _ in kept], dtype=np.float64)
        rates = np.array([r for _, r in kept], dtype=np.float64)
        return starts, rates

    def expected_arrivals(self, duration_s: float) -> float:
        """The integral of the rate over [0, duration): the mean number of arrivals."""
        starts, rates = self.segments(duration_s)
        ends = np.append(starts[1:], duration_s)
        return float(np.sum(rates * (ends - starts)))

    def mean_rate(self, duration_s: float) -> float:
        return self.expected_arrivals(duration_s) / duration_s if duration_s > 0 else 0.0


def arrival_times(
    schedule: RateSchedule,
    *,
    duration_s: float,
    rng: np.random.Generator,
    process: ArrivalProcess = "poisson",
) -> np.ndarray[Any, Any]:
    """Sorted arrival offsets in [0, duration) following the schedule.

    Works in "operational time" u = Λ(t), the integral of the rate: there a Poisson process of
    any piecewise-constant rate is a unit-rate one (its points are uniform given their count),
    and evenly spaced arrivals are u = 0, 1, 2, ...; mapping back through Λ⁻¹ is exact.
    """
    if duration_s <= 0:
        return np.empty(0, dtype=np.float64)
    starts, rates = schedule.segments(duration_s)
    ends = np.append(starts[1:], duration_s)
    cumulative = np.concatenate([[0.0], np.cumsum(rates * (ends - starts))])
    total = float(cumulative[-1])
    if total > MAX_ARRIVALS:
        raise ValueError(
            f"the schedule asks for {total:.0f} requests; at most {MAX_ARRIVALS} per run"
        )
    if process == "poisson":
        u = np.sort(rng.uniform(0.0, total, size=rng.poisson(total)))
    elif process == "uniform":
        u = np.arange(0.0, total, 1.0)
    else:
        raise ValueError(f"unknown arrival process {process!r}")
    # cumulative[i] <= u < cumulative[i + 1] means segment i, whose rate is then > 0.
    index = np.searchsorted(cumulative, u, side="right") - 1
    times = starts[index] + (u - cumulative[index]) / rates[index]
    within: np.ndarray[Any, Any] = times[times < duration_s]
    return within


# --- Statistics (pure) -----------------------------------------------------------------------


def nearest_rank(sorted_values: np.ndarray[Any, Any], percent: float) -> float:
    """The textbook percentile: the smallest sample with at least `percent` % of the samples at
    or below it. "P99 <= SLA" then means what it says: 99 % of requests were within the SLA."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no samples")
    # The tiny slack keeps e.g. 99 % of 100 at rank 99 despite 0.99 * 100 == 99.00000000000001.
    rank = max(1, math.ceil(n * percent / 100.0 - 1e-9))
    return float(sorted_values[min(rank, n) - 1])


@dataclass(frozen=True, slots=True)
class LatencyStats:
    count: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


def latency_stats(samples_s: np.ndarray[Any, Any] | Sequence[float]) -> LatencyStats | None:
    """Exact percentiles (nearest rank) of latency samples given in seconds; None if empty."""
    values = np.sort(np.asarray(samples_s, dtype=np.float64)) * 1000.0
    if len(values) == 0:
        return None
    return LatencyStats(
        count=len(values),
        mean_ms=float(values.mean()),
        p50_ms=nearest_rank(values, 50),
        p95_ms=nearest_rank(values, 95),
        p99_ms=nearest_rank(values, 99),
        max_ms=float(values[-1]),
    )


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One time window of the measured period, in seconds from its start. `offered_rps` counts
    arrivals (sends in a closed loop) by scheduled time; `served_rps`, `errors` and `p99_ms`
    count completions by the time they completed — what an observer of the server (Prometheus,
    a live view) would see. The last window also holds what completed after the period."""

    start_s: float
    end_s: float
    offered_rps: float
    served_rps: float
    errors: int
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Every request of a run, one entry each, times in seconds from the start of the run.
    `kind` is "" for success, else the error kind; `sent` is NaN where nothing was sent."""

    scheduled: np.ndarray[Any, Any]
    sent: np.ndarray[Any, Any]
    done: np.ndarray[Any, Any]
    kind: np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    mode: Literal["open", "closed"]
    url: str
    model: str
    inputs: Mapping[str, tuple[int, ...]]
    request_bytes: int
    duration_s: float
    warmup_s: float
    elapsed_s: float
    """From the start of the measured period to the last measured completion (for an open loop
    at least the duration, which the offered schedule spans)."""
    target_rps: float | None
    """The schedule's mean rate over the duration (open loop)."""
    offered_rps: float | None
    """Arrivals actually scheduled over the duration (open loop)."""
    concurrency: int | None
    scheduled: int
    sent: int
    succeeded: int
    achieved_qps: float
    errors: Mapping[str, int]
    shed: int
    failed: int
    latency_ms: LatencyStats | None
    """From the scheduled send time (open loop), over successful requests."""
    service_latency_ms: LatencyStats | None
    """From the actual send time, over successful requests."""
    windows: tuple[WindowStats, ...]
    window_s: float
    aborted: bool = False
    """The run stopped early, once it could no longer meet the SLA (find-max probes)."""

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["inputs"] = {name: list(shape) for name, shape in self.inputs.items()}
        doc["errors"] = dict(self.errors)
        return doc


class Summary(TypedDict):
    """The measured numbers of a run; the fields of LoadReport that come from its outcomes."""

    scheduled: int
    sent: int
    succeeded: int
    achieved_qps: float
    offered_rps: float | None
    errors: dict[str, int]
    shed: int
    failed: int
    elapsed_s: float
    latency_ms: LatencyStats | None
    service_latency_ms: LatencyStats | None
    windows: tuple[WindowStats, ...]


def summarize(
    outcomes: Outcomes,
    *,
    measure_start_s: float,
    duration_s: float,
    window_s: float,
    open_loop: bool,
    stopped_early: bool = False,
) -> Summary:
    """The numbers of a report, from the raw outcomes: only requests scheduled at or after
    `measure_start_s` count (the rest are warm-up)."""
    measured = outcomes.scheduled >= measure_start_s
    scheduled = outcomes.scheduled[measured] - measure_start_s
    sent = outcomes.sent[measured] - measure_start_s
    done = outcomes.done[measured] - measure_start_s
    kind = outcomes.kind[measured]
    ok = kind == ""
    kinds, counts = np.unique(kind[~ok], return_counts=True)
    errors = {str(k): int(c) for k, c in zip(kinds, counts, strict=True)}
    shed = sum(count for k, count in errors.items() if k in SHED_KINDS)
    last_done = float(done.max()) if len(done) else 0.0
    elapsed = max(last_done, duration_s) if open_loop and not stopped_early else last_done
    succeeded = int(ok.sum())
    # A run stopped early offered its arrivals over the time it ran, not the duration.
    offered_over = elapsed if stopped_early else duration_s
    return {
        "scheduled": len(kind),
        "sent": int(np.sum(kind != DROPPED_CLIENT)),
        "succeeded": succeeded,
        "achieved_qps": succeeded / elapsed if elapsed > 0 else 0.0,
        "offered_rps": len(kind) / offered_over if open_loop and offered_over > 0 else None,
        "errors": errors,
        "shed": shed,
        "failed": sum(errors.values()) - shed,
        "elapsed_s": elapsed,
        "latency_ms": latency_stats(done[ok] - scheduled[ok]),
        "service_latency_ms": latency_stats(done[ok] - sent[ok]),
        "windows": _windows(
            scheduled, done, ok, span_s=min(elapsed, duration_s), window_s=window_s
        ),
    }


def _windows(
    scheduled: np.ndarray[Any, Any],
    done: np.ndarray[Any, Any],
    ok: np.ndarray[Any, Any],
    *,
    span_s: float,
    window_s: float,
) -> tuple[WindowStats, ...]:
    if span_s <= 0:
        return ()
    count = max(1, math.ceil(span_s / window_s - 1e-9))

    def bucket(times: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.clip((times // window_s).astype(np.int64), 0, count - 1)

    offered = np.bincount(bucket(scheduled), minlength=count)
    served = np.bincount(bucket(done[ok]), minlength=count)
    errors = np.bincount(bucket(done[~ok]), minlength=count)
    # Sort successes by (window, latency) once, so each window's p99 is one index away.
    ok_window = bucket(done[ok])
    latency = done[ok] - scheduled[ok]
    order = np.lexsort((latency, ok_window))
    ok_window, latency = ok_window[order], latency[order]
    bounds = np.searchsorted(ok_window, np.arange(count + 1))
    result = []
    for i in range(count):
        chunk = latency[bounds[i] : bounds[i + 1]]
        start, end = i * window_s, min((i + 1) * window_s, span_s)
        result.append(
            WindowStats(
                start_s=start,
                end_s=end,
                offered_rps=float(offered[i]) / (end - start),
                served_rps=float(served[i]) / (end - start),
                errors=int(errors[i]),
                p99_ms=nearest_rank(chunk, 99) * 1000.0 if len(chunk) else None,
            )
        )
    return tuple(result)


# --- The find-max search (pure) --------------------------------------------------------------


@dataclass(slots=True)
class RateSearch:
    """Exponential ramp until a probe fails, then bisection (geometric, since the precision is
    relative) between the best passing and the lowest failing rate. Assumes that passing is
    monotone in the rate, which is what saturation looks like."""

    start_rps: float
    precision: float = 0.05
    min_rps: float = 0.5
    max_rps: float = MAX_RATE_RPS
    passed_rps: float = 0.0
    failed_rps: float | None = None

    def next_rate(self) -> float | None:
        """The next rate to probe, or None once the search is done."""
        if self.failed_rps is None:
            if self.passed_rps == 0:
                return self.start_rps
            return (
                min(self.passed_rps * 2, self.max_rps) if self.passed_rps < self.max_rps else None
            )
        if self.passed_rps == 0:
            rate = self.failed_rps / 2
            return rate if rate >= self.min_rps else None
        if self.failed_rps / self.passed_rps - 1 <= self.precision:
            return None
        return math.sqrt(self.passed_rps * self.failed_rps)

    def record(self, rate_rps: float, *, passed: bool) -> None:
        if passed:
            self.passed_rps = max(self.passed_rps, rate_rps)
        elif self.failed_rps is None or rate_rps < self.failed_rps:
            self.failed_rps = rate_rps


def probe_passes(report: LoadReport, *, sla_ms: float) -> bool:
    """A probe passes with no error of any kind (shed load included), P99 within the SLA, and
    the run not stopped early."""
    return (
        not report.aborted
        and report.succeeded > 0
        and not report.errors
        and report.latency_ms is not None
        and report.latency_ms.p99_ms <= sla_ms
    )


# --- The request ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    """-1 marks a dynamic axis; axis 0 is the batch axis."""


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def from_json(cls, doc: Any) -> ModelMetadata:
        """Parse a v2 model metadata document; TargetError says what was wrong."""
        try:
            return cls(
                name=str(doc["name"]),
                platform=str(doc.get("platform", "")),
                inputs=tuple(_spec(raw) for raw in doc["inputs"]),
                outputs=tuple(_spec(raw) for raw in doc.get("outputs") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TargetError(f"the model metadata is not v2 metadata ({exc!r}): {doc}") from None


def _spec(raw: Mapping[str, Any]) -> TensorSpec:
    shape = tuple(int(d) for d in raw["shape"])
    return TensorSpec(name=str(raw["name"]), datatype=str(raw["datatype"]), shape=shape)


def request_shape(spec: TensorSpec, *, rows: int) -> tuple[int, ...]:
    """The shape to send: -1 becomes `rows` on the batch axis and 1 elsewhere; fixed axes stay."""
    return tuple((rows if axis == 0 else 1) if d == -1 else d for axis, d in enumerate(spec.shape))


def random_inputs(
    metadata: ModelMetadata,
    *,
    rows: int,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int,
) -> tuple[Tensor, ...]:
    """One random tensor per model input, of the model's datatype. Integers are small and
    non-negative, so models that index with them (embeddings, class ids) accept them."""
    unknown = set(shapes) - {spec.name for spec in metadata.inputs}
    if unknown:
        raise TargetError(
            f"--shape names {sorted(unknown)}, but the model's inputs are "
            f"{[spec.name for spec in metadata.inputs]}"
        )
    batched = [spec for spec in metadata.inputs if spec.shape[:1] == (-1,)]
    if rows != 1 and not batched and not shapes:
        # Some inputs may legitimately have no batch axis, but if none has one, `rows` would be
        # ignored without a word.
        raise TargetError(
            f"no input of {metadata.name!r} has a dynamic batch axis, so rows={rows} does not "
            "fit; give the shapes explicitly (--shape NAME=D,D,...)"
        )
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in metadata.inputs:
        dtype = DATATYPES.get(spec.datatype)
        if dtype is None:
            raise TargetError(
                f"input {spec.name!r} has datatype {spec.datatype}, which the load generator "
                "cannot fill (it supports " + ", ".join(DATATYPES) + ")"
            )
        shape = shapes[spec.name] if spec.name in shapes else request_shape(spec, rows=rows)
        data: np.ndarray[Any, Any]
        if dtype.kind == "f":
            data = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            data = rng.random(shape) < 0.5
        else:
            data = rng.integers(0, 10, size=shape).astype(dtype)
        tensors.append(Tensor(spec.name, spec.datatype, data))
    return tuple(tensors)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """The one request every send reuses: encoded once, up front."""

    url: URL
    body: bytes
    headers: Mapping[str, str]
    inputs: Mapping[str, tuple[int, ...]]
    expected_outputs: tuple[TensorSpec, ...]
    batch_rows: int | None


def prepare_request(
    url: str, metadata: ModelMetadata, inputs: Sequence[Tensor], *, binary: bool
) -> PreparedRequest:
    body, header_length = encode_request(inputs, binary=binary, binary_outputs=binary)
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(header_length),
        }
    first = inputs[0].data.shape if inputs else ()
    return PreparedRequest(
        url=URL(url) / "v2" / "models" / metadata.name / "infer",
        body=body,
        headers=headers,
        inputs={t.name: tuple(t.data.shape) for t in inputs},
        expected_outputs=metadata.outputs,
        batch_rows=first[0] if first else None,
    )


def response_is_valid(request: PreparedRequest, body: bytes, headers: Mapping[str, str]) -> bool:
    """Decode a response (`--verify`): every declared output present, with the request's rows on
    the batch axis where that axis is dynamic."""
    try:
        length = headers.get(HEADER_LENGTH)
        outputs = decode_response(body, header_length=int(length) if length else None)
    except Exception:  # any way a body can fail to decode is the same verdict
        return False
    for spec in request.expected_outputs:
        out = outputs.get(spec.name)
        if out is None:
            return False
        dynamic_batch = bool(spec.shape) and spec.shape[0] == -1
        if (
            dynamic_batch
            and request.batch_rows is not None
            and (not out.data.shape or out.data.shape[0] != request.batch_rows)
        ):
            return False
    return True


# --- Configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What to load and how each request looks."""

    url: str
    model: str
    rows: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Explicit input shapes by name; they win over the metadata and `rows`."""
    seed: int = 0
    json_tensors: bool = False
    verify: bool = False
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be at least 1, got {self.rows}")
        if not (0 < self.timeout_s <= 3600):
            raise ValueError(f"timeout_s must be in (0, 3600], got {self.timeout_s}")
        for name, shape in self.shapes.items():
            if any(d < 0 for d in shape):
                raise ValueError(f"shape of {name!r} must not have negative axes: {shape}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """One run: open loop when `schedule` is given, closed loop when `concurrency` is."""

    target: Target
    duration_s: float
    schedule: RateSchedule | None = None
    concurrency: int | None = None
    arrivals: ArrivalProcess = "poisson"
    max_outstanding: int = 2000
    """Open loop: arrivals beyond this many outstanding requests count as dropped_client."""
    max_requests: int | None = None
    """A cap on measured requests (the first ones in time)."""
    warmup_s: float = 0.0
    """Sent before the measured period (open loop: at the schedule's initial rate), not counted."""
    window_s: float = 1.0
    connections: int | None = None
    """Connection pool size; default: the concurrency, or max_outstanding in an open loop."""
    seed: int = 0
    """Seeds the arrival times."""
    stop_early_sla_ms: float | None = None
    """Open loop: stop as soon as the run can no longer have P99 <= this with no errors."""

    def __post_init__(self) -> None:
        if (self.schedule is None) == (self.concurrency is None):
            raise ValueError("give either a rate schedule (open loop) or a concurrency (closed)")
        if not (0 < self.duration_s <= MAX_DURATION_S):
            raise ValueError(
                f"duration_s must be in (0, {MAX_DURATION_S:g}], got {self.duration_s}"
            )
        if not (0 <= self.warmup_s <= MAX_DURATION_S):
            raise ValueError(f"warmup_s must be in [0, {MAX_DURATION_S:g}], got {self.warmup_s}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.max_outstanding < 1:
            raise ValueError(f"max_outstanding must be at least 1, got {self.max_outstanding}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, got {self.max_requests}")
        if self.connections is not None and self.connections < 1:
            raise ValueError(f"connections must be at least 1, got {self.connections}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be positive, got {self.window_s}")
        if self.stop_early_sla_ms is not None and self.schedule is None:
            raise ValueError("stop_early_sla_ms needs an open loop (a rate schedule)")

    @property
    def pool_size(self) -> int:
        if self.connections is not None:
            return self.connections
        return self.concurrency if self.concurrency is not None else self.max_outstanding


# --- Running load --------------------------------------------------------------------------


async def send_once(
    session: aiohttp.ClientSession, request: PreparedRequest, *, verify: bool = False
) -> str:
    """Send the request once; "" on success, else the error kind. The body is read (the latency
    includes receiving it) but decoded only when verifying."""
    try:
        async with session.post(request.url, data=request.body, headers=request.headers) as resp:
            body = await resp.read()
            if not 200 <= resp.status < 300:
                return str(resp.status)
            if verify and not response_is_valid(request, body, resp.headers):
                return INVALID_RESPONSE
            return ""
    except TimeoutError:  # before ClientConnectionError: aiohttp's timeouts subclass both
        return TIMEOUT
    except (aiohttp.ClientConnectionError, OSError):
        return CONNECTION
    except aiohttp.ClientError as exc:
        return type(exc).__name__


class _Recorder:
    """Appends one entry per request on the hot path; arrays are built once, at the end."""

    __slots__ = ("done", "kind", "on_record", "scheduled", "sent")

    def __init__(self) -> None:
        self.scheduled: list[float] = []
        self.sent: list[float] = []
        self.done: list[float] = []
        self.kind: list[str] = []
        self.on_record: Callable[[float, float, str], None] | None = None

    def add(self, scheduled: float, sent: float, done: float, kind: str) -> None:
        self.scheduled.append(scheduled)
        self.sent.append(sent)
        self.done.append(done)
        self.kind.append(kind)
        if self.on_record is not None:
            self.on_record(scheduled, done, kind)

    def outcomes(self) -> Outcomes:
        return Outcomes(
            scheduled=np.array(self.scheduled, dtype=np.float64),
            sent=np.array(self.sent, dtype=np.float64),
            done=np.array(self.done, dtype=np.float64),
            kind=np.array(self.kind, dtype=np.str_),
        )


def _breach_watch(
    *, sla_s: float, measure_start_s: float, planned: int, stop: Callable[[], None]
) -> Callable[[float, float, str], None]:
    """A callback that calls `stop` once P99 <= SLA with no errors has become impossible: any
    measured error, or more late successes than the 1 % that nearest-rank P99 allows."""
    allowed_late = planned - math.ceil(planned * 0.99 - 1e-9)
    late = 0

    def on_record(scheduled: float, done: float, kind: str) -> None:
        nonlocal late
        if scheduled < measure_start_s:
            return
        if kind:
            stop()
        elif done - scheduled > sla_s:
            late += 1
            if late > allowed_late:
                stop()

    return on_record


class _Client:
    """An HTTP session plus the prepared request for one target; shared by the probes of a
    find-max search so that connections are reused between them."""

    def __init__(self, target: Target, *, pool_size: int, clock: Clock) -> None:
        self.target = target
        self.clock = clock
        self._pool_size = pool_size
        self._stack = contextlib.AsyncExitStack()
        self.session: aiohttp.ClientSession | None = None
        self.request: PreparedRequest | None = None

    async def __aenter__(self) -> _Client:
        connector = aiohttp.TCPConnector(limit=self._pool_size)
        self.session = await self._stack.enter_async_context(
            aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.target.timeout_s),
            )
        )
        try:
            metadata = await fetch_metadata(
                self.session, self.target.url, self.target.model, timeout_s=self.target.timeout_s
            )
            inputs = random_inputs(
                metadata, rows=self.target.rows, shapes=self.target.shapes, seed=self.target.seed
            )
            self.request = prepare_request(
                self.target.url, metadata, inputs, binary=not self.target.json_tensors
            )
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def run(self, config: LoadConfig) -> LoadReport:
        assert self.session is not None, "use `async with`"
        assert self.request is not None, "use `async with`"
        session, request, verify, clock = self.session, self.request, self.target.verify, self.clock
        recorder = _Recorder()
        t0 = clock()

        async def send(scheduled: float) -> None:
            sent = clock() - t0
            try:
                kind = await send_once(session, request, verify=verify)
            except asyncio.CancelledError:
                recorder.add(scheduled, sent, clock() - t0, UNFINISHED)
                raise
            recorder.add(scheduled, sent, clock() - t0, kind)

        hard_deadline = (
            t0 + config.warmup_s + config.duration_s + self.target.timeout_s + _HARD_CAP_GRACE_S
        )
        if config.schedule is not None:
            stopped_early = await _open_loop(
                config, config.schedule, send, recorder, clock=clock, t0=t0, deadline=hard_deadline
            )
        else:
            assert config.concurrency is not None
            stopped_early = await _closed_loop(
                config, config.concurrency, send, clock=clock, t0=t0, deadline=hard_deadline
            )
        numbers = summarize(
            recorder.outcomes(),
            measure_start_s=config.warmup_s,
            duration_s=config.duration_s,
            window_s=config.window_s,
            open_loop=config.schedule is not None,
            stopped_early=stopped_early,
        )
        return LoadReport(
            mode="open" if config.schedule is not None else "closed",
            url=self.target.url,
            model=self.target.model,
            inputs=request.inputs,
            request_bytes=len(request.body),
            duration_s=config.duration_s,
            warmup_s=config.warmup_s,
            target_rps=(config.schedule.mean_rate(config.duration_s) if config.schedule else None),
            concurrency=config.concurrency,
            window_s=config.window_s,
            aborted=stopped_early,
            **numbers,
        )


async def _open_loop(
    config: LoadConfig,
    schedule: RateSchedule,
    send: Callable[[float], Coroutine[Any, Any, None]],
    recorder: _Recorder,
    *,
    clock: Clock,
    t0: float,
    deadline: float,
) -> bool:
    """Send every arrival at its scheduled time. Returns whether the run was stopped early."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng([config.seed, 1])
    warmup = arrival_times(
        RateSchedule.constant(schedule.rate_at(0.0)),
        duration_s=config.warmup_s,
        rng=rng,
        process=config.arrivals,
    )
    measured = arrival_times(
        schedule, duration_s=config.duration_s, rng=rng, process=config.arrivals
    )
    if config.max_requests is not None:
        measured = measured[: config.max_requests]
    arrivals: list[float] = np.concatenate([warmup, measured + config.warmup_s]).tolist()

    finished: asyncio.Future[bool] = loop.create_future()  # result: whether stopped early

    def finish(stopped_early: bool) -> None:
        if not finished.done():
            finished.set_result(stopped_early)

    if config.stop_early_sla_ms is not None:
        recorder.on_record = _breach_watch(
            sla_s=config.stop_early_sla_ms / 1000.0,
            measure_start_s=config.warmup_s,
            planned=len(measured),
            stop=lambda: finish(True),
        )

    outstanding: set[asyncio.Task[None]] = set()
    scheduling = True

    def on_request_done(task: asyncio.Task[None]) -> None:
        outstanding.discard(task)
        if not scheduling and not outstanding:
            finish(False)

    async def schedule_all() -> None:
        nonlocal scheduling
        launched_without_yield = 0
        for offset in arrivals:
            delay = t0 + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)
                launched_without_yield = 0
            elif launched_without_yield >= _YIELD_EVERY:
                await asyncio.sleep(0)
                launched_without_yield = 0
            if len(outstanding) >= config.max_outstanding:
                now = clock() - t0
                recorder.add(offset, math.nan, now, DROPPED_CLIENT)
                continue
            task = loop.create_task(send(offset))
            outstanding.add(task)
            task.add_done_callback(on_request_done)
            launched_without_yield += 1
        scheduling = False
        if not outstanding:
            finish(False)

    def on_scheduler_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            finish(False)  # a bug, not load: stop waiting, and raise it below

    scheduler = loop.create_task(schedule_all())
    scheduler.add_done_callback(on_scheduler_done)
    try:
        await asyncio.wait([finished], timeout=max(0.0, deadline - clock()))
    finally:
        await _cancel_all([scheduler, *outstanding])
    _raise_failure([scheduler])
    return finished.done() and finished.result()


async def _closed_loop(
    config: LoadConfig,
    concurrency: int,
    send: Callable[[float], Coroutine[Any, Any, None]],
    *,
    clock: Clock,
    t0: float,
    deadline: float,
) -> bool:
    """`concurrency` workers, each sending back to back until the duration (or the request cap)
    is reached. Latency is measured from each send: a closed loop offers no schedule."""
    loop = asyncio.get_running_loop()
    end = t0 + config.warmup_s + config.duration_s
    measure_start = t0 + config.warmup_s
    remaining = config.max_requests

    async def worker() -> None:
        nonlocal remaining
        while (now := clock()) < end:
            if now >= measure_start and remaining is not None:
                if remaining <= 0:
                    return
                remaining -= 1
            await send(now - t0)

    workers = [loop.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.wait(workers, timeout=max(0.0, deadline - clock()))
    finally:
        await _cancel_all(workers)
    _raise_failure(workers)
    return False


async def _cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _raise_failure(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Re-raise the first exception of a finished task: a bug in the generator must not pass
    for a result."""
    for task in tasks:
        if task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None:
                raise exc


async def fetch_metadata(
    session: aiohttp.ClientSession, url: str, model: str, *, timeout_s: float = 10.0
) -> ModelMetadata:
    """GET the v2 model metadata; TargetError says why the target can't be used."""
    where = URL(url) / "v2" / "models" / model
    try:
        async with session.get(where, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await resp.read()
            if resp.status != 200:
                text = body[:300].decode(errors="replace")
                raise TargetError(f"GET {where} answered {resp.status}: {text}")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TargetError(f"cannot reach {where}: {str(exc) or type(exc).__name__}") from None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise TargetError(f"GET {where} did not answer JSON: {exc}") from None
    return ModelMetadata.from_json(doc)


async def run_load(config: LoadConfig, *, clock: Clock = PRECISE_CLOCK) -> LoadReport:
    """Run one load test as configured. Raises TargetError if the target can't be used."""
    async with _Client(config.target, pool_size=config.pool_size, clock=clock) as client:
        return await client.run(config)


# --- Find the maximum rate within the SLA ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchConfig:
    target: Target
    sla_ms: float
    start_rps: float = 10.0
    probe_duration_s: float = 5.0
    warmup_s: float = 0.0
    precision: float = 0.05
    max_probes: int = 16
    max_total_s: float = 600.0
    """No probe starts unless it can finish (duration + warm-up + timeout) within this."""
    settle_s: float = 1.0
    """Pause between probes, so the backlog of a failed probe doesn't leak into the next one."""
    arrivals: ArrivalProcess = "poisson"
    max_outstanding: int = 2000
    min_rps: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sla_ms <= 0:
            raise ValueError(f"sla_ms must be positive, got {self.sla_ms}")
        if not (0 < self.start_rps <= MAX_RATE_RPS):
            raise ValueError(f"start_rps must be in (0, {MAX_RATE_RPS:g}], got {self.start_rps}")
        if not (0 < self.probe_duration_s <= MAX_DURATION_S):
            raise ValueError(f"probe_duration_s must be positive, got {self.probe_duration_s}")
        if not (0 < self.precision < 1):
            raise ValueError(f"precision must be in (0, 1), got {self.precision}")
        if not (1 <= self.max_probes <= 64):
            raise ValueError(f"max_probes must be in [1, 64], got {self.max_probes}")
        if self.max_total_s <= 0 or self.settle_s < 0:
            raise ValueError("max_total_s must be positive and settle_s not negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    rate_rps: float
    passed: bool
    report: LoadReport


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    sla_ms: float
    best_rps: float | None
    """The highest probed rate that passed; None if none did."""
    stopped_because: Literal["converged", "max_probes", "time_budget", "nothing_passes"]
    precision: float
    probes: tuple[Probe, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sla_ms": self.sla_ms,
            "best_rps": self.best_rps,
            "stopped_because": self.stopped_because,
            "precision": self.precision,
            "probes": [
                {"rate_rps": p.rate_rps, "passed": p.passed, "report": p.report.to_dict()}
                for p in self.probes
            ],
        }


async def find_max_rate(config: SearchConfig, *, clock: Clock = PRECISE_CLOCK) -> SearchResult:
    """The highest constant open-loop rate with P99 <= SLA and no errors (503s included)."""
    started = clock()
    search = RateSearch(config.start_rps, precision=config.precision, min_rps=config.min_rps)
    probes: list[Probe] = []
    worst_probe_s = (
        config.settle_s + config.warmup_s + config.probe_duration_s + config.target.timeout_s
    )
    stopped: Literal["converged", "max_probes", "time_budget", "nothing_passes"] = "converged"
    async with _Client(config.target, pool_size=config.max_outstanding, clock=clock) as client:
        while True:
            rate = search.next_rate()
            if rate is None:
                stopped = "converged" if search.passed_rps > 0 else "nothing_passes"
                break
            if len(probes) >= config.max_probes:
                stopped = "max_probes"
                break
            if clock() - started + worst_probe_s > config.max_total_s:
                stopped = "time_budget"
                break
            if probes and config.settle_s > 0:
                await asyncio.sleep(config.settle_s)
            report = await client.run(
                LoadConfig(
                    target=config.target,
                    duration_s=config.probe_duration_s,
                    schedule=RateSchedule.constant(rate),
                    arrivals=config.arrivals,
                    max_outstanding=config.max_outstanding,
                    warmup_s=config.warmup_s,
                    seed=config.seed + len(probes),
                    stop_early_sla_ms=config.sla_ms,
                )
            )
            passed = probe_passes(report, sla_ms=config.sla_ms)
            search.record(rate, passed=passed)
            probes.append(Probe(rate_rps=rate, passed=passed, report=report))
    return SearchResult(
        sla_ms=config.sla_ms,
        best_rps=search.passed_rps or None,
        stopped_because=stopped,
        precision=config.precision,
        probes=tuple(probes),
    )


# --- Human output ----------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_report(report: LoadReport, *, max_windows: int = 120) -> str:
    """The report as a table for a terminal."""
    mode = (
        f"open loop, {report.target_rps:.1f} rps target"
        if report.mode == "open" and report.target_rps is not None
        else f"closed loop, concurrency {report.concurrency}"
    )
    inputs = ", ".join(f"{name} {list(shape)}" for name, shape in report.inputs.items())
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(report.errors.items())) or "none"
    lines = [
        f"batchpilot loadgen: {report.url} model {report.model} ({mode})",
        f"  request      {inputs}, {report.request_bytes} bytes",
        f"  duration     {report.duration_s:.1f} s measured (+{report.warmup_s:.1f} s warm-up), "
        f"elapsed {report.elapsed_s:.2f} s" + (" — stopped early" if report.aborted else ""),
    ]
    if report.offered_rps is not None:
        lines.append(f"  offered      {report.offered_rps:.1f} rps ({report.scheduled} arrivals)")
    lines += [
        f"  achieved     {report.achieved_qps:.1f} qps "
        f"({report.succeeded} succeeded of {report.sent} sent)",
        f"  errors       shed {report.shed}, failed {report.failed} ({errors})",
    ]
    for label, stats in (("latency", report.latency_ms), ("service", report.service_latency_ms)):
        if stats is None:
            lines.append(f"  {label:<12} no successful requests")
        else:
            lines.append(
                f"  {label:<12} p50 {stats.p50_ms:.1f}  p95 {stats.p95_ms:.1f}  "
                f"p99 {stats.p99_ms:.1f}  max {stats.max_ms:.1f}  mean {stats.mean_ms:.1f} ms"
            )
    if report.windows:
        if len(report.windows) > max_windows:
            lines.append(f"  {len(report.windows)} windows of {report.window_s:g} s: see --json")
        else:
            lines.append(
                f"  {'window s':>10} {'offered':>9} {'served':>9} {'errors':>7} {'p99 ms':>9}"
            )
            for w in report.windows:
                lines.append(
                    f"  {w.start_s:>10.1f} {w.offered_rps:>9.1f} {w.served_rps:>9.1f} "
                    f"{w.errors:>7} {_ms(w.p99_ms):>9}"
                )
    return "\n".join(lines)


def format_search(result: SearchResult) -> str:
    lines = [
        f"batchpilot loadgen --find-max: P99 <= {result.sla_ms:g} ms, no errors",
        f"  {'probe':>5} {'rate rps':>10} {'achieved':>10} {'p99 ms':>9} {'errors':>7}  result",
    ]
    for i, probe in enumerate(result.probes, start=1):
        r = probe.report
        p99 = r.latency_ms.p99_ms if r.latency_ms else None
        verdict = "pass" if probe.passed else ("fail (stopped early)" if r.aborted else "fail")
        lines.append(
            f"  {i:>5} {probe.rate_rps:>10.1f} {r.achieved_qps:>10.1f} {_ms(p99):>9} "
            f"{sum(r.errors.values()):>7}  {verdict}"
        )
    best = "none passed" if result.best_rps is None else f"{result.best_rps:.1f} rps"
    lines.append(
        f"  best: {best} (search {result.stopped_because.replace('_', ' ')}, "
        f"precision {result.precision:.0%})"
    )
    return "\n".join(lines)


# --- Command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    target.add_argument("--model", required=True, help="model name")
    target.add_argument("--rows", type=int, default=1, help="batch rows per request (default 1)")
    target.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D,D,...",
        help="explicit shape of an input (repeatable); wins over the metadata and --rows",
    )
    target.add_argument("--seed", type=int, default=0, help="seeds the data and the arrivals")
    target.add_argument(
        "--json-tensors", action="store_true", help="send JSON tensor data instead of binary"
    )
    target.add_argument("--verify", action="store_true", help="decode and check every response")
    target.add_argument("--timeout-s", type=float, default=10.0, help="per request (default 10)")

    load = parser.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, help="open loop at this constant rate (rps)")
    mode.add_argument("--schedule", help='open loop, piecewise constant: "0:50,20:400,40:100"')
    mode.add_argument("--schedule-file", help="open loop from a t_seconds,rate_rps CSV")
    mode.add_argument("--concurrency", type=int, help="closed loop with this many workers")
    load.add_argument("--duration", type=float, help="measured seconds (required for a run)")
    load.add_argument(
        "--arrivals",
        choices=["poisson", "uniform"],
        default="poisson",
        help="open-loop arrival process (default poisson)",
    )
    load.add_argument(
        "--max-outstanding",
        type=int,
        default=2000,
        help="open loop: arrivals beyond this many in flight count as dropped_client",
    )
    load.add_argument("--requests", type=int, help="cap on measured requests")
    load.add_argument(
        "--warmup-s", type=float, default=0.0, help="unmeasured lead-in seconds (default 0)"
    )
    load.add_argument(
        "--connections", type=int, help="connection pool size (default: concurrency or outstanding)"
    )
    load.add_argument(
        "--window-s", type=float, default=1.0, help="time-series window seconds (default 1)"
    )

    search = parser.add_argument_group("find-max")
    search.add_argument(
        "--find-max", action="store_true", help="search the highest rate within --sla-ms"
    )
    search.add_argument("--sla-ms", type=float, help="P99 latency SLA for --find-max")
    search.add_argument(
        "--start-rps", type=float, default=10.0, help="first probe's rate (default 10; or --rate)"
    )
    search.add_argument(
        "--probe-duration-s", type=float, default=5.0, help="seconds per probe (default 5)"
    )
    search.add_argument(
        "--precision", type=float, default=0.05, help="relative precision (default 0.05)"
    )
    search.add_argument("--max-probes", type=int, default=16, help="at most this many (16)")
    search.add_argument(
        "--max-total-s", type=float, default=600.0, help="time budget of the search (600)"
    )
    search.add_argument(
        "--settle-s", type=float, default=1.0, help="pause between probes (default 1)"
    )

    parser.add_argument("--json", metavar="OUT", help="write the report as JSON ('-': stdout)")


def _parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise ValueError(f"--shape {item!r} is not NAME=D,D,...") from None
    return shapes


def _target_from(args: argparse.Namespace) -> Target:
    return Target(
        url=args.url,
        model=args.model,
        rows=args.rows,
        shapes=_parse_shapes(args.shape),
        seed=args.seed,
        json_tensors=args.json_tensors,
        verify=args.verify,
        timeout_s=args.timeout_s,
    )


def _schedule_from(args: argparse.Namespace) -> RateSchedule | None:
    if args.rate is not None:
        return RateSchedule.constant(args.rate)
    if args.schedule is not None:
        return RateSchedule.parse(args.schedule)
    if args.schedule_file is not None:
        try:
            return RateSchedule.from_csv(args.schedule_file)
        except OSError as exc:
            raise ValueError(f"cannot read --schedule-file: {exc}") from None
    return None


def config_from_args(args: argparse.Namespace) -> LoadConfig | SearchConfig:
    """Turn parsed arguments into a run or a search; ValueError says what is wrong."""
    target = _target_from(args)
    if args.find_max:
        if args.sla_ms is None:
            raise ValueError("--find-max needs --sla-ms")
        if args.concurrency is not None or args.schedule or args.schedule_file:
            raise ValueError("--find-max probes constant rates; drop --concurrency/--schedule")
        return SearchConfig(
            target=target,
            sla_ms=args.sla_ms,
            start_rps=args.rate if args.rate is not None else args.start_rps,
            probe_duration_s=args.probe_duration_s,
            warmup_s=args.warmup_s,
            precision=args.precision,
            max_probes=args.max_probes,
            max_total_s=args.max_total_s,
            settle_s=args.settle_s,
            arrivals=args.arrivals,
            max_outstanding=args.max_outstanding,
            seed=args.seed,
        )
    if args.duration is None:
        raise ValueError("--duration is required (seconds)")
    schedule = _schedule_from(args)
    if schedule is None and args.concurrency is None:
        raise ValueError("give one of --rate, --schedule, --schedule-file or --concurrency")
    return LoadConfig(
        target=target,
        duration_s=args.duration,
        schedule=schedule,
        concurrency=args.concurrency,
        arrivals=args.arrivals,
        max_outstanding=args.max_outstanding,
        max_requests=args.requests,
        warmup_s=args.warmup_s,
        window_s=args.window_s,
        connections=args.connections,
        seed=args.seed,
    )


def _run_async(factory: Callable[[], Awaitable[_T]]) -> _T:
    """Run on uvloop where it is installed: a cheaper loop leaves more CPU to the server."""

    async def call() -> _T:
        return await factory()

    try:
        import uvloop
    except ImportError:
        return asyncio.run(call())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(call())


def _allow_open_files(count: int) -> None:
    """An open loop may hold one connection per outstanding request; raise the soft limit on
    open files towards the hard one so that a default `ulimit -n` of 1024 is not what fails."""
    try:
        import resource
    except ImportError:  # not on this platform: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 64  # the pool, plus what the process already holds
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def main(args: argparse.Namespace) -> int:
    """`batchpilot loadgen`: 0 after a completed run (server errors are in the report), 2 on bad
    arguments or an unusable target."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"batchpilot loadgen: {exc}", file=sys.stderr)
        return 2
    doc: dict[str, Any]
    _allow_open_files(
        config.max_outstanding if isinstance(config, SearchConfig) else config.pool_size
    )
    try:
        if isinstance(config, SearchConfig):
            search_config = config
            result = _run_async(lambda: find_max_rate(search_config))
            table, doc = format_search(result), result.to_dict()
        else:
            load_config = config
            report = _run_async(lambda: run_load(load_config))
            table, doc = format_report(report), report.to_dict()
    except TargetError as exc:
        print(f"batchpilot loadgen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("batchpilot loadgen: interrupted; no report", file=sys.stderr)
        return 130
    # With the JSON on stdout, the table goes to stderr so the JSON stays parseable.
    print(table, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json is not None:
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        if args.json == "-":
            sys.stdout.write(data.decode() + "\n")
        else:
            Path(args.json).write_bytes(data + b"\n")
    return 0


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run; argparse's own usage errors come back as exit status 2."""
    parser = argparse.ArgumentParser(
        prog="batchpilot loadgen", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return main(args)


if __name__ == "__main__":
    sys.exit(run_cli())
