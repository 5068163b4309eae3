"""Reading and showing the batching settings document, `batchpilot.api.batching`, in force.

The operator PUTs the document to ready pods and writes it into the ConfigMap that new pods read;
both paths parse it here, so they accept the same thing, and refuse a bad one in the runtime's
own error vocabulary (`InvalidRequest`: a 400 at the admin endpoint, a logged and ignored file).
The document's shape and keys are the api's, shared with the operator that writes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from batchpilot.api.batching import BATCHING_KEYS, BatchingDocument
from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import InvalidRequest

log = logging.getLogger(__name__)


def batching_doc(settings: BatchSettings) -> BatchingDocument:
    doc: BatchingDocument = {
        "maxBatchSize": settings.max_batch_size,
        "maxQueueDelayMs": settings.max_queue_delay_s * 1e3,
        "deadlineMs": (settings.deadline_s or 0.0) * 1e3,
    }
    if settings.sla_s is not None:
        doc["slaMs"] = round(settings.sla_s * 1e3, 6)
    if settings.objective is not None:
        doc["objectivePercent"] = round(settings.objective * 100, 10)
    if settings.burst_batch_size is not None:
        doc["burstBatchSize"] = settings.burst_batch_size
    if settings.calibration_rows is not None:
        doc["calibrationRows"] = settings.calibration_rows
    return doc


def _optional_number(doc: dict[str, Any], key: str) -> float | None:
    """The number under `key`; None when absent (or null)."""
    value = doc.get(key)
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise InvalidRequest(f"{key} must be a number, got {value!r}")
    return value


def parse_batching(body: bytes, *, current: BatchSettings) -> BatchSettings:
    """Parse `{"maxBatchSize": N, "maxQueueDelayMs": D, "deadlineMs": T, "slaMs": S,
    "objectivePercent": P, "burstBatchSize": C, "calibrationRows": R}`; absent keys keep their
    value.

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
    burst = doc.get("burstBatchSize", current.burst_batch_size or 0)
    calibration = doc.get("calibrationRows", current.calibration_rows or 0)
    wholes = (("maxBatchSize", size), ("burstBatchSize", burst), ("calibrationRows", calibration))
    for key, whole in wholes:
        if not isinstance(whole, int) or isinstance(whole, bool):
            raise InvalidRequest(f"{key} must be an integer, got {whole!r}")
    for key, whole in wholes[1:]:
        if whole < 0:
            raise InvalidRequest(f"{key} must be 0 (none) or more, got {whole!r}")
    for key, value in (("maxQueueDelayMs", delay_ms), ("deadlineMs", deadline_ms)):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise InvalidRequest(f"{key} must be a number, got {value!r}")
    if deadline_ms < 0:
        raise InvalidRequest(f"deadlineMs must be 0 (no deadline) or more, got {deadline_ms!r}")
    sla_ms = _optional_number(doc, "slaMs")
    percent = _optional_number(doc, "objectivePercent")
    if sla_ms is not None and sla_ms <= 0:
        raise InvalidRequest(f"slaMs must be more than 0, got {sla_ms!r}")
    if percent is not None and not 0 < percent < 100:
        raise InvalidRequest(f"objectivePercent must be more than 0 and below 100, got {percent!r}")
    try:
        return BatchSettings(
            max_batch_size=size,
            max_queue_delay_s=delay_ms / 1e3,
            deadline_s=deadline_ms / 1e3 if deadline_ms else None,
            sla_s=current.sla_s if sla_ms is None else sla_ms / 1e3,
            # Rounded: 99.9 / 100 is 0.9990000000000001 in binary floating point.
            objective=current.objective if percent is None else round(percent / 100, 12),
            burst_batch_size=burst or None,
            calibration_rows=calibration or None,
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
