"""The access document (`batchpilot.api.access`) read into the policy the gate enforces: which
key ids may call, and their limits — and the policy written back as a document, for
`GET /admin/access`.

Parsed here, strictly, in the runtime's error vocabulary: a document that is not exactly right is
refused whole (`InvalidRequest`), and the policy in force stays (the file watcher's and the admin
endpoint's rule alike). Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from batchpilot.api.access import (
    ACCESS_KEYS,
    MAX_BURST,
    MAX_RATE_RPS,
    MIN_RATE_RPS,
    AccessDocument,
    KeyQuotaDocument,
    QuotaDocument,
    key_id_problem,
)
from batchpilot.runtime.access.quota import Limit
from batchpilot.runtime.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    allowed: frozenset[str] | None = None
    """Key ids that may call; None: every key in the table."""
    default: Limit | None = None
    per_key: dict[str, Limit] = field(default_factory=dict)
    total: Limit | None = None

    def allows(self, key_id: str) -> bool:
        return self.allowed is None or key_id in self.allowed


OPEN_POLICY = AccessPolicy()
"""Every key of the table, no limits: the policy without an access document."""


def _limit(doc: Any, where: str) -> Limit:
    if not isinstance(doc, dict) or set(doc) - {"requestsPerSecond", "burst"}:
        raise InvalidRequest(f"{where} must be {{requestsPerSecond, burst}}, got {doc!r}")
    rate = doc.get("requestsPerSecond")
    if (
        not isinstance(rate, int | float)
        or isinstance(rate, bool)
        or not MIN_RATE_RPS <= rate <= MAX_RATE_RPS
    ):
        raise InvalidRequest(
            f"{where}.requestsPerSecond must be a number from {MIN_RATE_RPS:g} to "
            f"{MAX_RATE_RPS:g}, got {rate!r}"
        )
    burst = doc.get("burst", max(1, math.ceil(rate)))
    if not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= MAX_BURST:
        raise InvalidRequest(
            f"{where}.burst must be a whole number from 1 to {MAX_BURST}, got {burst!r}"
        )
    return Limit(rate_rps=float(rate), burst=burst)


def _key_id(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a key id, got {value!r}")
    if (problem := key_id_problem(value)) is not None:
        raise InvalidRequest(f"{where}: {problem}")
    return value


def parse_access(body: bytes) -> AccessPolicy:
    """The policy of an access document; `InvalidRequest` says what is wrong with it."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the access document is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the access document must be a JSON object")
    if unknown := sorted(set(doc) - set(ACCESS_KEYS)):
        raise InvalidRequest(
            f"unknown access setting {', '.join(unknown)}; known: {', '.join(ACCESS_KEYS)}"
        )
    allowed: frozenset[str] | None = None
    if "allowedKeyIds" in doc:
        ids = doc["allowedKeyIds"]
        if not isinstance(ids, list):
            raise InvalidRequest(f"allowedKeyIds must be a list of key ids, got {ids!r}")
        allowed = frozenset(_key_id(v, f"allowedKeyIds[{i}]") for i, v in enumerate(ids))
    per_key: dict[str, Limit] = {}
    quotas = doc.get("keyQuotas", [])
    if not isinstance(quotas, list):
        raise InvalidRequest(f"keyQuotas must be a list, got {quotas!r}")
    for index, entry in enumerate(quotas):
        where = f"keyQuotas[{index}]"
        if not isinstance(entry, dict):
            raise InvalidRequest(f"{where} must be {{keyId, requestsPerSecond, burst}}")
        key_id = _key_id(entry.get("keyId"), f"{where}.keyId")
        if key_id in per_key:
            raise InvalidRequest(f"{where}.keyId {key_id!r} has a quota already")
        per_key[key_id] = _limit({k: v for k, v in entry.items() if k != "keyId"}, where)
    return AccessPolicy(
        allowed=allowed,
        default=_limit(doc["defaultQuota"], "defaultQuota") if "defaultQuota" in doc else None,
        per_key=per_key,
        total=_limit(doc["totalQuota"], "totalQuota") if "totalQuota" in doc else None,
    )


def _quota_doc(limit: Limit) -> QuotaDocument:
    return {"requestsPerSecond": limit.rate_rps, "burst": limit.burst}


def access_doc(policy: AccessPolicy) -> AccessDocument:
    """The access document of `policy`: `parse_access` of it gives the same policy back."""
    doc: AccessDocument = {}
    if policy.allowed is not None:
        doc["allowedKeyIds"] = sorted(policy.allowed)
    if policy.default is not None:
        doc["defaultQuota"] = _quota_doc(policy.default)
    if policy.per_key:
        per_key: list[KeyQuotaDocument] = [
            {"keyId": key_id, **_quota_doc(limit)}
            for key_id, limit in sorted(policy.per_key.items())
        ]
        doc["keyQuotas"] = per_key
    if policy.total is not None:
        doc["totalQuota"] = _quota_doc(policy.total)
    return doc
