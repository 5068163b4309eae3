"""What a load test is asked to do: the target, a run, a find-max search.

Each is validated once, at construction, so the command line and library callers (the
benchmark, the tests) get the same ValueErrors, and the code that runs load can trust them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from batchpilot.api.request_rows import RowMix
from batchpilot.runtime.loadgen.schedule import MAX_RATE_RPS, ArrivalProcess, RateSchedule
from batchpilot.runtime.loadgen.stats import DEFAULT_MAX_SEND_LAG_MS

MAX_DURATION_S: Final = 24 * 3600.0
"""The longest run the generator accepts; every run also stops at duration + timeout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What to load and how each request looks."""

    url: str
    model: str
    rows: int = 1
    row_mix: RowMix | None = None
    """Requests of varied rows: each send's rows drawn from this (seeded by `seed`); wins over
    `rows`. None: every request brings `rows`."""
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Explicit input shapes by name; they win over the metadata and `rows`."""
    seed: int = 0
    json_tensors: bool = False
    verify: bool = False
    timeout_s: float = 10.0
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Sent with every request, the metadata read included: an API key, say. Not shown in the
    target's repr, which may end up in a log."""

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be at least 1, got {self.rows}")
        if self.row_mix is not None and self.shapes:
            raise ValueError(
                "a mix of rows a request and explicit shapes do not go together: the shapes "
                "fix the rows"
            )
        if not (0 < self.timeout_s <= 3600):
            raise ValueError(f"timeout_s must be in (0, 3600], got {self.timeout_s}")
        for name, shape in self.shapes.items():
            if any(d < 0 for d in shape):
                raise ValueError(f"shape of {name!r} must not have negative axes: {shape}")


MAX_RETRY_WAIT_S: Final = 10.0
"""The longest a retrying client waits before a retry, whatever `Retry-After` says."""


@dataclass(frozen=True, slots=True)
class Retries:
    """Clients that send a refused request (503/429) again, as client libraries do: what the
    server counts as arrivals is then the requests plus their retries."""

    attempts: int
    """Repeats of a refused request at most (0: none)."""
    delay_s: float | None = None
    """The wait before each repeat; None: the answer's `Retry-After` (1 s where it has none)."""
    marked: bool = False
    """Each try says which it is in `x-envoy-attempt-count` (1, 2, …), as an Envoy proxy that
    retries for its client does where the route includes the attempt count: the server counts
    the repeats as retries, not as demand."""

    def __post_init__(self) -> None:
        if self.attempts < 0:
            raise ValueError(f"retries must be at least 0, got {self.attempts}")
        if self.delay_s is not None and not 0 <= self.delay_s <= MAX_RETRY_WAIT_S:
            raise ValueError(
                f"the retry delay must be in [0, {MAX_RETRY_WAIT_S:g}] s, got {self.delay_s}"
            )

    def wait_s(self, retry_after_s: float | None) -> float:
        """The wait before a repeat, given the refusal's `Retry-After` (None: none)."""
        if self.delay_s is not None:
            return self.delay_s
        return min(MAX_RETRY_WAIT_S, 1.0 if retry_after_s is None else retry_after_s)

    @property
    def longest_s(self) -> float:
        """The most a request's repeats can wait in all."""
        return self.attempts * (MAX_RETRY_WAIT_S if self.delay_s is None else self.delay_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """One run: open loop when `schedule` is given, closed loop when `concurrency` is."""

    target: Target
    duration_s: float
    schedule: RateSchedule | None = None
    concurrency: int | None = None
    arrivals: ArrivalProcess = "poisson"
    clump: float = 1.0
    """Open loop, Poisson: requests go in clumps of this mean size, each clump's at once."""
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
    """Open loop: stop as soon as the run can no longer have P99 <= this (refusals counting
    as misses) with no other error."""
    sla_ms: float | None = None
    """The latency SLA the report's goodput counts against (answers within it per second)."""
    max_send_lag_ms: float = DEFAULT_MAX_SEND_LAG_MS
    """Open loop: a send lag P99 above this makes the run invalid (the client fell behind)."""
    retries: Retries = Retries(0)
    """Refused requests are sent again (none by default). A request's latency then runs from
    its (scheduled) first send to its last answer, waits included."""
    hedge_s: float | None = None
    """Hedged requests: one not answered this long after it was sent goes out once more, and
    the first success is its answer — the other send is cancelled (its connection closed), as
    gRPC's hedging policy and Envoy's `hedge_on_per_try_timeout` do to cut the tail. The copy
    says it is the second try in `x-envoy-attempt-count` where `retries.marked`. None: no
    hedging."""

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
        if not (1 <= self.clump < math.inf):
            raise ValueError(f"the mean clump is at least 1 request, got {self.clump}")
        if self.clump > 1 and (self.schedule is None or self.arrivals != "poisson"):
            raise ValueError("clumps are of an open loop's Poisson arrivals: drop --clump")
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
        if self.sla_ms is not None and not self.sla_ms > 0:
            raise ValueError(f"sla_ms must be positive, got {self.sla_ms}")
        if not self.max_send_lag_ms > 0:
            raise ValueError(f"max_send_lag_ms must be positive, got {self.max_send_lag_ms}")
        if self.retries.marked and not self.retries.attempts and self.hedge_s is None:
            raise ValueError("marking tries needs retries or hedging: give --retries too")
        if self.hedge_s is not None:
            if not 0 < self.hedge_s < math.inf:
                raise ValueError(f"the hedging delay must be positive, got {self.hedge_s}")
            if self.retries.attempts:
                raise ValueError("a hedged request is not retried: drop --retries or --hedge-ms")

    @property
    def pool_size(self) -> int:
        if self.connections is not None:
            return self.connections
        sends = self.concurrency if self.concurrency is not None else self.max_outstanding
        # a hedged request may have two sends out at once, each on a connection of its own
        return 2 * sends if self.hedge_s is not None else sends


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
    max_send_lag_ms: float = DEFAULT_MAX_SEND_LAG_MS
    """A probe whose send lag P99 exceeds this is invalid, and stops the search."""

    def __post_init__(self) -> None:
        if not self.max_send_lag_ms > 0:
            raise ValueError(f"max_send_lag_ms must be positive, got {self.max_send_lag_ms}")
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
