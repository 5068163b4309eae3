"""Admission in front of a pipeline's preprocess: a request waits for the stage only as long as
its deadline allows.

The batch queue admits a request on its predicted finish (admission.py), but a pipeline's
preprocess runs before it, in a pool of threads whose own line has no bound: a burst of 100 image
requests at a stage of 20 ms on one thread, each with 200 ms to live, waited there, was every one
preprocessed, and 91 of them got 504 up to 2.1 s after they came — no 503 at all, and the stage's
time spent on requests no one waited for any longer. So the stage has its own gate:

- at arrival, the request's finish in the stage is predicted: the requests ahead of it in the
  stage (waiting or running) over its threads, whole rounds of the stage's recent mean time, then
  its own; a request whose deadline that passes is refused at once (`Overloaded`,
  "predicted_late"), and so is one that finds `capacity` requests in the stage already
  ("queue_full": the queue's bound, for requests without a deadline);
- a request whose deadline passed while it waited is not preprocessed (`StageExpired`, raised in
  the thread instead of running the stage);
- the server answers 504 at the deadline, not when the stage is done (server.py).

The mean is an exponentially weighted one of the stage's times (`WEIGHT`); until the stage has
run once nothing is predicted. Thread-safe: the stage's threads report, the event loop admits.
"""

from __future__ import annotations

import threading

from batchpilot.runtime.errors import Overloaded

WEIGHT = 0.2
"""The weight of the newest stage time in the mean (about the last five count)."""


class StageExpired(Exception):
    """The request's deadline passed before a thread of the stage took it up: not run."""


class StageGate:
    """`admit(timeout_s)` before a request enters the stage, `left()` once it is out of it (run,
    skipped or cancelled before a thread took it), `ran(seconds)` for each time the stage ran."""

    def __init__(self, *, threads: int, capacity: int) -> None:
        self._threads = max(1, threads)
        self._capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._inside = 0
        self._mean_s: float | None = None

    @property
    def inside(self) -> int:
        """Requests waiting for the stage or in it."""
        return self._inside

    @property
    def mean_s(self) -> float | None:
        """The stage's recent mean time (None: it has not run yet)."""
        return self._mean_s

    def predicted_s(self) -> float | None:
        """How long a request arriving now would take to leave the stage (None: not known)."""
        with self._lock:
            mean, ahead = self._mean_s, self._inside
        if mean is None:
            return None
        return (ahead // self._threads + 1) * mean

    def admit(self, timeout_s: float | None) -> None:
        """Count the request in, or refuse it (`Overloaded`): the stage holds `capacity`
        already, or it would leave the stage after `timeout_s`."""
        with self._lock:
            mean, ahead = self._mean_s, self._inside
            if ahead >= self._capacity:
                raise Overloaded(
                    f"{ahead} requests are waiting for the preprocess already, the most this "
                    "server holds; retry shortly or elsewhere",
                    reason="queue_full",
                )
            if timeout_s is not None and mean is not None:
                finish = (ahead // self._threads + 1) * mean
                if finish > timeout_s:
                    raise Overloaded(
                        f"the request would wait past its deadline for the preprocess: "
                        f"{finish * 1e3:.0f} ms ({ahead} requests ahead of it on "
                        f"{self._threads} threads, {mean * 1e3:.1f} ms each) where "
                        f"{timeout_s * 1e3:.0f} ms are left; retry shortly or elsewhere",
                        reason="predicted_late",
                    )
            self._inside += 1

    def left(self) -> None:
        with self._lock:
            self._inside = max(0, self._inside - 1)

    def ran(self, seconds: float) -> None:
        with self._lock:
            if self._mean_s is None:
                self._mean_s = seconds
            else:
                self._mean_s += WEIGHT * (seconds - self._mean_s)
