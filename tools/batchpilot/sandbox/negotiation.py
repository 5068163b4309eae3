"""Which representation a client asked for in its `Accept` header.

kubectl asks for server-side Tables (`application/json;as=Table;v=v1;g=meta.k8s.io,...`),
some clients for `PartialObjectMetadata`, everyone else for JSON. Protobuf is not served: a
client that also accepts JSON gets JSON, one that accepts only protobuf gets 406.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Representation = Literal["json", "yaml", "table", "partial"]


@dataclass(frozen=True)
class Output:
    representation: Representation
    version: str = "v1"  # of meta.k8s.io, for tables and partial metadata

    @property
    def api_version(self) -> str:
        return f"meta.k8s.io/{self.version}"


JSON = Output("json")


def _parse(item: str) -> tuple[str, dict[str, str]]:
    media, *raw_params = item.split(";")
    params: dict[str, str] = {}
    for raw in raw_params:
        key, _, value = raw.partition("=")
        params[key.strip().lower()] = value.strip()
    return media.strip().lower(), params


def negotiate(accept: str | None) -> Output | None:
    """The first acceptable representation in the header; None when nothing is acceptable."""
    if not accept or not accept.strip():
        return JSON
    for item in accept.split(","):
        media, params = _parse(item)
        if media not in ("application/json", "application/yaml", "application/*", "*/*"):
            continue
        as_kind = params.get("as")
        if as_kind is None:
            return Output("yaml") if media == "application/yaml" else JSON
        if params.get("g") != "meta.k8s.io" or params.get("v") not in ("v1", "v1beta1"):
            continue
        if as_kind == "Table":
            return Output("table", params["v"])
        if as_kind in ("PartialObjectMetadata", "PartialObjectMetadataList"):
            return Output("partial", params["v"])
    return None
