"""The leader elector: leadership.py's rounds against the API, as client-go's leaderelection runs
them — wait as a standby until the Lease is ours, renew it while leading, give it up on the way
out.

Blocking and thread-based on purpose: it must keep renewing whatever kopf's event loop is doing,
and it runs before that loop exists. A renewal that the API does not answer is not waited out:
the leader counts itself lost when the renew deadline passes on its own clock, even with a request
still in flight, so that it stops before a standby may take over (lease duration after the
standby last saw a renewal). The deadline runs from when the renewal that went through was
asked, not answered, as client-go's runs from the start of its renew loop: the standby may have
seen it as soon as the API server carried it out.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from batchpilot.operator.kinds import LEASE
from batchpilot.operator.kube import Kube, KubeError
from batchpilot.operator.leadership import (
    Action,
    Candidate,
    LeaseRecord,
    Observed,
    decide,
    release,
)

logger = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 3
"""A release that meets a Conflict reads the Lease again: someone wrote it meanwhile."""


def default_identity() -> str:
    """The pod's name (POD_NAME, the downward API), else the host's name and a random suffix, as
    client-go's callers do: unique among the candidates, and readable in the Lease."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4()}"


class LeaderElector:
    """One candidate for the Lease. `acquire()` then `keep()` from one thread; `stop()` from any
    thread ends either; `release()` after `keep()` has returned."""

    def __init__(
        self,
        kube: Kube,
        candidate: Candidate,
        *,
        renew_deadline_s: float,
        retry_period_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self.candidate = candidate
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._clock = clock
        self._wall = wall
        self._observed: Observed | None = None
        self._renewed_at: float | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        """Set by `stop()` and by the renewer when the Lease turns out to be someone else's."""
        self._round_lock = threading.Lock()
        """No renewal runs while the Lease is released, nor starts after it."""
        self.lost_because = ""

    @property
    def identity(self) -> str:
        return self.candidate.identity

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def try_round(self, *, leading: bool = False) -> bool:
        """One round: read the Lease, decide, write. True when this process holds it after.
        `leading`: only a renewal will do — a leader that finds the Lease gone, free or someone
        else's has lost it, whatever it could take now."""
        lease = self._kube.get(LEASE, self.candidate.namespace, self.candidate.name)
        now = self._clock()  # when the read came back: the latest a change could be seen
        step = decide(
            lease, candidate=self.candidate, previous=self._observed, now=now, wall=self._wall()
        )
        self._observed = step.observed
        if step.body is None or (leading and step.action is not Action.RENEW):
            logger.debug("lease %s: %s", self.candidate.name, step.reason)
            return False
        if leading and self._wake.is_set():  # lost or stopped while the read was in flight
            return False
        try:
            if step.action is Action.CREATE:
                written = self._kube.create(step.body)
            else:
                written = self._kube.replace(step.body)
        except KubeError as exc:
            if exc.status == 409:  # another candidate wrote first this round
                logger.debug(
                    "lease %s: %s lost the round: %s", self.candidate.name, step.action, exc
                )
                return False
            raise
        if step.action is not Action.RENEW:
            logger.info(
                "lease %s: %s took it (%s)", self.candidate.name, self.identity, step.reason
            )
        self._observed = Observed(LeaseRecord.of(written), self._clock())
        return True

    def acquire(self) -> bool:
        """Wait as a standby until this process holds the Lease (True), or `stop()` (False)."""
        logger.info("lease %s: %s is a candidate", self.candidate.name, self.identity)
        while not self._stopping.is_set():
            asked = self._clock()
            if self._round_quietly():
                self._renewed_at = asked
                return True
            self._stopping.wait(self.retry_period_s)
        return False

    def keep(self) -> bool:
        """Renew the Lease every retry period until `stop()` (True) or until it is lost (False):
        someone else holds it, or no renewal went through for the renew deadline."""
        if self._renewed_at is None:
            raise RuntimeError("keep() before acquire() succeeded")
        renewer = threading.Thread(target=self._renew, name="lease-renewer", daemon=True)
        renewer.start()
        while True:
            if self._stopping.is_set():
                return True
            if self.lost_because:
                return False
            left = (self._renewed_at or 0.0) + self.renew_deadline_s - self._clock()
            if left <= 0:
                self.lost_because = f"not renewed for {self.renew_deadline_s:g} s"
                self._wake.set()
                return False
            self._wake.wait(left)

    def release(self) -> bool:
        """Give the Lease up, so that a standby takes it at once. True when it was ours and now
        is free; False when it was not ours (lost), the API refused, or the Lease runs out by
        itself first: a renewal still in flight against an API server in trouble (its client
        retrying) is not waited for past the time a standby may take the Lease anyway, nor is
        another attempt started after it — the process's shutdown is not held for nothing."""
        self.stop()
        expires = (self._renewed_at or self._clock()) + self.candidate.duration_s
        if not self._round_lock.acquire(timeout=max(0.0, expires - self._clock())):
            logger.warning(
                "lease %s: not released: a renewal is still in flight; it runs out by itself",
                self.candidate.name,
            )
            return False
        try:
            for _ in range(RELEASE_ATTEMPTS):
                if self._clock() >= expires:
                    logger.info("lease %s: not released: it has run out", self.candidate.name)
                    return False
                try:
                    lease = self._kube.get(LEASE, self.candidate.namespace, self.candidate.name)
                    body = release(lease, candidate=self.candidate, wall=self._wall())
                    if body is None:
                        return False
                    self._kube.replace(body)
                except KubeError as exc:
                    if exc.status == 409:
                        continue
                    logger.warning("lease %s: not released: %s", self.candidate.name, exc)
                    return False
                logger.info("lease %s: %s released it", self.candidate.name, self.identity)
                return True
        finally:
            self._round_lock.release()
        return False

    def _renew(self) -> None:
        while not self._wake.wait(self.retry_period_s):
            with self._round_lock:
                if self._wake.is_set():
                    return
                # Dated from when it was asked: a standby measures the lease from when it saw
                # the renewal, about when the API server carried it out, which an answer slow
                # to come back (a second and more from a loaded API server) is well after.
                asked = self._clock()
                if self._round_quietly(leading=True):
                    self._renewed_at = asked
                    continue
            holder = self._observed.record.holder if self._observed else ""
            if holder != self.identity:  # someone else's, free, or gone
                self.lost_because = f"the lease is {holder or 'free'}'s now"
                self._wake.set()
                return

    def _round_quietly(self, *, leading: bool = False) -> bool:
        """A round whose failure is only a round not won: the renew deadline, not an exception,
        decides when a leader that cannot reach the API stops."""
        try:
            return self.try_round(leading=leading)
        except Exception as exc:  # any failure to reach the API: KubeError, urllib3, OSError
            logger.warning("lease %s: round failed: %s", self.candidate.name, exc)
            return False
