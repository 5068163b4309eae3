"""The PATCH formats (pure): merge patch, JSON patch, the strategic-merge approximation."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.sandbox import errors, patching
from batchpilot.sandbox.patching import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
)

DEPLOYMENT: dict[str, Any] = {
    "metadata": {"name": "web", "resourceVersion": "7", "finalizers": ["a"]},
    "spec": {
        "replicas": 2,
        "template": {
            "spec": {
                "containers": [
                    {"name": "web", "image": "nginx:1", "env": [{"name": "A", "value": "1"}]},
                    {"name": "side", "image": "busybox"},
                ],
                "tolerations": [{"key": "x"}],
            }
        },
    },
}


class TestMergePatch:
    def test_objects_merge_and_null_removes(self) -> None:
        patched = patching.apply(
            MERGE_PATCH, DEPLOYMENT, {"spec": {"replicas": 3, "template": None}, "x": 1}
        )
        assert patched["spec"] == {"replicas": 3}
        assert patched["x"] == 1

    def test_lists_are_replaced(self) -> None:
        patched = patching.apply(MERGE_PATCH, {"a": [1, 2]}, {"a": [3]})
        assert patched == {"a": [3]}

    def test_the_target_is_not_modified(self) -> None:
        target = {"a": {"b": 1}}
        patching.apply(MERGE_PATCH, target, {"a": {"b": 2}})
        assert target == {"a": {"b": 1}}


class TestJSONPatch:
    def test_operations(self) -> None:
        doc = {"a": {"b": [1, 2]}, "c": 1}
        patched = patching.json_patch(
            doc,
            [
                {"op": "add", "path": "/a/b/-", "value": 3},
                {"op": "add", "path": "/a/b/0", "value": 0},
                {"op": "replace", "path": "/c", "value": 2},
                {"op": "copy", "from": "/c", "path": "/d"},
                {"op": "move", "from": "/d", "path": "/e"},
                {"op": "remove", "path": "/a/b/1"},
                {"op": "add", "path": "/x~1y", "value": True},
                {"op": "test", "path": "/e", "value": 2},
            ],
        )
        assert patched == {"a": {"b": [0, 2, 3]}, "c": 2, "e": 2, "x/y": True}
        assert doc == {"a": {"b": [1, 2]}, "c": 1}

    def test_a_failed_test_op_is_422_as_kopf_expects(self) -> None:
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "6"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]
        with pytest.raises(PatchError) as caught:
            patching.apply(JSON_PATCH, DEPLOYMENT, ops)
        assert caught.value.code == 422
        assert caught.value.reason == "Invalid"
        assert "/metadata/resourceVersion" in caught.value.detail

    @pytest.mark.parametrize(
        "ops",
        [
            [{"op": "remove", "path": "/nope"}],
            [{"op": "replace", "path": "/nope", "value": 1}],
            [{"op": "add", "path": "/a/9", "value": 1}],
            [{"op": "add", "path": "nope", "value": 1}],
        ],
    )
    def test_impossible_operations_are_422(self, ops: list[dict[str, Any]]) -> None:
        with pytest.raises(PatchError):
            patching.json_patch({"a": []}, ops)

    def test_malformed_documents_are_400(self) -> None:
        with pytest.raises(errors.ApiError) as caught:
            patching.json_patch({}, {"op": "add"})
        assert caught.value.code == 400


class TestStrategicMergePatch:
    def test_named_lists_merge_by_key(self) -> None:
        patch = {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "web",
                                "image": "nginx:2",
                                "env": [{"name": "B", "value": "2"}],
                            }
                        ]
                    }
                }
            }
        }
        patched = patching.apply(STRATEGIC_MERGE_PATCH, DEPLOYMENT, patch)
        containers = patched["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["web", "side"]
        assert containers[0]["image"] == "nginx:2"
        assert containers[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]

    def test_directives(self) -> None:
        patch = {
            "metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {
                "template": {
                    "spec": {
                        "$setElementOrder/containers": [{"name": "side"}, {"name": "web"}],
                        "containers": [{"name": "web", "$patch": "delete"}],
                        "tolerations": [{"key": "y"}],
                    }
                },
                "strategy": {"$patch": "replace", "type": "Recreate"},
            },
        }
        patched = patching.apply(STRATEGIC_MERGE_PATCH, DEPLOYMENT, patch)
        assert patched["metadata"]["finalizers"] == ["b"]
        pod = patched["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["containers"]] == ["side"]
        assert pod["tolerations"] == [{"key": "y"}]  # no merge key: replaced
        assert patched["spec"]["strategy"] == {"type": "Recreate"}

    def test_set_element_order_reorders(self) -> None:
        patch = {
            "spec": {
                "template": {
                    "spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "web"}]}
                }
            }
        }
        patched = patching.apply(STRATEGIC_MERGE_PATCH, DEPLOYMENT, patch)
        names = [c["name"] for c in patched["spec"]["template"]["spec"]["containers"]]
        assert names == ["side", "web"]

    def test_finalizers_merge_as_a_set(self) -> None:
        patched = patching.apply(
            STRATEGIC_MERGE_PATCH, DEPLOYMENT, {"metadata": {"finalizers": ["a", "c"]}}
        )
        assert patched["metadata"]["finalizers"] == ["a", "c"]

    def test_retain_keys(self) -> None:
        patched = patching.strategic_merge_patch(
            {"s": {"type": "A", "rollingUpdate": {"x": 1}}},
            {"s": {"$retainKeys": ["type"], "type": "B"}},
        )
        assert patched == {"s": {"type": "B"}}


class TestMediaTypes:
    def test_server_side_apply_merges_the_applied_configuration(self) -> None:
        patched = patching.apply(APPLY_PATCH, DEPLOYMENT, {"spec": {"replicas": 5}})
        assert patched["spec"]["replicas"] == 5
        assert patched["spec"]["template"] == DEPLOYMENT["spec"]["template"]

    def test_unknown_media_types_are_415(self) -> None:
        with pytest.raises(errors.ApiError) as caught:
            patching.apply("application/xml", {}, {})
        assert caught.value.code == 415
