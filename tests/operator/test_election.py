"""Leader election against the local Kubernetes API: two electors for one Lease, through the
operator's real client — one leader at a time, take-over after a crash, after a hand-over and
after renewals the API server fails (through the test's fault proxy), one winner per race.
Short durations (a 2 s lease, 0.2 s retries) keep it fast; every take-over time is measured and
bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchpilot.operator.kinds import ResourceKind
from batchpilot.operator.kube import KubeClient
from batchpilot.operator.leadership import LeaseRecord
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import (
    DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_S,
    SLACK_S,
    Candidacy,
    client_for,
    elector,
    read,
    renewed_for,
)
from tests.operator.fault_proxy import Answer, Fault, FaultProxy, Reset
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def two(lease_kube: KubeClient, lease_name: str) -> Iterator[tuple[Candidacy, Candidacy]]:
    """Two candidates, the first started first (so it leads), the second a standby."""
    first = Candidacy(elector(lease_kube, lease_name, "operator-a"))
    assert first.leading.wait(5)
    second = Candidacy(elector(lease_kube, lease_name, "operator-b"))
    yield first, second
    for candidacy in (first, second):
        candidacy.elector.stop()
        candidacy.done.wait(5)


class TestOneLeader:
    def test_the_standby_waits_while_the_leader_renews(
        self, lease_kube: KubeClient, lease_name: str, two: tuple[Candidacy, Candidacy]
    ) -> None:
        leader, standby = two
        # Renewed well past two lease durations: the standby had every chance to take over.
        wait_until(
            lambda: renewed_for(lease_kube, lease_name) >= 2 * DURATION_S,
            timeout=10,
            what="the leader renewing for two lease durations",
        )
        assert not standby.leading.is_set()
        assert not leader.done.is_set()
        record = LeaseRecord.of(read(lease_kube, lease_name))
        assert record.holder == "operator-a"
        assert record.duration_s == DURATION_S
        assert record.transitions == 0

    def test_a_crashed_leader_is_replaced_after_the_lease_duration(
        self, lease_kube: KubeClient, lease_name: str, two: tuple[Candidacy, Candidacy]
    ) -> None:
        leader, standby = two
        wait_until(
            lambda: renewed_for(lease_kube, lease_name) >= DURATION_S,
            timeout=10,
            what="the standby having seen renewals",
        )
        killed = time.monotonic()
        leader.crash()
        assert standby.leading.wait(DURATION_S + RETRY_S + SLACK_S + 5)
        took = standby.led_since - killed
        print(f"take-over after a crash: {took:.2f} s (lease {DURATION_S} s, retry {RETRY_S} s)")
        # Never before the lease ran out since the last renewal the standby saw (at most a retry
        # period before the crash), and at most a retry period after.
        assert DURATION_S - RETRY_S - SLACK_S <= took <= DURATION_S + RETRY_S + SLACK_S
        record = LeaseRecord.of(read(lease_kube, lease_name))
        assert record.holder == "operator-b"
        assert record.transitions == 1

    def test_a_released_lease_is_taken_within_a_retry_period(
        self, lease_kube: KubeClient, lease_name: str, two: tuple[Candidacy, Candidacy]
    ) -> None:
        leader, standby = two
        wait_until(
            lambda: renewed_for(lease_kube, lease_name) >= RETRY_S,
            timeout=10,
            what="a renewal",
        )
        started = time.monotonic()
        leader.hand_over()
        assert standby.leading.wait(RETRY_S + SLACK_S + 5)
        took = standby.led_since - started
        print(f"take-over after a release: {took:.2f} s (retry {RETRY_S} s)")
        assert took <= RETRY_S + SLACK_S
        assert leader.kept is True  # stopped, not lost
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == "operator-b"

    def test_releasing_what_is_no_longer_ours_changes_nothing(
        self, lease_kube: KubeClient, lease_name: str, two: tuple[Candidacy, Candidacy]
    ) -> None:
        leader, standby = two
        leader.crash()
        assert standby.leading.wait(DURATION_S + RETRY_S + SLACK_S + 5)
        before = read(lease_kube, lease_name)
        assert leader.elector.release() is False
        assert (
            read(lease_kube, lease_name)["metadata"]["resourceVersion"]
            == (before["metadata"]["resourceVersion"])
        )


class Paced:
    """The client, with every candidate's read held until all have read: a race, every time."""

    def __init__(self, kube: KubeClient, barrier: threading.Barrier) -> None:
        self._kube = kube
        self._barrier = barrier

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        found = self._kube.get(kind, namespace, name)
        self._barrier.wait(timeout=5)
        return found

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._kube.create(obj)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._kube.replace(obj)

    def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("the elector never patches")

    def delete(self, *args: Any) -> None:
        raise AssertionError("the elector never deletes")


def race(kube: KubeClient, lease_name: str, identities: list[str]) -> dict[str, bool]:
    barrier = threading.Barrier(len(identities))
    results: dict[str, bool] = {}

    def run(identity: str) -> None:
        results[identity] = elector(Paced(kube, barrier), lease_name, identity).try_round()

    threads = [threading.Thread(target=run, args=(i,)) for i in identities]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == len(identities)
    return results


class TestRaces:
    def test_two_creating_at_once_one_wins(self, lease_kube: KubeClient, lease_name: str) -> None:
        results = race(lease_kube, lease_name, ["operator-a", "operator-b"])
        (winner,) = [identity for identity, won in results.items() if won]
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == winner

    def test_two_taking_a_free_lease_at_once_one_wins(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        holder = elector(lease_kube, lease_name, "operator-z")
        assert holder.try_round()
        assert holder.release()
        results = race(lease_kube, lease_name, ["operator-a", "operator-b", "operator-c"])
        (winner,) = [identity for identity, won in results.items() if won]
        record = LeaseRecord.of(read(lease_kube, lease_name))
        assert record.holder == winner
        assert record.transitions == 1  # one transition: the losers wrote nothing


class Unanswered:
    """The client, with reads that hang once `cut` is set: an API server gone quiet."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self.cut = threading.Event()
        self.restored = threading.Event()
        self.hanging = threading.Event()
        """Set once a read hangs."""

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        if self.cut.is_set():
            self.hanging.set()
            self.restored.wait(30)
        return self._kube.get(kind, namespace, name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._kube.create(obj)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._kube.replace(obj)

    def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("the elector never patches")

    def delete(self, *args: Any) -> None:
        raise AssertionError("the elector never deletes")


class AnsweredLate(Unanswered):
    """Renewals the API server carries out at once and answers `late_s` later (a slow network,
    an overloaded apiserver), once `late` is set; reads hang once `cut` is set."""

    def __init__(self, kube: KubeClient, late_s: float) -> None:
        super().__init__(kube)
        self.late = threading.Event()
        self.late_s = late_s
        self.committed: list[float] = []

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        written = super().replace(obj)
        self.committed.append(time.monotonic())
        if self.late.is_set():
            time.sleep(self.late_s)
        return written


class TestLosingTheLease:
    def test_someone_else_holding_it_ends_the_leadership_at_the_next_renewal(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        leader = Candidacy(elector(lease_kube, lease_name, "operator-a"))
        assert leader.leading.wait(5)
        lease = read(lease_kube, lease_name)
        lease["spec"]["holderIdentity"] = "intruder"  # e.g. a split brain resolved against us
        lease_kube.replace(lease)
        assert leader.done.wait(RETRY_S + SLACK_S + 5)
        assert leader.kept is False
        assert leader.elector.lost_because == "the lease is intruder's now"
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == "intruder"

    @pytest.mark.parametrize(
        "fault",
        [Answer(503), Answer(429, retry_after=30), Reset()],
        ids=["503", "429-retry-after-30", "reset"],
    )
    def test_renewals_the_api_server_fails_end_the_leadership_by_the_deadline(
        self,
        lease_api: LocalKubernetesAPI,
        lease_kube: KubeClient,
        lease_name: str,
        tmp_path: Path,
        fault: Answer | Reset,
    ) -> None:
        """The leader talks to the API through the fault proxy, the standby straight to it: the
        leader's renewals fail, it stops by the renew deadline, the standby takes over once the
        lease has run out — never two leaders."""
        with FaultProxy(lease_api.url).threaded() as proxy:
            through_proxy = client_for(proxy, tmp_path / "kubeconfig")  # type: ignore[arg-type]
            leader = Candidacy(elector(through_proxy, lease_name, "operator-a"))
            candidacies = [leader]
            try:
                assert leader.leading.wait(5)
                standby = Candidacy(elector(lease_kube, lease_name, "operator-b"))
                candidacies.append(standby)
                wait_until(
                    lambda: renewed_for(lease_kube, lease_name) >= RETRY_S,
                    timeout=10,
                    what="a renewal",
                )
                proxy.add(Fault(fault, path=f"/leases/{lease_name}$", method="PUT"))
                failing_since = time.monotonic()
                assert leader.done.wait(RENEW_DEADLINE_S + SLACK_S + 5)
                stopped_after = time.monotonic() - failing_since
                assert leader.kept is False
                assert leader.elector.lost_because == f"not renewed for {RENEW_DEADLINE_S:g} s"
                assert stopped_after <= RENEW_DEADLINE_S + SLACK_S
                assert not standby.leading.is_set()  # the leader stopped first
                assert standby.leading.wait(DURATION_S + RETRY_S + SLACK_S + 5)
                assert time.monotonic() - failing_since >= DURATION_S - RETRY_S - SLACK_S
            finally:
                for candidacy in candidacies:
                    candidacy.elector.stop()
                    candidacy.done.wait(5)

    def test_an_unanswered_renewal_is_not_waited_out_past_the_deadline(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        quiet = Unanswered(lease_kube)
        leader = Candidacy(elector(quiet, lease_name, "operator-a"))
        try:
            assert leader.leading.wait(5)
            wait_until(
                lambda: renewed_for(lease_kube, lease_name) >= RETRY_S,
                timeout=10,
                what="a renewal",
            )
            last_renewal = time.monotonic()
            quiet.cut.set()
            assert leader.done.wait(RENEW_DEADLINE_S + SLACK_S + 5)
            lost_after = time.monotonic() - last_renewal
            assert leader.kept is False
            assert leader.elector.lost_because == f"not renewed for {RENEW_DEADLINE_S:g} s"
            # Lost by the deadline, though the read still hangs; the Lease is not expired yet
            # for anyone who saw the last renewal.
            assert lost_after <= RENEW_DEADLINE_S + SLACK_S
            assert lost_after < DURATION_S
        finally:
            quiet.restored.set()

    def test_a_renewal_answered_late_counts_from_when_it_was_asked(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        """A standby measures the lease from when it saw the renewal, about when the API server
        carried it out; a leader that dated it from the answer, a second later, would stop a
        second after a standby may take over — two leaders for that second."""
        slow = AnsweredLate(lease_kube, late_s=1.0)
        leader = Candidacy(elector(slow, lease_name, "operator-a"))
        try:
            assert leader.leading.wait(5)
            slow.late.set()
            count = len(slow.committed)
            wait_until(lambda: len(slow.committed) > count, timeout=10, what="a late renewal")
            slow.cut.set()  # the API server goes quiet once that renewal is carried out
            last_commit = slow.committed[-1]
            assert leader.done.wait(DURATION_S + SLACK_S + 5)
            lost_after = time.monotonic() - last_commit
            assert leader.kept is False
            assert leader.elector.lost_because == f"not renewed for {RENEW_DEADLINE_S:g} s"
            assert lost_after < DURATION_S  # before anyone who saw that renewal may take over
        finally:
            slow.restored.set()


class TestHandOverInTrouble:
    def test_a_release_behind_a_hung_renewal_gives_up_when_the_lease_runs_out(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        """SIGTERM while a renewal hangs on an API server gone quiet: the release would wait for
        that round (30 s here, a client's retries in a cluster), holding the pod's shutdown for a
        Lease a standby may take anyway once it has run out."""
        quiet = Unanswered(lease_kube)
        leader = Candidacy(elector(quiet, lease_name, "operator-a"))
        try:
            assert leader.leading.wait(5)
            wait_until(
                lambda: renewed_for(lease_kube, lease_name) >= RETRY_S,
                timeout=10,
                what="a renewal",
            )
            quiet.cut.set()
            assert quiet.hanging.wait(5)  # the next renewal's read hangs
            stopping = time.monotonic()
            leader.elector.stop()
            assert leader.done.wait(5)
            assert leader.elector.release() is False
            assert time.monotonic() - stopping <= DURATION_S + SLACK_S
        finally:
            quiet.restored.set()
