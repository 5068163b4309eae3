"""The API key table: which key ids exist, and which one a presented key is.

Built from the keys' Secret as the pod mounts it (key id → key); it keeps only each key's SHA-256
digest, so the raw keys live no longer than the reading of the files. A presented key is hashed
and compared with every digest in constant time (`hmac.compare_digest`, no early exit), so how
long the answer takes says nothing about which key, or which part of one, came close. Pure: no
I/O; the files are read by `access.files`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from batchpilot.api.access import MAX_KEYS, key_id_problem, key_problem


class KeyTableError(ValueError):
    """The keys cannot make a table; the message says why, never showing a key."""


def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


@dataclass(frozen=True, slots=True)
class KeyTable:
    """Key ids and their keys' digests. Immutable: a new Secret makes a new table, swapped in
    whole (`access.gate`)."""

    entries: tuple[tuple[str, bytes], ...]
    """(key id, SHA-256 of the key), sorted by key id."""

    @classmethod
    def from_keys(cls, keys: Mapping[str, bytes]) -> KeyTable:
        """The table of `keys` (key id → key as stored; surrounding whitespace dropped). Raises
        `KeyTableError` for an invalid id or key, two ids with one key, or too many keys."""
        if len(keys) > MAX_KEYS:
            raise KeyTableError(f"{len(keys)} keys: at most {MAX_KEYS} per model")
        entries: dict[str, bytes] = {}
        owners: dict[bytes, str] = {}
        for key_id in sorted(keys):
            problem = key_id_problem(key_id) or key_problem(key_id, keys[key_id])
            if problem is not None:
                raise KeyTableError(problem)
            hashed = digest(keys[key_id].strip())
            if hashed in owners:
                raise KeyTableError(
                    f"{owners[hashed]!r} and {key_id!r} hold the same key: a key must name one "
                    "caller"
                )
            owners[hashed] = key_id
            entries[key_id] = hashed
        return cls(tuple(entries.items()))

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(key_id for key_id, _ in self.entries)

    def identify(self, key: str) -> str | None:
        """The id of `key`, or None when no entry holds it. Compares with every entry."""
        presented = digest(key.encode("utf-8", "surrogateescape"))
        found: str | None = None
        for key_id, hashed in self.entries:
            if hmac.compare_digest(presented, hashed):
                found = key_id
        return found
