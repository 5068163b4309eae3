"""The four PATCH formats the API server accepts, applied to plain JSON documents.

- `application/merge-patch+json` (RFC 7386): what kopf, kubectl (for custom resources) and
  the operator's client send.
- `application/json-patch+json` (RFC 6902): kopf removes its finalizer with a `test` op on
  `/metadata/resourceVersion` first; a failed `test` must end in 422, never 500, because kopf
  treats 422 as "the object changed, retry on the next event".
- `application/strategic-merge-patch+json`: kubectl apply and the official client use it for
  built-in kinds. The real algorithm reads per-field merge strategies from the Go types; here
  it is an approximation: a JSON merge patch, plus the patch directives (`$patch`,
  `$retainKeys`, `$setElementOrder/…`, `$deleteFromPrimitiveList/…`) and merging of the
  lists the Kubernetes types merge by key (containers and env by `name`, ports by
  `containerPort`/`port`, conditions by `type`, ...; `finalizers` as a set). Other lists
  are replaced, as merge patches do.
- `application/apply-patch+yaml` (server-side apply): approximated as the strategic merge of
  the applied configuration into the live object. There is no field ownership: fields left out
  of an applied configuration are not removed, and there are no apply conflicts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from batchpilot.sandbox import errors

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Lists that Kubernetes types merge by a key (`patchMergeKey`); the field name decides.
_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "ports": ("containerPort", "port"),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "topologySpreadConstraints": ("topologyKey",),
    "resourceClaims": ("name",),
}
# Lists of scalars that Kubernetes types merge as sets.
_SET_LISTS = frozenset({"finalizers"})


class PatchError(errors.ApiError):
    """A patch that cannot be applied to the object (422)."""

    def __init__(self, message: str) -> None:
        super().__init__(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
            details={"causes": [{"message": message}]},
        )
        self.detail = message


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` removes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- RFC 6902 ----------------------------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    if path == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _list_index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    limit = len(container) + (1 if allow_end else 0)
    if index >= limit:
        raise PatchError(f"array index {index} out of bounds")
    return index


def _resolve(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path does not exist: /{'/'.join(tokens)}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"path does not exist: /{'/'.join(tokens)}")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, last, allow_end=True), value)
    else:
        raise PatchError(f"cannot add to a scalar at /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> tuple[Any, Any]:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_list_index(parent, last, allow_end=False))
    raise PatchError(f"cannot remove from a scalar at /{'/'.join(tokens)}")


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 on a copy of `target`; any failure (a failed `test` too) is a `PatchError`."""
    if not isinstance(operations, list):
        raise errors.bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, Mapping) or "op" not in operation:
            raise errors.bad_request(f"invalid json patch operation: {operation!r}")
        op = operation["op"]
        tokens = _pointer(operation.get("path"))
        match op:
            case "add":
                doc = _add(doc, tokens, copy.deepcopy(operation.get("value")))
            case "remove":
                doc, _ = _remove(doc, tokens)
            case "replace":
                _resolve(doc, tokens)
                if tokens:
                    doc, _ = _remove(doc, tokens)
                doc = _add(doc, tokens, copy.deepcopy(operation.get("value")))
            case "move":
                source = _pointer(operation.get("from"))
                doc, value = _remove(doc, source)
                doc = _add(doc, tokens, value)
            case "copy":
                value = copy.deepcopy(_resolve(doc, _pointer(operation.get("from"))))
                doc = _add(doc, tokens, value)
            case "test":
                try:
                    actual = _resolve(doc, tokens)
                except PatchError:
                    actual = None
                expected = operation.get("value")
                if actual != expected or isinstance(actual, bool) != isinstance(expected, bool):
                    raise PatchError(
                        f"testing value {operation.get('path')} failed: expected"
                        f" {expected!r}, found {actual!r}"
                    )
            case _:
                raise errors.bad_request(f"unexpected json patch operation: {op!r}")
    return doc


# --- strategic merge (approximation) -----------------------------------------------------------


def _merge_key(field: str, items: list[Any]) -> str | None:
    candidates = _MERGE_KEYS.get(field)
    if not candidates:
        return None
    dicts = [item for item in items if isinstance(item, Mapping)]
    if len(dicts) != len(items):
        return None
    for key in candidates:
        if all(key in item or item.get("$patch") == "delete" for item in dicts):
            return key
    return None


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if field in _SET_LISTS and all(not isinstance(item, dict | list) for item in patch):
        merged = list(current) if isinstance(current, list) else []
        merged.extend(item for item in patch if item not in merged)
        return merged
    base = list(current) if isinstance(current, list) else []
    key = _merge_key(field, base + patch)
    if key is None:
        return [strategic_merge_patch(None, item) for item in patch]
    merged = [copy.deepcopy(item) for item in base]
    for item in patch:
        position = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), -1)
        if item.get("$patch") == "delete":
            if position >= 0:
                merged.pop(position)
        elif item.get("$patch") == "replace":
            replacement = {k: v for k, v in item.items() if k != "$patch"}
            if position >= 0:
                merged[position] = replacement
            else:
                merged.append(replacement)
        elif position >= 0:
            merged[position] = strategic_merge_patch(merged[position], item)
        else:
            merged.append(strategic_merge_patch(None, item))
    return merged


def _order(items: list[Any], order: list[Any], field: str) -> list[Any]:
    key = _merge_key(field, items)
    if key is None:
        ranked = {repr(value): index for index, value in enumerate(order)}
        return sorted(items, key=lambda item: ranked.get(repr(item), len(ranked)))
    ranked = {
        repr(entry.get(key)): index for index, entry in enumerate(order) if isinstance(entry, dict)
    }
    return sorted(items, key=lambda item: ranked.get(repr(item.get(key)), len(ranked)))


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch (see the module docstring for what is approximated)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    body = {key: value for key, value in patch.items() if key != "$patch"}
    if directive == "replace":
        return strategic_merge_patch(None, body)
    result: dict[str, Any] = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    orders: dict[str, list[Any]] = {}
    retain: list[str] | None = None
    for key, value in body.items():
        if key == "$retainKeys":
            retain = [str(item) for item in value or []]
        elif key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = list(value or [])
        elif key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in (value or [])]
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        elif isinstance(value, Mapping):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = value
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _order(result[field], order, field)
    if retain is not None:
        result = {key: value for key, value in result.items() if key in retain}
    return result


def apply_configuration(target: Any, applied: Any) -> Any:
    """Server-side apply, approximated (see the module docstring)."""
    return strategic_merge_patch(target, applied)


def apply(content_type: str, target: Any, patch: Any) -> Any:
    """Apply a patch document of the given media type to a copy of `target`."""
    target = copy.deepcopy(target)
    if content_type == MERGE_PATCH:
        if not isinstance(patch, Mapping):
            raise errors.bad_request("merge patch must be a JSON object")
        return merge_patch(target, patch)
    if content_type == JSON_PATCH:
        return json_patch(target, patch)
    if content_type == STRATEGIC_MERGE_PATCH:
        if not isinstance(patch, Mapping):
            raise errors.bad_request("strategic merge patch must be a JSON object")
        return strategic_merge_patch(target, patch)
    if content_type == APPLY_PATCH:
        if not isinstance(patch, Mapping):
            raise errors.bad_request("applied configuration must be an object")
        return apply_configuration(target, patch)
    raise errors.unsupported_media_type(
        content_type, [JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH]
    )
