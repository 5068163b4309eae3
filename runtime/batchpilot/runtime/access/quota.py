"""Rate limits as token buckets: a per-key limit, and a limit over every key together.

A bucket holds up to `burst` tokens and gains `rate` per second; a request takes one, and when
none is left the answer is how long until one is (the 429's Retry-After). Pure: the time is an
argument (the event loop's monotonic clock in the server), so tests step it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limit:
    """`burst` requests at once, then `rate_rps` per second."""

    rate_rps: float
    burst: int

    def __post_init__(self) -> None:
        if not (self.rate_rps > 0 and math.isfinite(self.rate_rps)):
            raise ValueError(f"a rate limit needs a rate above 0, got {self.rate_rps!r}")
        if self.burst < 1:
            raise ValueError(f"a rate limit needs a burst of at least 1, got {self.burst!r}")

    def describe(self) -> str:
        return f"{self.rate_rps:g} requests/s, burst {self.burst}"


class TokenBucket:
    """One bucket; starts full."""

    __slots__ = ("_stamp", "_tokens", "limit")

    def __init__(self, limit: Limit, *, now: float, tokens: float | None = None) -> None:
        self.limit = limit
        self._tokens = float(limit.burst) if tokens is None else min(tokens, limit.burst)
        self._stamp = now

    def tokens(self, now: float) -> float:
        """Tokens available at `now` (refilled up to the burst)."""
        elapsed = max(0.0, now - self._stamp)
        return min(float(self.limit.burst), self._tokens + elapsed * self.limit.rate_rps)

    def wait_s(self, now: float) -> float:
        """Seconds until a token is available at `now` (0: one is)."""
        missing = 1.0 - self.tokens(now)
        return 0.0 if missing <= 1e-9 else missing / self.limit.rate_rps

    def take(self, now: float) -> None:
        """Take a token; call only when `wait_s(now)` is 0."""
        self._tokens = self.tokens(now) - 1.0
        self._stamp = max(self._stamp, now)

    def resized(self, limit: Limit, *, now: float) -> TokenBucket:
        """This bucket under a new limit: the tokens it has now, up to the new burst."""
        return TokenBucket(limit, now=now, tokens=self.tokens(now))


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request over a limit: whose limit (`key` or `total`), the limit, and how long until
    it lets a request through."""

    scope: str
    limit: Limit
    retry_after_s: float


class Quotas:
    """The buckets of one server: one per key with a limit, one over all keys."""

    def __init__(
        self,
        *,
        default: Limit | None = None,
        per_key: Mapping[str, Limit] | None = None,
        total: Limit | None = None,
    ) -> None:
        self._default = default
        self._per_key = dict(per_key or {})
        self._total_limit = total
        self._buckets: dict[str, TokenBucket] = {}
        self._total: TokenBucket | None = None

    def limit_of(self, key_id: str) -> Limit | None:
        return self._per_key.get(key_id, self._default)

    def admit(self, key_id: str, *, now: float) -> Refusal | None:
        """Take a token from the key's bucket and the total's, or neither: None when admitted,
        else the refusal of the limit that waits longest."""
        bucket = self._bucket(key_id, now)
        total = self._total_bucket(now)
        waits = [
            Refusal(scope, b.limit, b.wait_s(now))
            for scope, b in (("key", bucket), ("total", total))
            if b is not None
        ]
        refused = [w for w in waits if w.retry_after_s > 0]
        if refused:
            return max(refused, key=lambda r: r.retry_after_s)
        for b in (bucket, total):
            if b is not None:
                b.take(now)
        return None

    def reconfigured(
        self,
        *,
        default: Limit | None,
        per_key: Mapping[str, Limit],
        total: Limit | None,
        now: float,
    ) -> Quotas:
        """New limits, keeping what each bucket holds (up to its new burst): a changed limit
        neither forgives nor punishes what was just spent."""
        new = Quotas(default=default, per_key=per_key, total=total)
        for key_id, bucket in self._buckets.items():
            limit = new.limit_of(key_id)
            if limit is not None:
                new._buckets[key_id] = bucket.resized(limit, now=now)
        if total is not None and self._total is not None:
            new._total = self._total.resized(total, now=now)
        return new

    def _bucket(self, key_id: str, now: float) -> TokenBucket | None:
        bucket = self._buckets.get(key_id)
        if bucket is None:
            limit = self.limit_of(key_id)
            if limit is None:
                return None
            bucket = self._buckets[key_id] = TokenBucket(limit, now=now)
        return bucket

    def _total_bucket(self, now: float) -> TokenBucket | None:
        if self._total is None and self._total_limit is not None:
            self._total = TokenBucket(self._total_limit, now=now)
        return self._total
