"""URL paths of the Kubernetes API, parsed into what they address.

`/api/v1/namespaces/x` is a Namespace object but `/api/v1/namespaces/x/configmaps` is a list
in it; `/apis/g/v/namespaces/ns/plural/name/status` is a subresource. kmock's own parser reads
the first as a namespace scope, so the sandbox routes requests with this small parser instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DiscoveryKind = Literal["root", "version", "api", "apis", "group", "groupversion", "health"]


@dataclass(frozen=True)
class Discovery:
    kind: DiscoveryKind
    group: str = ""
    version: str = ""


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_path: bool = False  # the legacy /api/v1/watch/... form


Route = Discovery | Resource


def _resource(group: str, version: str, parts: list[str]) -> Resource | None:
    watch = False
    if parts and parts[0] == "watch":
        watch = True
        parts = parts[1:]
    if not parts or not all(parts):
        return None
    if parts[0] == "namespaces" and group == "":
        if len(parts) == 1:
            return Resource(group, version, "namespaces", watch_path=watch)
        if len(parts) == 2:
            return Resource(group, version, "namespaces", name=parts[1], watch_path=watch)
        if len(parts) == 3 and parts[2] in ("status", "finalize"):
            return Resource(group, version, "namespaces", name=parts[1], subresource=parts[2])
    if parts[0] == "namespaces":
        if len(parts) < 3:
            return None
        namespace: str | None = parts[1]
        parts = parts[2:]
    else:
        namespace = None
    plural, *rest = parts
    name = rest[0] if rest else None
    subresource = "/".join(rest[1:]) or None
    return Resource(group, version, plural, namespace, name, subresource, watch)


def parse(path: str) -> Route | None:
    """What a request path addresses; None for paths the API does not have."""
    parts = [part for part in path.split("/")]
    if parts and parts[0] == "":
        parts = parts[1:]
    if parts and parts[-1] == "":
        parts = parts[:-1]
    if not parts:
        return Discovery("root")
    head = parts[0]
    if head == "version" and len(parts) == 1:
        return Discovery("version")
    if head in ("healthz", "readyz", "livez"):
        return Discovery("health")
    if head == "api":
        if len(parts) == 1:
            return Discovery("api")
        if len(parts) == 2:
            return Discovery("groupversion", "", parts[1])
        return _resource("", parts[1], parts[2:])
    if head == "apis":
        if len(parts) == 1:
            return Discovery("apis")
        if len(parts) == 2:
            return Discovery("group", parts[1])
        if len(parts) == 3:
            return Discovery("groupversion", parts[1], parts[2])
        return _resource(parts[1], parts[2], parts[3:])
    return None
