"""The API server's write semantics, on the store directly (no HTTP; the clock is fixed)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

import kmock
import pytest

from batchpilot.sandbox import errors
from batchpilot.sandbox.resources import ResourceType
from batchpilot.sandbox.store import Store, new_store
from tests.sandbox.helpers import widget, widget_crd

NOW = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)


@pytest.fixture
def store() -> Store:
    created = new_store(kmock.ObjectsArray(), clock=lambda: NOW, seed=1)
    created.install_crd(widget_crd())
    return created


def kind(store: Store, group: str, version: str, plural: str) -> ResourceType:
    found = store.registry.get(group, version, plural)
    assert found is not None
    return found


def widgets(store: Store) -> ResourceType:
    return kind(store, "sandbox.batchpilot.io", "v1alpha1", "widgets")


def configmaps(store: Store) -> ResourceType:
    return kind(store, "", "v1", "configmaps")


def rv(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def owned_configmap(name: str, owner: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {"metadata": {"name": name, "ownerReferences": [ref], **extra}, "data": {"k": "v"}}


def error_of(call: Any) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as caught:
        call()
    return caught.value


class TestServerMetadata:
    def test_create_assigns_uid_timestamps_versions_and_generation(self, store: Store) -> None:
        first, _ = store.create(widgets(store), "default", widget("a"))
        second, _ = store.create(widgets(store), "default", widget("b"))
        meta = first["metadata"]
        assert len(meta["uid"]) == 36
        assert meta["creationTimestamp"] == "2024-05-01T12:00:00Z"
        assert meta["generation"] == 1
        assert rv(second) > rv(first)
        assert first["metadata"]["uid"] != second["metadata"]["uid"]

    def test_generate_name(self, store: Store) -> None:
        body = {"metadata": {"generateName": "cm-"}, "data": {}}
        one, _ = store.create(configmaps(store), "default", body)
        two, _ = store.create(configmaps(store), "default", body)
        assert one["metadata"]["name"].startswith("cm-")
        assert len(one["metadata"]["name"]) == len("cm-") + 5
        assert one["metadata"]["name"] != two["metadata"]["name"]

    def test_names_are_required_and_checked(self, store: Store) -> None:
        assert error_of(lambda: store.create(configmaps(store), "default", {})).code == 422
        refused = error_of(
            lambda: store.create(configmaps(store), "default", {"metadata": {"name": "Bad_Name"}})
        )
        assert refused.code == 422
        assert "RFC 1123 subdomain" in refused.message

    def test_service_names_are_dns_1035_labels(self, store: Store) -> None:
        services = store.registry.get("", "v1", "services")
        assert services is not None
        body = {"metadata": {"name": "1resnet"}, "spec": {"ports": [{"port": 80}]}}
        refused = error_of(lambda: store.create(services, "default", body))
        assert refused.code == 422
        assert "DNS-1035 label" in refused.message
        body["metadata"]["name"] = "resnet1"
        store.create(services, "default", body)

    def test_duplicates_are_409(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        conflict = error_of(lambda: store.create(widgets(store), "default", widget("a")))
        assert (conflict.code, conflict.reason) == (409, "AlreadyExists")
        assert conflict.message == 'widgets.sandbox.batchpilot.io "a" already exists'

    def test_namespaces_must_exist(self, store: Store) -> None:
        body = widget("a")
        del body["metadata"]["namespace"]
        missing = error_of(lambda: store.create(widgets(store), "nowhere", body))
        assert (missing.code, missing.message) == (404, 'namespaces "nowhere" not found')

    def test_the_body_namespace_must_match_the_url(self, store: Store) -> None:
        mismatch = error_of(lambda: store.create(widgets(store), "kube-system", widget("a")))
        assert mismatch.code == 400

    def test_cluster_scoped_objects_have_no_namespace(self, store: Store) -> None:
        ns, _ = store.create(
            kind(store, "", "v1", "namespaces"), None, {"metadata": {"name": "x", "namespace": "y"}}
        )
        assert "namespace" not in ns["metadata"]
        assert ns["status"] == {"phase": "Active"}

    def test_client_supplied_versions_are_refused_on_create(self, store: Store) -> None:
        body = widget("a")
        body["metadata"]["resourceVersion"] = "5"
        assert error_of(lambda: store.create(widgets(store), "default", body)).code == 400

    def test_kind_and_api_version_must_match_the_url(self, store: Store) -> None:
        body = widget("a")
        body["kind"] = "Gadget"
        assert error_of(lambda: store.create(widgets(store), "default", body)).code == 400


class TestGeneration:
    def test_spec_changes_bump_generation(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        patched, _, _ = store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"spec": {"replicas": 3}},
        )
        assert patched["metadata"]["generation"] == 2

    def test_status_and_metadata_writes_do_not(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        merge = "application/merge-patch+json"
        store.patch(
            widgets(store), "default", "a", merge, {"status": {"replicas": 1}}, subresource="status"
        )
        labelled, _, _ = store.patch(
            widgets(store), "default", "a", merge, {"metadata": {"labels": {"x": "y"}}}
        )
        assert labelled["metadata"]["generation"] == 1
        assert labelled["status"] == {"replicas": 1}

    def test_no_op_writes_change_nothing(self, store: Store) -> None:
        created, _ = store.create(widgets(store), "default", widget("a"))
        again, _, _ = store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"spec": {"replicas": 1}},
        )
        assert rv(again) == rv(created)
        assert len(store.objects[widgets(store).storage, "default", "a"].history) == 1


class TestStatusSubresource:
    def test_creating_drops_status(self, store: Store) -> None:
        body = widget("a")
        body["status"] = {"replicas": 5}
        created, _ = store.create(widgets(store), "default", body)
        assert "status" not in created

    def test_writes_to_the_object_ignore_status(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        merge = "application/merge-patch+json"
        patched, _, _ = store.patch(
            widgets(store),
            "default",
            "a",
            merge,
            {"spec": {"replicas": 2}, "status": {"replicas": 9}},
        )
        assert patched["spec"]["replicas"] == 2
        assert "status" not in patched

    def test_writes_to_status_change_only_status(self, store: Store) -> None:
        created, _ = store.create(widgets(store), "default", widget("a"))
        body = widget("a")
        body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        body["spec"]["replicas"] = 7
        body["status"] = {"replicas": 1}
        updated, _ = store.update(widgets(store), "default", "a", body, subresource="status")
        assert updated["spec"]["replicas"] == 1
        assert updated["status"] == {"replicas": 1}

    def test_status_is_validated_too(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        bad = {"status": {"conditions": [{"type": "Ready", "status": "Yes"}]}}
        refused = error_of(
            lambda: store.patch(
                widgets(store),
                "default",
                "a",
                "application/merge-patch+json",
                bad,
                subresource="status",
            )
        )
        assert refused.code == 422
        assert "status.conditions[0].status" in refused.message


class TestConcurrency:
    def test_stale_resource_versions_conflict(self, store: Store) -> None:
        created, _ = store.create(widgets(store), "default", widget("a"))
        store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"spec": {"replicas": 2}},
        )
        stale = widget("a", replicas=3)
        stale["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        conflict = error_of(lambda: store.update(widgets(store), "default", "a", stale))
        assert (conflict.code, conflict.reason) == (409, "Conflict")
        assert "the object has been modified" in conflict.message

    def test_custom_resources_need_a_version_to_be_replaced(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        refused = error_of(lambda: store.update(widgets(store), "default", "a", widget("a")))
        assert refused.code == 422
        assert "metadata.resourceVersion" in refused.message

    def test_built_in_kinds_can_be_replaced_unconditionally(self, store: Store) -> None:
        store.create(configmaps(store), "default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
        replaced, _ = store.update(
            configmaps(store), "default", "c", {"metadata": {"name": "c"}, "data": {"b": "2"}}
        )
        assert replaced["data"] == {"b": "2"}


class TestValidation:
    def test_invalid_custom_resources_are_422_with_causes(self, store: Store) -> None:
        refused = error_of(
            lambda: store.create(widgets(store), "default", widget("bad", replicas=-1))
        )
        assert refused.status() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'Widget.sandbox.batchpilot.io "bad" is invalid: spec.replicas:'
            " Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
            "reason": "Invalid",
            "details": {
                "name": "bad",
                "group": "sandbox.batchpilot.io",
                "kind": "Widget",
                "causes": [
                    {
                        "reason": "FieldValueInvalid",
                        "message": "Invalid value: -1: spec.replicas in body should be"
                        " greater than or equal to 0",
                        "field": "spec.replicas",
                    }
                ],
            },
            "code": 422,
        }

    def test_several_problems_are_listed(self, store: Store) -> None:
        refused = error_of(
            lambda: store.create(
                widgets(store), "default", widget("bad", replicas=-1, scaling={"mode": "x"})
            )
        )
        assert refused.message.startswith('Widget.sandbox.batchpilot.io "bad" is invalid: [')
        assert len(refused.details["causes"]) == 2  # type: ignore[index]

    def test_type_errors_block_cel_rules(self, store: Store) -> None:
        refused = error_of(
            lambda: store.create(
                widgets(store), "default", widget("bad", scaling={"minReplicas": "x"})
            )
        )
        assert "some validation rules were not checked" in refused.message

    def test_defaults_are_stored(self, store: Store) -> None:
        created, _ = store.create(widgets(store), "default", widget("a"))
        assert created["spec"]["scaling"] == {"mode": "auto", "minReplicas": 1, "maxReplicas": 8}

    def test_unknown_fields_by_field_validation(self, store: Store) -> None:
        body = widget("a", colour="red")
        strict = error_of(
            lambda: store.create(widgets(store), "default", body, field_validation="Strict")
        )
        assert strict.code == 400
        assert 'strict decoding error: unknown field "spec.colour"' in strict.message
        created, warnings = store.create(widgets(store), "default", body, field_validation="Warn")
        assert warnings == ('unknown field "spec.colour"',)
        assert "colour" not in created["spec"]

    def test_transition_rules_see_the_old_object(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        refused = error_of(
            lambda: store.patch(
                widgets(store),
                "default",
                "a",
                "application/merge-patch+json",
                {"spec": {"model": {"uri": "s3://b/other.onnx"}}},
            )
        )
        assert "model.uri is immutable" in refused.message

    def test_dry_run_validates_without_writing(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"), dry_run=True)
        assert store.count(widgets(store)) == 0


class TestDeletion:
    def test_finalizers_hold_the_object_until_removed(self, store: Store) -> None:
        body = widget("a")
        body["metadata"]["finalizers"] = ["example.com/cleanup"]
        store.create(widgets(store), "default", body)
        marked = store.delete(widgets(store), "default", "a")
        assert marked["metadata"]["deletionTimestamp"] == "2024-05-01T12:00:00Z"
        assert marked["metadata"]["generation"] == 2
        assert store.get(widgets(store), "default", "a")["metadata"]["finalizers"] == [
            "example.com/cleanup"
        ]
        store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"metadata": {"finalizers": None}},
        )
        assert error_of(lambda: store.get(widgets(store), "default", "a")).code == 404

    def test_no_new_finalizers_while_deleting(self, store: Store) -> None:
        body = widget("a")
        body["metadata"]["finalizers"] = ["x"]
        store.create(widgets(store), "default", body)
        store.delete(widgets(store), "default", "a")
        refused = error_of(
            lambda: store.patch(
                widgets(store),
                "default",
                "a",
                "application/merge-patch+json",
                {"metadata": {"finalizers": ["x", "y"]}},
            )
        )
        assert refused.code == 422

    def test_preconditions(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        refused = error_of(
            lambda: store.delete(
                widgets(store), "default", "a", {"preconditions": {"uid": "other"}}
            )
        )
        assert refused.code == 409

    def test_missing_objects_are_404(self, store: Store) -> None:
        missing = error_of(lambda: store.delete(widgets(store), "default", "nope"))
        assert missing.message == 'widgets.sandbox.batchpilot.io "nope" not found'
        assert missing.details == {
            "name": "nope",
            "kind": "widgets",
            "group": "sandbox.batchpilot.io",
        }

    def test_history_is_kept_in_kmock(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        store.delete(widgets(store), "default", "a")
        entry = store.objects[widgets(store).storage, "default", "a"]
        assert entry.deleted
        assert entry.history[0] is not None
        assert entry.history[-1] is None


class TestGarbageCollection:
    def test_deleting_an_owner_deletes_its_dependents_across_kinds(self, store: Store) -> None:
        owner, _ = store.create(widgets(store), "default", widget("a"))
        store.create(configmaps(store), "default", owned_configmap("child", owner))
        deployments = kind(store, "apps", "v1", "deployments")
        deployment = owned_configmap("web", owner)
        deployment.pop("data")
        store.create(deployments, "default", deployment)
        store.delete(widgets(store), "default", "a")
        assert store.count(configmaps(store)) == 0
        assert store.count(deployments) == 0

    def test_cascades_are_transitive(self, store: Store) -> None:
        owner, _ = store.create(widgets(store), "default", widget("a"))
        middle, _ = store.create(configmaps(store), "default", owned_configmap("middle", owner))
        store.create(configmaps(store), "default", owned_configmap("leaf", middle))
        store.delete(widgets(store), "default", "a")
        assert store.count(configmaps(store)) == 0

    def test_dependents_wait_for_finalized_owners(self, store: Store) -> None:
        body = widget("a")
        body["metadata"]["finalizers"] = ["x"]
        owner, _ = store.create(widgets(store), "default", body)
        store.create(configmaps(store), "default", owned_configmap("child", owner))
        store.delete(widgets(store), "default", "a")
        assert store.count(configmaps(store)) == 1
        store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"metadata": {"finalizers": []}},
        )
        assert store.count(configmaps(store)) == 0

    def test_orphan_policy_keeps_dependents(self, store: Store) -> None:
        owner, _ = store.create(widgets(store), "default", widget("a"))
        store.create(configmaps(store), "default", owned_configmap("child", owner))
        store.delete(widgets(store), "default", "a", {"propagationPolicy": "Orphan"})
        child = store.get(configmaps(store), "default", "child")
        assert "ownerReferences" not in child["metadata"]

    def test_foreground_deletes_dependents_first(self, store: Store) -> None:
        owner, _ = store.create(widgets(store), "default", widget("a"))
        child = owned_configmap("child", owner, finalizers=["hold"])
        store.create(configmaps(store), "default", child)
        store.delete(widgets(store), "default", "a", {"propagationPolicy": "Foreground"})
        waiting = store.get(widgets(store), "default", "a")
        assert waiting["metadata"]["finalizers"] == ["foregroundDeletion"]
        assert "deletionTimestamp" in store.get(configmaps(store), "default", "child")["metadata"]
        store.patch(
            configmaps(store),
            "default",
            "child",
            "application/merge-patch+json",
            {"metadata": {"finalizers": None}},
        )
        assert store.count(widgets(store)) == 0

    def test_a_dependent_keeps_living_while_another_owner_lives(self, store: Store) -> None:
        first, _ = store.create(widgets(store), "default", widget("a"))
        second, _ = store.create(widgets(store), "default", widget("b"))
        child = owned_configmap("child", first)
        child["metadata"]["ownerReferences"].append(
            {
                **child["metadata"]["ownerReferences"][0],
                "name": "b",
                "uid": second["metadata"]["uid"],
                "controller": False,
            }
        )
        store.create(configmaps(store), "default", child)
        store.delete(widgets(store), "default", "a")
        (ref,) = store.get(configmaps(store), "default", "child")["metadata"]["ownerReferences"]
        assert ref["name"] == "b"

    def test_objects_whose_owner_never_existed_are_collected(self, store: Store) -> None:
        ghost = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ghost", "uid": "nope"},
        }
        store.create(configmaps(store), "default", owned_configmap("orphan", ghost))
        assert store.count(configmaps(store)) == 0

    # A write that leaves the controllers nothing to do is not planned over every object; these
    # are the writes that do give them work although no object was deleted.

    def test_a_dependent_created_under_an_owner_deleted_in_the_foreground_is_deleted(
        self, store: Store
    ) -> None:
        owner, _ = store.create(widgets(store), "default", widget("a"))
        store.create(configmaps(store), "default", owned_configmap("held", owner, finalizers=["x"]))
        store.delete(widgets(store), "default", "a", {"propagationPolicy": "Foreground"})
        store.create(configmaps(store), "default", owned_configmap("late", owner))
        assert store.count(configmaps(store)) == 1  # "late" went at once; "held" waits on "x"

    def test_a_dependent_that_lets_go_of_an_owner_in_the_foreground_releases_it(
        self, store: Store
    ) -> None:
        owner, _ = store.create(widgets(store), "default", widget("a"))
        store.create(configmaps(store), "default", owned_configmap("held", owner, finalizers=["x"]))
        store.delete(widgets(store), "default", "a", {"propagationPolicy": "Foreground"})
        assert store.count(widgets(store)) == 1
        store.patch(
            configmaps(store),
            "default",
            "held",
            "application/merge-patch+json",
            {"metadata": {"ownerReferences": None}},
        )
        assert store.count(widgets(store)) == 0


class TestNamespaces:
    def test_deleting_a_namespace_deletes_its_objects_then_itself(self, store: Store) -> None:
        namespaces = kind(store, "", "v1", "namespaces")
        store.ensure_namespace("team")
        store.create(configmaps(store), "team", {"metadata": {"name": "c", "finalizers": ["hold"]}})
        store.delete(namespaces, None, "team")
        assert store.get(namespaces, None, "team")["status"]["phase"] == "Terminating"
        refused = error_of(
            lambda: store.create(configmaps(store), "team", {"metadata": {"name": "d"}})
        )
        assert refused.code == 403
        store.patch(
            configmaps(store),
            "team",
            "c",
            "application/merge-patch+json",
            {"metadata": {"finalizers": None}},
        )
        assert error_of(lambda: store.get(namespaces, None, "team")).code == 404


class TestScale:
    def test_scale_maps_onto_the_crd_paths(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"status": {"replicas": 1, "selector": "app=a"}},
            subresource="status",
        )
        scale = store.get_scale(widgets(store), "default", "a")
        assert scale["kind"] == "Scale"
        assert scale["apiVersion"] == "autoscaling/v1"
        assert scale["spec"] == {"replicas": 1}
        assert scale["status"] == {"replicas": 1, "selector": "app=a"}
        scaled = store.write_scale(
            widgets(store),
            "default",
            "a",
            body={"spec": {"replicas": 4}},
            content_type="application/merge-patch+json",
        )
        assert scaled["spec"]["replicas"] == 4
        stored = store.get(widgets(store), "default", "a")
        assert stored["spec"]["replicas"] == 4
        assert stored["metadata"]["generation"] == 2

    def test_negative_replicas_are_refused(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        refused = error_of(
            lambda: store.write_scale(
                widgets(store), "default", "a", body={"spec": {"replicas": -1}}
            )
        )
        assert refused.code == 422

    def test_deployments_scale_with_their_selector(self, store: Store) -> None:
        deployments = kind(store, "apps", "v1", "deployments")
        store.create(
            deployments,
            "default",
            {
                "metadata": {"name": "d"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}}},
            },
        )
        assert store.get_scale(deployments, "default", "d")["status"]["selector"] == "app=d"
        store.write_scale(deployments, "default", "d", body={"spec": {"replicas": 3}})
        assert store.get(deployments, "default", "d")["spec"]["replicas"] == 3


class TestCustomResourceDefinitions:
    def test_deleting_a_crd_removes_its_kind_and_objects(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        crds = kind(store, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
        crd = store.get(crds, None, "widgets.sandbox.batchpilot.io")
        assert {c["type"] for c in crd["status"]["conditions"]} == {"NamesAccepted", "Established"}
        store.delete(crds, None, "widgets.sandbox.batchpilot.io")
        assert store.registry.get("sandbox.batchpilot.io", "v1alpha1", "widgets") is None
        assert store.objects[widgets_storage(), "default", "a"].deleted

    def test_crds_with_broken_rules_are_refused(self, store: Store) -> None:
        crd = widget_crd()
        crd["metadata"]["name"] = "gadgets.sandbox.batchpilot.io"
        crd["spec"]["names"] = {"kind": "Gadget", "plural": "gadgets"}
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = [
            {"rule": "self.metadata.name.size( <= 3"}
        ]
        refused = error_of(lambda: store.install_crd(crd))
        assert refused.code == 422
        assert "compilation failed" in refused.message

    def test_crd_names_must_match(self, store: Store) -> None:
        crd = widget_crd()
        crd["metadata"]["name"] = "wrong.sandbox.batchpilot.io"
        assert (
            'must be spec.names.plural+"."+spec.group'
            in error_of(lambda: store.install_crd(crd)).message
        )


def widgets_storage() -> kmock.resource:
    return kmock.resource("sandbox.batchpilot.io", "v1alpha1", "widgets")


class TestEvents:
    def test_events_k8s_io_events_are_core_events(self, store: Store) -> None:
        new_api = kind(store, "events.k8s.io", "v1", "events")
        body = {
            "metadata": {"name": "e1"},
            "regarding": {"kind": "Widget", "name": "a"},
            "note": "scaled",
            "reason": "Scaled",
            "type": "Normal",
            "reportingController": "batchpilot",
            "reportingInstance": "x",
            "action": "Scale",
            "eventTime": "2024-05-01T12:00:00.000000Z",
        }
        store.create(new_api, "default", body)
        core = store.get(kind(store, "", "v1", "events"), "default", "e1")
        assert core["apiVersion"] == "v1"
        assert core["involvedObject"] == {"kind": "Widget", "name": "a"}
        assert core["message"] == "scaled"
        assert store.get(new_api, "default", "e1")["note"] == "scaled"


class TestWatches:
    async def collect(self, watch: Any, count: int) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        async with asyncio.timeout(2):
            async for event_type, obj in watch.events():
                seen.append((event_type, obj["metadata"]["name"]))
                if len(seen) == count:
                    break
        return seen

    async def test_a_watch_without_a_version_starts_with_what_exists(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        watch = store.watch(widgets(store), "default", resource_version=None)
        store.create(widgets(store), "default", widget("b"))
        assert await self.collect(watch, 2) == [("ADDED", "a"), ("ADDED", "b")]

    async def test_a_watch_resumes_after_the_version_it_names(self, store: Store) -> None:
        store.create(widgets(store), "default", widget("a"))
        _, version = store.list_objects(widgets(store), "default")
        store.patch(
            widgets(store),
            "default",
            "a",
            "application/merge-patch+json",
            {"spec": {"replicas": 2}},
        )
        watch = store.watch(widgets(store), "default", resource_version=str(version))
        store.delete(widgets(store), "default", "a")
        assert await self.collect(watch, 2) == [("MODIFIED", "a"), ("DELETED", "a")]

    async def test_selectors_turn_changes_into_added_and_deleted(self, store: Store) -> None:
        from batchpilot.sandbox.selectors import parse_label_selector

        store.create(configmaps(store), "default", {"metadata": {"name": "c"}})
        watch = store.watch(
            configmaps(store),
            "default",
            resource_version=str(store.resource_version),
            labels=parse_label_selector("app=x"),
        )
        merge = "application/merge-patch+json"
        store.patch(
            configmaps(store), "default", "c", merge, {"metadata": {"labels": {"app": "x"}}}
        )
        store.patch(configmaps(store), "default", "c", merge, {"data": {"a": "1"}})
        store.patch(configmaps(store), "default", "c", merge, {"metadata": {"labels": None}})
        assert await self.collect(watch, 3) == [("ADDED", "c"), ("MODIFIED", "c"), ("DELETED", "c")]

    def test_versions_older_than_the_log_are_expired(self) -> None:
        from batchpilot.sandbox.watching import WatchHub

        small = new_store(kmock.ObjectsArray(), hub=WatchHub(log_limit=2), clock=lambda: NOW)
        cms = kind(small, "", "v1", "configmaps")
        for index in range(4):
            small.create(cms, "default", {"metadata": {"name": f"c{index}"}})
        expired = error_of(lambda: small.watch(cms, "default", resource_version="1"))
        assert (expired.code, expired.reason) == (410, "Expired")
