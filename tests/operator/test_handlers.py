"""The kopf handlers, called as kopf calls them: every trigger runs the one reconcile path —
the same writes, the same status, the same Events — and triggers for one InferenceService
never overlap. What differs is only what a failure means to kopf."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import kopf
import pytest

from batchpilot.operator import handlers
from batchpilot.operator.autopilot.pilot import Autopilot, learned_outside_s
from batchpilot.operator.autopilot.prometheus import FleetRound
from batchpilot.operator.cache import WatchCache
from batchpilot.operator.children.common import ISVC_LABEL
from batchpilot.operator.fleet import FleetPilot
from batchpilot.operator.kinds import DEPLOYMENT, INFERENCESERVICE, ResourceKind
from batchpilot.operator.kube import KubeError
from batchpilot.operator.passes import KeyedLocks, Passes
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.rollout import IN_PLACE, SURGE
from batchpilot.operator.settings import OperatorSettings
from tests.operator.fake_kube import FakeKube
from tests.operator.test_passes import WAIT_S, Background, ObservedLock, awaited
from tests.operator.test_reconciler import NS, T0, TestARolloutWithNoRoom, isvc
from tests.operator.test_telemetry import counted_for

Posted = list[tuple[str, str, str, str]]


class Blind:
    """A Prometheus that does not answer: every round's answers are None."""

    def round(self, at: float | None = None) -> FleetRound:
        return FleetRound(T0.timestamp(), None, 60, None, None)


class Operator:
    """The operator's memo as its startup handler builds it, over the in-memory API."""

    def __init__(self, body: dict[str, Any], *, kube: FakeKube | None = None) -> None:
        self.kube = kube or FakeKube()
        self.kube.put_object(body)
        self.locks: KeyedLocks[tuple[str, str]] = KeyedLocks()
        passes = Passes(self.kube, locks=self.locks)
        pilot = Autopilot(
            self.kube,
            observe=lambda scope, *, ready_replicas: None,
            pods=self,
            push=lambda endpoint, *, token, document: None,
            clock=lambda: T0,
            seconds=lambda: T0.timestamp(),
        )
        self.memo = kopf.Memo(
            passes=passes,
            reconciler=Reconciler(
                self.kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: T0
            ),
            autopilot=pilot,
            fleet=FleetPilot(passes, pilot, Blind(), post=handlers._post, workers=2),
        )

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return []

    def status(self) -> dict[str, Any]:
        return dict(self.kube.of(INFERENCESERVICE, NS, "resnet50").get("status", {}))


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> Posted:
    """Events as kopf would post them: (object, type, reason, message)."""
    found: Posted = []

    def event(obj: Any, *, type: str, reason: str, message: str = "") -> None:
        found.append((obj["metadata"]["name"], type, reason, message))

    monkeypatch.setattr(kopf, "event", event)
    return found


def child_event(kind: ResourceKind = DEPLOYMENT) -> dict[str, Any]:
    """kopf's raw event for a child of resnet50 (the handler reads only its metadata)."""
    return {
        "type": "MODIFIED",
        "object": {
            "kind": kind.kind,
            "metadata": {
                "name": "resnet50",
                "namespace": NS,
                "labels": {"batchpilot.io/inferenceservice": "resnet50"},
            },
        },
    }


TRIGGERS: dict[str, Callable[[Operator], None]] = {
    "create/update/resume": lambda op: handlers.reconcile(
        name="resnet50", namespace=NS, memo=op.memo
    ),
    "the periodic timer": lambda op: handlers.reconcile_periodically(
        name="resnet50", namespace=NS, memo=op.memo
    ),
    "a child's event": lambda op: handlers._on_child_event(event=child_event(), memo=op.memo),
    "a stuck pod's event": lambda op: handlers._on_pod_stuck(event=pod_event(), memo=op.memo),
}


def pod_event(waiting: str = "ImagePullBackOff") -> dict[str, Any]:
    """kopf's raw event for a pod of resnet50 whose runtime container waits for `waiting`."""
    return {
        "type": "MODIFIED",
        "object": {
            "kind": "Pod",
            "metadata": {
                "name": "resnet50-5c7d-x",
                "namespace": NS,
                "labels": {"batchpilot.io/inferenceservice": "resnet50"},
            },
            "status": {
                "containerStatuses": [
                    {"name": "runtime", "state": {"waiting": {"reason": waiting}}}
                ]
            },
        },
    }


def test_only_stuck_pods_reconcile_their_inference_service() -> None:
    memo = Operator(isvc()).memo
    assert handlers._pod_stuck(event=pod_event(), memo=memo)
    assert handlers._pod_stuck(event=pod_event("CrashLoopBackOff"), memo=memo)
    assert not handlers._pod_stuck(event=pod_event("ContainerCreating"), memo=memo)
    assert not handlers._pod_stuck(event=pod_event(), memo=kopf.Memo())  # not leading


def triggered(name: str, body: dict[str, Any], posted: Posted) -> tuple[Any, ...]:
    """What one trigger did to a fresh cluster: writes, the status stored, the Events posted."""
    posted.clear()
    operator = Operator(copy.deepcopy(body))
    try:
        TRIGGERS[name](operator)
    except kopf.PermanentError:
        assert name == "create/update/resume"  # only the resource's own handler tells kopf
    return list(operator.kube.writes), operator.status(), list(posted)


class TestOneReconcilePath:
    @pytest.mark.parametrize("name", list(TRIGGERS))
    def test_every_trigger_writes_children_status_and_events_alike(
        self, name: str, posted: Posted
    ) -> None:
        expected = triggered("create/update/resume", isvc(), posted)
        writes, status, events = expected
        assert ("patch/status", "InferenceService", "resnet50") in writes
        assert status["conditions"][0]["reason"] == "Progressing"
        assert ("resnet50", "Normal", "Created", "created Deployment resnet50") in events

        assert triggered(name, isvc(), posted) == expected

    @pytest.mark.parametrize("name", list(TRIGGERS))
    def test_a_spec_that_cannot_work_is_reported_alike(self, name: str, posted: Posted) -> None:
        bad = isvc(scaling={"minReplicas": 5, "maxReplicas": 2})
        expected = triggered("create/update/resume", bad, posted)
        writes, status, events = expected
        assert writes == [("patch/status", "InferenceService", "resnet50")]
        assert status["conditions"][0]["reason"] == "InvalidSpec"
        assert [e[2] for e in events] == ["InvalidSpec"]

        assert triggered(name, bad, posted) == expected

    def test_a_second_trigger_with_nothing_changed_writes_nothing(self, posted: Posted) -> None:
        operator = Operator(isvc())
        handlers.reconcile(name="resnet50", namespace=NS, memo=operator.memo)
        operator.kube.writes.clear()
        posted.clear()

        for trigger in TRIGGERS.values():
            trigger(operator)

        assert operator.kube.writes == []
        assert posted == []

    def test_the_autopilot_writes_status_by_the_same_route_and_keeps_reconciles_conditions(
        self, posted: Posted
    ) -> None:
        operator = Operator(isvc())
        handlers.reconcile(name="resnet50", namespace=NS, memo=operator.memo)
        operator.kube.writes.clear()

        operator.memo.fleet.run_round([(NS, "resnet50")])

        assert operator.kube.writes[-1] == ("patch/status", "InferenceService", "resnet50")
        types = {c["type"] for c in operator.status()["conditions"]}
        assert {"Ready", "MetricsAvailable"} <= types

    def test_the_events_posted_are_counted_for_their_service_until_it_is_deleted(
        self, posted: Posted
    ) -> None:
        handlers.deleted(name="resnet50", namespace=NS, body=isvc(), memo=kopf.Memo())
        operator = Operator(isvc())
        handlers.reconcile(name="resnet50", namespace=NS, memo=operator.memo)
        operator.memo.fleet.run_round([(NS, "resnet50")])  # the autopilot's posts, in its round

        kinds = [(type_, reason) for _, type_, reason, _ in posted]
        expected = {kind: float(kinds.count(kind)) for kind in set(kinds)}
        assert counted_for(NS, "resnet50") == expected
        assert ("Normal", "Created") in counted_for(NS, "resnet50")
        handlers.deleted(name="resnet50", namespace=NS, body=isvc(), memo=operator.memo)
        assert counted_for(NS, "resnet50") == {}


class TestFailures:
    def test_the_resource_handler_asks_kopf_to_stop_on_a_spec_that_cannot_work(
        self, posted: Posted
    ) -> None:
        operator = Operator(isvc(scaling={"minReplicas": 5, "maxReplicas": 2}))
        with pytest.raises(kopf.PermanentError, match="minReplicas must not exceed"):
            handlers.reconcile(name="resnet50", namespace=NS, memo=operator.memo)

    def test_an_api_failure_is_retried_by_the_resource_handler_and_waited_out_by_the_rest(
        self, posted: Posted, caplog: pytest.LogCaptureFixture
    ) -> None:
        class Down(FakeKube):
            def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
                raise KubeError(503, "unavailable")

        operator = Operator(isvc(), kube=Down())
        with pytest.raises(kopf.TemporaryError, match="503: unavailable"):
            handlers.reconcile(name="resnet50", namespace=NS, memo=operator.memo)
        handlers.reconcile_periodically(name="resnet50", namespace=NS, memo=operator.memo)
        handlers._on_child_event(event=child_event(), memo=operator.memo)
        operator.memo.fleet.run_round([(NS, "resnet50")])

        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 3
        assert all(w.endswith("failed: 503: unavailable") for w in warnings)

    def test_a_child_of_an_inference_service_being_deleted_triggers_nothing(
        self, posted: Posted
    ) -> None:
        body = isvc()
        body["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
        operator = Operator(body)

        handlers._on_child_event(event=child_event(), memo=operator.memo)

        assert operator.kube.writes == []


class GatedKube(FakeKube):
    """Holds the first read of the Deployment until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.release = threading.Event(), threading.Event()
        self.gated = False
        self.owner_reads = 0

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        if kind is INFERENCESERVICE:
            self.owner_reads += 1
        if kind is DEPLOYMENT and not self.gated:
            self.gated = True
            self.inside.set()
            assert self.release.wait(WAIT_S)
        return super().get(kind, namespace, name)


class TestSerialized:
    def test_a_child_event_during_a_reconcile_waits_for_it_then_finds_nothing_to_do(
        self, posted: Posted
    ) -> None:
        kube = GatedKube()
        operator = Operator(isvc(), kube=kube)
        lock = ObservedLock()
        operator.memo.passes = Passes(kube, locks=KeyedLocks(new_lock=lambda: lock))

        resource = Background(
            lambda: handlers.reconcile(name="resnet50", namespace=NS, memo=operator.memo)
        )
        assert kube.inside.wait(WAIT_S)  # the resource's pass has read its owner, not its children
        child = Background(
            lambda: handlers._on_child_event(event=child_event(DEPLOYMENT), memo=operator.memo)
        )
        awaited(lock.attempts, 2)  # the child's trigger is at the lock the resource's pass holds
        assert kube.owner_reads == 1
        kube.release.set()
        resource.join(), child.join()

        assert kube.owner_reads == 2
        # The child's pass ran after the first had created everything: no second create (a 409),
        # no second status write, no duplicate Events.
        assert [w[0] for w in kube.writes].count("create") == 5  # the five children
        assert kube.writes.count(("patch/status", "InferenceService", "resnet50")) == 1
        assert [e[2] for e in posted].count("Created") == 5


class TestATurnToRollInPlaceFreed:
    """`rollout_in_place_max_services` at 1: a service whose rollout waits for a turn to go in
    place is reconciled when the rollout that held it is over, not at its next periodic pass."""

    def test_the_rollout_that_is_over_hands_its_turn_to_the_waiting_service(
        self, monkeypatch: pytest.MonkeyPatch, posted: Posted
    ) -> None:
        settings = OperatorSettings(rollout_in_place_max_services=1)
        monkeypatch.setattr(handlers, "_SETTINGS", settings)
        kube = FakeKube()
        cache = WatchCache(
            kube,  # type: ignore[arg-type]  # no pod or list is asked of it
            (INFERENCESERVICE, DEPLOYMENT),
            packed=(DEPLOYMENT,),
            flag={
                DEPLOYMENT: handlers._rolling_in_place,
                INFERENCESERVICE: handlers._waiting_its_turn,
            },
        )
        cache.mark_synced()
        now = T0
        pods: list[dict[str, Any]] = []
        memo = kopf.Memo(
            cache=cache,
            passes=Passes(cache),
            reconciler=Reconciler(
                cache,
                settings,
                learned_outside_s=learned_outside_s,
                clock=lambda: now,
                read_pods=lambda namespace, selector: [
                    p for p in pods if selector.items() <= p["metadata"]["labels"].items()
                ],
                read_rolling_in_place=lambda: cache.flagged(DEPLOYMENT),
            ),
        )

        def rolled(name: str, *, replicas: int, updated: int) -> dict[str, Any]:
            """The Deployment's controller reports its rollout; the watch brings it."""
            deployment = kube.of(DEPLOYMENT, NS, name)
            deployment["status"] = {"replicas": replicas, "updatedReplicas": updated}
            stored = kube.put_object(deployment)
            cache.seen(DEPLOYMENT, stored)
            return stored

        def strategy(name: str) -> dict[str, Any]:
            found: dict[str, Any] = kube.of(DEPLOYMENT, NS, name)["spec"]["strategy"]
            return found["rollingUpdate"]

        for name in ("a", "b"):
            body = isvc(scaling={"minReplicas": 3, "maxReplicas": 3, "mode": "off"})
            body["metadata"].update(name=name, uid=f"{name}-uid")
            cache.seen(INFERENCESERVICE, kube.put_object(body))
            handlers.reconcile(name=name, namespace=NS, memo=memo)
            rolled(name, replicas=4, updated=1)  # a surge pod beside three old ones
            pod = TestARolloutWithNoRoom.no_room_since(T0)
            pod["metadata"]["labels"] = {ISVC_LABEL: name}
            pods.append(pod)
        now = T0 + timedelta(seconds=120)
        posted.clear()
        handlers.reconcile(name="a", namespace=NS, memo=memo)
        handlers.reconcile(name="b", namespace=NS, memo=memo)
        assert (strategy("a"), strategy("b")) == (IN_PLACE, SURGE)
        assert [(name, reason) for name, _, reason, _ in posted if "InPlace" in reason] == [
            ("a", "RollingInPlace"),
            ("b", "WaitingToRollInPlace"),
        ]
        assert cache.flagged(INFERENCESERVICE) == {(NS, "b")}

        posted.clear()
        over = rolled("a", replicas=3, updated=3)
        handlers._on_child_event(event={"type": "MODIFIED", "object": over}, memo=memo)
        assert (strategy("a"), strategy("b")) == (SURGE, IN_PLACE)
        assert ("b", "RollingInPlace") in [(name, reason) for name, _, reason, _ in posted]
        assert cache.flagged(INFERENCESERVICE) == set()
