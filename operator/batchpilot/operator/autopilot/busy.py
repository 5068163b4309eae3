"""The devices' busy share as a capacity reading, where no batch is sized or timed.

An exporter that gives P99, the request rates, the devices' busy share and the ready replicas,
and nothing of its batches (no rows or batches counted, no batch times by size), leaves t(b)
unknown: there is no latency model (`learn.busy_compute` needs the mean batch; where requests
carry rows that are not counted, it cannot tell a batch's time either). The busy share still
says what a request costs: R replicas, each busy a share u of the window, that served Q
requests a second spent c = u·R/Q device-seconds on each, at the batches the settings in force
made. A load of L then needs L·c/U replicas for each to be busy no more than U.

U, the busy share at which the SLA holds, is not known either, so it is learned from the windows
(`learned_target`): a window over the SLA, or refusing, at busy share u puts U below u; a window
comfortably inside it near U lets U creep up. c is measured at its window's load: where the
time is all per row, it is exact; where batches grow with the load (a cost per batch above the
cost per row), more load costs less a request, and the plan is on the safe side — far on it
where the cost is mostly a batch's: a replica running batches of one or two back to back reads
busy at a few per cent of what it carries in batches of sixteen.

How far, the windows say (`elasticity`): the busy share u of a replica carrying r requests a
second grows as r^e — e = 1 where the time is all per row, e near 0 where batches grow with the
load and their time barely does. Two windows at loads a replica at least `SPREAD` apart measure
e; where it is below `LINEAR` and the window was comfortably inside the SLA, a replica is planned
to the load at which u would reach the target, r·(U/u)^(1/e) — at most `STRETCH` times what it
was seen to carry, so each step is checked by the next window before another is taken, and
below a load a replica missed the SLA at (`ceiling_rps`).

Pure: values in, values out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_TARGET = 0.6
"""The busy share a replica is planned to until the windows teach another (the Kubernetes
HPA's examples plan GPUs to 50–70 %): low enough that a queue of batches stays short at the
textbook's sizes, high enough not to double the fleet."""
MIN_TARGET = 0.2
"""Never planned below this: a window over the SLA at a lower busy share was not over for load
(a burst within it, a batch limit too large for the SLA), and more replicas do not help."""
MAX_TARGET = 0.9
"""Never above this: the last tenth is the queue's (a replica busy 95 % of the time holds a
queue that any second of more arrivals turns into a miss)."""
BACKOFF = 0.85
"""A window over the SLA at busy share u sets the target to at most u times this…"""
STEP_DOWN = 0.8
"""…but one window lowers it by at most this factor: a window over the SLA whose busy share is
far below the target did not miss for load alone (traffic that began inside it, a burst), and a
target collapsed on one such window planned five replicas for every one needed."""
MAX_ELASTIC_TARGET = 0.98
"""…unless the busy share barely grows with the load (an elasticity below `LINEAR`): there a
replica busy 95 % of the time runs batches back to back that grow with what arrives, and its
queue is no longer than a batch; P99 says where its edge is (a stretched plan's `ceiling_rps`)."""
CREEP = 0.02
"""A window comfortably inside the SLA with the replicas near the target raises it by this."""
NEAR_TARGET = 0.8
"""…where the replicas were busy at least this share of the target: a window at a third of it
says nothing of how busy they may be."""
GIVE_BACK = 0.9
"""Replicas are given back only as far as the rest stay busy below this share of the target: a
load that wobbles around a replica's worth does not add and remove it every window."""
MIN_REQUESTS = 50
"""A window's cost is read from at least this many served requests: a few requests' busy time is
mostly the noise of their batches."""
TOO_LARGE_S = 3600.0
"""How long a batch limit found too large stays so."""
MAX_COST_S = 60.0
"""No request costs more device time than this: a larger persisted cost is an edited status."""
LINEAR = 0.7
"""An elasticity at or above this plans as 1: the busy share grows with the load nearly in
proportion, and two windows' noise (a few per cent of each reading) moves a per-row service's
reading this far from 1."""
MIN_ELASTICITY = 0.1
"""Below this, read as this: the extrapolation's exponent 1/e stays finite."""
SPREAD = 1.25
"""Two readings measure the elasticity where the load a replica carried differs at least this
factor between them (ln 1.25 ≈ 0.22, several times a reading's noise)."""
STRETCH = 4 / 3
"""A plan stretched by the elasticity has a replica carry at most this times the load it was
seen carry: a quarter fewer replicas a step, each checked by a window before the next."""
STRETCH_MARGIN = 0.8
"""A stretched plan keeps a replica's load below this share of the load at which a steady
window missed the SLA (for `TOO_LARGE_S`): the busy share did not see that edge coming, so
the margin is the plan's own."""
PROVEN_MARGIN = 0.8
"""A replica is planned to carry at least this share of the most it was seen carry in a steady
window comfortably inside the SLA (`proven_rps`)…"""
PROVEN_SEEN = 0.5
"""…which stands while windows comfortably inside the SLA see a replica carry at least this
share of it (planned to 80 % of it, behind the plan's headroom, a replica carries less)."""
MIN_COST_S = 1e-6
"""…and is at least a microsecond of device time a request: less is a busy share that rounds to
nothing (a device reading 0.01 % busy under thousands of requests a second), not a cost."""


@dataclass(frozen=True, slots=True)
class BusyShare:
    """What the busy share taught: the device time a request costs, at which batch limit, and
    the busy share a replica is planned to."""

    cost_s: float | None = None
    """Device-seconds a served request cost, the newest window that describes the settings in
    force; None until one has."""
    batch: int | None = None
    """The batch limit in force when it was measured."""
    target: float = DEFAULT_TARGET
    """The busy share a replica is planned to (see `learned_target`)."""
    too_large: int | None = None
    """The batch limit at which a window last missed the SLA with the devices not saturated: its
    batches may have run too long, and the limit is not raised to it again (for `TOO_LARGE_S`)."""
    too_large_at: float | None = None
    """When that window was read."""
    busy: float | None = None
    """The busy share `cost_s` was read at (with it, the load a replica carried: busy / cost)."""
    room: bool = False
    """Whether that window was comfortably inside the SLA, steady (or only unsteady after one
    with room): a plan may stretch from it (`carries`)."""
    elasticity: float = 1.0
    """e in u ∝ r^e, from two readings `SPREAD` apart (1 until they say otherwise)."""
    anchor: tuple[float, float] | None = None
    """The reading the next is measured against: (requests a second a replica carried, busy
    share), at the batch limit `batch`."""
    ceiling_rps: float | None = None
    """The load a replica carried where a steady window last missed the SLA…"""
    ceiling_at: float | None = None
    """…and when: a stretched plan stays below it for `TOO_LARGE_S`."""
    proven_rps: float | None = None
    """The most a replica was seen carry in a steady window comfortably inside the SLA, since
    the last miss…"""
    proven_batch: int | None = None
    """…at this batch limit…"""
    proven_at: float | None = None
    """…last seen so (a replica carrying at least `PROVEN_SEEN` of it) then: it stands for
    `TOO_LARGE_S`."""

    def current(self, now: float) -> BusyShare:
        """This, less a `too_large` or a ceiling older than `TOO_LARGE_S`: a miss an hour ago (a
        burst, a slow node, an SLA since raised) bans no batch limit or load for good."""
        known = self
        if self.too_large_at is not None and now - self.too_large_at > TOO_LARGE_S:
            known = replace(known, too_large=None, too_large_at=None)
        if self.ceiling_at is not None and now - self.ceiling_at > TOO_LARGE_S:
            known = replace(known, ceiling_rps=None, ceiling_at=None)
        if self.proven_at is not None and now - self.proven_at > TOO_LARGE_S:
            known = known.unproven()
        return known

    @property
    def limits(self) -> bool:
        """Whether a miss set a limit: a batch limit too large, or a ceiling on the load."""
        return self.too_large is not None or self.ceiling_rps is not None

    def without_limits(self) -> BusyShare:
        """This without the limits misses set (an SLA loosened since: they were its misses)."""
        return replace(self, too_large=None, too_large_at=None, ceiling_rps=None, ceiling_at=None)

    def unproven(self) -> BusyShare:
        """This without a proven load."""
        return replace(self, proven_rps=None, proven_batch=None, proven_at=None)

    def proving(self, rps: float, *, batch: int, now: float) -> BusyShare:
        """This after a steady window comfortably inside the SLA in which a replica carried
        `rps` at the batch limit `batch`: the most proven, where it is more (or the limit it
        was proven at is no longer in force), seen again where it is near it."""
        if (
            self.proven_rps is None
            or self.proven_batch is None
            or self.proven_batch > batch
            or rps > self.proven_rps
        ):
            return replace(self, proven_rps=rps, proven_batch=batch, proven_at=now)
        if rps >= PROVEN_SEEN * self.proven_rps:
            return replace(self, proven_at=now)
        return self

    def within(self, *, peak: float, batch: int) -> BusyShare:
        """This, less a proven load that cannot stand: more than the service's whole offered
        load at its peak of the hour (an edited status), or proven at a batch limit larger than
        the one planned (`batch`)."""
        if self.proven_rps is None or self.proven_batch is None:
            return self
        if self.proven_rps <= peak and self.proven_batch <= batch:
            return self
        return self.unproven()

    def missed(self, rps: float, *, now: float) -> BusyShare:
        """This after a steady window that missed the SLA with a replica carrying `rps`: that
        load a ceiling for stretched plans, and what was proven no longer (the service, or
        its traffic, is not what it was when it carried more)."""
        return replace(self.unproven(), ceiling_rps=rps, ceiling_at=now)

    def read(self, *, cost_s: float, busy: float, batch: int, room: bool) -> BusyShare:
        """This with a window's reading: its cost, the busy share and batch limit it was read
        at, whether it had `room`; and the elasticity, where the load a replica carried differs
        at least `SPREAD` from the anchor's at the same batch limit (the reading becomes the
        anchor). A reading nearer to linear is believed at once, one further from it a third of
        the way: from 1, below `LINEAR` only after two pairs (a stretch on one noisy pair of
        windows is a miss)."""
        busy = min(busy, 1.0)
        rps = busy / cost_s
        known = replace(self, cost_s=cost_s, busy=busy, batch=batch, room=room)
        if self.anchor is None or self.batch != batch:
            return replace(known, anchor=(rps, busy))
        anchor_rps, anchor_busy = self.anchor
        spread = math.log(rps / anchor_rps)
        if abs(spread) < math.log(SPREAD):
            return known
        measured = min(1.0, max(0.0, math.log(busy / anchor_busy) / spread))
        elasticity = (
            measured if measured >= self.elasticity else (measured + 2 * self.elasticity) / 3
        )
        return replace(known, elasticity=elasticity, anchor=(rps, busy))

    def carries(self) -> float | None:
        """Requests a second one replica carries: the target busy share over the cost a
        request; at least `PROVEN_MARGIN` of a load proven at the batch limit in force or a
        smaller one; stretched by the elasticity where it is below `LINEAR`, the reading had
        room and was below the target (see the module's docstring). None without a cost."""
        if not self.cost_s:
            return None
        linear = self.target / self.cost_s
        if (
            self.proven_rps is not None
            and self.proven_batch is not None
            and self.batch is not None
            and self.proven_batch <= self.batch
        ):
            linear = max(linear, PROVEN_MARGIN * self.proven_rps)
        if (
            not self.room
            or self.busy is None
            or self.elasticity >= LINEAR
            or self.busy >= self.target
        ):
            return linear
        seen = self.busy / self.cost_s
        # (in logarithms: a busy share read near nothing would overflow the power)
        reach = math.log(self.target / self.busy) / max(self.elasticity, MIN_ELASTICITY)
        stretched = seen * math.exp(min(reach, math.log(STRETCH)))
        if self.ceiling_rps is not None:
            stretched = min(stretched, STRETCH_MARGIN * self.ceiling_rps)
        return max(linear, stretched)

    def basis(self) -> str:
        """What `carries` rests on beyond the cost a request, in the words of a reason: the
        load a replica was proven to carry, or the stretch; "" where it is the cost alone."""
        carries = self.carries()
        if carries is None or self.cost_s is None or carries <= self.target / self.cost_s:
            return ""
        if self.proven_rps is not None and carries == PROVEN_MARGIN * self.proven_rps:
            return (
                f" ({self.proven_rps:.0f} rps a replica carried comfortably inside the SLA: "
                f"{PROVEN_MARGIN:.0%} of it)"
            )
        if self.busy is None:
            return ""
        return (
            f" (busy ∝ load^{self.elasticity:.2f}: stretched from the {self.busy:.0%} busy at "
            f"{self.busy / self.cost_s:.0f} rps a replica)"
        )

    def replicas_for(self, rate: float, *, share: float = 1.0) -> int | None:
        """Replicas that carry `rate` requests a second, each `share` of what one carries
        (`GIVE_BACK` where replicas are given back); None without a measured cost."""
        carries = self.carries()
        if carries is None or self.cost_s is None:
            return None
        if carries == self.target / self.cost_s:
            # (as the cost over the target: the same replicas as ever where nothing stretched)
            return max(1, math.ceil(rate * self.cost_s / (share * self.target) - 1e-9))
        return max(1, math.ceil(rate / (share * carries) - 1e-9))

    def batch_allowed(self, batch: int, *, budget_s: float) -> bool:
        """Whether a batch limit of `batch` is worth a trial: below `too_large`, and its batch
        no longer than `budget_s` even if every request in it cost what one costs now (a batch's
        time per request only falls as it grows, so that bounds it)."""
        if self.cost_s is None or (self.too_large is not None and batch >= self.too_large):
            return False
        return batch * self.cost_s <= budget_s


def measured_cost(
    *, busy: float | None, served_qps: float | None, replicas: int | None, window_s: float
) -> float | None:
    """Device-seconds per served request: `replicas` busy `busy` of the window each, serving
    `served_qps` between them. None where any is missing, nothing was busy, or too few requests
    were served to say (`MIN_REQUESTS`)."""
    if not (busy and served_qps and replicas) or busy <= 0 or served_qps <= 0:
        return None
    if served_qps * window_s < MIN_REQUESTS:
        return None
    cost = min(busy, 1.0) * replicas / served_qps
    return cost if cost >= MIN_COST_S else None


def learned_target(
    target: float,
    *,
    busy: float | None,
    over: bool,
    comfortable: bool,
    highest: float = MAX_TARGET,
) -> float:
    """The busy share to plan to after a window that describes the settings in force: below
    what the window ran at where it was `over` the SLA (P99, or refusals beyond what the guard
    tolerates); a little above the present one where it was `comfortable` (inside the SLA with
    the plan's headroom) with the replicas busy near the target; else unchanged. Never above
    `highest` (`MAX_TARGET`, or `MAX_ELASTIC_TARGET` where the busy share barely grows with the
    load)."""
    target = min(target, highest)
    if busy is None:
        return target
    busy = min(busy, 1.0)
    if over:
        return max(MIN_TARGET, min(target, max(busy * BACKOFF, target * STEP_DOWN)))
    if comfortable and busy >= NEAR_TARGET * target:
        return min(highest, target + CREEP)
    return target
