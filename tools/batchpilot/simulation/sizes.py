"""Requests of varied sizes on one replica: the reference the latency model's treatment of them
is checked against.

The simulator's replica (`replica`) counts in requests of one size: a request of k rows costs
β·k, and a batch limit of B rows holds B // k of them. Clients that send varied rows a request
(a ranking call with 1 to 50 candidates, an image batch of whatever the user uploaded) make
batches that differ in rows for the same number of requests, and batches whose next request
does not fit. This follows the runtime's batcher rule for rule, for requests of any rows: a
batch starts with the oldest waiting request and dispatches once the rows waiting reach the
limit or the oldest has waited `delay_s`, never before the device is free; it takes the waiting
requests oldest first while their rows fit the limit (the first one always: a request larger
than the limit runs alone), then fills the room the first that did not fit leaves with the
requests behind it that fit, oldest first (looking at `FILL_SCAN` of them). No admission and no
deadlines: every request is served, and its latency is its batch's end less its arrival.

`RowMix` (`batchpilot.api.request_rows`) is a distribution of rows a request (`1:9,16:1`:
nine in ten bring one row, one in ten sixteen); `serve` runs given arrivals and sizes,
`latencies` Poisson arrivals of a mix.

Pure: numpy and arithmetic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from batchpilot.api.request_rows import RowMix

FILL_SCAN = 64
"""The requests behind one that does not fit a batch looked at to fill its room (the runtime's
`batch_queue.FILL_SCAN`)."""

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
T = TypeVar("T")


def take(
    waiting: deque[T], rows_of: Callable[[T], int], most: int, scan: int = FILL_SCAN
) -> tuple[list[T], int]:
    """The batch the runtime's batcher forms from `waiting` (oldest first; taken out of it), and
    its rows: requests oldest first while their rows fit `most` (the first always), then the
    room the first that did not fit leaves filled with the requests behind it that fit, oldest
    first, looking at `scan` of them."""
    batch: list[T] = []
    rows = 0
    while waiting and (not batch or rows + rows_of(waiting[0]) <= most):
        batch.append(waiting.popleft())
        rows += rows_of(batch[-1])
    i, end = 1, min(len(waiting), 1 + scan)
    while i < end and rows < most:
        if rows + rows_of(waiting[i]) <= most:
            batch.append(waiting[i])
            rows += rows_of(waiting[i])
            del waiting[i]
            end -= 1
        else:
            i += 1
    return batch, rows


def draw(mix: RowMix, n: int, rng: np.random.Generator) -> IntArray:
    """`n` requests' rows, drawn from `mix` with `rng`."""
    return rng.choice(np.array(mix.rows, dtype=np.int64), size=n, p=np.array(mix.shares))


def latencies(
    rate: float,
    mix: RowMix,
    *,
    alpha_s: float,
    beta_s: float,
    max_batch: int,
    delay_s: float,
    requests: int,
    seed: int = 0,
    fill_scan: int = FILL_SCAN,
) -> FloatArray:
    """Each request's latency (seconds, in arrival order) on one replica offered `rate` Poisson
    requests per second of `mix`'s rows, with batches of t(b) = α + β·b for b rows."""
    if rate <= 0 or requests < 1:
        raise ValueError("need a positive rate and at least one request")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests))
    return serve(
        arrivals.tolist(),
        draw(mix, requests, rng).tolist(),
        alpha_s=alpha_s,
        beta_s=beta_s,
        max_batch=max_batch,
        delay_s=delay_s,
        fill_scan=fill_scan,
    )


def serve(
    arrivals: Sequence[float],
    sizes: Sequence[int],
    *,
    alpha_s: float,
    beta_s: float,
    max_batch: int,
    delay_s: float,
    fill_scan: int = FILL_SCAN,
) -> FloatArray:
    """Each request's latency (seconds) for requests arriving at `arrivals` (sorted) with
    `sizes` rows each, on one replica with batches of t(b) = α + β·b for b rows. `fill_scan`:
    how many requests behind one that does not fit are looked at to fill the room (0: none,
    the batch closes on it)."""
    if len(arrivals) != len(sizes):
        raise ValueError("one size for each arrival")
    if max_batch < 1 or delay_s < 0:
        raise ValueError("need a batch limit of at least one row and no negative delay")
    requests = len(arrivals)
    out = np.empty(requests, dtype=np.float64)
    waiting: deque[int] = deque()  # admitted, not yet in a batch, oldest first
    waiting_rows = 0
    arrived = 0  # arrivals[:arrived] are in the queue or served
    free = 0.0
    while arrived < requests or waiting:
        if not waiting:
            waiting.append(arrived)
            waiting_rows += sizes[arrived]
            arrived += 1
        oldest = arrivals[waiting[0]]
        start = free if free > oldest else oldest
        dispatch = max(start, oldest + delay_s)
        if waiting_rows >= max_batch:
            dispatch = start
        else:
            # Full earlier: the moment the rows waiting reach the limit, if before the delay.
            rows, i = waiting_rows, arrived
            while i < requests and arrivals[i] <= dispatch:
                rows += sizes[i]
                if rows >= max_batch:
                    dispatch = max(start, arrivals[i])
                    break
                i += 1
        while arrived < requests and arrivals[arrived] <= dispatch:
            waiting.append(arrived)
            waiting_rows += sizes[arrived]
            arrived += 1
        # The batch: oldest first while their rows fit (the first one always), then the room
        # left filled from behind the first that did not fit.
        batch, rows = take(waiting, sizes.__getitem__, max_batch, fill_scan)
        waiting_rows -= rows
        free = dispatch + alpha_s + beta_s * rows
        for j in batch:
            out[j] = free - arrivals[j]
    return out
