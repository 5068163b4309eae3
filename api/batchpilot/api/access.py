"""The access document and the API key rules: the contract between the operator, which writes the
document and checks the keys' Secret, and the runtime, which enforces both.

An InferenceService with `spec.auth` gets two things in its pods: the keys' Secret, mounted as a
folder (one file per key, named by its key id, holding the key), and this document, in the
ConfigMap beside the batching document (re-read when its content changes, like the batching one)
and sent by the operator to each ready pod's admin port (`PUT /admin/access`), which applies it at
once:

`{"allowedKeyIds": [...], "defaultQuota": {"requestsPerSecond": R, "burst": B},
"keyQuotas": [{"keyId": ..., "requestsPerSecond": R, "burst": B}], "totalQuota": {...}}`

- `allowedKeyIds`: the key ids that may call this model; absent: every key in the Secret. A key
  the Secret holds but this list does not name is known and refused (403).
- `defaultQuota`: each key's rate limit unless `keyQuotas` names it; absent: no per-key limit.
- `totalQuota`: the limit over every key together.

Limits are token buckets, and each runtime enforces the document it holds on the requests it
receives: a key may make `burst` requests at once and `requestsPerSecond` after that, on that
replica. For service-wide quotas (`spec.auth.quotas.scope: service`, the default) the operator
writes each replica its share — the service's rates and bursts divided by the ready replicas — so
the document changes when the service scales.

The rules a key id and a key must follow are here too (`key_id_problem`, `key_problem`), so the
operator refuses a Secret the runtime would refuse, with the same words. Pure: the standard
library only.
"""

from __future__ import annotations

import re
from typing import Final, TypedDict

KEY_ID_PATTERN: Final = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A key id: the name of the key's entry in the Secret, and the `key_id` label of its metrics."""
KEY_ID_MESSAGE: Final = (
    "a key id is 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
    "or digit (e.g. storefront or batch-jobs.v2)"
)
MIN_KEY_LENGTH: Final = 16
"""Shorter keys are guessable; `openssl rand -hex 32` makes a good one."""
MAX_KEY_LENGTH: Final = 4096
MAX_KEYS: Final = 1000
"""Keys per Secret: each request compares its key with all of them (in constant time)."""
MAX_RATE_RPS: Final = 100_000.0
MIN_RATE_RPS: Final = 0.01
MAX_BURST: Final = 100_000


class QuotaDocument(TypedDict):
    """A token bucket: `burst` requests at once, then `requestsPerSecond`."""

    requestsPerSecond: float
    burst: int


class KeyQuotaDocument(QuotaDocument):
    keyId: str


class AccessDocument(TypedDict, total=False):
    """The access document; every key optional (absent: no restriction of that kind)."""

    allowedKeyIds: list[str]
    defaultQuota: QuotaDocument
    keyQuotas: list[KeyQuotaDocument]
    totalQuota: QuotaDocument


ACCESS_KEYS: tuple[str, ...] = tuple(AccessDocument.__annotations__)
"""Every key an access document may have; any other is refused."""


def key_id_problem(key_id: str) -> str | None:
    """Why `key_id` cannot name a key (None: it can)."""
    if re.fullmatch(KEY_ID_PATTERN, key_id) is None:
        return f"{key_id!r}: {KEY_ID_MESSAGE}"
    return None


def key_problem(key_id: str, key: bytes) -> str | None:
    """Why the key stored under `key_id` cannot be used (None: it can). Surrounding whitespace
    (a trailing newline from `echo`) is not part of the key. The message never shows the key."""
    text = key.strip()
    if not MIN_KEY_LENGTH <= len(text) <= MAX_KEY_LENGTH:
        return (
            f"the key of {key_id!r} has {len(text)} characters: a key has {MIN_KEY_LENGTH} to "
            f"{MAX_KEY_LENGTH} (e.g. openssl rand -hex 32)"
        )
    if not all(0x21 <= byte <= 0x7E for byte in text):
        return (
            f"the key of {key_id!r} has characters a header cannot carry: a key is printable "
            "ASCII without spaces"
        )
    return None
