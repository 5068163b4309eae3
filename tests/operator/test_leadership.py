"""Leader election's rules (leadership.py), with the clocks injected: who may take the Lease when,
and what is written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from batchpilot.operator.leadership import (
    Action,
    Candidate,
    LeaseRecord,
    Observed,
    Round,
    decide,
    micro_time,
    parse_micro_time,
    release,
)

WALL = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
A = Candidate("operator-a", "batchpilot-operator", "batchpilot-system", 15)
B = Candidate("operator-b", "batchpilot-operator", "batchpilot-system", 15)


def lease(
    holder: str | None,
    *,
    duration: int = 15,
    renewed: datetime = WALL,
    acquired: datetime = WALL,
    transitions: int = 0,
    version: str = "7",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseDurationSeconds": duration,
        "acquireTime": micro_time(acquired),
        "renewTime": micro_time(renewed),
        "leaseTransitions": transitions,
    }
    if holder is not None:
        spec["holderIdentity"] = holder
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "batchpilot-operator",
            "namespace": "batchpilot-system",
            "resourceVersion": version,
            "uid": "lease-uid",
        },
        "spec": spec,
    }


def after_write(step: Round, now: float) -> Observed:
    """What the elector remembers once the write went through."""
    assert step.record is not None
    return Observed(step.record, now)


class TestMicroTime:
    def test_written_as_kubernetes_writes_a_microtime(self) -> None:
        at = datetime(2026, 11, 30, 12, 0, 1, 250, tzinfo=UTC)
        assert micro_time(at) == "2026-11-30T12:00:01.000250Z"

    def test_other_zones_are_written_in_utc(self) -> None:
        at = datetime(2026, 11, 30, 13, 0, tzinfo=timezone(timedelta(hours=1)))
        assert micro_time(at) == "2026-11-30T12:00:00.000000Z"

    @pytest.mark.parametrize(
        "text", ["2026-11-30T12:00:00.000000Z", "2026-11-30T12:00:00Z", "2026-11-30T13:00:00+01:00"]
    )
    def test_read_back_with_or_without_fractions(self, text: str) -> None:
        assert parse_micro_time(text) == WALL

    @pytest.mark.parametrize("text", [None, "", "yesterday", 12])
    def test_missing_or_unreadable_is_none(self, text: object) -> None:
        assert parse_micro_time(text) is None


class TestTakingTheLease:
    def test_no_lease_yet_is_created_holding_it(self) -> None:
        step = decide(None, candidate=A, previous=None, now=100.0, wall=WALL)
        assert step.action is Action.CREATE
        assert step.body == {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "batchpilot-operator", "namespace": "batchpilot-system"},
            "spec": {
                "holderIdentity": "operator-a",
                "leaseDurationSeconds": 15,
                "leaseTransitions": 0,
                "acquireTime": "2026-11-30T12:00:00.000000Z",
                "renewTime": "2026-11-30T12:00:00.000000Z",
            },
        }

    @pytest.mark.parametrize("holder", [None, ""])
    def test_a_released_lease_is_taken_at_once(self, holder: str | None) -> None:
        released = lease(holder, duration=1, transitions=3)
        step = decide(released, candidate=B, previous=None, now=100.0, wall=WALL)
        assert step.action is Action.TAKE
        assert step.body is not None
        assert step.body["spec"]["holderIdentity"] == "operator-b"
        assert step.body["spec"]["leaseTransitions"] == 4  # a new holder: one more transition
        assert step.body["spec"]["leaseDurationSeconds"] == 15  # ours, not the released 1 s

    def test_the_write_carries_the_version_read_so_a_race_has_one_winner(self) -> None:
        step = decide(lease("", version="41"), candidate=B, previous=None, now=1.0, wall=WALL)
        assert step.body is not None
        assert step.body["metadata"]["resourceVersion"] == "41"
        assert step.body["metadata"]["uid"] == "lease-uid"


class TestWaitingForExpiry:
    def test_someone_elses_valid_lease_is_waited_for(self) -> None:
        step = decide(lease("operator-a"), candidate=B, previous=None, now=100.0, wall=WALL)
        assert step.action is Action.WAIT
        assert step.body is None
        assert step.reason == "held by operator-a, 15.0 s left unless renewed"

    def test_expiry_counts_from_when_the_change_was_seen_not_from_renew_time(self) -> None:
        # operator-a's clock is an hour behind: its renewTime looks long expired. Expiry counts
        # from when operator-b saw the record change, so it waits the full duration anyway.
        skewed = lease("operator-a", renewed=WALL - timedelta(hours=1))
        seen = None
        for tick, now in enumerate([100.0, 105.0, 110.0, 114.9]):
            step = decide(skewed, candidate=B, previous=seen, now=now, wall=WALL)
            assert step.action is Action.WAIT, tick
            seen = step.observed
        assert seen is not None
        assert seen.at == 100.0  # 100 + 15 = 115: the first instant it may be taken
        step = decide(skewed, candidate=B, previous=seen, now=115.0, wall=WALL)
        assert step.action is Action.TAKE
        assert step.reason == "expired: operator-a did not renew"

    def test_a_renew_time_in_the_future_buys_no_extra_time(self) -> None:
        # operator-a's clock is an hour ahead; it stopped renewing at 100.
        ahead = lease("operator-a", renewed=WALL + timedelta(hours=1))
        first = decide(ahead, candidate=B, previous=None, now=100.0, wall=WALL)
        step = decide(ahead, candidate=B, previous=first.observed, now=115.0, wall=WALL)
        assert step.action is Action.TAKE

    def test_each_renewal_seen_restarts_the_wait(self) -> None:
        seen = None
        for tick, now in enumerate([100.0, 110.0, 120.0, 130.0]):
            renewed = lease("operator-a", renewed=WALL + timedelta(seconds=now))
            step = decide(renewed, candidate=B, previous=seen, now=now, wall=WALL)
            assert step.action is Action.WAIT, tick  # never 15 s after a change seen
            seen = step.observed
        assert seen is not None
        assert seen.at == 130.0

    def test_the_holders_own_duration_decides(self) -> None:
        # operator-a wrote 5 s; operator-b's own 15 s do not count for a.
        short = lease("operator-a", duration=5)
        first = decide(short, candidate=B, previous=None, now=100.0, wall=WALL)
        assert decide(short, candidate=B, previous=first.observed, now=104.9, wall=WALL).action is (
            Action.WAIT
        )
        assert decide(short, candidate=B, previous=first.observed, now=105.0, wall=WALL).action is (
            Action.TAKE
        )

    def test_a_taken_over_lease_counts_a_transition_and_a_new_acquire_time(self) -> None:
        stale = lease("operator-a", transitions=2, acquired=WALL - timedelta(hours=2))
        first = decide(stale, candidate=B, previous=None, now=0.0, wall=WALL)
        later = WALL + timedelta(seconds=15)
        step = decide(stale, candidate=B, previous=first.observed, now=15.0, wall=later)
        assert step.body is not None
        spec = step.body["spec"]
        assert spec["leaseTransitions"] == 3
        assert spec["acquireTime"] == spec["renewTime"] == micro_time(later)


class TestRenewing:
    def test_our_lease_is_renewed_keeping_acquire_time_and_transitions(self) -> None:
        ours = lease("operator-a", transitions=5, acquired=WALL - timedelta(minutes=3))
        later = WALL + timedelta(seconds=2)
        step = decide(ours, candidate=A, previous=None, now=2.0, wall=later)
        assert step.action is Action.RENEW
        assert step.body is not None
        assert step.body["spec"] == {
            "holderIdentity": "operator-a",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 5,
            "acquireTime": micro_time(WALL - timedelta(minutes=3)),
            "renewTime": micro_time(later),
        }

    def test_a_renewal_is_due_even_past_expiry(self) -> None:
        # Ours, even if we have not renewed for longer than the duration: renewing is the only
        # way to find out whether anyone else wrote meanwhile (409 if so).
        ours = lease("operator-a")
        first = decide(ours, candidate=A, previous=None, now=0.0, wall=WALL)
        assert decide(ours, candidate=A, previous=first.observed, now=60.0, wall=WALL).action is (
            Action.RENEW
        )


class TestHandOver:
    def test_renew_wait_release_take(self) -> None:
        """Two candidates, A leading; each tick both read the Lease as A last wrote it."""
        stored: dict[str, Any] | None = None
        seen: dict[str, Observed | None] = {"operator-a": None, "operator-b": None}

        def tick(candidate: Candidate, now: float) -> Action:
            nonlocal stored
            wall = WALL + timedelta(seconds=now)
            previous = seen[candidate.identity]
            step = decide(stored, candidate=candidate, previous=previous, now=now, wall=wall)
            seen[candidate.identity] = step.observed
            if step.body is not None:
                stored = {
                    **step.body,
                    "metadata": {**step.body["metadata"], "resourceVersion": now},
                }
                seen[candidate.identity] = after_write(step, now)
            return step.action

        assert tick(A, 0.0) is Action.CREATE
        for now in (2.0, 4.0, 6.0):
            assert tick(B, now) is Action.WAIT, now
            assert tick(A, now) is Action.RENEW, now
        released = release(stored, candidate=A, wall=WALL + timedelta(seconds=7))
        assert released is not None
        assert released["spec"]["holderIdentity"] == ""
        assert released["spec"]["leaseDurationSeconds"] == 1
        stored = released
        assert tick(B, 8.0) is Action.TAKE  # at once: no duration to wait out
        assert stored["spec"]["holderIdentity"] == "operator-b"
        assert stored["spec"]["leaseTransitions"] == 1
        assert tick(A, 8.0) is Action.WAIT

    def test_only_the_holder_releases(self) -> None:
        assert release(lease("operator-a"), candidate=B, wall=WALL) is None
        assert release(lease(""), candidate=A, wall=WALL) is None
        assert release(None, candidate=A, wall=WALL) is None

    def test_a_release_keeps_the_version_read_and_the_transitions(self) -> None:
        released = release(lease("operator-a", transitions=4, version="9"), candidate=A, wall=WALL)
        assert released is not None
        assert released["metadata"]["resourceVersion"] == "9"
        assert LeaseRecord.of(released) == LeaseRecord("", 1, WALL, WALL, 4)


class TestTheRecord:
    def test_an_empty_spec_is_a_free_lease(self) -> None:
        assert LeaseRecord.of({"metadata": {}}) == LeaseRecord()
        assert LeaseRecord.of({"spec": None}) == LeaseRecord()

    def test_it_round_trips_through_a_spec(self) -> None:
        record = LeaseRecord("operator-a", 15, WALL, WALL + timedelta(seconds=3), 2)
        assert LeaseRecord.of({"spec": record.spec()}) == record

    def test_an_unchanged_record_keeps_the_time_it_was_first_seen(self) -> None:
        record = LeaseRecord("operator-a", 15)
        seen = Observed(record, 10.0)
        assert seen.then(record, 20.0) is seen
        assert seen.then(LeaseRecord("operator-a", 15, transitions=1), 20.0).at == 20.0
