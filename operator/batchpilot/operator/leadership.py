"""Leader election on a coordination.k8s.io/v1 Lease, decided without I/O: client-go's rules.

Several operator replicas run; only the one holding the Lease reconciles. Each round a candidate
reads the Lease and `decide` says what to do — create it (absent), take it (free, expired), renew
it (ours), or wait (someone else's, still valid) — and gives the object to write. A replace
carries the resourceVersion that was read, so of two candidates writing in the same round the API
server lets exactly one through and answers the other 409 Conflict.

Expiry is judged as client-go judges it: by when *this* process last saw the record change, on
its own monotonic clock, plus the lease duration the holder wrote — never by the holder's
renewTime, which another machine's clock wrote. A holder whose clock is skewed can then neither
keep a lease it stopped renewing nor lose one it renews. The timestamps written are MicroTime
(RFC 3339 with microseconds, UTC), as Kubernetes writes them, and are for people reading the
Lease.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"
RELEASED_DURATION_S = 1
"""What a released Lease says its duration is, as client-go writes it: expired at once even for a
candidate that ignored the empty holder."""


def micro_time(at: datetime) -> str:
    """`2026-11-30T12:00:00.000000Z`: a Kubernetes MicroTime."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: object) -> datetime | None:
    """A MicroTime (or any RFC 3339 time) as written in a Lease; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The leader-election record in a Lease's spec. An empty holder is a free lease."""

    holder: str = ""
    duration_s: int = 0
    acquired: datetime | None = None
    renewed: datetime | None = None
    transitions: int = 0

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquired=parse_micro_time(spec.get("acquireTime")),
            renewed=parse_micro_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": self.transitions,
        }
        if self.acquired is not None:
            spec["acquireTime"] = micro_time(self.acquired)
        if self.renewed is not None:
            spec["renewTime"] = micro_time(self.renewed)
        return spec


@dataclass(frozen=True, slots=True)
class Observed:
    """The record this process saw last, and when it saw it change (its own monotonic clock)."""

    record: LeaseRecord
    at: float

    def expired(self, now: float) -> bool:
        return now >= self.at + self.record.duration_s

    def then(self, record: LeaseRecord, now: float) -> Observed:
        """What is observed after reading `record` at `now`: the time moves only on a change."""
        return self if record == self.record else Observed(record, now)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One process competing for the Lease `namespace/name`."""

    identity: str
    name: str
    namespace: str
    duration_s: int


class Action(StrEnum):
    CREATE = "create"
    """No Lease yet: create it, holding it."""
    TAKE = "take"
    """Free or expired: replace it, holding it (a leader transition)."""
    RENEW = "renew"
    """Ours: replace it with a fresh renewTime."""
    WAIT = "wait"
    """Someone else holds it and it has not expired: try again next round."""


@dataclass(frozen=True, slots=True)
class Round:
    """One round's decision. `observed` is remembered whatever happens to the write; after a
    write goes through, the record written is observed instead (`Observed(record, now)`)."""

    action: Action
    reason: str
    observed: Observed | None
    body: dict[str, Any] | None = None
    """The Lease to create or replace (None: WAIT)."""
    record: LeaseRecord | None = None
    """The record in `body`."""


def decide(
    lease: Mapping[str, Any] | None,
    *,
    candidate: Candidate,
    previous: Observed | None,
    now: float,
    wall: datetime,
) -> Round:
    """What `candidate` does with the Lease as read (None: it does not exist) at monotonic `now`
    (`wall` only goes into the timestamps written)."""
    if lease is None:
        record = LeaseRecord(candidate.identity, candidate.duration_s, wall, wall, 0)
        return Round(Action.CREATE, "no lease yet", None, _body(None, candidate, record), record)
    current = LeaseRecord.of(lease)
    observed = Observed(current, now) if previous is None else previous.then(current, now)
    if current.holder == candidate.identity:
        acquired = current.acquired or wall
        record = LeaseRecord(
            candidate.identity, candidate.duration_s, acquired, wall, current.transitions
        )
        return Round(Action.RENEW, "ours", observed, _body(lease, candidate, record), record)
    if current.holder and not observed.expired(now):
        left = observed.at + current.duration_s - now
        reason = f"held by {current.holder}, {left:.1f} s left unless renewed"
        return Round(Action.WAIT, reason, observed)
    reason = f"expired: {current.holder} did not renew" if current.holder else "free"
    record = LeaseRecord(
        candidate.identity, candidate.duration_s, wall, wall, current.transitions + 1
    )
    return Round(Action.TAKE, reason, observed, _body(lease, candidate, record), record)


def release(
    lease: Mapping[str, Any] | None, *, candidate: Candidate, wall: datetime
) -> dict[str, Any] | None:
    """The Lease to write to give it up at once (client-go's release: no holder, a 1 s duration),
    or None when it is not `candidate`'s to give."""
    if lease is None or LeaseRecord.of(lease).holder != candidate.identity:
        return None
    current = LeaseRecord.of(lease)
    record = LeaseRecord("", RELEASED_DURATION_S, wall, wall, current.transitions)
    return _body(lease, candidate, record)


def _body(
    lease: Mapping[str, Any] | None, candidate: Candidate, record: LeaseRecord
) -> dict[str, Any]:
    """The Lease to write: what was read (its metadata, resourceVersion included, so a replace
    is refused if it changed since) with the record as its spec; a new one when none was read."""
    if lease is None:
        metadata: dict[str, Any] = {"name": candidate.name, "namespace": candidate.namespace}
    else:
        metadata = copy.deepcopy(dict(lease.get("metadata") or {}))
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": record.spec()}
