"""Service-wide quotas: the limits `spec.auth.quotas` writes are the service's, and each replica
that serves enforces its share of them.

A replica counts only the requests that reach it, so a limit meant for the service is divided
among the replicas that serve it. kube-proxy (and a Gateway) spread a key's calls roughly evenly
over the ready endpoints, so the shares add up to the service's limit within the imbalance of
that spreading: a key whose calls happen to land mostly on one replica meets that replica's share
first. The share follows the number of ready replicas — a scale-up or a scale-down changes the
document, which the operator writes into the ConfigMap and sends to every ready pod at once.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from typing import Any

from batchpilot.api.access import MIN_RATE_RPS, AccessDocument, QuotaDocument

RATE_DIGITS = 6
"""Significant digits of a share's rate: 400/3 is 133.333, not 133.33333333333334."""


def serving_replicas(deployment: dict[str, Any] | None) -> int:
    """The replicas that serve: the Deployment's ready pods, and at least 1 — before any is ready
    the first to become ready serves alone, and must not start with a fraction of the limit."""
    ready = ((deployment or {}).get("status") or {}).get("readyReplicas")
    return ready if isinstance(ready, int) and ready > 1 else 1


def share(quota: QuotaDocument, replicas: int) -> QuotaDocument:
    """One replica's share of a service's limit: the rate and the burst divided by `replicas`.
    The burst is rounded to the nearest whole request and is at least 1 (a smaller bucket would
    admit nothing), so with more replicas than burst the replicas together allow more than the
    burst; the rate is at least the smallest one the runtime takes (`MIN_RATE_RPS`)."""
    if replicas <= 1:
        return {"requestsPerSecond": quota["requestsPerSecond"], "burst": quota["burst"]}
    rate = float(f"{quota['requestsPerSecond'] / replicas:.{RATE_DIGITS}g}")
    return {
        "requestsPerSecond": max(MIN_RATE_RPS, rate),
        "burst": max(1, math.floor(quota["burst"] / replicas + 0.5)),
    }


def shared(document: AccessDocument, replicas: int) -> AccessDocument:
    """The access document each of `replicas` replicas enforces, given the service's: every
    rate and burst divided (`share`), the allowed key ids as they are."""
    result: AccessDocument = {}
    if "allowedKeyIds" in document:
        result["allowedKeyIds"] = list(document["allowedKeyIds"])
    if "defaultQuota" in document:
        result["defaultQuota"] = share(document["defaultQuota"], replicas)
    if "keyQuotas" in document:
        result["keyQuotas"] = [
            {"keyId": quota["keyId"], **share(quota, replicas)} for quota in document["keyQuotas"]
        ]
    if "totalQuota" in document:
        result["totalQuota"] = share(document["totalQuota"], replicas)
    return result
