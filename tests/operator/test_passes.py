"""Passes over one InferenceService run one at a time, each on a fresh read, and write status by
one route; passes over different objects do not wait for each other; locks do not pile up."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pytest

from batchpilot.operator.kinds import INFERENCESERVICE
from batchpilot.operator.passes import KeyedLocks, Passes
from tests.operator.fake_kube import FakeKube
from tests.operator.test_reconciler import NS, isvc

WAIT_S = 10
"""How long a test waits for another thread before it fails (never reached when it passes)."""


@dataclass
class Wrote:
    status: dict[str, Any] = field(default_factory=dict)


class ObservedLock:
    """A lock that says when someone tries to take it (each attempt releases `attempts`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attempts = threading.Semaphore(0)

    def __enter__(self) -> None:
        self.attempts.release()
        self._lock.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()


def awaited(semaphore: threading.Semaphore, times: int) -> None:
    for _ in range(times):
        assert semaphore.acquire(timeout=WAIT_S), "the other thread never got there"


class Background:
    """A pass in a thread of its own, as kopf runs a sync handler."""

    def __init__(self, target: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target,))
        self._thread.start()

    def _run(self, target: Any) -> None:
        try:
            self.result = target()
        except BaseException as exc:
            self.error = exc

    def join(self) -> Any:
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the pass never finished"
        if self.error is not None:
            raise self.error
        return self.result


def cluster_with(*names: str) -> FakeKube:
    kube = FakeKube()
    for name in names:
        body = isvc()
        body["metadata"]["name"] = name
        kube.put_object(body)
    return kube


class TestOneAtATime:
    def test_a_second_trigger_waits_and_then_reads_what_the_first_wrote(self) -> None:
        kube = cluster_with("resnet50")
        lock = ObservedLock()
        locks: KeyedLocks[tuple[str, str]] = KeyedLocks(new_lock=lambda: lock)
        passes = Passes(kube, locks=locks)
        log: list[str] = []
        first_inside, release_first = threading.Event(), threading.Event()
        seen_by_second: list[dict[str, Any]] = []

        def first(body: dict[str, Any]) -> Wrote:
            log.append("first in")
            first_inside.set()
            assert release_first.wait(WAIT_S)
            log.append("first out")
            return Wrote({"replicasText": "0/1"})

        def second(body: dict[str, Any]) -> Wrote:
            log.append("second in")
            seen_by_second.append(body["status"])
            return Wrote({"replicasText": "0/1", "url": "http://resnet50"})

        one = Background(lambda: passes.run(NS, "resnet50", first))
        assert first_inside.wait(WAIT_S)
        two = Background(lambda: passes.run(NS, "resnet50", second))
        awaited(lock.attempts, 2)  # both triggers have reached the lock; the first holds it
        assert log == ["first in"]
        release_first.set()
        one.join(), two.join()

        assert log == ["first in", "first out", "second in"]
        assert seen_by_second == [{"replicasText": "0/1"}]  # read after the first pass wrote
        assert kube.writes == [
            ("patch/status", "InferenceService", "resnet50"),
            ("patch/status", "InferenceService", "resnet50"),
        ]
        assert kube.of(INFERENCESERVICE, NS, "resnet50")["status"] == {
            "replicasText": "0/1",
            "url": "http://resnet50",
        }
        assert len(locks) == 0

    def test_passes_over_different_objects_do_not_wait_for_each_other(self) -> None:
        kube = cluster_with("resnet50", "bert")
        passes = Passes(kube)
        inside, release = threading.Event(), threading.Event()

        def slow(body: dict[str, Any]) -> Wrote:
            inside.set()
            assert release.wait(WAIT_S)
            return Wrote()

        held = Background(lambda: passes.run(NS, "resnet50", slow))
        assert inside.wait(WAIT_S)
        other = Background(lambda: passes.run(NS, "bert", lambda body: Wrote({"url": "x"})))
        assert other.join() is not None  # finished while the first still holds its lock
        release.set()
        held.join()


class TestWhatAPassWrites:
    def test_only_the_status_fields_that_changed_are_written(self) -> None:
        kube = cluster_with("resnet50")
        passes = Passes(kube)
        passes.run(NS, "resnet50", lambda body: Wrote({"replicas": 1, "readyReplicas": 0}))
        kube.writes.clear()

        ran = passes.run(NS, "resnet50", lambda body: Wrote({"replicas": 1, "readyReplicas": 0}))

        assert ran is not None
        assert kube.writes == []  # a pass with nothing to say writes nothing

    @pytest.mark.parametrize("state", ["gone", "being deleted"])
    def test_an_inference_service_that_is_gone_or_going_is_left_alone(self, state: str) -> None:
        kube = cluster_with() if state == "gone" else cluster_with("resnet50")
        if state == "being deleted":
            stored = kube.objects[("InferenceService", NS, "resnet50")]
            stored["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
        steps: list[dict[str, Any]] = []

        ran = Passes(kube).run(NS, "resnet50", lambda body: steps.append(body) or Wrote())

        assert ran is None
        assert steps == []
        assert kube.writes == []


class TestLocksAreBounded:
    def test_a_lock_lives_only_while_a_pass_holds_or_waits_for_it(self) -> None:
        locks: KeyedLocks[str] = KeyedLocks()
        with locks.hold("a"), locks.hold("b"):
            assert len(locks) == 2
        assert len(locks) == 0

    def test_a_failing_pass_releases_its_lock(self) -> None:
        kube = cluster_with("resnet50")
        locks: KeyedLocks[tuple[str, str]] = KeyedLocks()
        passes = Passes(kube, locks=locks)

        def fails(body: dict[str, Any]) -> Wrote:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            passes.run(NS, "resnet50", fails)

        assert len(locks) == 0
        assert passes.run(NS, "resnet50", lambda body: Wrote()) is not None
