"""API keys and quotas, the pure core: the key table, the token bucket with a stepped clock, the
access document (read, and written back), and the gate's answers (401, 403, 429 with the wait) —
values only, no server; and the watcher taking a document sent to the admin port."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from batchpilot.runtime.access import (
    OPEN_POLICY,
    AccessGate,
    AccessPolicy,
    KeyTable,
    KeyTableError,
    Limit,
    Quotas,
    TokenBucket,
    parse_access,
    presented_key,
)
from batchpilot.runtime.access.files import AccessWatcher, read_keys, read_policy
from batchpilot.runtime.access.policy import access_doc
from batchpilot.runtime.errors import Forbidden, InvalidRequest, QuotaExceeded, Unauthorized

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
KEYS = {"alice": ALICE.encode(), "bob": BOB.encode() + b"\n"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


class TestKeyTable:
    def test_a_key_names_its_id_and_an_unknown_key_none(self) -> None:
        table = KeyTable.from_keys(KEYS)
        assert table.identify(ALICE) == "alice"
        assert table.identify(BOB) == "bob"  # the file's trailing newline is not the key
        assert table.identify(ALICE[:-1]) is None
        assert table.identify("") is None
        assert table.key_ids == {"alice", "bob"}

    def test_only_digests_are_kept(self) -> None:
        table = KeyTable.from_keys(KEYS)
        assert dict(table.entries) == {
            "alice": hashlib.sha256(ALICE.encode()).digest(),
            "bob": hashlib.sha256(BOB.encode()).digest(),
        }
        assert ALICE not in repr(table)
        assert BOB not in repr(table)

    @pytest.mark.parametrize(
        ("keys", "message"),
        [
            ({"-bad": ALICE.encode()}, "a key id is 1 to 63 letters"),
            ({"a b": ALICE.encode()}, "a key id is 1 to 63 letters"),
            ({"short": b"abc"}, "'short' has 3 characters: a key has 16 to 4096"),
            ({"spaced": b"0123456789 abcdef"}, "printable ASCII without spaces"),
            ({"one": ALICE.encode(), "two": ALICE.encode()}, "'one' and 'two' hold the same key"),
        ],
    )
    def test_a_bad_table_is_refused_whole_without_showing_a_key(
        self, keys: dict[str, bytes], message: str
    ) -> None:
        with pytest.raises(KeyTableError, match=message) as caught:
            KeyTable.from_keys(keys)
        assert ALICE not in str(caught.value)


class TestTokenBucket:
    def test_burst_then_rate(self) -> None:
        bucket = TokenBucket(Limit(rate_rps=2, burst=3), now=0.0)
        for _ in range(3):
            assert bucket.wait_s(0.0) == 0
            bucket.take(0.0)
        # empty: one token takes 1 / 2 rps = 0.5 s
        assert bucket.wait_s(0.0) == pytest.approx(0.5)
        assert bucket.wait_s(0.4) == pytest.approx(0.1)
        assert bucket.wait_s(0.5) == 0
        bucket.take(0.5)
        # refill stops at the burst: 10 s idle is 3 tokens, not 20
        assert bucket.tokens(10.5) == 3

    def test_a_new_limit_keeps_what_is_left_up_to_its_burst(self) -> None:
        bucket = TokenBucket(Limit(rate_rps=1, burst=10), now=0.0)
        bucket.take(0.0)
        assert bucket.resized(Limit(rate_rps=1, burst=4), now=0.0).tokens(0.0) == 4
        assert bucket.resized(Limit(rate_rps=1, burst=20), now=0.0).tokens(0.0) == 9

    @pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (1, 0)])
    def test_a_limit_that_admits_nothing_or_everything_is_refused(
        self, rate: float, burst: int
    ) -> None:
        with pytest.raises(ValueError, match="a rate limit needs"):
            Limit(rate_rps=rate, burst=burst)


class TestQuotas:
    def test_per_key_buckets_are_independent(self) -> None:
        quotas = Quotas(default=Limit(rate_rps=1, burst=1))
        assert quotas.admit("alice", now=0.0) is None
        refusal = quotas.admit("alice", now=0.0)
        assert refusal is not None
        assert refusal.scope == "key"
        assert refusal.retry_after_s == pytest.approx(1.0)
        assert quotas.admit("bob", now=0.0) is None

    def test_a_key_quota_wins_over_the_default_and_no_limit_is_unlimited(self) -> None:
        quotas = Quotas(per_key={"bulk": Limit(rate_rps=1, burst=2)})
        assert [quotas.admit("bulk", now=0.0) is None for _ in range(3)] == [True, True, False]
        assert all(quotas.admit("other", now=0.0) is None for _ in range(1000))

    def test_the_total_refuses_without_spending_the_keys_token(self) -> None:
        quotas = Quotas(default=Limit(rate_rps=10, burst=2), total=Limit(rate_rps=1, burst=1))
        assert quotas.admit("alice", now=0.0) is None
        refusal = quotas.admit("bob", now=0.0)
        assert refusal is not None
        assert refusal.scope == "total"
        # bob's bucket was not charged for the refused request: two tokens at t=1
        assert quotas.admit("bob", now=1.0) is None
        assert quotas.admit("bob", now=2.0) is None


class TestAccessDocument:
    def test_every_part(self) -> None:
        policy = parse_access(
            b'{"allowedKeyIds": ["alice"], "defaultQuota": {"requestsPerSecond": 5, "burst": 10},'
            b' "keyQuotas": [{"keyId": "bulk", "requestsPerSecond": 0.5, "burst": 1}],'
            b' "totalQuota": {"requestsPerSecond": 100}}'
        )
        assert policy == AccessPolicy(
            allowed=frozenset({"alice"}),
            default=Limit(5, 10),
            per_key={"bulk": Limit(0.5, 1)},
            total=Limit(100, 100),  # burst: one second's worth unless given
        )
        assert parse_access(b"{}") == OPEN_POLICY

    def test_the_policy_written_back_reads_as_the_same_policy(self) -> None:
        body = (
            b'{"allowedKeyIds": ["bob", "alice"], "defaultQuota": {"requestsPerSecond": 5},'
            b' "keyQuotas": [{"keyId": "z", "requestsPerSecond": 0.5, "burst": 1},'
            b' {"keyId": "a", "requestsPerSecond": 2, "burst": 4}]}'
        )
        policy = parse_access(body)
        doc = access_doc(policy)
        assert doc == {
            "allowedKeyIds": ["alice", "bob"],
            "defaultQuota": {"requestsPerSecond": 5.0, "burst": 5},
            "keyQuotas": [
                {"keyId": "a", "requestsPerSecond": 2.0, "burst": 4},
                {"keyId": "z", "requestsPerSecond": 0.5, "burst": 1},
            ],
        }
        assert parse_access(orjson.dumps(doc)) == policy
        assert access_doc(OPEN_POLICY) == {}

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (b"[", "not valid JSON"),
            (b'{"quota": 1}', "unknown access setting quota"),
            (b'{"defaultQuota": {"requestsPerSecond": -1}}', "from 0.01 to 100000"),
            (b'{"defaultQuota": {"requestsPerSecond": 1e9}}', "from 0.01 to 100000"),
            (b'{"totalQuota": {"requestsPerSecond": 1, "burst": 0}}', "whole number from 1"),
            (b'{"allowedKeyIds": ["a b"]}', r"allowedKeyIds\[0\]: 'a b': a key id is"),
            (
                b'{"keyQuotas": [{"keyId": "x", "requestsPerSecond": 1},'
                b' {"keyId": "x", "requestsPerSecond": 2}]}',
                "has a quota already",
            ),
        ],
    )
    def test_a_bad_document_is_refused_with_the_reason(self, body: bytes, message: str) -> None:
        with pytest.raises(InvalidRequest, match=message):
            parse_access(body)


class TestPresentedKey:
    def test_bearer_or_x_api_key(self) -> None:
        assert presented_key(bearer(ALICE)) == ALICE
        assert presented_key([("authorization", f"bearer  {ALICE} ")]) == ALICE
        assert presented_key([("x-api-key", ALICE)]) == ALICE
        assert presented_key([("x-api-key", ALICE), *bearer(ALICE)]) == ALICE
        assert presented_key([("content-type", "application/json")]) is None

    @pytest.mark.parametrize(
        ("headers", "message"),
        [
            ([("authorization", f"Basic {ALICE}")], "must be 'Bearer <key>'"),
            ([("authorization", "Bearer ")], "must be 'Bearer <key>'"),
            ([("x-api-key", ALICE), ("authorization", f"Bearer {BOB}")], "two different keys"),
        ],
    )
    def test_malformed(self, headers: list[tuple[str, str]], message: str) -> None:
        with pytest.raises(Unauthorized, match=message) as caught:
            presented_key(headers)
        assert caught.value.error == "invalid_request"


class TestGate:
    def gate(
        self, policy: AccessPolicy = OPEN_POLICY
    ) -> tuple[AccessGate, Clock, list[tuple[str, str]]]:
        clock, counted = Clock(), []
        gate = AccessGate(
            KeyTable.from_keys(KEYS),
            policy,
            model="resnet50",
            clock=clock,
            count=lambda key_id, outcome: counted.append((key_id, outcome)),
        )
        return gate, clock, counted

    def test_callers_are_the_keys_the_policy_allows(self) -> None:
        assert self.gate()[0].callers() == 2
        only_alice = AccessPolicy(allowed=frozenset({"alice", "carol"}))  # carol: not in the table
        gate = self.gate(only_alice)[0]
        assert gate.callers() == 1
        gate.replace(policy=OPEN_POLICY)
        assert gate.callers() == 2

    def test_the_table_of_answers(self) -> None:
        policy = AccessPolicy(allowed=frozenset({"alice"}), default=Limit(rate_rps=2, burst=1))
        gate, clock, counted = self.gate(policy)
        assert gate.admit(bearer(ALICE)) == "alice"
        with pytest.raises(Unauthorized, match="needs an API key") as no_key:
            gate.admit([])
        assert no_key.value.error is None  # RFC 6750: no error code when none was sent
        with pytest.raises(Unauthorized, match="not valid here") as wrong:
            gate.admit(bearer("not-a-key-0123456789"))
        assert wrong.value.error == "invalid_token"
        with pytest.raises(Forbidden, match="key 'bob' may not call model 'resnet50'"):
            gate.admit([("x-api-key", BOB)])
        with pytest.raises(QuotaExceeded, match="key 'alice' is over its quota") as over:
            gate.admit(bearer(ALICE))
        assert over.value.retry_after_s == pytest.approx(0.5)  # one token at 2 rps
        clock.now += 0.5
        assert gate.admit(bearer(ALICE)) == "alice"
        assert counted == [
            ("alice", "admitted"),
            ("unknown", "unauthenticated"),
            ("unknown", "unauthenticated"),
            ("bob", "forbidden"),
            ("alice", "over_quota"),
            ("alice", "admitted"),
        ]

    def test_metadata_reads_take_no_quota(self) -> None:
        gate, _, _ = self.gate(AccessPolicy(default=Limit(rate_rps=1, burst=1)))
        for _ in range(5):
            assert gate.identify(bearer(ALICE)) == "alice"
        assert gate.admit(bearer(ALICE)) == "alice"

    def test_a_new_table_retires_a_key_and_the_buckets_stay(self) -> None:
        gate, clock, _ = self.gate(AccessPolicy(default=Limit(rate_rps=1, burst=1)))
        gate.admit(bearer(ALICE))
        gate.replace(table=KeyTable.from_keys({"alice": b"alice-rotated-0123456789"}))
        with pytest.raises(Unauthorized):
            gate.admit(bearer(ALICE))
        # the same id, a new key: its bucket is the one it emptied a moment ago
        with pytest.raises(QuotaExceeded):
            gate.admit(bearer("alice-rotated-0123456789"))
        clock.now += 1
        assert gate.admit(bearer("alice-rotated-0123456789")) == "alice"

    def test_a_new_policy_applies_at_once(self) -> None:
        gate, _, _ = self.gate()
        gate.admit([("x-api-key", BOB)])
        gate.replace(policy=AccessPolicy(allowed=frozenset({"alice"})))
        with pytest.raises(Forbidden):
            gate.admit([("x-api-key", BOB)])

    def test_an_equal_policy_changes_nothing(self) -> None:
        policy = AccessPolicy(default=Limit(rate_rps=1, burst=2))
        gate, _, _ = self.gate(policy)
        gate.admit(bearer(ALICE))
        gate.replace(policy=AccessPolicy(default=Limit(rate_rps=1, burst=2)))
        assert gate.policy is policy  # the one in force stays, buckets and all
        gate.admit(bearer(ALICE))
        with pytest.raises(QuotaExceeded):
            gate.admit(bearer(ALICE))


class TestTheWatcherTakesDocumentsFromTheAdminPort:
    def watcher(self, tmp_path: Path) -> tuple[AccessWatcher, AccessGate, list[tuple[str, bool]]]:
        keys = tmp_path / "keys"
        keys.mkdir()
        (keys / "alice").write_bytes(KEYS["alice"])
        access = tmp_path / "access.json"
        access.write_text('{"defaultQuota": {"requestsPerSecond": 1, "burst": 3}}')
        gate = AccessGate(read_keys(keys), read_policy(access), model="m", clock=Clock())
        reported: list[tuple[str, bool]] = []
        watcher = AccessWatcher(
            gate, keys=keys, access=access, report=lambda s, ok: reported.append((s, ok))
        )
        return watcher, gate, reported

    def test_a_document_is_swapped_in_whole_and_a_bad_one_refused(self, tmp_path: Path) -> None:
        watcher, gate, reported = self.watcher(tmp_path)
        for _ in range(3):
            gate.admit(bearer(ALICE))
        policy = watcher.apply(b'{"defaultQuota": {"requestsPerSecond": 1, "burst": 10}}')
        assert gate.policy == policy == AccessPolicy(default=Limit(1, 10))
        with pytest.raises(QuotaExceeded):  # the bucket emptied under the old limit stays empty
            gate.admit(bearer(ALICE))
        with pytest.raises(InvalidRequest, match=r"defaultQuota\.burst must be a whole number"):
            watcher.apply(b'{"defaultQuota": {"requestsPerSecond": 1, "burst": 0.5}}')
        assert gate.policy is policy
        assert reported == [("admin", True), ("admin", False)]
        assert watcher.check() is False  # the file has not changed
