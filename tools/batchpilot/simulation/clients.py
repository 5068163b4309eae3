"""Clients that send a refused request again: the load a retry storm adds to the trace's.

A trace says how many requests clients *mean* to send; what reaches the runtimes is more when
refusals are retried. Each refusal (503 at arrival, a full queue, no ready endpoint, a connection
to a dead node's replica) comes back after a delay, until it is served or the client's attempts
run out. The runtime counts every attempt as an arrival — it cannot tell a retry from a new
request — so the rate the autopilot reads is inflated by exactly the refusals it was meant to
prevent: the loop a platform team meets on its worst day (a retry storm, a metastable overload).

`Retries` is how the clients behave; `RetryQueue` holds the attempts waiting to go out again.
Delays grow by `backoff` per attempt with "full jitter" around the mean (`jitter` 0.5: uniform
within ±50 %), as client libraries do (gRPC's retry policy, AWS SDKs, urllib3's `Retry`).
`delay_s` 1 with `backoff` 1 is a client that honours the runtime's `Retry-After` (1 s at the
least); 0.05 with `backoff` 1, one that retries at once.

The simulator serves time in passes; a retry due inside the pass that refused it goes out at
the pass's end, so passes are cut at most `step_s` long while retries are on (a retry is late by
less than that). What a replica held queued when its node died is not retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from batchpilot.simulation.replica import FloatArray, IntArray

MIN_STEP_S = 0.25
"""The shortest pass: retries sooner than this go out up to this late (bounds the passes of
an hour to 14,400)."""


@dataclass(frozen=True, slots=True)
class Retries:
    attempts: int = 3
    """Tries in all, the first included: a request refused this many times is given up."""
    delay_s: float = 1.0
    """The mean wait before the first retry."""
    backoff: float = 1.0
    """Each later retry waits this many times the one before."""
    jitter: float = 0.5
    """Each wait is drawn uniformly within ±`jitter` of its mean."""
    marked: bool = False
    """Each retry says it is one (an Envoy `x-envoy-attempt-count`, gRPC's
    `grpc-previous-rpc-attempts`): the runtimes count it under `attempt="retry"`, and the
    autopilot's arrival signals (and the seasonal history) are the first attempts alone."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("retries: attempts must be at least 1 (the first try)")
        if self.delay_s <= 0 or self.backoff < 1:
            raise ValueError("retries: delay_s must be positive and backoff at least 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("retries: jitter must be in [0, 1)")

    @property
    def step_s(self) -> float:
        """The longest pass while these clients retry."""
        return max(MIN_STEP_S, self.delay_s * (1 - self.jitter))

    def describe(self) -> dict[str, float | bool]:
        return {
            "attempts": self.attempts,
            "delayS": self.delay_s,
            "backoff": self.backoff,
            "jitter": self.jitter,
            "marked": self.marked,
        }

    @classmethod
    def parse(cls, text: str) -> Retries:
        """`attempts=3,delay_s=1,backoff=2,jitter=0.5,marked=1`; any left out keep their
        defaults."""
        known = {"attempts": int, "delay_s": float, "backoff": float, "jitter": float}
        values: dict[str, float | bool] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if key == "marked" and sep:
                values[key] = _flag(value)
                continue
            if not sep or key not in known:
                raise ValueError(
                    f"retries: {part!r} is not one of attempts=, delay_s=, backoff=, jitter=, "
                    "marked="
                )
            try:
                values[key] = known[key](value)
            except ValueError:
                raise ValueError(f"retries: {key} must be a number, not {value!r}") from None
        return cls(**values)  # type: ignore[arg-type]


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    raise ValueError(f"retries: marked must be 1 or 0 (true or false), not {value!r}")


@dataclass
class RetryQueue:
    """Attempts refused and waiting to go out again, with what became of the clients' tries."""

    retries: Retries
    due_at: FloatArray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    attempt: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """The attempt each waiting one will be (2 for the first retry)."""
    sent: int = 0
    """Retries sent so far (attempts after the first)."""
    gave_up: int = 0
    """Requests refused on their last attempt: never served."""
    _in_flight: dict[float, int] = field(default_factory=dict)

    def due(self, before: float) -> FloatArray:
        """The retries that go out before `before`, taken off the queue; their arrival times
        are remembered as theirs until `refused` or `settle` is called."""
        now = self.due_at < before
        times = self.due_at[now]
        self._in_flight.update(zip(times.tolist(), self.attempt[now].tolist(), strict=True))
        self.due_at, self.attempt = self.due_at[~now], self.attempt[~now]
        self.sent += int(times.shape[0])
        return times

    def refused(self, times: FloatArray, rng: np.random.Generator, *, lo: float, hi: float) -> None:
        """Requests refused at `times` (their arrivals, in the pass [lo, hi)): each goes out
        again after its delay, or is given up. One due inside the pass goes out a pass later
        (its spacing from the others kept: no burst at the pass's end)."""
        if times.shape[0] == 0:
            return
        tried = np.array([self._in_flight.get(t, 1) for t in times.tolist()], dtype=np.int64)
        again = tried < self.retries.attempts
        self.gave_up += int((~again).sum())
        times, tried = times[again], tried[again]
        if times.shape[0] == 0:
            return
        mean = self.retries.delay_s * self.retries.backoff ** (tried - 1)
        spread = 1 + self.retries.jitter * (2 * rng.random(times.shape[0]) - 1)
        due = times + mean * spread
        due = np.where(due < hi, due + (hi - lo), due)
        self.due_at = np.concatenate([self.due_at, due])
        self.attempt = np.concatenate([self.attempt, tried + 1])

    def settle(self) -> None:
        """The pass is over: what it sent was served or refused."""
        self._in_flight.clear()

    @property
    def waiting(self) -> int:
        return int(self.due_at.shape[0])
