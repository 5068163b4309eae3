"""The keys' Secret and the access document as the pod mounts them: read at start, watched
while serving, swapped into the gate when they change — and the access document the operator
sends to the admin port (`PUT /admin/access`), swapped in the same way.

Kubernetes updates a mounted Secret or ConfigMap by writing the new version into a fresh folder
and swapping the `..data` symlink to it: each file appears to change at once. The keys are read
through the resolved `..data`, so one table comes from one version of the Secret even if a swap
happens during the read. Like the batching file (`live_settings.ConfigFileWatcher`), both are
polled: one stat per file and second, on any filesystem.

The operator sends a changed access document to each ready pod at once (a mounted ConfigMap
takes up to a minute) and writes the same document into the ConfigMap, the durable copy. So the
file is judged by its content: the kubelet re-publishes every entry of the ConfigMap when any one
changes (the batch settings, often), and a file whose content did not change changes nothing —
it never undoes what the admin port applied. A file with new content wins, as it always did.

Never open up: a folder or document that cannot be read or parsed is refused at start (the
server exits 1, saying why) and, while serving, keeps the table and policy in force, logged and
counted. Messages name key ids and files, never a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from batchpilot.runtime.access.gate import AccessGate
from batchpilot.runtime.access.keys import KeyTable, KeyTableError
from batchpilot.runtime.access.policy import OPEN_POLICY, AccessPolicy, parse_access
from batchpilot.runtime.errors import InvalidRequest

log = logging.getLogger(__name__)

KUBELET_DATA = "..data"
"""The symlink Kubernetes swaps to publish a new version of a mounted Secret or ConfigMap."""


class AccessFileError(Exception):
    """The keys or the access document cannot be used; the message says which and why."""


def _version_folder(folder: Path) -> Path:
    data = folder / KUBELET_DATA
    return data.resolve(strict=True) if data.is_symlink() else folder


def read_keys(folder: Path) -> KeyTable:
    """The table of the keys in `folder`: one file per key, named by its key id (a mounted
    Secret). Raises `AccessFileError`."""
    try:
        base = _version_folder(folder)
        keys: dict[str, bytes] = {}
        for name in sorted(os.listdir(base)):
            if name.startswith(".."):  # the kubelet's own entries
                continue
            path = base / name
            if path.is_dir():
                raise AccessFileError(f"API keys {folder}: {name} is a folder, not a key")
            keys[name] = path.read_bytes()
        return KeyTable.from_keys(keys)
    except KeyTableError as exc:
        raise AccessFileError(f"API keys {folder}: {exc}") from None
    except OSError as exc:
        raise AccessFileError(f"API keys {folder} cannot be read: {exc.strerror or exc}") from None


def read_policy(path: Path | None) -> AccessPolicy:
    """The policy of the access document at `path` (None: every key, no limits). Raises
    `AccessFileError`."""
    if path is None:
        return OPEN_POLICY
    return _parse_document(path, _read_document(path))


def _read_document(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AccessFileError(f"access document {path} cannot be read: {exc.strerror}") from None


def _parse_document(path: Path, body: bytes) -> AccessPolicy:
    try:
        return parse_access(body)
    except InvalidRequest as exc:
        raise AccessFileError(f"access document {path}: {exc}") from None


Fingerprint = tuple[object, ...]


def _fingerprint(path: Path) -> Fingerprint:
    """What changes when the file, or any file of the folder, is replaced (inode, mtime, size
    through the symlinks); () when it cannot be looked at."""
    try:
        if not path.is_dir():
            stat = path.stat()
            return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        entries: list[object] = [str(_version_folder(path))]
        for name in sorted(os.listdir(path)):
            stat = (path / name).stat()
            entries.append((name, stat.st_ino, stat.st_mtime_ns, stat.st_size))
        return tuple(entries)
    except OSError:
        return ()


class AccessWatcher:
    """Keeps the gate current: re-reads the keys folder and the access document when they
    change, and takes the access documents sent to the admin port (`apply`). `report(source,
    applied)` is told each attempt: "keys" or "access" (the files), "admin" (the endpoint)."""

    def __init__(
        self,
        gate: AccessGate,
        *,
        keys: Path,
        access: Path | None,
        report: Callable[[str, bool], None] = lambda source, applied: None,
    ) -> None:
        self._gate = gate
        self._paths = {"keys": keys, **({"access": access} if access is not None else {})}
        self._report = report
        self._seen = {source: _fingerprint(path) for source, path in self._paths.items()}
        self._document: bytes | None = None
        """The access file's content when last read: the same content again is no change."""
        if access is not None:
            with contextlib.suppress(AccessFileError):
                self._document = _read_document(access)

    @property
    def gate(self) -> AccessGate:
        return self._gate

    def apply(self, body: bytes, *, source: str = "admin") -> AccessPolicy:
        """Swap in the access document `body` whole, each bucket keeping what it holds, as a
        changed file is. Raises `InvalidRequest` saying what is wrong; the policy in force
        stays then. The file keeps its say: when its content next changes, it wins."""
        try:
            policy = parse_access(body)
        except InvalidRequest as exc:
            log.error(
                "access document from the %s endpoint refused: %s; the limits in force stay",
                source,
                exc,
            )
            self._report(source, False)
            raise
        self._gate.replace(policy=policy)
        log.info("access document from the %s endpoint applied", source)
        self._report(source, True)
        return policy

    def check(self) -> bool:
        """Apply whatever changed since the last check; True when something was swapped in."""
        swapped = False
        for source, path in self._paths.items():
            fingerprint = _fingerprint(path)
            if fingerprint == self._seen[source]:
                continue
            self._seen[source] = fingerprint
            try:
                if source == "keys":
                    table = read_keys(path)
                    self._gate.replace(table=table)
                    log.info("API keys %s reloaded: %d keys", path, len(table.entries))
                elif not self._reload_document(path):
                    continue
            except AccessFileError as exc:
                log.error("%s; the keys and limits in force stay", exc)
                self._report(source, False)
                continue
            self._report(source, True)
            swapped = True
        return swapped

    def _reload_document(self, path: Path) -> bool:
        """Swap in the access file's policy if its content changed and differs from the policy
        in force (False: nothing to do). Raises `AccessFileError`."""
        body = _read_document(path)
        if body == self._document:
            return False  # re-published with the rest of the ConfigMap: the same document
        self._document = body
        policy = _parse_document(path, body)
        if policy == self._gate.policy:
            log.debug("access document %s: already in force", path)
            return False
        self._gate.replace(policy=policy)
        log.info("access document %s reloaded", path)
        return True

    async def run(self, *, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.check()
