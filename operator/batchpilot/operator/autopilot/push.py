"""Tells a running runtime pod its new batch settings through its admin endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request


def push_batching(endpoint: str, *, token: str, document: str, timeout_s: float = 2.0) -> None:
    """PUT the batching document to `http://IP:PORT/admin/batching`; raises on failure."""
    request = urllib.request.Request(
        f"http://{endpoint}/admin/batching",
        data=document.encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if response.status != 200:
            raise urllib.error.HTTPError(
                request.full_url, response.status, "unexpected status", response.headers, None
            )
