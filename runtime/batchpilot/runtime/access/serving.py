"""The gate of a serving process: its files read, its metrics registered, its watcher made."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from batchpilot.runtime.access.files import AccessWatcher, read_keys, read_policy
from batchpilot.runtime.access.gate import AccessGate
from batchpilot.runtime.access.metrics import AccessMetrics

log = logging.getLogger(__name__)


def serving_gate(
    *,
    keys: Path,
    access: Path | None,
    model: str,
    registry: CollectorRegistry,
    labels: dict[str, str],
) -> tuple[AccessGate, AccessWatcher]:
    """The gate over the keys folder and the access document, with its metrics on `registry`,
    and the watcher that keeps it current. Raises `AccessFileError` when either cannot be used:
    a server never starts open because its keys are broken."""
    table = read_keys(keys)
    policy = read_policy(access)
    metrics = AccessMetrics(registry, labels)
    gate = AccessGate(table, policy, model=model, clock=time.monotonic, count=metrics.count)
    metrics.keys.set(len(table.entries))

    def report(source: str, applied: bool) -> None:
        metrics.reloaded(source, applied)
        metrics.keys.set(len(gate.table.entries))

    log.info(
        "API keys from %s: %d keys%s",
        keys,
        len(table.entries),
        f", access document {access}" if access is not None else "",
    )
    return gate, AccessWatcher(gate, keys=keys, access=access, report=report)
