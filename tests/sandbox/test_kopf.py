"""A tiny kopf operator against the sandbox: finalizers, status through /status, Events, a
child adopted through ownerReferences and garbage-collected with its owner."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchpilot.sandbox import LocalKubernetesAPI
from tests.sandbox.helpers import wait_for, widget

GROUP, VERSION, PLURAL = "sandbox.batchpilot.io", "v1alpha1", "widgets"
FINALIZER = "sandbox.batchpilot.io/test-operator"


@pytest.fixture(autouse=True)
def _kopfs_default_registry_restored() -> Iterator[None]:
    """kopf's `run` command (under KopfRunner) makes the registry it is given kopf's default one
    and leaves it so: the operator's handlers, registered in the original, would be gone for the
    tests that run after this one (tests/deploy/test_rbac.py reads them from there)."""
    default = kopf.get_default_registry()
    yield
    kopf.set_default_registry(default)


def widget_operator(url: str) -> kopf.OperatorRegistry:
    """Handlers in their own registry, so nothing leaks into kopf's default one."""
    registry = kopf.OperatorRegistry()

    def core() -> client.CoreV1Api:
        configuration = client.Configuration()
        configuration.host = url
        return client.CoreV1Api(client.ApiClient(configuration))

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, insecure=True, default_namespace="default")

    @kopf.on.create(GROUP, VERSION, PLURAL, id="create", registry=registry)
    def create(
        body: kopf.Body, spec: kopf.Spec, name: str, namespace: str, patch: kopf.Patch, **_: Any
    ) -> dict[str, str]:
        child: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-config"},
            "data": {"model": spec["model"]["uri"]},
        }
        kopf.adopt(child, owner=body)
        core().create_namespaced_config_map(namespace, child)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch.status["replicas"] = spec.get("replicas", 1)
        patch.status["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "ConfigMapCreated",
                "message": f"{name}-config holds the settings",
                "lastTransitionTime": now,
            }
        ]
        kopf.info(body, reason="ChildCreated", message=f"created configmap {name}-config")
        return {"child": f"{name}-config"}

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="delete", registry=registry)
    def delete(**_: Any) -> None:
        pass  # its presence is what makes kopf hold the object with a finalizer

    return registry


@pytest.fixture
def kube(sandbox: LocalKubernetesAPI) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    configuration.host = sandbox.url
    with client.ApiClient(configuration) as api_client:
        yield api_client


def read_or_none(read: Any, *args: Any) -> Any:
    try:
        return read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_kopf_operator_round_trip(sandbox: LocalKubernetesAPI, kube: client.ApiClient) -> None:
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = 20
    registry = widget_operator(sandbox.url)
    args = ["run", "--standalone", "--all-namespaces", "--verbose"]
    with KopfRunner(args, registry=registry, settings=settings, timeout=30) as runner:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("demo"))

        child = wait_for(
            lambda: read_or_none(core.read_namespaced_config_map, "demo-config", "default"),
            what="the operator to create the child ConfigMap",
        )
        owner = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "demo")
        (reference,) = child.metadata.owner_references
        assert (reference.kind, reference.name, reference.uid, reference.controller) == (
            "Widget",
            "demo",
            owner["metadata"]["uid"],
            True,
        )

        def status() -> dict[str, Any] | None:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "demo")
            found: dict[str, Any] | None = obj.get("status")
            return found if found and "conditions" in found and "create" in found else None

        written = wait_for(status, what="the operator to write status")
        assert written["conditions"][0]["reason"] == "ConfigMapCreated"
        assert written["create"] == {"child": "demo-config"}  # kopf's handler result
        current = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "demo")
        assert FINALIZER in current["metadata"]["finalizers"]
        assert current["metadata"]["generation"] == 1  # status and finalizers are no spec change

        events = wait_for(
            lambda: (
                core.list_namespaced_event(
                    "default", field_selector="involvedObject.name=demo,involvedObject.kind=Widget"
                ).items
            ),
            what="kopf's Event",
        )
        assert "ChildCreated" in {event.reason for event in events}

        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "demo")
        wait_for(
            lambda: (
                read_or_none(
                    custom.get_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, "demo"
                )
                is None
            ),
            what="kopf to release its finalizer",
        )
        wait_for(
            lambda: read_or_none(core.read_namespaced_config_map, "demo-config", "default") is None,
            what="the child to be garbage-collected",
        )

    assert runner.exception is None
    assert runner.exit_code == 0
    finalizer_patches = [
        record
        for record in sandbox.writes
        if record.resource == "widgets.sandbox.batchpilot.io" and record.method == "PATCH"
    ]
    assert finalizer_patches, "kopf patched the Widget (finalizers, annotations)"
    assert all(record.code < 500 for record in sandbox.writes), json.dumps(
        [str(record) for record in sandbox.writes]
    )
