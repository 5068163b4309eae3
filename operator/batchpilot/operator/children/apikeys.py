"""API keys and quotas in the pods: the keys' Secret mounted as a folder, the access document
beside the batching document, the runtime's flags — and the check that the Secret can be used
before any of it is applied.

The Secret is the user's, not a child: the operator reads it, mounts it and never writes it.
The kubelet updates a mounted Secret in place (a `..data` symlink swap), so rotating a key is
editing the Secret; the runtime notices and swaps its key table. That is also why the mount is a
whole volume and never a `subPath`, which the kubelet does not update. The access document (the
allowed key ids and the quotas, `batchpilot.api.access`) lives in the batching ConfigMap, which
running pods re-read, and the operator also sends it to each ready pod's admin port: quotas
change without a restart. With service-wide quotas (the default) the document is one replica's
share of the limits written (`quota_share`), so it changes with the number of serving replicas.

Pure: the Secret is an argument; the reconciler reads it.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from batchpilot.api.access import MIN_RATE_RPS, AccessDocument, KeyQuotaDocument, QuotaDocument
from batchpilot.operator.access_spec import QuotaSpec
from batchpilot.operator.children.common import ACCESS_FILE, BATCHING_DIR, Owner
from batchpilot.operator.children.keys_secret import checked_problem
from batchpilot.operator.children.quota_share import share, shared
from batchpilot.operator.events import API_KEYS_SECRET_INVALID, API_KEYS_SECRET_MISSING

API_KEYS_DIR = "/var/run/secrets/batchpilot-api-keys"
API_KEYS_VOLUME = "api-keys"


class SecretProblem(NamedTuple):
    """Why the keys' Secret cannot be mounted yet: a condition reason and a message."""

    reason: str
    message: str


def _quota(spec: QuotaSpec) -> QuotaDocument:
    rate = spec.requests_per_second
    return {
        "requestsPerSecond": rate,
        "burst": spec.burst if spec.burst is not None else max(1, math.ceil(rate)),
    }


def access_document(owner: Owner, *, serving_replicas: int = 1) -> str | None:
    """The access document each pod enforces (the ConfigMap's `--access-config`, and what the
    operator sends to the pods' admin port); None without `spec.auth`. Service-wide quotas are
    divided among the `serving_replicas` replicas that serve."""
    doc = _written(owner)
    if doc is None:
        return None
    auth = owner.spec.auth
    if auth is not None and auth.quotas.scope == "service":
        doc = shared(doc, serving_replicas)
    return json.dumps(doc, sort_keys=True)


def _written(owner: Owner) -> AccessDocument | None:
    """The access document of the limits as `spec.auth` writes them, undivided."""
    auth = owner.spec.auth
    if auth is None:
        return None
    doc: AccessDocument = {}
    if auth.api_keys.allowed_key_ids is not None:
        doc["allowedKeyIds"] = sorted(set(auth.api_keys.allowed_key_ids))
    quotas = auth.quotas
    if quotas.default is not None:
        doc["defaultQuota"] = _quota(quotas.default)
    if quotas.per_key:
        per_key: list[KeyQuotaDocument] = []
        for quota in sorted(quotas.per_key, key=lambda q: q.key_id):
            limit = _quota(quota)
            per_key.append({"keyId": quota.key_id, **limit})
        doc["keyQuotas"] = per_key
    if quotas.total is not None:
        doc["totalQuota"] = _quota(quotas.total)
    return doc


def api_keys_args(owner: Owner) -> list[str]:
    """The runtime's flags for API keys (none without `spec.auth`)."""
    if owner.spec.auth is None:
        return []
    return ["--api-keys", API_KEYS_DIR, "--access-config", f"{BATCHING_DIR}/{ACCESS_FILE}"]


def api_keys_volume(owner: Owner) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the keys' Secret: read-only, readable by the runtime's group only."""
    auth = owner.spec.auth
    if auth is None:
        return [], []
    volume = {
        "name": API_KEYS_VOLUME,
        "secret": {"secretName": auth.api_keys.secret_name, "defaultMode": 0o440},
    }
    mount = {"name": API_KEYS_VOLUME, "mountPath": API_KEYS_DIR, "readOnly": True}
    return [volume], [mount]


def keys_secret_problem(owner: Owner, secret: dict[str, Any] | None) -> SecretProblem | None:
    """Why the Secret `spec.auth.apiKeys.secretName` names cannot be used (None: it can, or
    there is no `spec.auth`). The runtime refuses to start with a Secret like that, so the
    operator applies nothing of the spec until it is fixed. Messages never show a key."""
    auth = owner.spec.auth
    if auth is None:
        return None
    name = auth.api_keys.secret_name
    if secret is None:
        return SecretProblem(
            API_KEYS_SECRET_MISSING,
            f"the API keys' Secret {name} does not exist in namespace {owner.namespace}: create "
            "it with one entry per key (the entry's name is the key id, its value the key); "
            "nothing of this spec is applied until it exists",
        )
    problem = checked_problem(secret)  # whole, or as the cache keeps it (keys_secret)
    return None if problem is None else SecretProblem(API_KEYS_SECRET_INVALID, problem)


def _describe(quota: QuotaDocument, *, scope: str, replicas: int) -> str:
    rate, burst = quota["requestsPerSecond"], quota["burst"]
    if scope == "replica":
        return f"{rate:g} requests/s, burst {burst}"
    part = share(quota, replicas)
    across = f"across {replicas} replica{'s' if replicas != 1 else ''}"
    said = (
        f"{rate:g} requests/s for the service, {part['requestsPerSecond']:g} per replica "
        f"{across} (burst {burst}, {part['burst']} per replica)"
    )
    allowed = part["requestsPerSecond"] * replicas
    if allowed > rate * (1 + 1e-6):  # the smallest share a replica takes raised it
        said += (
            f"; {allowed:g} requests/s in all: a replica's share is {MIN_RATE_RPS:g} at the least"
        )
    return said


def auth_status(owner: Owner, *, serving_replicas: int = 1) -> dict[str, Any] | None:
    """`status.auth`: the keys and limits in force, in words; None without `spec.auth`."""
    auth = owner.spec.auth
    doc = _written(owner)
    if auth is None or doc is None:
        return None
    scope = auth.quotas.scope
    allowed = doc.get("allowedKeyIds")
    who = "every key" if allowed is None else f"key ids {', '.join(allowed) or 'none'}"
    limits: list[tuple[str, QuotaDocument]] = []
    if "defaultQuota" in doc:
        limits.append(("each key", doc["defaultQuota"]))
    for quota in doc.get("keyQuotas", []):
        limits.append((quota["keyId"], quota))
    if "totalQuota" in doc:
        limits.append(("in total", doc["totalQuota"]))
    text = f"API keys from Secret {auth.api_keys.secret_name}: {who}"
    if limits:
        described = [
            f"{name} {_describe(quota, scope=scope, replicas=serving_replicas)}"
            for name, quota in limits
        ]
        heading = "per replica" if scope == "replica" else "limits"
        text += f"; {heading}: {'; '.join(described)}"
    status: dict[str, Any] = {
        "secretName": auth.api_keys.secret_name,
        "text": text,
        "quotaScope": scope,
    }
    if scope == "service":
        status["servingReplicas"] = serving_replicas
    if allowed is not None:
        status["allowedKeyIds"] = allowed
    return status
