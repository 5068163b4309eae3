"""The watch-fed cache: passes read memory, not the API; what they write is what they read next;
what others change arrives by the watch and is repaired; until the initial list, a miss asks.

The API here is the in-memory fake, which also plays the watch: every change it makes is queued
as the event a watch would deliver, and `deliver()` hands the queue to the cache — so a test
can hold events back (a watch behind the operator's own writes) or deliver old ones late.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.cache import WatchCache, slim_pod
from batchpilot.operator.children.common import ISVC_LABEL
from batchpilot.operator.handlers import _rolling_in_place, ours
from batchpilot.operator.kinds import (
    DEPLOYMENT,
    INFERENCESERVICE,
    KINDS,
    PDB,
    POD,
    SERVICE,
    ResourceKind,
)
from batchpilot.operator.passes import Passes
from batchpilot.operator.plan import CHILD_KINDS
from batchpilot.operator.reconciler import ReconcileOutcome, Reconciler
from batchpilot.operator.rollout import IN_PLACE, SURGE
from batchpilot.operator.settings import OperatorSettings
from tests.operator.fake_kube import FakeKube
from tests.operator.test_reconciler import NS, T0, isvc


class WatchedApi(FakeKube):
    """The fake API, counting every call, with the watch events its changes would cause."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def put_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        stored = super().put_object(obj)
        self.events.append(("MODIFIED", copy.deepcopy(stored)))
        return stored

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {kind.kind}")
        return super().get(kind, namespace, name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"create {obj['kind']}")
        return super().create(obj)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"replace {obj['kind']}")
        return super().replace(obj)

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        self.calls.append(f"patch {kind.kind}")
        result = super().patch(kind, namespace, name, patch, subresource=subresource)
        self.events.append(("MODIFIED", copy.deepcopy(result)))
        return result

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> None:
        self.calls.append(f"delete {kind.kind}")
        final = self.objects.get((kind.kind, namespace, name))
        super().delete(kind, namespace, name)
        if final is not None:
            final["metadata"]["resourceVersion"] = str(next(self._versions))
            self.events.append(("DELETED", final))

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        self.calls.append("list Pod")
        return ["10.9.9.9:8082"]

    def edit(self, kind: ResourceKind, name: str, change: Any) -> None:
        """Someone else changes an object (not a call of the operator's)."""
        obj = self.objects[(kind.kind, NS, name)]
        change(obj)
        self.put_object(obj)

    def remove(self, kind: ResourceKind, name: str) -> None:
        """Someone else deletes an object."""
        calls = list(self.calls)
        self.delete(kind, NS, name)
        self.calls = calls

    def deliver(self, cache: WatchCache) -> None:
        """The watch catches up: every queued event, in order."""
        events, self.events = self.events, []
        for type_, obj in events:
            kind = KINDS[obj["kind"]]
            (cache.gone if type_ == "DELETED" else cache.seen)(kind, obj)


class Operator:
    """A pass over resnet50 as the operator runs it: Passes and the reconciler over the cache."""

    def __init__(self, body: dict[str, Any] | None = None) -> None:
        self.api = WatchedApi()
        self.api.put_object(body or isvc())
        self.cache = WatchCache(
            self.api,
            (INFERENCESERVICE, *CHILD_KINDS, POD),
            keep=ours,
            slim={POD: slim_pod},
            packed=CHILD_KINDS,
        )
        self.api.deliver(self.cache)  # the initial list
        self.cache.mark_synced()
        self.passes = Passes(self.cache)
        self.reconciler = Reconciler(
            self.cache, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: T0
        )

    def reconcile(self) -> ReconcileOutcome:
        ran = self.passes.run(NS, "resnet50", self.reconciler.reconcile)
        assert ran is not None
        return ran.outcome

    def calls_of_a_pass(self) -> list[str]:
        self.api.calls.clear()
        outcome = self.reconcile()
        assert outcome.retry_error is None, outcome.retry_error
        return list(self.api.calls)


def settled() -> Operator:
    """resnet50 with its children created and the watch caught up."""
    operator = Operator()
    operator.reconcile()
    operator.api.deliver(operator.cache)
    return operator


class TestReadsFromMemory:
    def test_a_pass_with_nothing_to_do_makes_no_request(self) -> None:
        operator = settled()
        assert operator.calls_of_a_pass() == []
        assert operator.calls_of_a_pass() == []

    def test_until_the_initial_list_a_miss_asks_the_api(self) -> None:
        api = WatchedApi()
        api.put_object({"kind": "Service", "metadata": {"name": "web", "namespace": NS}})
        cache = WatchCache(api, (SERVICE,))
        assert cache.get(SERVICE, NS, "web") is not None
        assert api.calls == ["get Service"]
        assert cache.get(SERVICE, NS, "web") is not None  # kept from that read
        assert cache.get(SERVICE, NS, "other") is None
        assert api.calls == ["get Service", "get Service"]

        cache.mark_synced()
        api.calls.clear()
        assert cache.get(SERVICE, NS, "other") is None  # listed: a miss is "no such object"
        assert api.calls == []

    def test_the_keys_of_a_kind_once_it_is_listed(self) -> None:
        """What the periodic pass walks: every object of the kind in memory, none before the
        initial list (a fleet half listed would leave services out of a round)."""
        api = WatchedApi()
        cache = WatchCache(api, (SERVICE,))
        cache.seen(SERVICE, {"kind": "Service", "metadata": {"name": "a", "namespace": NS}})
        assert cache.keys(SERVICE) is None
        cache.mark_synced()
        cache.seen(SERVICE, {"kind": "Service", "metadata": {"name": "b", "namespace": "other"}})
        assert cache.keys(SERVICE) == {(NS, "a"), ("other", "b")}
        cache.gone(SERVICE, {"kind": "Service", "metadata": {"name": "a", "namespace": NS}})
        assert cache.keys(SERVICE) == {("other", "b")}
        assert cache.keys(DEPLOYMENT) is None  # not a kind it keeps
        assert api.calls == []

    def test_kinds_it_does_not_watch_are_asked_of_the_api(self) -> None:
        api = WatchedApi()
        cache = WatchCache(api, (SERVICE,))
        cache.mark_synced()
        assert cache.get(DEPLOYMENT, NS, "resnet50") is None
        assert api.calls == ["get Deployment"]

    @staticmethod
    def pod(
        name: str, *, namespace: str = NS, owner: str = "resnet50", ready: str = "True"
    ) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": "1",
                "labels": {ISVC_LABEL: owner},
                "managedFields": [{"manager": "kubelet"}],
            },
            "spec": {
                "containers": [
                    {
                        "image": "x",
                        "ports": [
                            {"name": "http", "containerPort": 8080},
                            {"name": "admin", "containerPort": 8082},
                        ],
                    }
                ]
            },
            "status": {
                "podIP": f"10.0.0.{len(name)}",
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": [{"name": "runtime"}],
            },
        }

    @pytest.mark.parametrize("index_label", [None, ISVC_LABEL])
    def test_ready_pods_come_from_memory_once_listed(self, index_label: str | None) -> None:
        api = WatchedApi()
        cache = WatchCache(api, (POD,), slim={POD: slim_pod}, index_label=index_label)
        pod = self.pod

        assert cache.ready_pod_endpoints(NS, {ISVC_LABEL: "resnet50"}) == ["10.9.9.9:8082"]
        assert api.calls == ["list Pod"]  # not listed yet: the API answers

        for found in (
            pod("a"),
            pod("bb", ready="False"),
            pod("ccc", owner="other"),
            pod("dddd", namespace="elsewhere"),
        ):
            cache.seen(POD, found)
        cache.mark_synced()
        api.calls.clear()
        endpoints = cache.ready_pod_endpoints(NS, {ISVC_LABEL: "resnet50"})
        assert [endpoint.split(":")[0] for endpoint in endpoints] == ["10.0.0.1"]
        # The service's pods, ready or not; not another service's, nor another namespace's.
        pods = cache.pods(NS, {ISVC_LABEL: "resnet50"})
        assert sorted(p["metadata"]["name"] for p in pods) == ["a", "bb"]
        assert cache.pods(NS, {ISVC_LABEL: "resnet50", "team": "x"}) == []
        assert api.calls == []
        kept = cache.get(POD, NS, "a")
        assert kept is not None
        assert "managedFields" not in kept["metadata"]
        assert "containerStatuses" not in kept["status"]
        assert "image" not in kept["spec"]["containers"][0]

    def test_the_index_follows_relabels_and_departures(self) -> None:
        cache = WatchCache(WatchedApi(), (POD,), slim={POD: slim_pod}, index_label=ISVC_LABEL)
        cache.mark_synced()

        def names(owner: str) -> list[str]:
            return sorted(p["metadata"]["name"] for p in cache.pods(NS, {ISVC_LABEL: owner}))

        for name in ("a", "b", "c"):
            cache.seen(POD, self.pod(name))
        assert names("resnet50") == ["a", "b", "c"]
        # relabelled: filed under its new value, and out of the old one
        moved = self.pod("b", owner="other")
        moved["metadata"]["resourceVersion"] = "2"
        cache.seen(POD, moved)
        assert (names("resnet50"), names("other")) == (["a", "c"], ["b"])
        # the watch's DELETED, and a delete of the operator's own
        cache.gone(POD, self.pod("a"))
        cache.delete(POD, NS, "c")
        assert (names("resnet50"), names("other")) == ([], ["b"])
        # a label taken off: in no one's list
        bare = self.pod("b")
        bare["metadata"].update(resourceVersion="3", labels={})
        cache.seen(POD, bare)
        assert names("other") == []
        assert cache.get(POD, NS, "b") is not None

    def test_the_deployments_rolling_in_place_are_listed_fleet_wide(self) -> None:
        """What `rollout_in_place_max_services` counts (handlers.py), among packed children:
        kept as each object arrives, whatever brought it (the watch, a write, a delete)."""
        api = WatchedApi()
        cache = WatchCache(
            api, (DEPLOYMENT,), packed=(DEPLOYMENT,), flag={DEPLOYMENT: _rolling_in_place}
        )

        def deployment(
            name: str, version: int, *, namespace: str = NS, updated: int = 1, in_place: bool = True
        ) -> dict[str, Any]:
            return {
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version)},
                "spec": {
                    "replicas": 2,
                    "strategy": {"rollingUpdate": dict(IN_PLACE if in_place else SURGE)},
                    "template": {"spec": {"containers": []}},
                },
                "status": {"replicas": 2, "updatedReplicas": updated},
            }

        cache.seen(DEPLOYMENT, deployment("a", 1))
        assert cache.flagged(DEPLOYMENT) is None  # not listed yet: not known
        cache.mark_synced()
        cache.seen(DEPLOYMENT, deployment("b", 2, namespace="text"))
        cache.seen(DEPLOYMENT, deployment("c", 3, in_place=False))
        assert cache.flagged(DEPLOYMENT) == {(NS, "a"), ("text", "b")}
        cache.seen(DEPLOYMENT, deployment("a", 4, updated=2))  # its rollout is over
        cache.gone(DEPLOYMENT, deployment("b", 5, namespace="text"))
        assert cache.flagged(DEPLOYMENT) == set()
        cache.create(deployment("d", 0))  # a pass's write, before its watch event
        assert cache.flagged(DEPLOYMENT) == {(NS, "d")}
        cache.delete(DEPLOYMENT, NS, "d")
        assert cache.flagged(DEPLOYMENT) == set()
        assert cache.flagged(POD) is None  # nothing flagged of a kind without `flag`


class TestItsOwnWrites:
    def test_the_next_pass_sees_what_this_one_wrote_before_the_watch_does(self) -> None:
        operator = Operator()
        first = operator.reconcile()
        assert first.status  # created everything and wrote the status
        # No watch event delivered yet: the cache holds what the writes answered.
        assert operator.calls_of_a_pass() == []

    def test_an_older_event_arriving_after_a_write_does_not_undo_it(self) -> None:
        operator = settled()
        before = operator.cache.get(DEPLOYMENT, NS, "resnet50")
        assert before is not None
        operator.api.edit(DEPLOYMENT, "resnet50", lambda d: d["metadata"].update(annotations={}))
        operator.api.events.clear()  # someone's edit, which the watch has not brought yet
        operator.api.edit(
            INFERENCESERVICE,
            "resnet50",
            lambda b: b["spec"]["runtime"].update(image="registry.local/runtime:2"),
        )
        operator.api.deliver(operator.cache)
        # The pass replaces from its stale copy: 409, reads afresh, plans again, writes.
        assert operator.calls_of_a_pass() == [
            "replace Deployment",
            "get Deployment",
            "replace Deployment",
        ]
        written = operator.cache.get(DEPLOYMENT, NS, "resnet50")
        assert written is not None
        operator.cache.seen(DEPLOYMENT, before)  # an event from before the write, late
        assert operator.cache.get(DEPLOYMENT, NS, "resnet50") == written
        assert operator.calls_of_a_pass() == []

    def test_a_child_it_deleted_stays_gone_until_the_watch_says_so(self) -> None:
        operator = settled()
        operator.api.edit(DEPLOYMENT, "resnet50", lambda d: d["spec"].update(replicas=3))
        operator.api.deliver(operator.cache)
        operator.reconcile()  # three replicas: a PodDisruptionBudget
        operator.api.deliver(operator.cache)
        budget = operator.cache.get(PDB, NS, "resnet50")
        assert budget is not None

        operator.api.edit(DEPLOYMENT, "resnet50", lambda d: d["spec"].update(replicas=1))
        operator.api.deliver(operator.cache)
        assert operator.calls_of_a_pass() == [
            "delete PodDisruptionBudget",
            "patch InferenceService",  # status: one replica
        ]
        operator.cache.seen(PDB, budget)  # the watch, behind, still shows it
        assert operator.cache.get(PDB, NS, "resnet50") is None
        assert operator.calls_of_a_pass() == []  # not deleted twice
        operator.api.deliver(operator.cache)  # DELETED arrives

        created_again = copy.deepcopy(budget)
        created_again["metadata"]["resourceVersion"] = "9999"
        operator.cache.seen(PDB, created_again)  # someone made one since
        assert operator.cache.get(PDB, NS, "resnet50") is not None


class TestOthersChanges:
    def test_an_edited_child_is_repaired_when_the_watch_brings_the_edit(self) -> None:
        operator = settled()

        def other_image(deployment: dict[str, Any]) -> None:
            deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else"

        operator.api.edit(DEPLOYMENT, "resnet50", other_image)
        operator.api.deliver(operator.cache)
        assert operator.calls_of_a_pass() == ["replace Deployment"]
        restored = operator.api.of(DEPLOYMENT, NS, "resnet50")
        assert restored["spec"]["template"]["spec"]["containers"][0]["image"] != "someone/else"

    def test_a_deleted_child_is_created_once_when_the_watch_brings_the_deletion(self) -> None:
        operator = settled()
        operator.api.remove(SERVICE, "resnet50")
        operator.api.deliver(operator.cache)
        assert operator.calls_of_a_pass() == ["create Service"]
        assert operator.calls_of_a_pass() == []

    def test_a_child_whose_labels_were_edited_stays_in_view_and_is_repaired(self) -> None:
        operator = settled()
        operator.api.edit(
            SERVICE,
            "resnet50",
            lambda s: s["metadata"]["labels"].update({"app.kubernetes.io/managed-by": "else"}),
        )
        operator.api.deliver(operator.cache)
        assert operator.calls_of_a_pass() == ["replace Service"]

    def test_a_deletion_older_than_what_is_kept_is_ignored(self) -> None:
        operator = settled()
        kept = operator.cache.get(SERVICE, NS, "resnet50")
        assert kept is not None
        older = copy.deepcopy(kept)
        older["metadata"]["resourceVersion"] = "1"  # an earlier object of that name, gone
        operator.cache.gone(SERVICE, older)
        assert operator.cache.get(SERVICE, NS, "resnet50") == kept

    def test_a_name_taken_by_someone_elses_object_is_a_conflict_not_a_failure(self) -> None:
        foreign = {
            "kind": "Service",
            "metadata": {"name": "resnet50", "namespace": NS, "labels": {"team": "web"}},
            "spec": {"selector": {"app": "theirs"}},
        }
        operator = Operator()
        operator.api.put_object(foreign)
        operator.api.events.clear()  # not ours: the cache never kept it
        assert operator.cache.get(SERVICE, NS, "resnet50") is None

        outcome = operator.reconcile()
        assert outcome.retry_error is None
        ready = {c["type"]: c for c in outcome.status["conditions"]}["Ready"]
        assert ready["reason"] == "ChildConflict"
        assert operator.api.calls.count("create Service") == 1  # refused once, then known
        operator.api.deliver(operator.cache)
        assert operator.calls_of_a_pass() == []


class TestWhatOnlyAListTells:
    """A watch that cannot resume (410 Gone) makes kopf list the kind again: a deletion made
    while it was down is told by no event, only by its absence from that list."""

    @staticmethod
    def listing(operator: Operator, kind: ResourceKind) -> tuple[set[tuple[str, str]], str]:
        """The API's list of `kind` now: its objects' keys, and the list's resourceVersion."""
        keys = {(ns, name) for (k, ns, name) in operator.api.objects if k == kind.kind}
        version = max(int(o["metadata"]["resourceVersion"]) for o in operator.api.objects.values())
        return keys, str(version)

    def test_a_child_deleted_unreported_goes_with_the_list_and_is_created_again(self) -> None:
        operator = settled()
        operator.api.remove(SERVICE, "resnet50")
        operator.api.events.clear()  # the watch was down: its DELETED is never delivered
        assert operator.calls_of_a_pass() == []  # blind: memory still holds it

        (gone,) = operator.cache.relisted(SERVICE, None, *self.listing(operator, SERVICE))
        assert gone["metadata"]["name"] == "resnet50"  # whose owner the handlers reconcile
        assert operator.calls_of_a_pass() == ["create Service"]
        assert operator.calls_of_a_pass() == []

    def test_what_the_list_shows_or_is_newer_than_it_stays(self) -> None:
        operator = settled()
        operator.api.remove(SERVICE, "resnet50")
        operator.api.deliver(operator.cache)
        keys, version = self.listing(operator, SERVICE)  # taken before the pass below
        operator.reconcile()  # created again after the list was taken: a newer version
        assert operator.cache.relisted(SERVICE, None, keys, version) == []
        assert operator.cache.get(SERVICE, NS, "resnet50") is not None
        assert operator.cache.relisted(DEPLOYMENT, None, *self.listing(operator, DEPLOYMENT)) == []
        assert operator.cache.get(DEPLOYMENT, NS, "resnet50") is not None

    def test_a_list_of_one_namespace_speaks_for_that_namespace_only(self) -> None:
        operator = settled()
        _, version = self.listing(operator, SERVICE)
        assert operator.cache.relisted(SERVICE, "elsewhere", set(), version) == []
        assert operator.cache.get(SERVICE, NS, "resnet50") is not None
        assert len(operator.cache.relisted(SERVICE, NS, set(), version)) == 1

    def test_without_a_comparable_version_nothing_goes(self) -> None:
        operator = settled()
        assert operator.cache.relisted(SERVICE, None, set(), "not-a-number") == []
        assert operator.cache.relisted(SERVICE, None, set(), None) == []
        assert operator.cache.get(SERVICE, NS, "resnet50") is not None

    def test_its_own_delete_seen_by_no_event_is_forgotten_with_the_list(self) -> None:
        operator = settled()
        operator.api.edit(DEPLOYMENT, "resnet50", lambda d: d["spec"].update(replicas=3))
        operator.api.deliver(operator.cache)
        operator.reconcile()  # three replicas: a PodDisruptionBudget
        operator.api.deliver(operator.cache)
        operator.api.edit(DEPLOYMENT, "resnet50", lambda d: d["spec"].update(replicas=1))
        operator.api.deliver(operator.cache)
        operator.reconcile()  # deletes it; its DELETED is in the gap
        operator.api.events.clear()
        assert operator.cache.relisted(PDB, None, *self.listing(operator, PDB)) == []
        assert operator.cache.get(PDB, NS, "resnet50") is None


class TestSharedObjects:
    def test_children_are_kept_as_text_and_each_read_is_a_copy(self) -> None:
        operator = settled()
        first = operator.cache.get(DEPLOYMENT, NS, "resnet50")
        assert first is not None
        first["spec"]["replicas"] = 99
        again = operator.cache.get(DEPLOYMENT, NS, "resnet50")
        assert again is not None
        assert again["spec"]["replicas"] == 1
        assert again == operator.api.of(DEPLOYMENT, NS, "resnet50")

    def test_the_watchs_copy_of_an_inferenceservice_replaces_the_writes_answer(self) -> None:
        operator = Operator()
        operator.reconcile()  # its status write's answer is kept
        from_watch = [obj for _, obj in operator.api.events if obj["kind"] == "InferenceService"]
        operator.api.deliver(operator.cache)  # the same version from the watch: kopf's copy
        kept = operator.cache.get(INFERENCESERVICE, NS, "resnet50")
        assert kept is from_watch[-1]  # one dict for kopf and the cache, not two

    @pytest.mark.parametrize("drift", [False, True], ids=["idle", "drift"])
    def test_a_pass_changes_nothing_it_was_handed(self, drift: bool) -> None:
        operator = settled()
        if drift:
            operator.api.edit(DEPLOYMENT, "resnet50", lambda d: d["metadata"]["labels"].clear())
            operator.api.deliver(operator.cache)
        before = {
            key: copy.deepcopy(operator.cache.get(KINDS[key[0]], key[1], key[2]))
            for key in operator.api.objects
        }
        handed = {
            key: operator.cache.get(KINDS[key[0]], key[1], key[2]) for key in operator.api.objects
        }
        operator.reconcile()
        assert {key: copy.deepcopy(obj) for key, obj in handed.items()} == before
