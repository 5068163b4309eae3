"""API discovery documents: how kopf, kubectl and the official client learn what is served.

kopf scans `/api` and `/apis` for every group/version and needs each resource's
subresources (it patches status through `/status` only when discovery lists it); kubectl
resolves short names, categories (`kubectl get all`) and the Scale kind of `/scale` from here.
The core group's `groupVersion` is `v1` (not `/v1`), which kmock's generic documents get wrong.
"""

from __future__ import annotations

from typing import Any

from batchpilot.sandbox.resources import SUBRESOURCE_VERBS, Registry, ResourceType

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-batchpilot-sandbox",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "python (kmock)",
    "compiler": "kmock",
    "platform": "linux/amd64",
}


def root_paths(registry: Registry) -> dict[str, Any]:
    paths = {"/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"}
    for group, versions in registry.groups().items():
        paths.add(f"/apis/{group}")
        paths.update(f"/apis/{group}/{version}" for version in versions)
    return {"paths": sorted(paths)}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(group: str, versions: list[str]) -> dict[str, Any]:
    return {
        "name": group,
        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
    }


def api_group_list(registry: Registry) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(group, versions) for group, versions in registry.groups().items()],
    }


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.groups().get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def _entries(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular or rt.kind.lower(),
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    entries = [main]
    if rt.status:
        entries.append(
            {
                "name": f"{rt.plural}/status",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(SUBRESOURCE_VERBS),
            }
        )
    if rt.scale is not None:
        entries.append(
            {
                "name": f"{rt.plural}/scale",
                "singularName": "",
                "namespaced": rt.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": list(SUBRESOURCE_VERBS),
            }
        )
    return entries


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = registry.in_group_version(group, version)
    if not types and group:
        return None
    if group == "" and version != "v1":
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [entry for rt in types for entry in _entries(rt)],
    }
