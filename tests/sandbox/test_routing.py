"""Paths, content negotiation and discovery documents (pure)."""

from __future__ import annotations

import pytest

from batchpilot.sandbox import crds, discovery, negotiation, routing
from batchpilot.sandbox.store import new_registry
from tests.sandbox.helpers import widget_crd

R = routing.Resource
D = routing.Discovery


class TestPaths:
    @pytest.mark.parametrize(
        ("path", "route"),
        [
            ("/", D("root")),
            ("/version", D("version")),
            ("/healthz", D("health")),
            ("/api", D("api")),
            ("/api/v1", D("groupversion", "", "v1")),
            ("/apis", D("apis")),
            ("/apis/apps", D("group", "apps")),
            ("/apis/apps/v1", D("groupversion", "apps", "v1")),
            ("/api/v1/namespaces", R("", "v1", "namespaces")),
            ("/api/v1/namespaces/x", R("", "v1", "namespaces", name="x")),
            (
                "/api/v1/namespaces/x/status",
                R("", "v1", "namespaces", name="x", subresource="status"),
            ),
            ("/api/v1/namespaces/x/configmaps", R("", "v1", "configmaps", "x")),
            ("/api/v1/namespaces/x/configmaps/c", R("", "v1", "configmaps", "x", "c")),
            ("/api/v1/nodes/n1", R("", "v1", "nodes", name="n1")),
            ("/api/v1/events", R("", "v1", "events")),
            (
                "/apis/b.io/v1/namespaces/ns/things/t/scale",
                R("b.io", "v1", "things", "ns", "t", "scale"),
            ),
            ("/apis/b.io/v1/things", R("b.io", "v1", "things")),
            ("/api/v1/watch/namespaces/x/pods", R("", "v1", "pods", "x", watch_path=True)),
            ("/apis/b.io/v1/namespaces/ns", None),
            ("/openapi/v2", None),
            ("/nothing", None),
        ],
    )
    def test_parse(self, path: str, route: routing.Route | None) -> None:
        assert routing.parse(path) == route


class TestNegotiation:
    KUBECTL_GET = (
        "application/json;as=Table;v=v1;g=meta.k8s.io,"
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
    )

    @pytest.mark.parametrize(
        ("accept", "representation"),
        [
            (None, "json"),
            ("", "json"),
            ("*/*", "json"),
            ("application/json", "json"),
            ("application/yaml", "yaml"),
            (KUBECTL_GET, "table"),
            ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", "partial"),
            ("application/vnd.kubernetes.protobuf, application/json", "json"),
            ("application/json;as=Other;v=v1;g=x.io,application/json", "json"),
        ],
    )
    def test_choice(self, accept: str | None, representation: str) -> None:
        output = negotiation.negotiate(accept)
        assert output is not None
        assert output.representation == representation

    def test_nothing_acceptable(self) -> None:
        assert negotiation.negotiate("application/vnd.kubernetes.protobuf") is None


class TestDiscovery:
    def registry(self):  # type: ignore[no-untyped-def]
        registry = new_registry()
        for rt in crds.resource_types(widget_crd()):
            registry.add(rt)
        return registry

    def test_core_group_version_is_v1(self) -> None:
        document = discovery.api_resource_list(self.registry(), "", "v1")
        assert document is not None
        assert document["groupVersion"] == "v1"
        names = {entry["name"] for entry in document["resources"]}
        assert {"namespaces", "configmaps", "events", "namespaces/status"} <= names

    def test_custom_resources_with_subresources_names_and_categories(self) -> None:
        document = discovery.api_resource_list(self.registry(), "sandbox.batchpilot.io", "v1alpha1")
        assert document is not None
        entries = {entry["name"]: entry for entry in document["resources"]}
        assert entries["widgets"]["shortNames"] == ["wdg"]
        assert entries["widgets"]["categories"] == ["sandboxtest"]
        assert entries["widgets"]["kind"] == "Widget"
        assert entries["widgets/status"]["verbs"] == ["get", "patch", "update"]
        assert entries["widgets/scale"]["group"] == "autoscaling"
        assert entries["widgets/scale"]["kind"] == "Scale"

    def test_groups(self) -> None:
        groups = {g["name"]: g for g in discovery.api_group_list(self.registry())["groups"]}
        for name in (
            "apps",
            "policy",
            "events.k8s.io",
            "coordination.k8s.io",
            "sandbox.batchpilot.io",
        ):
            assert name in groups
        assert groups["apps"]["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
        assert discovery.api_group(self.registry(), "nope.io") is None
        assert discovery.api_resource_list(self.registry(), "apps", "v9") is None
