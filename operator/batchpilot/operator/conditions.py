"""metav1.Condition bookkeeping: `lastTransitionTime` moves only when `status` changes.

Pure: the clock is an argument.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]

READY = "Ready"
METRICS_AVAILABLE = "MetricsAvailable"
SLA_MET = "SLAMet"
SCALING_LIMITED = "ScalingLimited"
EXPOSED = "Exposed"
"""Whether the way in of spec.exposure works: True once the Gateway accepted every route (an
Ingress: once applied), False with the Gateway's reason when it refused one or the routes could
not be applied, Unknown while the Gateway has not said (children/route_acceptance.py); absent
without spec.exposure."""
SLO_AT_RISK = "SLOAtRisk"
"""True while the error budget burns fast enough to fire a burn-rate alert (see autopilot.slo)."""


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with a Z, second precision, as the API server writes it."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    for condition in conditions or []:
        if condition.get("type") == type_:
            return condition
    return None


def set_condition(
    conditions: list[dict[str, Any]] | None,
    *,
    type_: str,
    status: Status,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """A new list with `type_` set; other conditions and their order are kept."""
    previous = find(conditions, type_)
    changed = previous is None or previous.get("status") != status
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (
            timestamp(now)
            if previous is None or changed
            else previous.get("lastTransitionTime", timestamp(now))
        ),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    result = [dict(c) for c in conditions or []]
    for index, existing in enumerate(result):
        if existing.get("type") == type_:
            result[index] = condition
            return result
    result.append(condition)
    return result


def without(conditions: list[dict[str, Any]] | None, type_: str) -> list[dict[str, Any]]:
    """A new list without `type_`; the others and their order kept."""
    return [dict(c) for c in conditions or [] if c.get("type") != type_]
