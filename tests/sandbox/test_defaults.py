"""Server-side defaults of built-in kinds: the live object has more than the manifest, and
writing the manifest again changes nothing (as on a real server)."""

from __future__ import annotations

import copy
from typing import Any

import kmock
import pytest

from batchpilot.sandbox import defaults
from batchpilot.sandbox.store import Store, new_store

DEPLOYMENT: dict[str, Any] = {
    "metadata": {"name": "web"},
    "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "web",
                        "image": "ghcr.io/x/server:1.2",
                        "ports": [{"containerPort": 8000}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8000}},
                    }
                ],
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            },
        },
    },
}
SERVICE: dict[str, Any] = {
    "metadata": {"name": "web"},
    "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]},
}


@pytest.fixture
def store() -> Store:
    return new_store(kmock.ObjectsArray(), seed=5)


def kind(store: Store, group: str, plural: str) -> Any:
    return next(rt for rt in store.registry if (rt.group, rt.plural) == (group, plural))


class TestDefaults:
    def test_deployments(self, store: Store) -> None:
        created, _ = store.create(kind(store, "apps", "deployments"), "default", DEPLOYMENT)
        spec = created["spec"]
        assert (
            spec["replicas"],
            spec["revisionHistoryLimit"],
            spec["progressDeadlineSeconds"],
        ) == (
            1,
            10,
            600,
        )
        assert spec["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
        }
        pod = spec["template"]["spec"]
        assert (pod["restartPolicy"], pod["dnsPolicy"], pod["schedulerName"]) == (
            "Always",
            "ClusterFirst",
            "default-scheduler",
        )
        container = pod["containers"][0]
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert container["ports"][0]["protocol"] == "TCP"
        assert container["readinessProbe"]["periodSeconds"] == 10
        assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
        assert pod["volumes"][0]["configMap"]["defaultMode"] == 420

    def test_services_get_a_cluster_ip_that_sticks(self, store: Store) -> None:
        services = kind(store, "", "services")
        created, _ = store.create(services, "default", SERVICE)
        assert created["spec"]["clusterIP"].startswith("10.96.")
        assert created["spec"]["ports"][0] == {
            "name": "http",
            "port": 80,
            "protocol": "TCP",
            "targetPort": 80,
        }
        replaced, _ = store.update(services, "default", "web", copy.deepcopy(SERVICE))
        assert replaced["spec"]["clusterIP"] == created["spec"]["clusterIP"]

    def test_secrets_store_string_data_as_data(self, store: Store) -> None:
        body = {"metadata": {"name": "s"}, "stringData": {"token": "abc"}}
        created, _ = store.create(kind(store, "", "secrets"), "default", body)
        assert created["data"] == {"token": "YWJj"}
        assert created["type"] == "Opaque"
        assert "stringData" not in created

    @pytest.mark.parametrize(
        ("image", "policy"),
        [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("localhost:5000/x", "Always"),
            ("localhost:5000/x:2", "IfNotPresent"),
            ("x@sha256:abc", "IfNotPresent"),
        ],
    )
    def test_image_pull_policy(self, image: str, policy: str) -> None:
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}]}
        defaults.pod_spec(spec)
        assert spec["containers"][0]["imagePullPolicy"] == policy


class TestWritingTheManifestAgain:
    @pytest.mark.parametrize(
        ("group", "plural", "manifest"),
        [("apps", "deployments", DEPLOYMENT), ("", "services", SERVICE)],
    )
    def test_is_a_no_op(
        self, store: Store, group: str, plural: str, manifest: dict[str, Any]
    ) -> None:
        rt = kind(store, group, plural)
        created, _ = store.create(rt, "default", manifest)
        replaced, _ = store.update(rt, "default", "web", copy.deepcopy(manifest))
        assert replaced["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        assert replaced["metadata"].get("generation") == created["metadata"].get("generation")
