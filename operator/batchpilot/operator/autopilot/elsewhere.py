"""Another writer of the Deployment's replica count — a HorizontalPodAutoscaler (KEDA's
ScaledObjects make one), `kubectl scale` in an incident, a script — seen and said.

With `spec.scaling.mode: auto` the autopilot owns the Deployment's replica count, and anything
else that writes it fights the autopilot: an HPA sets its count on its own cadence (15 s), the
autopilot sets its own at its next tick, and pods are started and drained in turn — on GPUs each
start is a cold start of tens of seconds. Nothing in a tick's own view shows it: every tick
finds a count in force and decides from it, and a replica count set by hand is scaled back a
scale-down delay later without a word. So the pilot remembers the count it left in force on the
Deployment (by the Deployment's uid) after each tick; a count found different at the next one,
other than the spec's bounds clamping it (the reconciler does), was written by someone else. A
Warning Event says so and what to do, at most once every `EVERY_S` per service (it counts the
changes in between).

The autopilot goes on deciding from the count it finds, as the InferenceService declares:
replicas the load does not need go as any surplus does, once the scale-down delay's
recommendations say fewer (those made before the change count: a count raised by hand under a
steady load goes within seconds), and too few are undone at the next tick. The memory is the
operator process's: after a restart, or a new leader, the first tick only looks.

Pure: the time is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from batchpilot.operator.events import Event

REASON = "ReplicasChangedElsewhere"
EVERY_S = 600.0
"""Say it at most this often per service: an HPA in a fight changes the count every few
ticks, and one Event per change would bury every other."""


@dataclass(slots=True)
class _Left:
    uid: str
    replicas: int
    unsaid: int = 0
    """Changes seen since the last Event."""
    said_at: float | None = None


class OtherWriters:
    """`check` at the start of a tick in mode auto, `left` once the tick's count is in force."""

    def __init__(self, *, every_s: float = EVERY_S) -> None:
        self._every_s = every_s
        self._left: dict[tuple[str, str], _Left] = {}

    def check(
        self,
        key: tuple[str, str],
        *,
        uid: str,
        replicas: int,
        low: int,
        high: int,
        now: float,
    ) -> Event | None:
        """The Warning to post when the Deployment (`uid`) of service `key` has `replicas` where
        the autopilot left another count (one the spec's bounds `low`…`high` do not explain),
        unless one was posted less than `every_s` ago."""
        left = self._left.get(key)
        if left is None or left.uid != uid:
            return None  # nothing left yet, or a new Deployment (deleted and created again)
        if replicas in (left.replicas, max(low, min(high, left.replicas))):
            return None
        was, left.replicas = left.replicas, replicas
        left.unsaid += 1
        if left.said_at is not None and now - left.said_at < self._every_s:
            return None
        times, left.unsaid, left.said_at = left.unsaid, 0, now
        return Event("Warning", REASON, message(key[1], was=was, now=replicas, times=times))

    def left(self, key: tuple[str, str], *, uid: str, replicas: int) -> None:
        """The tick of service `key` left `replicas` in force on its Deployment (`uid`)."""
        known = self._left.get(key)
        if known is None or known.uid != uid:
            self._left[key] = _Left(uid, replicas)
        else:
            known.replicas = replicas

    def drop(self, key: tuple[str, str]) -> None:
        """Forget service `key` (its count is no longer the autopilot's: mode recommend, off)."""
        self._left.pop(key, None)

    def forget(self, keep: Iterable[tuple[str, str]]) -> None:
        """Drop every service but `keep` (deleted, or no longer in mode auto)."""
        kept = set(keep)
        for key in [k for k in self._left if k not in kept]:
            del self._left[key]


def message(name: str, *, was: int, now: int, times: int) -> str:
    often = "" if times <= 1 else f" ({times} such changes since this was last said)"
    return (
        f"the replicas of Deployment {name} were changed from {was} to {now} by another writer"
        f"{often}: a HorizontalPodAutoscaler or KEDA ScaledObject that targets it, or kubectl "
        f"scale. With spec.scaling.mode auto the autopilot owns the replica count and decides "
        f"from {now}: replicas the load does not need go as any surplus does, once the "
        f"scale-down delay's recommendations say fewer (those already made count), and too few "
        f"are undone at the next tick. To scale by other means set "
        f"spec.scaling.mode to recommend or off; to keep a floor, spec.scaling.minReplicas."
    )
