"""A list in pages, as the API server serves one asked with `limit`: `continue` for the rest.

client-go's pager, kubectl (`--chunk-size`, 500 by default) and the operator's own lists of the
fleet ask for 500 objects at a time; the API server answers that many, in key order (namespace,
then name), with `metadata.continue` — an opaque token for the next page — and
`remainingItemCount` while more are left. The real server serves every page from the snapshot of
the first; this one from the store as it is when each page is asked, after the last key the token
names (an object created or deleted between two pages shows or not, as in a fresh list). A token
that cannot be read is refused (400), as the real server refuses one it did not make.

Pure: lists and strings.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from batchpilot.sandbox import errors


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _token(version: int, after: tuple[str, str]) -> str:
    text = json.dumps({"v": version, "after": list(after)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode()


def _after(token: str) -> tuple[str, str]:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
        namespace, name = decoded["after"]
        return str(namespace), str(name)
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise errors.bad_request(f"continue key is not valid: {token!r}") from None


def page(
    items: list[dict[str, Any]], version: int, params: Mapping[str, str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The page of `items` that `params` (`limit`, `continue`) ask for, and what the list's
    `metadata` says beside its resourceVersion (`continue`, `remainingItemCount`: nothing on
    the last page). Without `limit` (or 0), every item, as one page."""
    raw_limit = params.get("limit") or "0"
    try:
        limit = int(raw_limit)
    except ValueError:
        raise errors.bad_request(f"limit must be an integer, not {raw_limit!r}") from None
    token = params.get("continue")
    if limit < 0:
        raise errors.bad_request(f"limit must not be negative: {limit}")
    if limit == 0 and not token:
        return items, {}
    ordered = sorted(items, key=_key)
    if token:
        after = _after(token)
        ordered = [obj for obj in ordered if _key(obj) > after]
    if limit == 0 or len(ordered) <= limit:
        return ordered, {}
    shown = ordered[:limit]
    return shown, {
        "continue": _token(version, _key(shown[-1])),
        "remainingItemCount": len(ordered) - limit,
    }
