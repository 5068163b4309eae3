"""The sandbox's kubelet: runs the runtime processes that batchpilot's Deployments ask for.

There is no kubelet and no container engine on the machines the sandbox runs on, so this
plays both, honestly and in the open: it watches (polls, twice a second) the Deployments that
InferenceServices own, and for each desired replica starts `batchpilot runtime serve` with the
arguments the Deployment's container asks for — rewritten only where a pod and a process
differ: loopback host, free ports (one per listener), the model path mapped from `/models/...`
to a local directory, the mounted ConfigMap and Secret replaced by files this runner keeps in
sync with the API. A replica waits `start_delay_s` before its process starts (image pull and cold
start), becomes Ready when `GET /v2/health/ready` answers, and is restarted when it crashes.
Pods and Deployment status are reported back into the API, so the operator and kubectl see
what a cluster would show; the ready endpoints go to the sandbox's Service proxy and every
running process to Prometheus' file-based discovery.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchpilot.operator.children.common import MANAGED_BY
from batchpilot.sandbox.prometheus import free_ports

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


@dataclass
class Replica:
    """One pod: its object name, its process, its state."""

    name: str
    namespace: str
    deployment: str
    directory: Path
    start_at: float
    template: str
    """The hash of the Deployment's pod template it was made from (pod-template-hash)."""
    container: Mapping[str, Any]
    port: int = 0
    grpc_port: int = 0
    admin_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    restarts: int = 0
    reported: dict[str, Any] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_endpoint(self) -> str:
        """Where Prometheus scrapes it: the metrics port when the pod has one."""
        return f"127.0.0.1:{self.metrics_port or self.port}"


@dataclass(frozen=True)
class Endpoints:
    """What the runner found after a pass: ready endpoints per Deployment, scrape targets."""

    ready: Mapping[tuple[str, str], Sequence[str]]
    scrape: Sequence[tuple[str, Mapping[str, str]]]


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


class PodRunner:
    """Converges running processes to the Deployments' replicas; call `run_in_thread()`."""

    def __init__(
        self,
        api_url: str,
        *,
        workdir: Path,
        models_dir: Path,
        start_delay_s: float = 3.0,
        pre_stop_s: float = 1.5,
        poll_s: float = 0.5,
        on_endpoints: Callable[[Endpoints], None] | None = None,
    ) -> None:
        self.api = API(api_url)
        self.workdir = workdir
        self.models_dir = models_dir
        self.start_delay_s = start_delay_s
        self.pre_stop_s = pre_stop_s
        self.poll_s = poll_s
        self.on_endpoints = on_endpoints
        self.replicas: dict[str, Replica] = {}
        self.terminating: list[tuple[subprocess.Popen[bytes], float, float]] = []
        """Removed pods' processes: (process, SIGTERM at, SIGKILL at); SIGTERM sent: 0."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_endpoints: Endpoints | None = None
        self._reported_deployments: dict[str, dict[str, Any]] = {}
        self.started_pids: list[int] = []

    # -- lifecycle -------------------------------------------------------------------------
    def run_in_thread(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="podrunner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # keep playing the kubelet; say what broke
                self.errors.append(repr(exc))
            self._stop.wait(self.poll_s)

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every process this runner started: SIGTERM, then SIGKILL after `grace_s`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        processes = [r.process for r in self.replicas.values() if r.process is not None]
        processes += [p for p, _, _ in self.terminating]
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.replicas.clear()
        self.terminating.clear()

    def pids(self) -> list[int]:
        """Every process this runner has running now (for hygiene checks)."""
        found = [r.process.pid for r in self.replicas.values() if r.process is not None]
        return found + [p.pid for p, _, _ in self.terminating]

    # -- one pass --------------------------------------------------------------------------
    def sync_once(self) -> None:
        listing = self.api.call(
            "/apis/apps/v1/deployments?" + urllib.parse.urlencode({"labelSelector": SELECTOR})
        )
        deployments = {
            (d["metadata"]["namespace"], d["metadata"]["name"]): d
            for d in (listing or {}).get("items", [])
        }
        for replica in list(self.replicas.values()):
            if (replica.namespace, replica.deployment) not in deployments:
                self._remove(replica, delete_pod=False)
        for (namespace, name), deployment in deployments.items():
            self._converge(namespace, name, deployment)
        self._reap()
        self._publish(deployments)

    def _converge(self, namespace: str, name: str, deployment: dict[str, Any]) -> None:
        now = time.monotonic()
        desired = int(deployment["spec"].get("replicas", 1))
        template = template_hash(deployment)
        mine = [
            r for r in self.replicas.values() if (r.namespace, r.deployment) == (namespace, name)
        ]
        fresh = [r for r in mine if r.template == template]
        outdated = [r for r in mine if r.template != template]
        doomed: list[Replica] = []
        if len(fresh) > desired:
            # Like a ReplicaSet: not-ready pods go first, then the youngest.
            doomed = sorted(fresh, key=lambda r: (r.ready, -r.start_at))[: len(fresh) - desired]
            doomed += outdated
        elif outdated:
            # A rolling update, maxSurge 1 and maxUnavailable 0 (what the operator asks for):
            # one new pod at a time; an old one goes once every new one is ready.
            if len(fresh) < desired and len(mine) < desired + 1:
                mine.append(self._create(namespace, name, deployment, now))
            elif all(r.ready for r in fresh) and len(fresh) + len(outdated) > desired:
                doomed = sorted(outdated, key=lambda r: (r.ready, r.start_at))[:1]
        else:
            while len(mine) < desired:
                mine.append(self._create(namespace, name, deployment, now))
        for replica in doomed:
            self._remove(replica, delete_pod=True)
            mine.remove(replica)
        files = self._file_sources(namespace, deployment)
        for replica in mine:
            self._write_files(replica, files)
            self._advance(replica, now)
        self._report_deployment(namespace, name, deployment, mine, template)

    def _file_sources(self, namespace: str, deployment: dict[str, Any]) -> dict[str, bytes]:
        """The mounted ConfigMap and Secret, as file contents by name."""
        files: dict[str, bytes] = {}
        for volume in deployment["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                cm = self.api.call(
                    f"/api/v1/namespaces/{namespace}/configmaps/{volume['configMap']['name']}"
                )
                for key, value in ((cm or {}).get("data") or {}).items():
                    files[key] = str(value).encode()
            if "secret" in volume:
                secret = self.api.call(
                    f"/api/v1/namespaces/{namespace}/secrets/{volume['secret']['secretName']}"
                )
                folder = f"{API_KEYS_FOLDER}/" if volume.get("name") == API_KEYS_FOLDER else ""
                for key, value in ((secret or {}).get("data") or {}).items():
                    files[folder + key] = base64.b64decode(value)
        return files

    def _write_files(self, replica: Replica, files: Mapping[str, bytes]) -> None:
        prefix = f"{API_KEYS_FOLDER}/"
        keys = {k.removeprefix(prefix): v for k, v in files.items() if k.startswith(prefix)}
        if keys:
            publish_folder(replica.directory / API_KEYS_FOLDER, keys)
        for key, content in files.items():
            if key.startswith(prefix):
                continue
            path = replica.directory / key
            if not path.exists() or path.read_bytes() != content:
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(content)
                tmp.replace(path)  # atomic, like the kubelet's symlink swap

    def _create(self, namespace: str, name: str, deployment: dict[str, Any], now: float) -> Replica:
        pod_name = f"{name}-{secrets.token_hex(3)}"
        directory = self.workdir / "pods" / pod_name
        directory.mkdir(parents=True, exist_ok=True)
        template = deployment["spec"]["template"]
        containers = [dict(c) for c in template["spec"]["containers"]]
        replica = Replica(
            pod_name,
            namespace,
            name,
            directory,
            start_at=now + self.start_delay_s,
            template=template_hash(deployment),
            container=dict(containers[0]),
        )
        replica.port, replica.grpc_port, replica.admin_port, metrics_port = free_ports(4)
        named = {"http": replica.port, "grpc": replica.grpc_port, "admin": replica.admin_port}
        if "--metrics-port" in containers[0].get("args", []):
            replica.metrics_port = named["metrics"] = metrics_port
        containers[0]["ports"] = [
            {"name": name, "containerPort": port} for name, port in named.items()
        ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": namespace,
                "labels": dict(template["metadata"].get("labels", {})),
                "annotations": dict(template["metadata"].get("annotations", {})),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": name,
                        "uid": deployment["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {**template["spec"], "containers": containers, "nodeName": "sandbox"},
        }
        self.api.call(f"/api/v1/namespaces/{namespace}/pods", "POST", pod)
        self.replicas[pod_name] = replica
        self._report_pod(replica, phase="Pending")
        return replica

    def _advance(self, replica: Replica, now: float) -> None:
        container = replica.container
        if replica.process is None:
            if now < replica.start_at:
                return
            command = container_command(
                container,
                port=replica.port,
                grpc_port=replica.grpc_port,
                admin_port=replica.admin_port,
                metrics_port=replica.metrics_port or None,
                models_dir=self.models_dir,
                directory=replica.directory,
            )
            env = {
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                **{e["name"]: str(e.get("value", "")) for e in container.get("env", [])},
            }
            with (replica.directory / "runtime.log").open("ab") as log:
                replica.process = subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=False
                )
            self.started_pids.append(replica.process.pid)
            self._report_pod(replica, phase="Running")
            return
        if replica.process.poll() is not None:
            # Crashed: CrashLoopBackOff, briefly; the same pod restarts its container.
            replica.ready = False
            replica.restarts += 1
            replica.process = None
            replica.start_at = now + min(10.0, 1.0 * replica.restarts)
            self._report_pod(replica, phase="Running")
            return
        ready = _healthy(f"http://{replica.endpoint}/v2/health/ready")
        if ready != replica.ready:
            replica.ready = ready
            self._report_pod(replica, phase="Running")

    def _remove(self, replica: Replica, *, delete_pod: bool) -> None:
        self.replicas.pop(replica.name, None)
        replica.ready = False
        if replica.process is not None and replica.process.poll() is None:
            # The pre-stop pause: the endpoint leaves the Service (published at the end of this
            # pass) before SIGTERM makes the runtime refuse new requests and drain.
            now = time.monotonic()
            self.terminating.append((replica.process, now + self.pre_stop_s, now + 30))
        if delete_pod:
            with contextlib.suppress(urllib.error.HTTPError):
                self.api.call(
                    f"/api/v1/namespaces/{replica.namespace}/pods/{replica.name}", "DELETE"
                )

    def _reap(self) -> None:
        now = time.monotonic()
        still: list[tuple[subprocess.Popen[bytes], float, float]] = []
        for process, term_at, kill_at in self.terminating:
            if process.poll() is None:
                if now > kill_at:
                    process.kill()
                elif term_at <= now and term_at > 0:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)  # the runtime drains, then exits
                    term_at = 0
                still.append((process, term_at, kill_at))
        self.terminating = still

    # -- reporting -------------------------------------------------------------------------
    def _report_pod(self, replica: Replica, *, phase: str) -> None:
        ready = "True" if replica.ready else "False"
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1" if replica.process is not None else None,
            "conditions": [
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "containerStatuses": [
                {
                    "name": "runtime",
                    "ready": replica.ready,
                    "started": replica.process is not None,
                    "restartCount": replica.restarts,
                }
            ],
        }
        if status == replica.reported:
            return
        with contextlib.suppress(urllib.error.HTTPError):
            self.api.call(
                f"/api/v1/namespaces/{replica.namespace}/pods/{replica.name}/status",
                "PATCH",
                {"status": status},
                patch=True,
            )
            replica.reported = status

    def _report_deployment(
        self,
        namespace: str,
        name: str,
        deployment: dict[str, Any],
        mine: Sequence[Replica],
        template: str,
    ) -> None:
        ready = sum(r.ready for r in mine)
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(mine),
            "updatedReplicas": sum(r.template == template for r in mine),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": len(mine) - ready,
        }
        key = f"{namespace}/{name}"
        current = {k: deployment.get("status", {}).get(k) for k in status}
        if status == current and self._reported_deployments.get(key) == status:
            return
        self.api.call(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status",
            "PATCH",
            {"status": status},
            patch=True,
        )
        self._reported_deployments[key] = status

    def _publish(self, deployments: Mapping[tuple[str, str], Any]) -> None:
        ready: dict[tuple[str, str], list[str]] = {key: [] for key in deployments}
        scrape: list[tuple[str, Mapping[str, str]]] = []
        for replica in sorted(self.replicas.values(), key=lambda r: r.name):
            if replica.process is None:
                continue
            scrape.append((replica.metrics_endpoint, {"pod": replica.name}))
            if replica.ready:
                ready.setdefault((replica.namespace, replica.deployment), []).append(
                    replica.endpoint
                )
        endpoints = Endpoints(ready=ready, scrape=scrape)
        if endpoints != self._last_endpoints and self.on_endpoints is not None:
            self.on_endpoints(endpoints)
        self._last_endpoints = endpoints


def template_hash(deployment: Mapping[str, Any]) -> str:
    text = json.dumps(deployment["spec"]["template"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
