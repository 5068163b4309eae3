"""The official `kubernetes` client against the sandbox (server in a thread, client in the
test): the calls an operator's own code makes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from batchpilot.sandbox import LocalKubernetesAPI
from tests.sandbox.helpers import wait_for, widget

GROUP, VERSION, PLURAL = "sandbox.batchpilot.io", "v1alpha1", "widgets"


@pytest.fixture
def api_client(sandbox: LocalKubernetesAPI) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    configuration.host = sandbox.url
    with client.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def create_widget(
    custom: client.CustomObjectsApi, name: str = "demo", **spec: Any
) -> dict[str, Any]:
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, widget(name, **spec)
    )
    return created


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


class TestCustomResources:
    def test_status_writes_leave_generation_alone(self, custom: client.CustomObjectsApi) -> None:
        create_widget(custom)
        patched = custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "demo",
            {"status": {"replicas": 1, "observedGeneration": 1}},
        )
        assert patched["status"]["replicas"] == 1
        assert patched["metadata"]["generation"] == 1
        patched = custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "demo",
            {"spec": {"replicas": 2}, "status": {"replicas": 9}},
        )
        assert patched["metadata"]["generation"] == 2
        assert patched["status"]["replicas"] == 1

    def test_scale_subresource(self, custom: client.CustomObjectsApi) -> None:
        create_widget(custom)
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, "default", PLURAL, "demo", {"spec": {"replicas": 3}}
        )
        scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "demo")
        assert scale["spec"]["replicas"] == 3
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "demo")
        assert obj["spec"]["replicas"] == 3

    def test_a_failed_json_patch_test_is_422(self, custom: client.CustomObjectsApi) -> None:
        create_widget(custom)
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}]
        with pytest.raises(ApiException) as caught:
            custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                "default",
                PLURAL,
                "demo",
                ops,
                _content_type="application/json-patch+json",
            )
        assert caught.value.status == 422

    def test_invalid_objects_are_refused_with_causes(self, custom: client.CustomObjectsApi) -> None:
        with pytest.raises(ApiException) as caught:
            create_widget(custom, "bad", scaling={"minReplicas": 5, "maxReplicas": 2})
        failure = status_of(caught.value)
        assert caught.value.status == 422
        assert failure["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "object": minReplicas (5) must not exceed'
                " maxReplicas (2)",
                "field": "spec.scaling",
            }
        ]


class TestBuiltInKinds:
    def test_put_generate_name_and_label_selectors(self, core: client.CoreV1Api) -> None:
        for name, labels in (
            ("a", {"app": "a"}),
            ("b", {"app": "b"}),
            ("c", {"app": "a", "skip": "1"}),
        ):
            core.create_namespaced_config_map(
                "default",
                client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels)),
            )
        generated = core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(generate_name="gen-"))
        )
        assert generated.metadata.name.startswith("gen-")
        selected = core.list_namespaced_config_map("default", label_selector="app in (a,b),!skip")
        assert sorted(cm.metadata.name for cm in selected.items) == ["a", "b"]
        current = core.read_namespaced_config_map("a", "default")
        current.data = {"k": "v"}
        replaced = core.replace_namespaced_config_map("a", "default", current)
        assert replaced.data == {"k": "v"}
        assert int(replaced.metadata.resource_version) > int(current.metadata.resource_version)

    def test_deployments_patch_and_scale(self, apps: client.AppsV1Api) -> None:
        container = client.V1Container(name="web", image="nginx:1")
        deployment = client.V1Deployment(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1DeploymentSpec(
                replicas=1,
                selector=client.V1LabelSelector(match_labels={"app": "web"}),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "web"}),
                    spec=client.V1PodSpec(containers=[container]),
                ),
            ),
        )
        apps.create_namespaced_deployment("default", deployment)
        patch = {
            "spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:2"}]}}}
        }
        patched = apps.patch_namespaced_deployment("web", "default", patch)  # strategic merge
        assert patched.spec.template.spec.containers[0].image == "nginx:2"
        assert patched.metadata.generation == 2
        apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 4}})
        scale = apps.read_namespaced_deployment_scale("web", "default")
        assert (scale.spec.replicas, scale.status.selector) == (4, "app=web")

    def test_owner_references_garbage_collect(
        self, custom: client.CustomObjectsApi, core: client.CoreV1Api
    ) -> None:
        owner = create_widget(custom)
        reference = client.V1OwnerReference(
            api_version=owner["apiVersion"],
            kind=owner["kind"],
            name=owner["metadata"]["name"],
            uid=owner["metadata"]["uid"],
            controller=True,
            block_owner_deletion=True,
        )
        core.create_namespaced_config_map(
            "default",
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="child", owner_references=[reference])
            ),
        )
        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "demo")
        with pytest.raises(ApiException) as caught:
            core.read_namespaced_config_map("child", "default")
        assert caught.value.status == 404

    def test_watch_from_a_list_version(
        self, sandbox: LocalKubernetesAPI, core: client.CoreV1Api
    ) -> None:
        listed = core.list_namespaced_config_map("default")
        core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="new"))
        )
        stream = watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=2,
        )
        event = next(stream)
        assert (event["type"], event["object"].metadata.name) == ("ADDED", "new")
        stream.close()
        wait_for(lambda: sandbox.emulator.hub.subscriber_count() == 0, what="the watch to close")
