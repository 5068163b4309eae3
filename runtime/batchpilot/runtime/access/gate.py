"""The gate in front of the model: who is calling (an API key), may it call this model, and is
it within its rate limit — decided before a request is read or queued, the same for REST and
gRPC.

The key table, the policy and the buckets are one immutable-by-replacement state: a new Secret
or access document swaps a new state in with one assignment, so a request sees the old state or
the new, never half of each, and requests already past the gate are untouched. Pure: the clock
is injected, and what happened is told to a `count(key_id, outcome)` function (the metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from batchpilot.runtime.access.keys import KeyTable
from batchpilot.runtime.access.policy import AccessPolicy
from batchpilot.runtime.access.quota import Quotas
from batchpilot.runtime.errors import Forbidden, QuotaExceeded, Unauthorized

KEY_HEADERS: Final = ("authorization", "x-api-key")
"""Where a key may come: `Authorization: Bearer <key>`, or `x-api-key: <key>` (the header v2
clients such as tritonclient can send as they are told). HTTP headers and gRPC metadata alike."""
UNKNOWN: Final = "unknown"
"""The `key_id` label of a request without a key or with a key the table does not hold."""
OUTCOMES: Final = ("admitted", "unauthenticated", "forbidden", "over_quota")
"""The `outcome` label of `batchpilot_requests_by_key_total`."""
NO_KEY_MESSAGE: Final = (
    "this model needs an API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
)


def presented_key(headers: Iterable[tuple[str, str]]) -> str | None:
    """The key the request carries (names lower-cased, as HTTP servers and gRPC give them);
    None when it carries none. Raises `Unauthorized` for an Authorization header of another
    scheme, or two headers with different keys."""
    found: set[str] = set()
    for name, value in headers:
        if name == "authorization":
            scheme, _, credential = value.strip().partition(" ")
            if scheme.lower() != "bearer" or not credential.strip():
                raise Unauthorized(
                    "the Authorization header must be 'Bearer <key>'", error="invalid_request"
                )
            found.add(credential.strip())
        elif name == "x-api-key":
            found.add(value.strip())
    if len(found) > 1:
        raise Unauthorized(
            "the request carries two different keys (Authorization and x-api-key): send one",
            error="invalid_request",
        )
    return next(iter(found), None) or None


@dataclass(frozen=True, slots=True)
class _State:
    table: KeyTable
    policy: AccessPolicy
    quotas: Quotas


def _quotas(policy: AccessPolicy) -> Quotas:
    return Quotas(default=policy.default, per_key=policy.per_key, total=policy.total)


class AccessGate:
    """API keys and quotas for one model."""

    def __init__(
        self,
        table: KeyTable,
        policy: AccessPolicy,
        *,
        model: str,
        clock: Callable[[], float],
        count: Callable[[str, str], None] = lambda key_id, outcome: None,
    ) -> None:
        self._model = model
        self._clock = clock
        self._count = count
        self._state = _State(table, policy, _quotas(policy))

    @property
    def table(self) -> KeyTable:
        return self._state.table

    @property
    def policy(self) -> AccessPolicy:
        return self._state.policy

    def callers(self) -> int:
        """How many keys may call this model: the table's keys the policy allows."""
        state = self._state
        return sum(1 for key_id, _ in state.table.entries if state.policy.allows(key_id))

    def replace(self, *, table: KeyTable | None = None, policy: AccessPolicy | None = None) -> None:
        """Swap in a new key table and/or policy; the buckets keep what they hold. A policy
        equal to the one in force changes nothing (the same document from the admin port and,
        later, from the file)."""
        state = self._state
        if policy is None or policy == state.policy:
            policy = state.policy
        quotas = state.quotas
        if policy is not state.policy:
            quotas = quotas.reconfigured(
                default=policy.default,
                per_key=policy.per_key,
                total=policy.total,
                now=self._clock(),
            )
        self._state = _State(table or state.table, policy, quotas)

    def allows(self, key_id: str) -> bool:
        """Whether the key `key_id` may call this model now (a key another replica checked,
        relayed: `job_relay`)."""
        state = self._state
        return key_id in state.table.key_ids and state.policy.allows(key_id)

    def identify(self, headers: Iterable[tuple[str, str]]) -> str:
        """The id of the caller's key, allowed on this model; raises `Unauthorized` or
        `Forbidden`. Takes no quota: for reads (metadata, async results)."""
        state = self._state
        try:
            key = presented_key(headers)
        except Unauthorized:
            self._count(UNKNOWN, "unauthenticated")
            raise
        if key is None:
            self._count(UNKNOWN, "unauthenticated")
            raise Unauthorized(NO_KEY_MESSAGE)
        key_id = state.table.identify(key)
        if key_id is None:
            self._count(UNKNOWN, "unauthenticated")
            raise Unauthorized("the API key is not valid here", error="invalid_token")
        if not state.policy.allows(key_id):
            self._count(key_id, "forbidden")
            raise Forbidden(f"key {key_id!r} may not call model {self._model!r}")
        return key_id

    def admit(self, headers: Iterable[tuple[str, str]]) -> str:
        """`identify`, then a token from the key's and the model's quotas; raises
        `QuotaExceeded` (with the wait until a token) when either has none."""
        key_id = self.identify(headers)
        refusal = self._state.quotas.admit(key_id, now=self._clock())
        if refusal is not None:
            self._count(key_id, "over_quota")
            whose = (
                f"key {key_id!r} is over its quota"
                if refusal.scope == "key"
                else f"model {self._model!r} is over its total quota"
            )
            raise QuotaExceeded(
                f"{whose} ({refusal.limit.describe()}): retry in {refusal.retry_after_s:.2f} s",
                retry_after_s=refusal.retry_after_s,
            )
        self._count(key_id, "admitted")
        return key_id
