"""The local Kubernetes API as a process, a context manager, and a CLI command.

`batchpilot sandbox api --port PORT --kubeconfig FILE [--crds DIR]` serves the API on
127.0.0.1 in the foreground until Ctrl-C/SIGTERM, with the project's CRDs installed and a
kubeconfig written for kubectl (`kubectl --validate=false ...`), kopf and the official
client. Tests and the sandbox use the same server programmatically:

    async with LocalKubernetesAPI(crds=["crds"]) as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        ...
        assert api.writes.count("deployments.apps") == 0

or, for synchronous code (the official client, kopf's `KopfRunner`, subprocesses):

    with LocalKubernetesAPI(crds=["crds"]).threaded() as api:
        ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp.web
import yaml

from batchpilot.sandbox import background, errors
from batchpilot.sandbox import crds as crd_files
from batchpilot.sandbox.emulator import SandboxEmulator
from batchpilot.sandbox.store import Store
from batchpilot.sandbox.writelog import WriteLog

logger = logging.getLogger("batchpilot.sandbox")
HOST = background.HOST
CONTEXT = "batchpilot-sandbox"
T = TypeVar("T")


class LocalKubernetesAPI:
    """A Kubernetes API on 127.0.0.1 backed by `SandboxEmulator` (kmock + real semantics)."""

    def __init__(
        self,
        *,
        crds: Iterable[Path | str | Mapping[str, Any]] = (),
        port: int = 0,
        namespaces: Iterable[str] = (),
        clock: Callable[[], datetime.datetime] | None = None,
        seed: int | None = None,
        history_limit: int | None = 100,
        write_limit: int | None = None,
        request_limit: int | None = None,
        watch_log_limit: int = 10_000,
        log_requests: bool = False,
    ) -> None:
        self._crd_sources = list(crds)
        self._port = port
        self._namespaces = list(namespaces)
        self._emulator_options: dict[str, Any] = {
            "clock": clock,
            "seed": seed,
            "history_limit": history_limit,
            "write_limit": write_limit,
            "request_limit": request_limit,
            "watch_log_limit": watch_log_limit,
        }
        self._log_requests = log_requests
        self._emulator: SandboxEmulator | None = None
        self._runner: aiohttp.web.ServerRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bound_port: int | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def _crd_documents(self) -> list[Mapping[str, Any]]:
        documents: list[Mapping[str, Any]] = []
        paths: list[Path | str] = []
        for source in self._crd_sources:
            if isinstance(source, Mapping):
                documents.append(source)
            else:
                paths.append(source)
        return crd_files.load_documents(paths) + documents

    async def __aenter__(self) -> Self:
        emulator = SandboxEmulator(**self._emulator_options)
        emulator.log_requests = self._log_requests
        await emulator.__aenter__()
        try:
            for crd in self._crd_documents():
                emulator.store.install_crd(crd)
            for namespace in self._namespaces:
                emulator.store.ensure_namespace(namespace)
            runner, port = await background.listen(emulator, port=self._port)
        except BaseException:
            await emulator.__aexit__(None, None, None)
            raise
        self._emulator = emulator
        self._runner = runner
        self._loop = asyncio.get_running_loop()
        self._bound_port = port
        emulator.server_address = f"{HOST}:{self._bound_port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        emulator, runner = self._emulator, self._runner
        self._emulator = self._runner = None
        if emulator is not None:
            emulator.close()  # end the watch streams, or the server would wait for them
        if runner is not None:
            await runner.cleanup()
        if emulator is not None:
            await emulator.__aexit__(exc_type, exc, tb)

    @contextlib.contextmanager
    def threaded(self) -> Iterator[Self]:
        """Serve from a background thread with its own event loop (for synchronous callers)."""
        with background.in_thread(lambda: self, name="batchpilot-sandbox-api"):
            yield self

    # --- what callers use ----------------------------------------------------------------------

    @property
    def emulator(self) -> SandboxEmulator:
        if self._emulator is None:
            raise RuntimeError("the API is not running (use `async with` or `.threaded()`)")
        return self._emulator

    @property
    def store(self) -> Store:
        """The objects, directly; not thread-safe: from another thread, use `call()`."""
        return self.emulator.store

    @property
    def writes(self) -> WriteLog:
        """Every POST/PUT/PATCH/DELETE that reached the API (see `WriteLog.count`)."""
        return self.emulator.writes

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("the API is not running")
        return self._bound_port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's event loop (thread-safe; the store is not)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the API is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return fn()

        async def wrapper() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), loop).result(timeout=30)

    def kubeconfig(self, *, context: str = CONTEXT, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {}}],
            "contexts": [
                {
                    "name": context,
                    "context": {"cluster": context, "user": context, "namespace": namespace},
                }
            ],
            "current-context": context,
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: Path | str, *, context: str = CONTEXT, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this server (atomically, mode 0600) and return its path."""
        target = Path(path).expanduser().resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(
            self.kubeconfig(context=context, namespace=namespace), sort_keys=False
        )
        fd, temporary = tempfile.mkstemp(prefix=".kubeconfig-", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(temporary, 0o600)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return target


# --- CLI ---------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `batchpilot sandbox api`."""
    parser.add_argument(
        "--port", type=int, default=0, help="port on 127.0.0.1 (default: 0, any free port)"
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path("sandbox.kubeconfig"),
        help="where to write the kubeconfig for this API (default: ./sandbox.kubeconfig)",
    )
    parser.add_argument(
        "--crds",
        type=Path,
        default=None,
        help="directory or file of CustomResourceDefinitions to install (default: ./crds)",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NAME",
        help="create this namespace too (repeatable; default, kube-system, ... always exist)",
    )
    parser.add_argument("--log-requests", action="store_true", help="log every request")


def crd_sources(crds: Path | None) -> list[Path | str | Mapping[str, Any]] | None:
    """What `--crds` names (default: ./crds when present); None when it names nothing."""
    if crds is None:
        default = Path("crds")
        if default.is_dir():
            return [default]
        print(f"note: no {default}/ here; serving without CRDs", file=sys.stderr)
        return []
    if not crds.exists():
        print(f"error: --crds {crds}: no such file or directory", file=sys.stderr)
        return None
    return [crds]


async def serve(
    *,
    port: int,
    kubeconfig: Path,
    sources: list[Path | str | Mapping[str, Any]],
    namespaces: Iterable[str] = (),
    log_requests: bool = False,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve until `stop` is set (or SIGINT/SIGTERM); 0 on a clean stop, 2 on bad input."""
    api = LocalKubernetesAPI(
        crds=sources,
        port=port,
        namespaces=namespaces,
        history_limit=20,
        write_limit=10_000,
        request_limit=1_000,
        log_requests=log_requests,
    )
    try:
        async with api:
            path = api.write_kubeconfig(kubeconfig)
            served = sorted({rt.qualified for rt in api.store.registry if rt.custom})
            print(
                f"batchpilot sandbox: Kubernetes API (kmock emulator) on {api.url}\n"
                f"  CRDs:       {', '.join(served) or '(none)'}\n"
                f"  kubeconfig: {path}\n"
                f"  try:        KUBECONFIG={path} kubectl --validate=false get all\n"
                "  (no OpenAPI documents are served, so kubectl needs --validate=false)\n"
                "Ctrl-C stops it.",
                flush=True,
            )
            stop = stop or asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signum, stop.set)
            try:
                await stop.wait()
            finally:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                        loop.remove_signal_handler(signum)
            print("batchpilot sandbox: stopping", flush=True)
    except crd_files.CRDLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except errors.ApiError as exc:
        print(f"error: a CRD was refused: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot serve on {HOST}:{port}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(args: argparse.Namespace) -> int:
    """Run `batchpilot sandbox api` with parsed arguments."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sources = crd_sources(args.crds)
    if sources is None:
        return 2
    try:
        return asyncio.run(
            serve(
                port=args.port,
                kubeconfig=args.kubeconfig,
                sources=sources,
                namespaces=args.namespace,
                log_requests=args.log_requests,
            )
        )
    except KeyboardInterrupt:
        return 0
