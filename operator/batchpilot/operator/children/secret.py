"""The admin-token Secret: authenticates the operator to the runtime's batching endpoint.

The token is generated once and kept: the builder takes the token already in force, so
reconciling never rotates it (rotation would need every pod to re-read the file first).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from batchpilot.operator.children.common import TOKEN_FILE, Owner


def new_token() -> str:
    return secrets.token_urlsafe(32)


def build_secret(owner: Owner, *, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owner.metadata(owner.secret_name),
        "type": "Opaque",
        "data": {TOKEN_FILE: base64.b64encode(token.encode()).decode()},
    }


def token_in(secret: dict[str, Any]) -> str | None:
    try:
        return base64.b64decode(secret["data"][TOKEN_FILE]).decode() or None
    except (KeyError, TypeError, ValueError):
        return None
