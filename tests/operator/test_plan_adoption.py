"""Adoption, the pure half: children the operator made for a gone InferenceService of the same
name (orphaned by `kubectl delete --cascade=orphan`, or restored with the gone uid's
ownerReference) are this one's, their values in force kept; anything else stays a conflict."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchpilot.operator.children.common import ISVC_LABEL, Owner, adoptable, owned_by
from batchpilot.operator.children.configmap import batching_in
from batchpilot.operator.children.secret import token_in
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, PDB, SECRET, ResourceKind
from batchpilot.operator.plan import Owned, desired_children, owned_values, plan
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec

SPEC = InferenceServiceSpec.model_validate(
    {
        "model": {"uri": "pvc://models/resnet50.onnx"},
        "runtime": {"device": "gpu"},
        "sla": {"latencyP99Ms": 100},
        "scaling": {"mode": "auto", "minReplicas": 1, "maxReplicas": 4, "maxBatchSize": 32},
        "batching": {"batchSize": 1, "maxQueueDelayMs": 5},
    }
)
GONE = Owner(name="resnet50", namespace="vision", uid="gone-uid", spec=SPEC)
NEW = Owner(name="resnet50", namespace="vision", uid="new-uid", spec=SPEC)
SETTINGS = OperatorSettings()

Obj = dict[str, Any]


def left_behind(*, owner_references: list[Obj] | None) -> dict[ResourceKind, Obj | None]:
    """The children the gone InferenceService had, the autopilot's 3 replicas and batch 8 in
    force, as the API server keeps them with `owner_references` (None: the field dropped)."""
    in_force = Owned(replicas=3, batch_size=8, max_queue_delay_ms=4.0, token="the-token")
    children = desired_children(GONE, SETTINGS, in_force)
    for child in children.values():
        if child is None:
            continue
        child["metadata"]["uid"] = f"child-{child['kind']}"
        child["metadata"]["resourceVersion"] = "7"
        if owner_references is None:
            del child["metadata"]["ownerReferences"]
        else:
            child["metadata"]["ownerReferences"] = copy.deepcopy(owner_references)
    return children


def planned(observed: dict[ResourceKind, Obj | None]) -> Any:
    return plan(NEW, SETTINGS, observed, owned_values(NEW, observed))


ORPHANED = {
    "no ownerReferences": None,
    "ownerReferences emptied": [],
    "the gone uid's": [GONE.owner_reference],
    "another's, not controlling": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u", "controller": False}
    ],
}


class TestOrphansAreAdopted:
    @pytest.mark.parametrize("refs", ORPHANED.values(), ids=ORPHANED.keys())
    def test_labelled_orphans_are_adopted_not_in_conflict(self, refs: list[Obj] | None) -> None:
        observed = left_behind(owner_references=refs)
        todo = planned(observed)
        assert todo.conflicts == []
        assert not todo.held
        assert todo.create == []
        assert todo.delete == []
        existing = {obj["kind"] for obj in observed.values() if obj is not None}
        assert {obj["kind"] for obj in todo.replace} == existing
        assert {kind.kind for kind, _ in todo.adopted} == existing
        for obj in todo.replace:
            (ref,) = obj["metadata"]["ownerReferences"]
            assert (ref["uid"], ref["controller"]) == ("new-uid", True), obj["kind"]
            assert obj["metadata"]["resourceVersion"] == "7"  # a replacement of what is there

    def test_the_values_in_force_are_kept_not_reset(self) -> None:
        todo = planned(left_behind(owner_references=None))
        by_kind = {obj["kind"]: obj for obj in todo.replace}
        # Not minReplicas (1) and batch 1: what the gone service's autopilot left in force.
        assert by_kind["Deployment"]["spec"]["replicas"] == 3
        batching = batching_in(by_kind["ConfigMap"])
        assert batching is not None
        assert (batching.batch_size, batching.max_queue_delay_ms) == (8, 4.0)
        assert token_in(by_kind["Secret"]) == "the-token"
        assert PDB.kind in by_kind  # 3 replicas keep their disruption budget

    def test_once_adopted_nothing_more_is_written(self) -> None:
        todo = planned(left_behind(owner_references=None))
        observed: dict[ResourceKind, Obj | None] = {
            kind: next((o for o in todo.replace if o["kind"] == kind.kind), None)
            for kind in (DEPLOYMENT, CONFIGMAP, SECRET)
        }
        observed |= {
            kind: obj
            for kind, obj in left_behind(owner_references=[NEW.owner_reference]).items()
            if kind not in observed
        }
        again = planned(observed)
        assert (again.writes, again.adopted, again.conflicts) == (0, [], [])


class TestWhatIsNotAdopted:
    def test_without_the_operators_labels_it_stays_a_conflict(self) -> None:
        observed = left_behind(owner_references=None)
        secret = observed[SECRET]
        assert secret is not None
        del secret["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        todo = planned(observed)
        assert todo.conflicts == [(SECRET, "resnet50-admin-token")]
        assert todo.held  # the pods would mount it: the Deployment waits
        assert DEPLOYMENT.kind not in {obj["kind"] for obj in todo.replace}

    def test_labelled_for_another_service_it_stays_a_conflict(self) -> None:
        observed = left_behind(owner_references=None)
        deployment = observed[DEPLOYMENT]
        assert deployment is not None
        deployment["metadata"]["labels"][ISVC_LABEL] = "bert"
        assert planned(observed).conflicts == [(DEPLOYMENT, "resnet50")]

    @pytest.mark.parametrize(
        "controller",
        [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "resnet50", "uid": "rs"},
            {"apiVersion": "batchpilot.io/v1alpha1", "kind": "InferenceService", "name": "bert"},
            {"apiVersion": "example.com/v1", "kind": "InferenceService", "name": "resnet50"},
        ],
        ids=["another kind", "another name", "another group"],
    )
    def test_controlled_by_anything_else_it_stays_a_conflict(self, controller: Obj) -> None:
        refs = [{"uid": "other-uid", **controller, "controller": True}]
        observed = left_behind(owner_references=refs)
        deployment = observed[DEPLOYMENT]
        assert deployment is not None
        assert not adoptable(deployment, NEW)
        todo = planned(observed)
        assert todo.adopted == []
        assert DEPLOYMENT in {kind for kind, _ in todo.conflicts}

    def test_its_own_children_are_owned_not_adopted(self) -> None:
        child = left_behind(owner_references=[NEW.owner_reference])[DEPLOYMENT]
        assert child is not None
        assert owned_by(child, NEW.uid)
        assert not adoptable(child, NEW)


class TestAPlantedSecret:
    def test_a_labelled_secret_alone_keeps_no_token(self) -> None:
        # Someone who may create Secrets and not read them plants the service's admin-token
        # Secret before the service exists: adopted, its token would open the admin port.
        observed = left_behind(owner_references=None)
        planted = {DEPLOYMENT: None, SECRET: observed[SECRET]}
        assert owned_values(NEW, planted).token != "the-token"
        # with the Deployment that mounts it (orphaned or restored serving pods): kept
        assert owned_values(NEW, observed).token == "the-token"

    def test_a_secret_planted_beside_a_deployment_already_adopted_keeps_no_token(self) -> None:
        observed = left_behind(owner_references=None)
        adopted = copy.deepcopy(observed[DEPLOYMENT])
        assert adopted is not None
        adopted["metadata"]["ownerReferences"] = [NEW.owner_reference]
        planted = {DEPLOYMENT: adopted, SECRET: observed[SECRET]}
        assert owned_values(NEW, planted).token != "the-token"
