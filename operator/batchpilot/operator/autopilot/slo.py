"""The service level objective, kept as SRE practice keeps one: attainment, error budget, burn rate.

The SLA says how fast (P99 under `latencyP99Ms`); the objective says how often: the share of time
whose window P99 is inside the SLA (and at most 1 % of the offered requests went unserved), over
a rolling window — e.g. 99 % over 1 h, an error budget of 1 % of the hour (36 s). Every decision
judges the metrics window it read and records the verdict here, weighted by the time it stands
for (the time since the previous verdict, at most one metrics window). Time without a verdict
(Prometheus silent) is not counted either way; time without traffic counts as good.

Burn rate over a lookback = the bad share of that lookback / the budget share (1 − objective):
1 spends the budget exactly over the window, 10 spends it ten times as fast. The alert is the
multi-window, multi-burn-rate one of the Google SRE workbook ("Alerting on SLOs"), scaled to the
objective's window: a *fast* pair (2 % of the budget within W/720, checked again over 1/12 of
that lookback so it stops as soon as the burning stops) and a *slow* pair (5 % within W/120).
For a 30-day window that is the workbook's 14.4× over 1 h and 5 min, and 6× over 6 h and 30 min.
Short windows cannot look back less than a few decisions, so lookbacks have floors (5 min and
30 min long, 1 min short), and the threshold never drops below 1: at risk means the budget will
not last the window at the present rate.

The ledger keeps two tiers of buckets, so its size is fixed whatever the window: fine buckets
for the burn-rate lookbacks and coarse ones for the whole window. Pure: time is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

BUCKETS = 60
"""Buckets per tier: the ledger's size in the status, whatever the window."""
FAST_BUDGET = 0.02
SLOW_BUDGET = 0.05
FAST_LOOKBACK_FLOOR_S = 300.0
SLOW_LOOKBACK_FLOOR_S = 1800.0
SHORT_LOOKBACK_FLOOR_S = 60.0
FINE_BUCKET_FLOOR_S = 15.0


@dataclass(frozen=True, slots=True)
class BurnAlert:
    """Fires while the burn rate exceeds `threshold` over both lookbacks."""

    name: str
    long_s: float
    short_s: float
    threshold: float


@dataclass(frozen=True, slots=True)
class Objective:
    """`target` of the time (a fraction, e.g. 0.99) inside the SLA over a rolling `window_s`."""

    target: float = 0.99
    window_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError("the objective must be a fraction strictly between 0 and 1")
        if not self.window_s > 0:
            raise ValueError("the objective's window must be positive")

    @property
    def budget(self) -> float:
        """The share of the window allowed outside the SLA."""
        return 1.0 - self.target

    def alerts(self) -> tuple[BurnAlert, BurnAlert]:
        def pair(name: str, share: float, fraction: float, floor: float) -> BurnAlert:
            long_s = min(self.window_s, max(floor, self.window_s * fraction))
            short_s = min(long_s, max(SHORT_LOOKBACK_FLOOR_S, long_s / 12))
            return BurnAlert(name, long_s, short_s, max(1.0, share * self.window_s / long_s))

        return (
            pair("fast", FAST_BUDGET, 1 / 720, FAST_LOOKBACK_FLOOR_S),
            pair("slow", SLOW_BUDGET, 1 / 120, SLOW_LOOKBACK_FLOOR_S),
        )

    def fine_bucket_s(self) -> float:
        longest = max(alert.long_s for alert in self.alerts())
        return max(FINE_BUCKET_FLOOR_S, longest / BUCKETS)

    def coarse_bucket_s(self) -> float:
        return max(self.fine_bucket_s(), self.window_s / BUCKETS)


@dataclass(frozen=True, slots=True)
class Tier:
    """Seconds judged and seconds bad per bucket of `width_s`, for the newest `BUCKETS` buckets
    ending with bucket number `last` (bucket k covers [k·width, (k+1)·width))."""

    width_s: float
    last: int = 0
    judged: tuple[float, ...] = ()
    bad: tuple[float, ...] = ()

    def add(self, now: float, seconds: float, bad: bool) -> Tier:
        index = math.floor(now / self.width_s)
        judged, worse = list(self.judged), list(self.bad)
        if not judged or index > self.last:
            gap = min(BUCKETS, index - self.last) if judged else 1
            judged += [0.0] * gap
            worse += [0.0] * gap
            last = index
        else:
            last = self.last  # a clock that went back: count it in the newest bucket
        judged[-1] += seconds
        if bad:
            worse[-1] += seconds
        return Tier(self.width_s, last, tuple(judged[-BUCKETS:]), tuple(worse[-BUCKETS:]))

    def sums(self, now: float, lookback_s: float) -> tuple[float, float]:
        """(judged, bad) seconds in the buckets that overlap [now − lookback, now]."""
        first = math.floor((now - lookback_s) / self.width_s)
        judged = bad = 0.0
        for offset, (j, b) in enumerate(zip(self.judged, self.bad, strict=True)):
            index = self.last - (len(self.judged) - 1 - offset)
            if first <= index:
                judged += j
                bad += b
        return judged, bad

    def runs(self, now: float, lookback_s: float) -> int:
        """Separate runs of buckets mostly judged bad among those wholly inside the lookback."""
        first = math.ceil((now - lookback_s) / self.width_s)
        runs, before = 0, False
        for offset, (j, b) in enumerate(zip(self.judged, self.bad, strict=True)):
            if self.last - (len(self.judged) - 1 - offset) < first:
                continue
            missed = j > 0 and b >= j / 2
            runs += missed and not before
            before = missed
        return runs

    def to_dict(self) -> dict[str, Any]:
        return {
            "widthS": self.width_s,
            "last": self.last,
            "judgedS": [round(v, 1) for v in self.judged],
            "badS": [round(v, 1) for v in self.bad],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Tier:
        judged = tuple(float(v) for v in doc["judgedS"])
        bad = tuple(float(v) for v in doc["badS"])
        width = float(doc["widthS"])
        finite = all(math.isfinite(v) and v >= 0 for v in (*judged, *bad)) and math.isfinite(width)
        if len(judged) != len(bad) or len(judged) > BUCKETS or not width > 0 or not finite:
            raise ValueError("not a ledger tier")
        return cls(width, int(doc["last"]), judged, bad)


@dataclass(frozen=True, slots=True)
class Misses:
    """The verdicts of a lookback: how much of it was judged, the share of that outside the SLA,
    and in how many separate runs of the ledger's buckets (mostly outside) the misses came."""

    judged_s: float
    share: float
    runs: int


@dataclass(frozen=True, slots=True)
class SloReport:
    """What the status shows of the objective at one moment."""

    attainment: float | None
    """Share of the judged time inside the SLA over the window; None before any verdict."""
    budget_remaining: float | None
    """1: untouched; 0: spent; below 0: overspent."""
    burn_rates: dict[str, float]
    """Burn rate by lookback name: fast, slow (the long lookbacks)."""
    at_risk: str | None
    """Why the budget is at risk (a firing alert), or None."""


@dataclass(frozen=True, slots=True)
class SloLedger:
    objective: Objective = field(default_factory=Objective)
    fine: Tier | None = None
    coarse: Tier | None = None
    last_at: float | None = None

    def _tiers(self) -> tuple[Tier, Tier]:
        fine = self.fine or Tier(self.objective.fine_bucket_s())
        coarse = self.coarse or Tier(self.objective.coarse_bucket_s())
        return fine, coarse

    def for_objective(self, objective: Objective) -> SloLedger:
        """This ledger under `objective`: kept when the buckets still fit, else started afresh
        (a changed window regroups time; a changed target keeps the verdicts)."""
        if objective == self.objective:
            return self
        kept = replace(self, objective=objective)
        fine, coarse = self._tiers()
        if (fine.width_s, coarse.width_s) == (
            objective.fine_bucket_s(),
            objective.coarse_bucket_s(),
        ):
            return kept
        return SloLedger(objective=objective, last_at=self.last_at)

    def record(self, now: float, verdict: bool | None, *, covers_s: float) -> SloLedger:
        """Count the time since the previous verdict (at most `covers_s`, the metrics window a
        verdict describes) as good or bad; None counts nothing."""
        if verdict is None or self.last_at is None:
            return replace(self, last_at=now)
        seconds = max(0.0, min(covers_s, now - self.last_at))
        fine, coarse = self._tiers()
        return replace(
            self,
            fine=fine.add(now, seconds, not verdict),
            coarse=coarse.add(now, seconds, not verdict),
            last_at=now,
        )

    def misses(self, now: float, lookback_s: float) -> Misses:
        """What the verdicts of the last `lookback_s` say of misses (see `Misses`)."""
        fine, _ = self._tiers()
        judged, bad = fine.sums(now, lookback_s)
        return Misses(judged, bad / judged if judged > 0 else 0.0, fine.runs(now, lookback_s))

    def burn_rate(self, now: float, lookback_s: float) -> float | None:
        fine, coarse = self._tiers()
        tier = fine if lookback_s <= fine.width_s * BUCKETS else coarse
        judged, bad = tier.sums(now, lookback_s)
        if judged <= 0:
            return None
        return bad / judged / self.objective.budget

    def report(self, now: float) -> SloReport:
        _, coarse = self._tiers()
        judged, bad = coarse.sums(now, self.objective.window_s)
        attainment = None if judged <= 0 else 1.0 - bad / judged
        remaining = None if judged <= 0 else 1.0 - bad / (judged * self.objective.budget)
        burns: dict[str, float] = {}
        firing: list[str] = []
        for alert in self.objective.alerts():
            long_burn = self.burn_rate(now, alert.long_s)
            short_burn = self.burn_rate(now, alert.short_s)
            if long_burn is not None:
                burns[alert.name] = long_burn
            if (
                long_burn is not None
                and short_burn is not None
                and long_burn > alert.threshold
                and short_burn > alert.threshold
            ):
                firing.append(
                    f"the error budget burns {long_burn:.1f}× as fast as the objective allows "
                    f"over {_duration(alert.long_s)} ({short_burn:.1f}× over the last "
                    f"{_duration(alert.short_s)}; alert above {alert.threshold:g}×)"
                )
        return SloReport(
            attainment=attainment,
            budget_remaining=remaining,
            burn_rates=burns,
            at_risk=firing[0] if firing else None,
        )

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"target": self.objective.target, "windowS": self.objective.window_s}
        if self.fine is not None:
            doc["fine"] = self.fine.to_dict()
        if self.coarse is not None:
            doc["coarse"] = self.coarse.to_dict()
        if self.last_at is not None:
            doc["lastAt"] = round(self.last_at, 3)
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> SloLedger:
        """Read a persisted ledger; anything unreadable starts afresh rather than failing."""
        if not isinstance(doc, dict):
            return cls()
        try:
            last = doc.get("lastAt")
            return cls(
                Objective(float(doc["target"]), float(doc["windowS"])),
                fine=None if doc.get("fine") is None else Tier.from_dict(doc["fine"]),
                coarse=None if doc.get("coarse") is None else Tier.from_dict(doc["coarse"]),
                last_at=None if last is None or not math.isfinite(float(last)) else float(last),
            )
        except (KeyError, TypeError, ValueError):
            return cls()


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:g} s"
