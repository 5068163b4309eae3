"""Admission in front of a pipeline's preprocess: a request waits for the stage only as long as
its deadline allows.

The batch queue admits a request on its predicted finish (admission.py), but a pipeline's
preprocess runs before it, in a pool of threads whose own line has no bound: a burst of 100 image
requests at a stage of 20 ms on one thread, each with 200 ms to live, waited there, was every one
preprocessed, and 91 of them got 504 up to 2.1 s after they came — no 503 at all, and the stage's
time spent on requests no one waited for any longer. So the stage has its own gate:

- at arrival, the request's finish in the stage is predicted: the rows ahead of it in the stage
  (waiting or running) over its threads, then its own, at the stage's recent time per row — a
  request of 12 photos takes twelve times one of one: learnt per request, three of them made
  every one-photo request look twelve times as long, and refused them all on an idle server; a
  request whose deadline that passes, less what its batch will take after (`reserve_s`: a
  request preprocessed with no time left for its batch was refused by the batch queue then,
  after waiting, its preprocess spent for nothing), is refused at once (`Overloaded`,
  "predicted_late"), and so is one that finds `capacity` requests in the stage already
  ("queue_full": the queue's bound, for requests without a deadline). A request that finds the
  stage empty is taken whatever the prediction: its run measures the stage again (a time learnt
  under a load gone, or from an odd request, must not refuse for good);
- a request whose deadline passed while it waited is not preprocessed (`StageExpired`, raised in
  the thread instead of running the stage);
- the server answers 504 at the deadline, not when the stage is done (server.py).

The time per row is an exponentially weighted mean of the stage's runs (`WEIGHT`); until the stage
has run once nothing is predicted. Thread-safe: the stage's threads report, the event loop admits.
"""

from __future__ import annotations

import threading

from batchpilot.runtime.errors import Overloaded

WEIGHT = 0.2
"""The weight of the newest stage time in the mean (about the last five count)."""


class StageExpired(Exception):
    """The request's deadline passed before a thread of the stage took it up: not run."""


class StageGate:
    """`admit(timeout_s, rows)` before a request enters the stage, `left(rows)` once it is out of
    it (run, skipped or cancelled before a thread took it), `ran(seconds, rows)` for each time the
    stage ran."""

    def __init__(self, *, threads: int, capacity: int) -> None:
        self._threads = max(1, threads)
        self._capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._inside = 0
        self._rows_inside = 0
        self._row_s: float | None = None

    @property
    def inside(self) -> int:
        """Requests waiting for the stage or in it."""
        return self._inside

    @property
    def mean_s(self) -> float | None:
        """The stage's recent time per row (None: it has not run yet)."""
        return self._row_s

    def predicted_s(self, rows: int = 1) -> float | None:
        """How long a request of `rows` rows arriving now would take to leave the stage (None:
        not known)."""
        with self._lock:
            row_s, ahead = self._row_s, self._rows_inside
        if row_s is None:
            return None
        return (ahead / self._threads + rows) * row_s

    def admit(self, timeout_s: float | None, *, rows: int = 1, reserve_s: float = 0.0) -> None:
        """Count the request in, or refuse it (`Overloaded`): the stage holds `capacity`
        already, or it would leave the stage with less than `reserve_s` of `timeout_s` left (the
        time its batch takes after); a request that finds the stage empty is taken."""
        with self._lock:
            row_s, ahead, inside = self._row_s, self._rows_inside, self._inside
            if inside >= self._capacity:
                raise Overloaded(
                    f"{inside} requests are waiting for the preprocess already, the most this "
                    "server holds; retry shortly or elsewhere",
                    reason="queue_full",
                )
            if timeout_s is not None and row_s is not None and inside:
                finish = (ahead / self._threads + rows) * row_s
                if finish + reserve_s > timeout_s:
                    after = f", and its batch {reserve_s * 1e3:.0f} ms after" if reserve_s else ""
                    raise Overloaded(
                        f"the request would wait past its deadline for the preprocess: "
                        f"{finish * 1e3:.0f} ms ({ahead} rows ahead of it on "
                        f"{self._threads} threads, {row_s * 1e3:.1f} ms a row){after}, where "
                        f"{timeout_s * 1e3:.0f} ms are left; retry shortly or elsewhere",
                        reason="predicted_late",
                    )
            self._inside += 1
            self._rows_inside += rows

    def left(self, rows: int = 1) -> None:
        with self._lock:
            self._inside = max(0, self._inside - 1)
            self._rows_inside = max(0, self._rows_inside - rows)

    def ran(self, seconds: float, rows: int = 1) -> None:
        per_row = seconds / max(1, rows)
        with self._lock:
            if self._row_s is None:
                self._row_s = per_row
            else:
                self._row_s += WEIGHT * (per_row - self._row_s)
