"""What the autopilot remembers between decisions, and how it is kept in `status.autopilot`.

`decide` takes a `State` and returns the next one; the pilot persists it in the
InferenceService's status so that an operator restart (or a new leader) resumes with the fit,
the overhead, the SLO ledger and the rate history learned so far. The document's shape is a
contract with every status already written, so it lives here, apart from the decision's logic:
a field added to `State` is added to both directions of the round trip in one place.

Pure: data and its dict round trip, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from batchpilot.operator.autopilot.busy import (
    LINEAR,
    MAX_COST_S,
    MAX_ELASTIC_TARGET,
    MAX_TARGET,
    MIN_COST_S,
    MIN_TARGET,
    BusyShare,
)
from batchpilot.operator.autopilot.ceiling import Ceiling
from batchpilot.operator.autopilot.headroom import RateHistory
from batchpilot.operator.autopilot.lost import Loss
from batchpilot.operator.autopilot.observation import ComputePoint
from batchpilot.operator.autopilot.service_model import (
    MAX_BATCH_CV,
    MAX_ROWS_CV,
    MAX_UNEVENNESS,
    LatencyFit,
)
from batchpilot.operator.autopilot.slo import SloLedger
from batchpilot.operator.autopilot.stragglers import Stragglers


@dataclass(frozen=True, slots=True)
class State:
    """What the autopilot remembers between decisions (persisted across operator restarts)."""

    fit: LatencyFit | None = None
    overhead_s: float | None = None
    """Latency spent outside the batcher (decoding, pre- and post-processing): observed P99 minus
    the model's prediction. None until learned."""
    before_s: float | None = None
    """Of it, what lies inside the deadline's clock before the batcher (`Observation.before_s`),
    a running mean: the pods' default deadline takes only the rest off the SLA. None: not
    measured (all of it taken off)."""
    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, replicas) recommended within the scale-down window."""
    refusing: tuple[tuple[float, float], ...] = ()
    """(time, served requests per second) of the recommendations made while the service refused
    requests: their load may count clients' retries (see `pacing`)."""
    changed_at: float | None = None
    """When the capacity in force last changed (batch settings, ready replicas): the metrics
    window describes the present only a window later."""
    ready_changed_at: float | None = None
    """When the ready replicas last changed (`changed_at` also moves with every batch retune):
    whether misses recur is judged over the windows since (see `feedback.misses_persist`)."""
    ready: int | None = None
    """Ready replicas at the previous decision."""
    replicas: int | None = None
    """Replicas in force at the previous decision (before it changed them)."""
    lost: Loss = field(default_factory=Loss)
    """Replicas that were ready and are away, not deleted (see `lost`)."""
    rate: tuple[float, float] | None = None
    """(time, offered requests per second) at the previous decision, for the trend."""
    refused: float | None = None
    """Requests per second the previous decision's window left unserved: whether the newest
    interval of a window still refused (see `learn.refused_lately`)."""
    estimates: tuple[tuple[float, float], ...] = ()
    """(time, the present rate estimated then) of the decisions of the last window and one
    interval more: where the interval a rising window drops stood, for the trend."""
    batch_first_at: float | None = None
    """When a rough model raised the batch limit and held the replicas it would have added: it
    does so once, then the window has measured the new batch sizes (see
    `capacity.batch_first`)."""
    slo: SloLedger = field(default_factory=SloLedger)
    """Every decision's verdict on its window, for attainment, error budget and burn rate."""
    history: RateHistory = field(default_factory=RateHistory)
    """The offered rate over the last hour, for the headroom (see `headroom`)."""
    cold_start_s: float | None = None
    """How long new replicas took to become ready, learned; None until measured."""
    pending_since: float | None = None
    """When the replicas still starting were asked for."""
    stragglers: Stragglers = field(default_factory=Stragglers)
    """Replicas found slower than their peers, and those replaced for it (see `stragglers`)."""
    anchor: ComputePoint | None = None
    """While the fit is rough: the one batch size its windows ran, and its time (see
    `learn.anchored`); a later window at another size gives the slope with it."""
    ceiling: Ceiling | None = None
    """The load per replica at which the guard found the SLA missed (see `ceiling`)."""
    busy: BusyShare = field(default_factory=BusyShare)
    """Where no batch is sized or timed: a request's device time and the busy share a replica
    is planned to (see `busy`)."""
    serving: str | None = None
    """What served while the fit, the anchor, the busy share and the ceiling were learned
    (`Policy.serving`); None: not recorded (a status written before it was)."""
    sla_s: float | None = None
    """The SLA the ceiling and the busy share's limits were found under; None: not recorded."""

    @property
    def outside_deadline_s(self) -> float | None:
        """Of the latency outside the batcher, what the pods' deadline does not already count:
        the overhead less its part inside the deadline's clock before the batcher (a
        preprocess, decode waits). Taken off the SLA whole, a preprocess counted twice — with
        one over half the SLA, the pods refused every request, even on an idle replica."""
        if self.overhead_s is None:
            return None
        return max(0.0, self.overhead_s - (self.before_s or 0.0))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "recommendations": [[round(t, 3), r] for t, r in self.recommendations],
            "slo": self.slo.to_dict(),
            "history": self.history.to_dict(),
        }
        if self.refusing:
            doc["refusing"] = [[round(t, 3), round(q, 3)] for t, q in self.refusing]
        if self.cold_start_s is not None:
            doc["coldStartS"] = round(self.cold_start_s, 3)
        if self.pending_since is not None:
            doc["pendingSince"] = round(self.pending_since, 3)
        if self.fit is not None:
            doc["fit"] = {
                "alphaMs": round(self.fit.alpha_s * 1e3, 4),
                "betaMs": round(self.fit.beta_s * 1e3, 4),
                "confident": self.fit.confident,
            }
            if self.fit.rows_per_request != 1.0:
                doc["fit"]["rowsPerRequest"] = round(self.fit.rows_per_request, 4)
            if self.fit.dispersion != 1.0:
                doc["fit"]["dispersion"] = round(self.fit.dispersion, 4)
            if self.fit.batch_cv:
                doc["fit"]["batchCv"] = round(self.fit.batch_cv, 4)
            if self.fit.rows_cv:
                doc["fit"]["rowsCv"] = round(self.fit.rows_cv, 4)
            if self.fit.unevenness != 1.0:
                doc["fit"]["unevenness"] = round(self.fit.unevenness, 4)
        if self.overhead_s is not None:
            doc["overheadMs"] = round(self.overhead_s * 1e3, 4)
        if self.before_s is not None:
            doc["beforeBatcherMs"] = round(self.before_s * 1e3, 4)
        if self.changed_at is not None:
            doc["changedAt"] = round(self.changed_at, 3)
        if self.ready_changed_at is not None:
            doc["readyChangedAt"] = round(self.ready_changed_at, 3)
        if self.ready is not None:
            doc["ready"] = self.ready
        if self.replicas is not None:
            doc["replicas"] = self.replicas
        if self.lost.count and self.lost.since is not None:
            doc["lost"] = {"count": self.lost.count, "since": round(self.lost.since, 3)}
        if self.rate is not None:
            doc["rate"] = [round(self.rate[0], 3), round(self.rate[1], 3)]
        if self.refused is not None:
            doc["refused"] = round(self.refused, 3)
        if self.estimates:
            doc["estimates"] = [[round(t, 3), round(r, 3)] for t, r in self.estimates]
        if self.batch_first_at is not None:
            doc["batchFirstAt"] = round(self.batch_first_at, 3)
        if stragglers := self.stragglers.to_dict():
            doc["stragglers"] = stragglers
        if self.ceiling is not None:
            doc["ceiling"] = {
                "at": round(self.ceiling.at, 3),
                "replicas": self.ceiling.replicas,
                "rpsPerReplica": round(self.ceiling.rps_per_replica, 3),
            }
        if self.busy != BusyShare():
            doc["busy"] = {"target": round(self.busy.target, 4)}
            if self.busy.cost_s is not None and self.busy.batch is not None:
                doc["busy"]["costMs"] = round(self.busy.cost_s * 1e3, 4)
                doc["busy"]["batch"] = self.busy.batch
            if self.busy.too_large is not None and self.busy.too_large_at is not None:
                doc["busy"]["tooLarge"] = self.busy.too_large
                doc["busy"]["tooLargeAt"] = round(self.busy.too_large_at, 3)
            doc["busy"].update(_busy_reading(self.busy))
        if self.serving is not None:
            doc["serving"] = self.serving
        if self.sla_s is not None:
            doc["slaMs"] = round(self.sla_s * 1e3, 3)
        if self.anchor is not None:
            doc["anchor"] = {
                "batch": round(self.anchor.mean_batch, 3),
                "ms": round(self.anchor.mean_seconds * 1e3, 4),
                "batches": round(self.anchor.batches, 1),
            }
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None, *, now: float | None = None) -> State:
        """Read persisted state; anything unreadable starts fresh rather than failing. A number
        that is not finite is unreadable (a status edited by hand: a NaN overhead would plan
        every replica at 0 rps, and be written back on every tick). With `now`, a time later
        than it by more than `CLOCK_SKEW_S` is forgotten: a recommendation dated in the future
        would hold its replicas through every scale-down window until then."""
        if not isinstance(doc, dict):
            return cls()
        late = math.inf if now is None else now + CLOCK_SKEW_S

        def at(value: Any) -> float | None:
            """A persisted time: None where absent or later than `late`."""
            return None if value is None or (t := _real(value)) > late else t

        try:
            raw_fit = doc.get("fit")
            model = (
                LatencyFit(
                    alpha_s=float(raw_fit["alphaMs"]) / 1e3,
                    beta_s=float(raw_fit["betaMs"]) / 1e3,
                    confident=bool(raw_fit["confident"]),
                    rows_per_request=_rows(raw_fit.get("rowsPerRequest")),
                    dispersion=_at_least_one(raw_fit.get("dispersion")),
                    batch_cv=_cv(raw_fit.get("batchCv")),
                    rows_cv=_rows_cv(raw_fit.get("rowsCv")),
                    unevenness=_unevenness(raw_fit.get("unevenness")),
                )
                if isinstance(raw_fit, dict)
                else None
            )
            if model is not None and not _physical(model):
                model = None  # a fit no batch time comes from: learn it again
            recs = tuple(
                (t, _count(r))
                for t, r in ((_real(t), r) for t, r in doc.get("recommendations", []))
                if t <= late
            )
            refusing = tuple(
                (t, _real(q))
                for t, q in ((_real(t), q) for t, q in doc.get("refusing", []))
                if t <= late
            )
            estimates = tuple(
                (t, r)
                for t, r in ((_real(t), _real(r)) for t, r in doc.get("estimates", []))
                if t <= late and r >= 0
            )
            overhead = doc.get("overheadMs")
            ready = doc.get("ready")
            raw_rate = doc.get("rate")
            rate_at = at(raw_rate[0]) if raw_rate is not None else None
            rate = None if raw_rate is None or rate_at is None else (rate_at, _real(raw_rate[1]))
            replicas = doc.get("replicas")
            raw_refused = doc.get("refused")
            refused = None if raw_refused is None else _real(raw_refused)
            raw_lost = doc.get("lost")
            lost_since = at(raw_lost["since"]) if isinstance(raw_lost, dict) else None
            lost = (
                Loss(_count(raw_lost["count"]), lost_since)
                if isinstance(raw_lost, dict) and lost_since is not None
                else Loss()
            )
            cold_start = doc.get("coldStartS")
            raw_ceiling = doc.get("ceiling")
            ceiling_at = at(raw_ceiling["at"]) if isinstance(raw_ceiling, dict) else None
            ceiling = (
                None
                if not isinstance(raw_ceiling, dict) or ceiling_at is None
                else Ceiling(
                    ceiling_at,
                    _count(raw_ceiling["replicas"]),
                    _real(raw_ceiling["rpsPerReplica"]),
                )
            )
            if ceiling is not None and not (ceiling.rps_per_replica > 0 and ceiling.replicas):
                ceiling = None
            serving = doc.get("serving")
            sla_ms = doc.get("slaMs")
            sla_s = None if sla_ms is None else _real(sla_ms) / 1e3
            return cls(
                fit=model,
                overhead_s=None if overhead is None else _real(overhead) / 1e3,
                before_s=(
                    None
                    if doc.get("beforeBatcherMs") is None
                    else _real(doc["beforeBatcherMs"]) / 1e3
                ),
                recommendations=recs,
                refusing=refusing,
                changed_at=at(doc.get("changedAt")),
                ready_changed_at=at(doc.get("readyChangedAt")),
                ready=None if ready is None else _count(ready),
                replicas=None if replicas is None else _count(replicas),
                lost=lost,
                rate=rate,
                # (a window's, with the rate it is compared with: not without it, never below 0)
                refused=None if refused is None or rate is None or refused < 0 else refused,
                estimates=estimates,
                batch_first_at=at(doc.get("batchFirstAt")),
                slo=SloLedger.from_dict(doc.get("slo")),
                history=RateHistory.from_dict(doc.get("history")),
                cold_start_s=None if cold_start is None else _real(cold_start),
                pending_since=at(doc.get("pendingSince")),
                stragglers=Stragglers.from_dict(doc.get("stragglers")),
                anchor=_anchor(doc.get("anchor")),
                ceiling=ceiling,
                busy=_busy(doc.get("busy"), at),
                serving=serving if isinstance(serving, str) else None,
                sla_s=sla_s if sla_s is not None and sla_s > 0 else None,
            )
        except (KeyError, IndexError, TypeError, ValueError):
            return cls()


def _anchor(value: Any) -> ComputePoint | None:
    """A persisted anchor; None where absent or not a batch time one could have measured."""
    if not isinstance(value, dict):
        return None
    point = ComputePoint(float(value["batch"]), float(value["ms"]) / 1e3, float(value["batches"]))
    usable = all(math.isfinite(v) and v > 0 for v in (point.mean_batch, point.mean_seconds))
    return point if usable and point.mean_batch >= 1 else None


def _busy(value: Any, at: Callable[[Any], float | None]) -> BusyShare:
    """A persisted busy share; what of it is out of range dropped: a target outside
    [`MIN_TARGET`, `MAX_ELASTIC_TARGET`] (the default share), a cost that is not a time a request
    could take or a batch limit that is not a count (no cost), a batch limit found too large
    without its time (not remembered). An edited field costs what it holds, not the rest of the
    state."""
    if not isinstance(value, dict):
        return BusyShare()
    try:
        target = _real(value["target"])
    except (KeyError, TypeError, ValueError):
        return BusyShare()
    if not MIN_TARGET <= target <= MAX_ELASTIC_TARGET:
        return BusyShare()
    kept = BusyShare(target=target)
    too_large = value.get("tooLarge")
    try:
        too_large_at = at(value.get("tooLargeAt"))
    except (TypeError, ValueError, OverflowError):
        too_large_at = None
    if _batch(too_large) and too_large > 1 and too_large_at is not None:
        kept = replace(kept, too_large=too_large, too_large_at=too_large_at)
    try:
        cost: float | None = _real(value["costMs"]) / 1e3
    except (KeyError, TypeError, ValueError):
        cost = None
    batch = value.get("batch")
    if cost is not None and MIN_COST_S <= cost <= MAX_COST_S and _batch(batch):
        kept = replace(kept, cost_s=cost, batch=batch)
    return _busy_learned(kept, value, at)


def _busy_reading(busy: BusyShare) -> dict[str, Any]:
    """The status fields of what the busy share's readings taught beyond the cost: the busy
    share it was read at, whether it had room, the elasticity, its anchor, the ceiling and the
    proven load."""
    doc: dict[str, Any] = {}
    if busy.busy is not None and busy.cost_s is not None:
        doc["busyShare"] = round(busy.busy, 4)
        if busy.room:
            doc["room"] = True
    if busy.elasticity != 1.0:
        doc["elasticity"] = round(busy.elasticity, 4)
    if busy.anchor is not None:
        doc["anchor"] = {"rps": round(busy.anchor[0], 4), "busyShare": round(busy.anchor[1], 4)}
    if busy.ceiling_rps is not None and busy.ceiling_at is not None:
        doc["ceilingRps"] = round(busy.ceiling_rps, 4)
        doc["ceilingAt"] = round(busy.ceiling_at, 3)
    if busy.proven_rps is not None and busy.proven_batch is not None and busy.proven_at is not None:
        doc["proven"] = {
            "rps": round(busy.proven_rps, 4),
            "batch": busy.proven_batch,
            "at": round(busy.proven_at, 3),
        }
    return doc


def _busy_learned(
    kept: BusyShare, value: dict[str, Any], at: Callable[[Any], float | None]
) -> BusyShare:
    """`_busy`'s second half: the reading's busy share, room, elasticity, anchor, ceiling and
    proven load, each dropped alone where out of range (a busy share or elasticity outside
    [0, 1], a load that is not a positive finite rate, a ceiling or proven load without its
    time, a proven load without a batch limit)."""
    try:
        elasticity = _real(value.get("elasticity", 1.0))
    except (TypeError, ValueError):
        elasticity = 1.0
    if 0.0 <= elasticity <= 1.0:
        kept = replace(kept, elasticity=elasticity)
    try:
        anchor = value["anchor"]
        rps, share = _real(anchor["rps"]), _real(anchor["busyShare"])
    except (KeyError, TypeError, ValueError):
        rps = share = 0.0
    if rps > 0 and 0 < share <= 1:
        kept = replace(kept, anchor=(rps, share))
    try:
        ceiling = _real(value["ceilingRps"])
        ceiling_at = at(value.get("ceilingAt"))
    except (KeyError, TypeError, ValueError, OverflowError):
        ceiling, ceiling_at = 0.0, None
    if ceiling > 0 and ceiling_at is not None:
        kept = replace(kept, ceiling_rps=ceiling, ceiling_at=ceiling_at)
    try:
        proven = value["proven"]
        proven_rps, proven_batch = _real(proven["rps"]), proven["batch"]
        proven_at = at(proven.get("at"))
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
        proven_rps, proven_batch, proven_at = 0.0, None, None
    if proven_rps > 0 and _batch(proven_batch) and proven_at is not None:
        kept = replace(kept, proven_rps=proven_rps, proven_batch=proven_batch, proven_at=proven_at)
    if kept.elasticity >= LINEAR:
        # (the target rises above `MAX_TARGET` only where the busy share barely grows)
        kept = replace(kept, target=min(kept.target, MAX_TARGET))
    if kept.cost_s is None:
        return kept
    try:
        share = _real(value["busyShare"])
    except (KeyError, TypeError, ValueError):
        return kept
    if 0 < share <= 1:
        kept = replace(kept, busy=share, room=value.get("room") is True)
    return kept


def _batch(value: Any) -> TypeGuard[int]:
    """Whether a persisted batch limit is one: a whole number, at least 1, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


CLOCK_SKEW_S = 60.0
"""How far a persisted time may lie ahead of this operator's clock and still be taken: the
status may have been written by another operator pod (a previous leader) whose clock ran ahead."""


def _real(value: Any) -> float:
    """A persisted number; ValueError where it is not finite (`float` reads "NaN" and "inf")."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _count(value: Any) -> int:
    """A persisted count of replicas; ValueError where it is negative."""
    count = int(value)
    if count < 0:
        raise ValueError(f"{value!r} is not a count")
    return count


def _rows(value: Any) -> float:
    """A persisted rows-per-request: 1 where absent or out of bounds."""
    rows = 1.0 if value is None else float(value)
    return rows if math.isfinite(rows) and rows >= 1.0 else 1.0


def _at_least_one(value: Any) -> float:
    """A persisted dispersion: 1 (Poisson) where absent or out of bounds."""
    dispersion = 1.0 if value is None else float(value)
    return dispersion if math.isfinite(dispersion) and dispersion >= 1.0 else 1.0


def _unevenness(value: Any) -> float:
    """A persisted unevenness: 1 (an even rate) where absent or out of bounds."""
    factor = 1.0 if value is None else float(value)
    return factor if math.isfinite(factor) and 1.0 <= factor <= MAX_UNEVENNESS else 1.0


def _cv(value: Any) -> float:
    """A persisted batch-time variation: 0 (none) where absent or out of bounds."""
    cv = 0.0 if value is None else float(value)
    return cv if math.isfinite(cv) and 0.0 <= cv <= MAX_BATCH_CV else 0.0


def _rows_cv(value: Any) -> float:
    """A persisted spread of rows a request: 0 (one size) where absent or out of bounds."""
    cv = 0.0 if value is None else float(value)
    return cv if math.isfinite(cv) and 0.0 <= cv <= MAX_ROWS_CV else 0.0


def _physical(model: LatencyFit) -> bool:
    """Whether a persisted fit can be planned with: finite, neither part negative, and a batch
    that takes some time (a status edited by hand, or written by a version with another bug,
    is read as no fit rather than failing every decision)."""
    parts = (model.alpha_s, model.beta_s)
    return all(math.isfinite(p) and p >= 0 for p in parts) and sum(parts) > 0
