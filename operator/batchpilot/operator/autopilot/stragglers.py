"""Replicas slower than their peers, and their replacement.

A GPU that throttles (a failing fan, a power cap, a hot rack), a node with a noisy neighbour on
its PCIe switch or its CPU: one replica's batches take twice as long as its peers' at the same
size. A Service spreads the requests evenly, so that replica gets its share of the load with half
the capacity: it queues, refuses what it cannot finish in time, and its requests are the fleet's
P99. The fleet's sums barely show it (one replica of eight at half speed is 6 % of the capacity),
and replicas added help only as far as they cut that replica's share: to bring a replica at half
speed inside the SLA the fleet must nearly double. Measured in the simulator (`batchpilot
simulate --slowdown 300:2::1 --keep-slow-replicas`, bench/README.md "A replica slower than its
peers"), an autopilot that could only add replicas kept a replica at half speed on a fixed-cost
service outside the SLA for as long as it stayed slow.

So each decision compares every replica's batch times with its peers'. Its pace is its mean
batch time over what the fit t(b) predicts for its mean batch (a replica that ran larger batches
is not slower for it), read between its last two scrapes where enough replicas ran enough batches
there (`Observation.recent_pods`: a replica that slowed a scrape ago reads twice as slow at the
next decision, where the window's mean takes half of it to read half as slow), else over the
window; a replica whose pace is `SLOW` times the normal one (and beyond the chance excess its
batches' spread allows, `NOISE`), at two decisions in a row (`SLOW_FOR_S`; a window apart where
read over the window), is replaced. The pilot deletes its pod and the ReplicaSet starts another
at once, which the scheduler places where a GPU is free — not on the one the old pod holds
while it drains — at once where the other replicas carry the load without it, else once a
replica asked in its place is ready (`hand_over`). Its batches, while it reads slow and until
they have left the window, are kept from the fit t(b) (`Verdict.taints`): steeper than any other
replica's, they taught a slope that ruled out the batch limits that carry the load.

What keeps it from doing harm:
- a pace needs peers: at least `MIN_PODS` replicas that each ran `MIN_BATCHES` batches, and
  the slow ones at most half of them, measured against the lower median of their paces (of two,
  the faster: slowness is what breaks, speed is not);
- one replacement at a time (of a quarter of the replicas at most, `AT_ONCE_SHARE`): none within
  `REPLACE_GAP_S` of the last, nor before the previous one's replacements can have started and
  been measured (a cold start and a window);
- at most `MAX_PER_HOUR`: slowness that follows the pods (a node that hosts their replacements
  again, a model whose speed depends on the data a replica happens to get) stops being
  replaced and is reported instead;
- never while the replicas run different templates (a rollout: a new model version or variant
  may be slower by design; the pilot says so with `comparable`).

Pure: observations and state in, pod names and state out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from batchpilot.operator.autopilot.observation import PodCompute
from batchpilot.operator.autopilot.service_model import LatencyFit

SLOW = 1.3
"""A replica whose batches take this many times its peers' (their lower median pace) is slow. Batch
times of one model on one kind of GPU agree within a few per cent; the batch-time variation
the model plans for (`LatencyFit.batch_cv`) is per batch and averages out over a window's."""
MIN_PODS = 2
"""Replicas that must have run enough batches for their pace to say what normal is."""
MIN_BATCHES = 20
"""Batches a replica must have run in the window for its pace to count."""
SLOW_FOR_S = 15.0
"""How long a replica must have been slow, decision after decision, before it is replaced: two
decisions in a row at the default interval. Read between the last two scrapes, their views do
not overlap: a replica stalled once (one batch that waited seconds on a page-fault storm, a
checkpoint) reads slow at one of them, and is not replaced. Read over the window (too few
batches between two scrapes), a window's length. Each minute a slow replica keeps
serving costs its share of the requests' SLA: at a 99 % objective over an hour, the error budget
is 36 s."""
NOISE = 2.0
"""Standard errors of a replica's mean batch time that its excess must pass too, beyond the
largest of n replicas' chance excesses (√(2·ln n) more: the largest of 200 replicas' means is
2.9 standard errors above theirs by chance alone): with few batches and batch times that vary
(`LatencyFit.batch_cv`), a mean 1.3× its peers' can be chance (cv 1 over 40 batches: 16 % a
standard error; of 200 replicas at cv 0.5, without the n, a few were "slow" every hour)."""
MIN_CV = 0.1
"""The batch-time variation the noise bound assumes at the least (a fit that measured none)."""
REPLACE_GAP_S = 120.0
"""The shortest time between two replacements of one service."""
MAX_PER_HOUR = 4
"""Replacements a service gets in an hour; beyond, slow replicas are reported, not replaced."""
MAX_WAIT_COLD_STARTS = 3.0
"""A slow replica serving on until the one asked in its place is ready goes after this many
cold starts anyway (a replica that cannot start: no GPU free, a quota)."""
AT_ONCE_SHARE = 4
"""One replacement may take a quarter of the replicas measured (one at least) at once: two GPUs
of eight that throttle together (one hot rack) are replaced together, not minutes apart."""
HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Stragglers:
    """What the autopilot remembers of slow replicas: since when each has been slow, the pods it
    chose to replace in the last hour (with when), and those of them still serving until the
    replicas asked beside them are ready (`hand_over`)."""

    slow: tuple[tuple[str, float], ...] = ()
    replaced: tuple[tuple[str, float], ...] = ()
    waiting: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for key in ("slow", "replaced", "waiting"):
            if pods := getattr(self, key):
                doc[key] = [[pod, round(at, 3)] for pod, at in pods]
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> Stragglers:
        """The persisted document; anything unreadable is forgotten (nothing is replaced on it)."""
        if not isinstance(doc, dict):
            return cls()
        try:
            read = {
                key: tuple((str(pod), float(at)) for pod, at in doc.get(key, []))
                for key in ("slow", "replaced", "waiting")
            }
        except (TypeError, ValueError):
            return cls()
        return cls(**read)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What this window says of slow replicas: the pods to replace now, the words for the
    decision's reason (empty where none is slow), and what to remember."""

    replace: tuple[str, ...]
    note: str
    state: Stragglers
    taints: bool = False
    """The window holds batches of a slow replica (slow now, or replaced within it and still
    draining there): the fit would learn them as the service's, a steeper t(b) than any
    replica but that one has — keep the fit learned before."""


def paces(pods: Sequence[PodCompute], model: LatencyFit) -> dict[str, float]:
    """Each replica's mean batch time over the fit's t(b) at its mean batch, for the replicas
    that ran `MIN_BATCHES` batches in the window."""
    out = {}
    for pod in pods:
        predicted = model.alpha_s + model.beta_s * pod.mean_batch
        if pod.batches >= MIN_BATCHES and pod.mean_seconds > 0 and predicted > 0:
            out[pod.pod] = pod.mean_seconds / predicted
    return out


def slow_pods(
    pods: Sequence[PodCompute], model: LatencyFit, *, gone: Collection[str] = ()
) -> dict[str, float]:
    """The replicas slower than `SLOW` times the lower median pace (and than the noise of their
    mean, `NOISE`), each with how many times; none without `MIN_PODS` to compare, or where more
    than half are slow. Pods `gone` (replaced: draining, still in the window) are none."""
    measured = paces([p for p in pods if p.pod not in gone], model)
    if len(measured) < MIN_PODS:
        return {}
    # The lower median: of two replicas, the faster one's pace is the normal one's. A GPU
    # that throttles, a node whose neighbour takes its bus, make a replica slower, never faster.
    normal = statistics.median_low(measured.values())
    batches = {p.pod: p.batches for p in pods}
    spread = max(model.batch_cv, MIN_CV) * (NOISE + math.sqrt(2 * math.log(len(measured))))
    slow = {
        pod: pace / normal
        for pod, pace in measured.items()
        if pace >= normal * max(SLOW, 1 + spread / math.sqrt(batches[pod]))
    }
    return slow if 2 * len(slow) <= len(measured) else {}


def slow_now(
    window: Sequence[PodCompute],
    recent: Sequence[PodCompute],
    model: LatencyFit,
    *,
    gone: Collection[str] = (),
) -> tuple[dict[str, float], bool]:
    """`slow_pods` of the freshest view that can tell — between the last two scrapes where
    `MIN_PODS` replicas ran enough batches there, else over the window — and whether it was
    the window's (whose readings a decision apart overlap: they confirm nothing)."""
    if len(paces([p for p in recent if p.pod not in gone], model)) >= MIN_PODS:
        return slow_pods(recent, model, gone=gone), False
    return slow_pods(window, model, gone=gone), True


def judge(
    pods: Sequence[PodCompute],
    model: LatencyFit | None,
    state: Stragglers,
    *,
    recent: Sequence[PodCompute] = (),
    now: float,
    cold_start_s: float,
    window_s: float,
    comparable: bool = True,
    act: bool = True,
) -> Verdict:
    """This window's slow replicas, and the ones to replace now if any (the slowest of those
    slow for `SLOW_FOR_S`), within the limits of the module's docstring; `act` False: only
    say which are slow (`spec.scaling.replaceSlowReplicas`)."""
    replaced = tuple((pod, at) for pod, at in state.replaced if now - at < HOUR_S)
    if model is None or not comparable:
        return Verdict((), "", Stragglers(replaced=replaced, waiting=state.waiting))
    slow, overlapping = slow_now(pods, recent, model, gone={pod for pod, _ in replaced})
    # Read over the window, two readings confirm each other only a window apart.
    confirm_s = window_s if overlapping else SLOW_FOR_S
    since = dict(state.slow)
    kept = tuple((pod, since.get(pod, now)) for pod in sorted(slow))
    remembered = Stragglers(slow=kept, replaced=replaced, waiting=state.waiting)
    draining = bool(state.waiting) or any(now - at < window_s for _, at in replaced)
    if not slow:
        return Verdict((), "", remembered, taints=draining)
    ripe = [pod for pod, at in kept if now - at >= confirm_s]
    last = max((at for _, at in replaced), default=None)
    gap = max(REPLACE_GAP_S, cold_start_s + window_s)
    slowest = max(slow, key=lambda pod: slow[pod])
    words = f"pod {slowest}'s batches take {slow[slowest]:.1f}× its peers'"
    if not act:
        note = f"{words} (replaceSlowReplicas is false: not replaced)"
        return Verdict((), note, remembered, taints=True)
    if not ripe:
        note = f"{words} (replaced if it stays so for {confirm_s:.0f} s)"
        return Verdict((), note, remembered, taints=True)
    chosen = max(ripe, key=lambda pod: slow[pod])
    words = f"pod {chosen}'s batches take {slow[chosen]:.1f}× its peers'"
    if len(replaced) >= MAX_PER_HOUR:
        return Verdict(
            (),
            f"{words}, not replaced: {len(replaced)} replaced within the hour already "
            "(its node or its GPU may be the cause: kubectl describe pod)",
            remembered,
            taints=True,
        )
    if last is not None and now - last < gap:
        note = f"{words}; replacing it once the last replacement has run"
        return Verdict((), note, remembered, taints=True)
    # The slowest first, as many as one go may replace and the hour has left.
    room = min(math.ceil(len(pods) / AT_ONCE_SHARE), MAX_PER_HOUR - len(replaced))
    chosen_ones = sorted(ripe, key=lambda pod: -slow[pod])[:room]
    said = ", ".join(
        f"pod {pod} ({slow[pod]:.1f}× for {now - since.get(pod, now):.0f} s)" for pod in chosen_ones
    )
    return Verdict(
        tuple(chosen_ones),
        f"replacing {said}: batches slower than their peers'",
        Stragglers(
            slow=tuple((pod, at) for pod, at in kept if pod not in chosen_ones),
            replaced=(*replaced, *((pod, now) for pod in chosen_ones)),
            waiting=state.waiting,
        ),
        taints=True,
    )


@dataclass(frozen=True, slots=True)
class Handover:
    """How the replicas chosen for replacement go: the pods to delete now, the replicas to ask
    for beside the plan's meanwhile, the words for the reason, and what to remember."""

    delete: tuple[str, ...]
    extra: int
    note: str
    state: Stragglers


def hand_over(
    chosen: Sequence[str],
    state: Stragglers,
    *,
    needed: float,
    ready: int,
    in_force: int,
    now: float,
    cold_start_s: float,
) -> Handover:
    """Delete a slow replica at once where the other ready replicas carry the load without it
    (`needed`: the replicas the load takes, a fraction): its share moves to them, balanced,
    and the ReplicaSet's new pod takes it up after a cold start — kept, it would go on refusing
    what its share brings beyond its half speed while they have room. Where they do not (two
    replicas, one slow: the other alone cannot carry the load), it serves on beside a replica
    asked for in its place, and goes once the others carry the load or every replica in force is
    ready (or after `MAX_WAIT_COLD_STARTS` cold starts, if that one never comes): a cold start at
    half speed, not a cold start at none. The replica asked for is then a surplus the scale-down
    gives back."""
    # The ready replicas that are not slow: what carries the load once the slow ones are gone.
    others = ready - len(state.waiting) - len(chosen)
    due = tuple(
        pod
        for pod, since in state.waiting
        if others >= needed
        or ready >= in_force
        or now - since >= MAX_WAIT_COLD_STARTS * max(cold_start_s, 1.0)
    )
    waiting = tuple((pod, since) for pod, since in state.waiting if pod not in due)
    now_too = tuple(chosen) if others >= needed else ()
    waiting += tuple((pod, now) for pod in chosen if pod not in now_too)
    delete = (*due, *now_too)
    notes = []
    if due:
        notes.append(f"deleting pod {', '.join(due)}: the others carry the load without it")
    if waiting:
        notes.append(
            f"pod {', '.join(pod for pod, _ in waiting)} serves on until the "
            f"{len(waiting)} asked in its place {'is' if len(waiting) == 1 else 'are'} ready"
        )
    return Handover(
        delete=delete,
        extra=len(waiting),
        note="; ".join(notes),
        state=Stragglers(slow=state.slow, replaced=state.replaced, waiting=waiting),
    )
