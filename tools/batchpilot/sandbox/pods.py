"""What a Pod's container becomes on a machine without a kubelet: a local command line and files.

The sandbox's pod runner (podrunner.py) decides which pods exist; this module says how one of
them is made local. The container's `batchpilot runtime serve` flags are kept, except where a pod
and a process differ — loopback host, a free port per listener, the model path mapped from
`/models/...` to a local folder, the mounted ConfigMap and Secret replaced by files the runner
keeps in sync (`publish_folder` updates a folder as the kubelet updates a mounted Secret).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchpilot.operator.children.common import MANAGED_BY
from batchpilot.sandbox.scheduling import NODE_NAME

SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
_REWRITTEN = {
    "--host",
    "--port",
    "--grpc-port",
    "--admin-port",
    "--metrics-port",
    "--model",
    "--batching-config",
    "--admin-token-file",
    "--api-keys",
    "--access-config",
}
API_KEYS_FOLDER = "api-keys"
"""The replica's folder for the API keys' Secret (the volume the operator names so): a folder of
its own, updated as the kubelet updates one (`publish_folder`), since the runtime reads every
file in it as a key."""


class API:
    """Just enough of a Kubernetes client for the runner: JSON over urllib."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, path: str, method: str = "GET", body: Any = None, *, patch: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        content = "application/merge-patch+json" if patch else "application/json"
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": content}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


def publish_folder(folder: Path, files: Mapping[str, bytes]) -> None:
    """Make `folder` hold exactly `files`, as the kubelet updates a mounted Secret: the new
    version in a fresh `..<n>` folder, the `..data` symlink swapped to it in one rename, one
    symlink per file through `..data`. Nothing is written when nothing changed."""
    data = folder / "..data"
    if data.is_symlink():
        current = data.resolve()
        names = sorted(p.name for p in current.iterdir())
        if names == sorted(files) and all((current / n).read_bytes() == files[n] for n in names):
            return
    folder.mkdir(parents=True, exist_ok=True)
    old = os.readlink(data) if data.is_symlink() else None
    version = folder / f"..{time.time_ns()}"
    version.mkdir()
    for name, content in files.items():
        (version / name).write_bytes(content)
    (folder / "..data_tmp").symlink_to(version.name)
    os.replace(folder / "..data_tmp", data)
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    for entry in os.listdir(folder):
        if not entry.startswith("..") and entry not in files:
            (folder / entry).unlink()
    if old is not None:
        shutil.rmtree(folder / old, ignore_errors=True)


def container_command(
    container: Mapping[str, Any],
    *,
    port: int,
    models_dir: Path,
    directory: Path,
    grpc_port: int | None = None,
    admin_port: int | None = None,
    metrics_port: int | None = None,
) -> list[str]:
    """The process for a runtime container: its args, with the pod-only parts made local.
    Every pod shares the loopback host, so each listener gets a free port of its own: the
    admin endpoint `admin_port` always (the runtime's default is one fixed port); gRPC
    `grpc_port` and metrics `metrics_port` when the container serves them and a port is given."""
    args = [str(a) for a in container.get("args", [])]
    out: list[str] = []
    model = ""
    serves_grpc = serves_metrics = keyed = False
    i = 0
    while i < len(args):
        if args[i] in _REWRITTEN and i + 1 < len(args):
            if args[i] == "--model":
                model = args[i + 1]
            keyed = keyed or args[i] == "--api-keys"
            serves_grpc = serves_grpc or args[i] == "--grpc-port"
            serves_metrics = serves_metrics or args[i] == "--metrics-port"
            i += 2
            continue
        out.append(args[i])
        i += 1
    local_model = models_dir / Path(model).name if model.startswith("/models/") else Path(model)
    out += [
        "--model", str(local_model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--batching-config", str(directory / "batching.json"),
        "--admin-token-file", str(directory / "admin-token"),
    ]  # fmt: skip
    if keyed:
        out += [
            "--api-keys", str(directory / API_KEYS_FOLDER),
            "--access-config", str(directory / "access.json"),
        ]  # fmt: skip
    if serves_grpc and grpc_port is not None:
        out += ["--grpc-port", str(grpc_port)]
    if admin_port is not None:
        out += ["--admin-port", str(admin_port)]
    if serves_metrics and metrics_port is not None:
        out += ["--metrics-port", str(metrics_port)]
    return [sys.executable, "-m", "batchpilot.runtime.cli", *out]


DEFAULT_GRACE_S = 30.0
"""The kubelet's terminationGracePeriodSeconds when a pod spec gives none."""
_SLEEP = re.compile(r"(?:^|\s)sleep\s+(\d+(?:\.\d+)?)(?:s)?(?:\s|$)")


def termination(pod_spec: Mapping[str, Any]) -> tuple[float, float]:
    """(pre-stop pause, grace period) in seconds, as the kubelet reads them from a pod spec.

    The pause is the first container's preStop hook when it is a sleep: the `sleep` action, or
    an `exec` whose command sleeps (`["sleep", "5"]`, `["sh", "-c", "sleep 5"]`); any other hook
    has nothing to run here and pauses for nothing. The kubelet runs the hook inside the grace
    period, so the pause is at most the grace period.
    """
    grace = float(pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
    containers = pod_spec.get("containers") or [{}]
    hook = (containers[0].get("lifecycle") or {}).get("preStop") or {}
    pause = 0.0
    if "sleep" in hook:
        pause = float(hook["sleep"].get("seconds", 0))
    elif "exec" in hook:
        found = _SLEEP.search(" ".join(str(part) for part in hook["exec"].get("command", [])))
        pause = float(found.group(1)) if found else 0.0
    return min(pause, grace), grace


def template_hash(deployment: Mapping[str, Any]) -> str:
    text = json.dumps(deployment["spec"]["template"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def healthy(url: str, *, timeout_s: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def serve_flags(command: Sequence[str]) -> list[str]:
    """The `runtime serve` flags of a `container_command`: what the pod host takes."""
    args = list(command[3:])  # python -m batchpilot.runtime.cli
    return args[2:] if args[:2] == ["runtime", "serve"] else args


def pod_object(
    name: str,
    deployment: Mapping[str, Any],
    containers: Sequence[Mapping[str, Any]],
    *,
    node: str | None = NODE_NAME,
) -> dict[str, Any]:
    """The Pod a ReplicaSet would make from `deployment`'s template, with these containers,
    bound to `node` (None: not yet scheduled)."""
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": deployment["metadata"]["namespace"],
            "labels": dict(template["metadata"].get("labels", {})),
            "annotations": dict(template["metadata"].get("annotations", {})),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": deployment["metadata"]["name"],
                    "uid": deployment["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            **template["spec"],
            "containers": list(containers),
            **({} if node is None else {"nodeName": node}),
        },
    }


LOG_TAIL_BYTES = 2048
LOG_TAIL_LINES = 80


def log_tail(path: Path) -> str:
    """The end of a container's log as the kubelet makes it a termination message under
    `FallbackToLogsOnError`: at most the last 80 lines and 2,048 bytes; "" without a log."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
            tail = log.read()
    except FileNotFoundError:
        return ""
    lines = tail.decode("utf-8", "replace").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(lines)


def pod_status(
    phase: str,
    *,
    ready: bool,
    started: bool,
    restarts: int,
    waiting: dict[str, str] | None = None,
    last_exit: dict[str, Any] | None = None,
    scheduled: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod's status as the kubelet reports it, for one container named `runtime`: `waiting`
    (reason, message) while it waits to restart, `last_exit` (exitCode, reason, message — the
    log's tail, as `terminationMessagePolicy: FallbackToLogsOnError` gives it) once it exited;
    `scheduled`, its PodScheduled condition, first among the conditions."""
    flag = "True" if ready else "False"
    container: dict[str, Any] = {
        "name": "runtime",
        "ready": ready,
        "started": started,
        "restartCount": restarts,
    }
    if waiting is not None:
        container["state"] = {"waiting": waiting}
    if last_exit is not None:
        container["lastState"] = {"terminated": last_exit}
    return {
        "phase": phase,
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1" if started else None,
        "conditions": [
            *([] if scheduled is None else [dict(scheduled)]),
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ],
        "containerStatuses": [container],
    }


def reserve_ports(count: int) -> list[socket.socket]:
    """`count` distinct free loopback ports, each held by a bound (not listening) socket until
    the caller closes it — right before the pod's server binds it. A port chosen and let go at
    once can be handed out again by the kernel before the pod starts, seconds later, and two
    pods of a burst then ask for the same port."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
    except OSError:
        release(held)
        raise
    return held


def hold_ports(ports: Sequence[int]) -> list[socket.socket]:
    """Hold these ports again where they are free (a crashed pod's, until it restarts)."""
    held = []
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        held.append(sock)
    return held


def release(sockets: Sequence[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
