"""The batching settings document shared by the admin endpoint and the mounted config file.

`{"maxBatchSize": N, "maxQueueDelayMs": D, "deadlineMs": T}` is what the operator PUTs to ready
pods and writes into the ConfigMap that new pods read; both paths parse it here, so they accept
the same thing. `deadlineMs` is the default deadline of a request (0: none).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import InvalidRequest

log = logging.getLogger(__name__)


BATCHING_KEYS = ("maxBatchSize", "maxQueueDelayMs", "deadlineMs")


def batching_doc(settings: BatchSettings) -> dict[str, Any]:
    return {
        "maxBatchSize": settings.max_batch_size,
        "maxQueueDelayMs": settings.max_queue_delay_s * 1e3,
        "deadlineMs": (settings.deadline_s or 0.0) * 1e3,
    }


def parse_batching(body: bytes, *, current: BatchSettings) -> BatchSettings:
    """Parse `{"maxBatchSize": N, "maxQueueDelayMs": D, "deadlineMs": T}`; absent keys keep
    their value.

    The same document is what the operator writes into the mounted batching config file.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"batching settings are not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("batching settings must be a JSON object")
    if unknown := sorted(set(doc) - set(BATCHING_KEYS)):
        raise InvalidRequest(
            f"unknown batching setting {', '.join(unknown)}; known: {', '.join(BATCHING_KEYS)}"
        )
    size = doc.get("maxBatchSize", current.max_batch_size)
    delay_ms = doc.get("maxQueueDelayMs", current.max_queue_delay_s * 1e3)
    deadline_ms = doc.get("deadlineMs", (current.deadline_s or 0.0) * 1e3)
    if not isinstance(size, int) or isinstance(size, bool):
        raise InvalidRequest(f"maxBatchSize must be an integer, got {size!r}")
    for key, value in (("maxQueueDelayMs", delay_ms), ("deadlineMs", deadline_ms)):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise InvalidRequest(f"{key} must be a number, got {value!r}")
    if deadline_ms < 0:
        raise InvalidRequest(f"deadlineMs must be 0 (no deadline) or more, got {deadline_ms!r}")
    try:
        return BatchSettings(
            max_batch_size=size,
            max_queue_delay_s=delay_ms / 1e3,
            deadline_s=deadline_ms / 1e3 if deadline_ms else None,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


class ConfigFileWatcher:
    """Re-reads the mounted batching config file when it changes.

    Kubernetes updates a mounted ConfigMap by swapping a symlink, which inotify on the file itself
    misses; comparing the target's (inode, mtime, size) once a second catches every update, costs
    one stat, and works on any filesystem. A file that cannot be parsed is reported and ignored:
    the settings in force stay.
    """

    def __init__(
        self,
        path: Path,
        *,
        current: Callable[[], BatchSettings],
        apply: Callable[[BatchSettings], None],
    ) -> None:
        self._path = path
        self._current = current
        self._apply = apply
        self._seen: tuple[int, int, int] | None = None

    def check(self) -> bool:
        """Apply the file if it changed since the last check; True when settings were applied."""
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            if self._seen is not None:
                log.warning("batching config %s disappeared; keeping current settings", self._path)
            self._seen = None
            return False
        fingerprint = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if fingerprint == self._seen:
            return False
        self._seen = fingerprint
        try:
            settings = parse_batching(self._path.read_bytes(), current=self._current())
        except (OSError, InvalidRequest) as exc:
            log.error("batching config %s ignored: %s", self._path, exc)
            return False
        self._apply(settings)
        return True

    async def run(self, *, interval_s: float) -> None:
        while True:
            self.check()
            await asyncio.sleep(interval_s)
