"""The store behind async inference: accepted jobs, their results, and when results expire.

`POST .../infer/async` answers at once with a job id; the job runs through the same batcher as a
synchronous request, and its result waits here until the client fetches it with `GET`, discards
it with `DELETE`, or its time-to-live (counted from completion) runs out. The store is bounded:
a submit when it is full fails at once (the HTTP layer answers 429 with Retry-After), and no job
is ever dropped to make room. A job that has not finished never expires, so an accepted job is
never silently lost; it only leaves by finishing and then expiring, or by being discarded.

A job may have an owner (with API keys on, the id of the key that submitted it): it is then
found, fetched and discarded only by that owner, and to anyone else it is just as absent as an
id never submitted, so a job id alone neither reads a result nor tells that the job exists.
Ownership is by key id, so a rotated key (same id, new value) keeps its jobs.

Owners share the store: with K keys allowed on the model, each holds at most `capacity // K`
jobs (its *share*; a lone key the whole store), so a caller that floods the store is refused
(429) at its share while every other key can still submit up to its own. A store that
partitions is the price of the guarantee: no job is ever dropped to make room, so room kept for
the others must be kept before they ask.

This module is pure: time comes from an injected clock, expiry happens when the store is used
(every call expires what is due first), and results are opaque to it. asyncio is used only for
the event a long-polling reader waits on.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

from batchpilot.runtime.errors import InferenceError, Overloaded

R = TypeVar("R")


class JobState(StrEnum):
    PENDING = "pending"
    """Accepted, not finished: queued for a batch or computing."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StoreFull(Overloaded):
    """The async job store holds `capacity` jobs; the client should retry later (429)."""


class OverShare(StoreFull):
    """The submitting key holds its share of the store; the rest is kept for the other keys
    (429)."""


class JobNotFound(InferenceError):
    """No such job: never submitted, discarded, or its result expired (404)."""


class HolderNotAnswering(InferenceError):
    """The replica holding the job (its id names it) did not answer in time (504)."""


@dataclass(eq=False, slots=True)
class Job(Generic[R]):
    id: str
    submitted_at: float
    owner: str | None = None
    """Who may see the job (the submitting API key's id); None: whoever can call the model."""
    state: JobState = JobState.PENDING
    finished_at: float | None = None
    result: R | None = None
    error: Exception | None = None
    fetched: bool = False
    """Its result (or error) has been read at least once."""
    size: int = 0
    """Bytes its result holds in the store (`JobStore.max_bytes`)."""
    work: asyncio.Task[None] | None = None
    """What computes the job; cancelled when a pending job is discarded."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the job finishes or leaves the store: what a long poll waits on."""

    @property
    def done(self) -> bool:
        return self.state is not JobState.PENDING


class JobStore(Generic[R]):
    """Bounded, expiring storage of async jobs and their results."""

    def __init__(
        self,
        *,
        capacity: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] | None = None,
        max_bytes: int | None = None,
        size_of: Callable[[R], int] | None = None,
    ) -> None:
        """`new_id`: makes a job's id (default: a random UUID's hex); a taken one is made again.
        `max_bytes`: the results' bytes (`size_of` each) past which submits get 429 too — a
        count alone let results of 1.2 MiB each (an output the size of a vocabulary) fill 1.2 GiB
        at the default capacity, within one key's share, and the pod's memory with it."""
        if capacity < 1:
            raise ValueError(f"async capacity must be at least 1, got {capacity}")
        if not ttl_s > 0:
            raise ValueError(f"async result TTL must be positive, got {ttl_s}")
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        self._jobs: dict[str, Job[R]] = {}
        self._finished: deque[Job[R]] = deque()
        """Finished jobs in completion order, which with one TTL is expiry order."""
        self._pending = 0
        self._held: dict[str, int] = {}
        """Jobs in the store by owner (owners with none are not in it)."""
        self._max_bytes = max_bytes
        self._size_of = size_of
        self.bytes_held = 0
        """The results' bytes in the store."""
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def share(self, owners: int) -> int:
        """The most jobs each of `owners` keys may hold: an equal part of the store, and at least
        one (with more keys than places, the store's own bound is the one that refuses)."""
        return max(1, self._capacity // max(1, owners))

    def held(self, owner: str) -> int:
        """The jobs `owner` has in the store, pending or finished."""
        self._expire(self._clock())
        return self._held.get(owner, 0)

    def submit(self, *, owner: str | None = None, owners: int = 1) -> Job[R]:
        """Accept a new pending job belonging to `owner`, one of `owners` keys that share the
        store, or raise at once: StoreFull when the store is full, OverShare when `owner`
        already holds its share."""
        now = self._clock()
        self._expire(now)
        if len(self._jobs) >= self._capacity:
            raise StoreFull(
                f"the async job store is full ({self._capacity} jobs: {self._pending} pending, "
                f"{len(self._jobs) - self._pending} finished and not yet fetched or expired); "
                "retry later, or DELETE results you have fetched",
                retry_after_s=self._room_in(now),
            )
        if self._max_bytes is not None and self.bytes_held >= self._max_bytes:
            raise StoreFull(
                f"the async job store holds {self.bytes_held / 2**20:.0f} MiB of results, its "
                f"bound ({self._max_bytes / 2**20:.0f} MiB); retry later, or DELETE results you "
                "have fetched",
                retry_after_s=self._room_in(now),
            )
        if owner is not None and owners > 1:
            self._check_share(owner, owners, now)
        job_id = self._new_id()
        while job_id in self._jobs:
            job_id = self._new_id()
        job: Job[R] = Job(id=job_id, submitted_at=now, owner=owner)
        self._jobs[job_id] = job
        self._pending += 1
        if owner is not None:
            self._held[owner] = self._held.get(owner, 0) + 1
        return job

    def _check_share(self, owner: str, owners: int, now: float) -> None:
        share = self.share(owners)
        held = self._held.get(owner, 0)
        if held < share:
            return
        raise OverShare(
            f"key {owner!r} holds {held} of the async job store's {self._capacity} places, its "
            f"share ({owners} keys share the store; the rest is kept for the others); retry "
            "later, or DELETE results you have fetched",
            retry_after_s=self._room_in(now, owner=owner),
        )

    def _room_in(self, now: float, *, owner: str | None = None) -> float:
        """Seconds until the oldest finished result (of `owner`, when given) expires; 1 s when
        there is none."""
        for job in self._finished:
            if self._jobs.get(job.id) is job and (owner is None or job.owner == owner):
                assert job.finished_at is not None
                return max(1.0, math.ceil(job.finished_at + self._ttl_s - now))
        return 1.0

    def _release(self, job: Job[R]) -> None:
        """Count `job` out of its owner's holding (it left the store)."""
        self.bytes_held -= job.size
        if job.owner is None:
            return
        left = self._held[job.owner] - 1
        if left:
            self._held[job.owner] = left
        else:
            del self._held[job.owner]

    def _owned(self, job_id: str, owner: str | None) -> Job[R] | None:
        job = self._jobs.get(job_id)
        return job if job is not None and job.owner == owner else None

    def get(self, job_id: str, *, owner: str | None = None) -> Job[R] | None:
        """`owner`'s job, or None when unknown, discarded, expired or another owner's."""
        self._expire(self._clock())
        return self._owned(job_id, owner)

    def succeed(self, job: Job[R], result: R) -> bool:
        """Record a result; False when the job had already left the store (discarded)."""
        return self._finish(job, JobState.SUCCEEDED, result=result)

    def fail(self, job: Job[R], error: Exception) -> bool:
        """Record the error the client will get; False when the job had left the store. Kept
        without its traceback and the exceptions it came from: their frames held the request's
        decoded inputs (8 MiB a job measured, up to a body's 64 MiB) for the result's TTL, for
        a job whose answer is a status and a message."""
        error.__traceback__ = None
        error.__context__ = error.__cause__ = None
        return self._finish(job, JobState.FAILED, error=error)

    def _finish(
        self,
        job: Job[R],
        state: JobState,
        *,
        result: R | None = None,
        error: Exception | None = None,
    ) -> bool:
        if job.done or self._jobs.get(job.id) is not job:
            return False
        now = self._clock()
        job.state, job.result, job.error, job.finished_at = state, result, error, now
        if result is not None and self._size_of is not None:
            job.size = self._size_of(result)
            self.bytes_held += job.size
        job.work = None
        self._pending -= 1
        self._finished.append(job)
        job.finished.set()
        self._expire(now)
        return True

    def discard(self, job_id: str, *, owner: str | None = None) -> Job[R] | None:
        """Remove `owner`'s job; a pending one has its work cancelled. None when `owner` has
        no such job (another owner's is left alone)."""
        self._expire(self._clock())
        job = self._owned(job_id, owner)
        if job is None:
            return None
        del self._jobs[job_id]
        self._release(job)
        if not job.done:
            self._pending -= 1
            if job.work is not None:
                job.work.cancel()
        job.finished.set()
        if len(self._finished) > 2 * len(self._jobs) + 64:
            # Discarded results leave stale entries behind; don't let them pile up for a TTL.
            self._finished = deque(j for j in self._finished if self._jobs.get(j.id) is j)
        return job

    def unfetched(self) -> int:
        """Jobs whose outcome nobody has read yet: pending, or finished and never fetched (what
        a draining replica holds on for, `graceful.hold_unfetched`)."""
        self._expire(self._clock())
        return sum(1 for job in self._jobs.values() if not job.fetched)

    def pending(self) -> list[Job[R]]:
        return [job for job in self._jobs.values() if not job.done]

    def counts(self) -> dict[str, int]:
        """Jobs stored by state (every state present), after expiring what is due."""
        self._expire(self._clock())
        counts = dict.fromkeys((state.value for state in JobState), 0)
        for job in self._jobs.values():
            counts[job.state.value] += 1
        return counts

    def expire(self) -> int:
        """Drop the results whose TTL has passed; returns how many."""
        return self._expire(self._clock())

    def _expire(self, now: float) -> int:
        dropped = 0
        while self._finished:
            job = self._finished[0]
            if self._jobs.get(job.id) is not job:
                self._finished.popleft()  # discarded earlier
                continue
            assert job.finished_at is not None
            if job.finished_at + self._ttl_s > now:
                break
            self._finished.popleft()
            del self._jobs[job.id]
            self._release(job)
            dropped += 1
        self.expired_total += dropped
        return dropped
