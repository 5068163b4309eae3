"""The sandbox's kubelet: runs the runtime pods that batchpilot's Deployments ask for.

There is no kubelet and no container engine on the machines the sandbox runs on, so this
plays both, honestly and in the open: every pass (twice a second by default) it lists the
Deployments that InferenceServices own, and the ConfigMaps and Secrets their pods mount, and for
each desired replica starts `batchpilot runtime serve` with the arguments the Deployment's
container asks for, made local (pods.py). A replica waits `start_delay_s` before it starts
(image pull and cold start), becomes Ready when `GET /v2/health/ready` answers, and is
restarted when it crashes or its livenessProbe fails (`_liveness_failed`). A pod that goes (a
scale-down, a rolling update) leaves the Service's endpoints at once and gets SIGTERM after its
container's preStop pause, SIGKILL at the end of its terminationGracePeriodSeconds, both as its
pod spec says (pods.termination). Pods and
Deployment status are reported back into the API, so the operator and kubectl see what a cluster
would show; the ready endpoints go to the sandbox's Service proxy and every running pod to
Prometheus' file-based discovery.

With a pod host (hosting.py), pods of the simulated engine are served by that one process
instead of a process each, which is what lets the sandbox hold a fleet: the runner plays the
kubelet for them all the same, and learns their readiness in one request per pass.

It also plays a node that dies (`lose_node`, nodes.py): the pods on it stop answering, are
marked not Ready after the node controller's notice, and are deleted and replaced only at their
eviction; meanwhile nothing probes, restarts or drains them.

Pods are made and deleted as the ReplicaSet and Deployment controllers would (rolling.py),
rollouts following the Deployment's maxSurge and maxUnavailable. With `node_gpus` the node has
that many GPUs, and the runner plays the scheduler too (scheduling.py): a pod asking for a GPU
that no pod frees waits Pending and Unschedulable, and is bound, then started, once one does.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import math
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchpilot.sandbox.hosting import HostedPod, HostRefused, PodHostClient, hostable
from batchpilot.sandbox.nodes import Unreachable, marked_not_ready, unreachable_toleration_s
from batchpilot.sandbox.pods import (
    API,
    API_KEYS_FOLDER,
    SELECTOR,
    container_command,
    healthy,
    hold_ports,
    log_tail,
    pod_object,
    pod_status,
    publish_folder,
    release,
    reserve_ports,
    serve_flags,
    template_hash,
    termination,
)
from batchpilot.sandbox.processes import stop_processes
from batchpilot.sandbox.rolling import PodView, Step, rolling_limits, step
from batchpilot.sandbox.scheduling import (
    NODE_NAME,
    GpuRequest,
    Waiting,
    bind_in_order,
    gpu_request,
    held,
    scheduled_condition,
    unschedulable_condition,
    unscheduled_status,
)

__all__ = [
    "API",
    "API_KEYS_FOLDER",
    "Endpoints",
    "PodRunner",
    "Replica",
    "container_command",
    "publish_folder",
]

Key = tuple[str, str]
"""(namespace, name)"""


HOST_STARTS_AT_ONCE = 16
"""Hosted pods the runner has the pod host start at once."""
PORT_TAKEN = "[Errno 98]"
"""What a runtime that cannot bind its port says as it exits (EADDRINUSE)."""


@dataclass
class Replica:
    """One pod: its object name, what runs it, its state."""

    name: str
    namespace: str
    deployment: str
    directory: Path
    start_at: float
    template: str
    """The hash of the Deployment's pod template it was made from (pod-template-hash)."""
    container: Mapping[str, Any]
    pre_stop_s: float = 0.0
    """Its preStop pause: from removal to SIGTERM."""
    grace_s: float = 30.0
    """Its terminationGracePeriodSeconds: from removal to SIGKILL."""
    port: int = 0
    grpc_port: int = 0
    admin_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    hosted_in_pass: int | None = None
    """The pass in which the pod host took this pod (None: not hosted, or not started)."""
    hosting: Future[None] | None = None
    """The pod host starting it (its PUT in flight: a pod's start-up takes as long as its
    runtime's does, the batches it times included), until a pass sees the answer."""
    ready: bool = False
    restarts: int = 0
    waiting: dict[str, str] | None = None
    """Why its container is not running (CrashLoopBackOff, until it restarts)."""
    last_exit: dict[str, Any] | None = None
    """How its container last exited: the kubelet's lastState.terminated."""
    reported: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    """The mounted files as last written, so that a pass compares in memory."""
    held: list[socket.socket] = field(default_factory=list)
    """Its ports, held until its server starts (`pods.reserve_ports`)."""
    created_at: float = 0.0
    toleration_s: float | None = None
    """How long its spec tolerates an unreachable node (None: it names no toleration)."""
    unreachable: Unreachable | None = None
    """Set when its node is lost: it answers nothing, and no kubelet looks after it."""
    throttled: bool = False
    """Its device throttles (`PodRunner.throttle`)."""
    gpus: GpuRequest | None = None
    """The GPUs its container asks for (None: none)."""
    bound: bool = True
    live_failures: int = 0
    """Its liveness probe's failures in a row."""
    live_probed_at: float = 0.0
    """When its liveness was last probed (0: not since its container started up)."""
    """Scheduled to the node; an unbound pod waits for room (`start_at` is infinite until it
    is bound)."""
    bound_since: str = ""
    """When it was bound (RFC 3339): its PodScheduled condition's lastTransitionTime."""
    unschedulable: dict[str, Any] | None = None
    """The scheduler's PodScheduled condition while it waits for room."""

    @property
    def ports(self) -> list[int]:
        return [p for p in (self.port, self.grpc_port, self.admin_port, self.metrics_port) if p]

    @property
    def started(self) -> bool:
        return (
            self.process is not None or self.hosted_in_pass is not None or self.hosting is not None
        )

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_endpoint(self) -> str:
        """Where Prometheus scrapes it: the metrics port when the pod has one."""
        return f"127.0.0.1:{self.metrics_port or self.port}"


def container_env(container: Mapping[str, Any], replica: Replica) -> dict[str, str]:
    """The container's env as the kubelet gives it: values, and the downward API's pod fields
    (`valueFrom.fieldRef`: the pod's IP is the loopback address every sandbox pod listens on)."""
    fields = {
        "status.podIP": "127.0.0.1",
        "metadata.name": replica.name,
        "metadata.namespace": replica.namespace,
    }
    env: dict[str, str] = {}
    for item in container.get("env", []):
        field_path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[item["name"]] = fields.get(field_path, "") if field_path else str(item.get("value", ""))
    return env


@dataclass(frozen=True)
class Endpoints:
    """What the runner found after a pass: ready endpoints per Deployment, scrape targets."""

    ready: Mapping[Key, Sequence[str]]
    scrape: Sequence[tuple[str, Mapping[str, str]]]


class PodRunner:
    """Converges running pods to the Deployments' replicas; call `run_in_thread()`."""

    def __init__(
        self,
        api_url: str,
        *,
        workdir: Path,
        models_dir: Path,
        start_delay_s: float = 3.0,
        pre_stop_s: float | None = None,
        poll_s: float = 0.5,
        on_endpoints: Callable[[Endpoints], None] | None = None,
        pod_host: PodHostClient | None = None,
        node_gpus: int | None = None,
    ) -> None:
        self.api = API(api_url)
        self.workdir = workdir
        self.models_dir = models_dir
        self.start_delay_s = start_delay_s
        self.pre_stop_s = pre_stop_s
        """The pause before SIGTERM for every pod; None: each pod's own preStop sleep."""
        self.poll_s = poll_s
        self.on_endpoints = on_endpoints
        self.pod_host = pod_host
        """Where simulated pods run; None: every pod is a process of its own."""
        if node_gpus is not None and node_gpus < 0:
            raise ValueError(f"a node has 0 GPUs or more, not {node_gpus}")
        self.node_gpus = node_gpus
        """The node's GPUs (of each GPU resource pods ask for); None: no limit, no scheduler."""
        self.replicas: dict[str, Replica] = {}
        self.terminating: list[tuple[subprocess.Popen[bytes], float, float]] = []
        """Removed pods' processes: (process, SIGTERM at, SIGKILL at); SIGTERM sent: 0."""
        self.leaving_host: list[tuple[str, float]] = []
        """Removed hosted pods: (name, when the host is told to drain it)."""
        self.errors: list[str] = []
        self.passes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_endpoints: Endpoints | None = None
        self._reported_deployments: dict[str, dict[str, Any]] = {}
        self._mounts: dict[str, dict[Key, Mapping[str, Any]]] = {}
        self._hosted: dict[str, HostedPod] = {}
        self._lock = threading.Lock()
        """Held by a pass, and by `lose_node` (called from another thread)."""
        self.started_pids: list[int] = []
        self.node_events: list[tuple[float, str]] = []
        """What happened to pods on the node — lost with it, waiting for room on it, bound to
        it: (monotonic time, what), in order."""
        self._refused: set[str] = set()
        """Errors said once (a Deployment's strategy the runner cannot follow)."""
        self._host_starts = (
            None
            if pod_host is None
            else ThreadPoolExecutor(HOST_STARTS_AT_ONCE, thread_name_prefix="podhost-start")
        )
        """Hosted pods start side by side, as a node's kubelet starts its pods: one at a time,
        each pass would wait out every new pod's start-up."""
        self._starting: dict[str, Future[None]] = {}
        """Hosted pods removed while the host was still starting them: drained once started."""

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
        """Stop every pod this runner started: processes get SIGTERM, then SIGKILL after
        `grace_s`; hosted pods are handed back to the host to drain."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        for replica in self.replicas.values():
            if replica.unreachable is not None and replica.process is not None:
                replica.process.kill()  # frozen: a SIGTERM would wait for a SIGCONT
        if self._host_starts is not None:
            self._host_starts.shutdown(wait=True, cancel_futures=True)
        if self.pod_host is not None:
            hosted = [
                r.name
                for r in self.replicas.values()
                if r.hosted_in_pass is not None or r.hosting is not None
            ]
            for name in hosted + [name for name, _ in self.leaving_host]:
                with contextlib.suppress(Exception):
                    self.pod_host.delete(name)
        for replica in self.replicas.values():
            release(replica.held)
        processes = [r.process for r in self.replicas.values() if r.process is not None]
        processes += [p for p, _, _ in self.terminating]
        stop_processes(processes, grace_s=grace_s)
        self.replicas.clear()
        self.terminating.clear()
        self.leaving_host.clear()

    def pids(self) -> list[int]:
        """Every process this runner has running now (for hygiene checks)."""
        found = [r.process.pid for r in self.replicas.values() if r.process is not None]
        return found + [p.pid for p, _, _ in self.terminating]

    # -- a node that dies -------------------------------------------------------------------
    def lose_node(
        self, namespace: str, deployment: str, *, count: int, notice_s: float, eviction_s: float
    ) -> list[str]:
        """The node of the Deployment's `count` oldest ready pods stops answering now: their
        processes are frozen (a hosted pod is cut off by the host), so what they hold and what
        is sent to them hangs. They stay Ready for `notice_s`, then are marked not Ready (and
        leave the endpoints), then after their toleration of the unreachable taint (`eviction_s`
        where their spec names none) are deleted, and replaced as any deleted pod is. Returns
        the pods' names (fewer than `count` when fewer are ready)."""
        with self._lock:
            now = time.monotonic()
            candidates = [
                r
                for r in self.replicas.values()
                if (r.namespace, r.deployment) == (namespace, deployment)
                and r.ready
                and r.unreachable is None
            ]
            lost = sorted(candidates, key=lambda r: r.created_at)[:count]
            for replica in lost:
                if replica.process is not None:
                    replica.process.send_signal(signal.SIGSTOP)
                elif self.pod_host is not None:
                    self.pod_host.cut_off(replica.name)
                tolerated_s = eviction_s if replica.toleration_s is None else replica.toleration_s
                replica.unreachable = Unreachable.starting(
                    now, notice_s=notice_s, eviction_s=tolerated_s
                )
                self.node_events.append(
                    (
                        now,
                        f"pod {replica.name}: its node stops answering; not Ready in "
                        f"{notice_s:g} s, evicted {tolerated_s:g} s later",
                    )
                )
            return [r.name for r in lost]

    # -- one pass --------------------------------------------------------------------------
    def sync_once(self) -> None:
        """One pass: a list each of Deployments, ConfigMaps and Secrets (never a read per
        pod), one listing from the pod host, then every Deployment converged."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        self.passes += 1
        self._deleted_through_the_api()
        listing = self.api.call(
            "/apis/apps/v1/deployments?" + urllib.parse.urlencode({"labelSelector": SELECTOR})
        )
        deployments = {
            (d["metadata"]["namespace"], d["metadata"]["name"]): d
            for d in (listing or {}).get("items", [])
        }
        self._mounts = {kind: self._list(kind) for kind in ("configmaps", "secrets")}
        if self.pod_host is not None:
            self._hosted = self.pod_host.pods()
        mine: dict[Key, list[Replica]] = collections.defaultdict(list)
        for replica in list(self.replicas.values()):
            key = (replica.namespace, replica.deployment)
            if key not in deployments:
                self._remove(replica, delete_pod=False)
            else:
                mine[key].append(replica)
        for key, deployment in deployments.items():
            self._converge(key, deployment, mine[key])
        self._schedule(time.monotonic())
        self._reap()
        self._publish(deployments)

    def _deleted_through_the_api(self) -> None:
        """Pods deleted by someone else (`kubectl delete pod`, the autopilot replacing a slow
        replica) are stopped as their kubelet stops them — preStop pause, SIGTERM, drain —
        and the Deployment's next convergence replaces them. One list a pass, as the runner
        lists the ConfigMaps and Secrets."""
        listing = self.api.call(
            "/api/v1/pods?" + urllib.parse.urlencode({"labelSelector": SELECTOR})
        )
        alive: set[Key] = set()
        going: set[Key] = set()
        for pod in (listing or {}).get("items", []):
            meta = pod["metadata"]
            key = (meta["namespace"], meta["name"])
            (going if meta.get("deletionTimestamp") else alive).add(key)
        now = time.monotonic()
        for replica in list(self.replicas.values()):
            key = (replica.namespace, replica.name)
            if key not in alive:
                self._remove(replica, delete_pod=key in going)
                self.node_events.append((now, f"pod {replica.name}: deleted through the API"))

    # -- a throttled pod ------------------------------------------------------------------
    def throttle(self, namespace: str, deployment: str) -> str | None:
        """The Deployment's oldest ready process pod's device throttles from now on, as a GPU
        at its power or thermal limit does: its runtime gets SIGUSR1, on which the simulated
        engine's batches take twice their time (`SimulatedEngine.throttle`). Returns the pod's
        name; None where no process pod is ready that is not throttled already (a hosted pod is
        not throttled)."""
        with self._lock:
            candidates = sorted(
                (
                    r
                    for r in self.replicas.values()
                    if (r.namespace, r.deployment) == (namespace, deployment)
                    and r.ready
                    and r.process is not None
                    and r.unreachable is None
                    and not r.throttled
                ),
                key=lambda r: r.created_at,
            )
            if not candidates:
                return None
            replica = candidates[0]
            assert replica.process is not None
            replica.process.send_signal(signal.SIGUSR1)
            replica.throttled = True
            self.node_events.append(
                (time.monotonic(), f"pod {replica.name}: its device throttles (batches 2× t(b))")
            )
            return replica.name

    def _list(self, kind: str) -> dict[Key, Mapping[str, Any]]:
        items = (self.api.call(f"/api/v1/{kind}") or {}).get("items", [])
        return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}

    def _converge(self, key: Key, deployment: dict[str, Any], mine: list[Replica]) -> None:
        now = time.monotonic()
        for replica in [r for r in mine if r.unreachable and now >= r.unreachable.evict_at]:
            # The unreachable taint outlasted its toleration: evicted, and so replaced below.
            self._remove(replica, delete_pod=True)
            mine.remove(replica)
            self.node_events.append((now, f"pod {replica.name}: evicted and deleted"))
        desired = int(deployment["spec"].get("replicas", 1))
        template = template_hash(deployment)
        decided = self._step(key, deployment, desired, mine, template)
        doomed = [r for r in mine if r.name in decided.delete]
        for _ in range(decided.create):
            mine.append(self._create(key, deployment, now))
        for replica in doomed:
            self._remove(replica, delete_pod=True)
            mine.remove(replica)
        files = self._file_sources(key[0], deployment)
        for replica in mine:
            if replica.unreachable is not None:
                self._advance_unreachable(replica, now)
                continue
            self._write_files(replica, files)
            self._advance(replica, now)
        self._report_deployment(key, deployment, mine, template)

    def _step(
        self,
        key: Key,
        deployment: dict[str, Any],
        desired: int,
        mine: Sequence[Replica],
        template: str,
    ) -> Step:
        """What the ReplicaSet and Deployment controllers do in this pass (rolling.py): a pod on
        a lost node counts as ready until it is marked not Ready, as it does for them."""
        try:
            limits = rolling_limits(deployment, desired)
        except ValueError as exc:  # the API server would have refused it: leave its pods be
            said = f"deployment {key[0]}/{key[1]}: {exc}"
            if said not in self._refused:
                self._refused.add(said)
                self.errors.append(said)
            return Step()

        def view(replica: Replica) -> PodView:
            return PodView(
                replica.name, ready=replica.ready, bound=replica.bound, started_at=replica.start_at
            )

        return step(
            replicas=desired,
            limits=limits,
            current=[view(r) for r in mine if r.template == template],
            old=[view(r) for r in mine if r.template != template],
        )

    def _schedule(self, now: float) -> None:
        """The scheduler's pass: the pods waiting for the node bound, oldest first, where the
        GPUs the bound pods hold leave room (scheduling.py); the rest said Unschedulable."""
        waiting = sorted(
            (r for r in self.replicas.values() if not r.bound), key=lambda r: r.created_at
        )
        if not waiting:
            return
        holding = held([r.gpus for r in self.replicas.values() if r.bound])
        taken = set(
            bind_in_order(
                [Waiting(r.name, r.created_at, r.gpus) for r in waiting],
                holding,
                gpus=self.node_gpus,
            )
        )
        stamp = _timestamp()
        for replica in waiting:
            if replica.name in taken:
                self._bind(replica, now, stamp)
            elif replica.unschedulable is None and replica.gpus is not None:
                replica.unschedulable = unschedulable_condition(replica.gpus, since=stamp)
                self._report_pod(replica, phase="Pending")
                self.node_events.append(
                    (now, f"pod {replica.name}: Unschedulable ({replica.unschedulable['message']})")
                )

    def _bind(self, replica: Replica, now: float, stamp: str) -> None:
        """The pod gets the node: its nodeName set, its start-up delay counted from now."""
        with contextlib.suppress(urllib.error.HTTPError):
            self.api.call(
                f"/api/v1/namespaces/{replica.namespace}/pods/{replica.name}",
                "PATCH",
                {"spec": {"nodeName": NODE_NAME}},
                patch=True,
            )
        if replica.unschedulable is not None:
            self.node_events.append(
                (now, f"pod {replica.name}: scheduled, {now - replica.created_at:.1f} s after it")
            )
        replica.bound = True
        replica.bound_since = stamp
        replica.unschedulable = None
        replica.start_at = now + self.start_delay_s
        self._report_pod(replica, phase="Pending")

    def _file_sources(self, namespace: str, deployment: dict[str, Any]) -> dict[str, bytes]:
        """The mounted ConfigMaps and Secrets, as file contents by name."""
        files: dict[str, bytes] = {}
        for volume in deployment["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                cm = self._mounts["configmaps"].get((namespace, volume["configMap"]["name"]))
                for key, value in ((cm or {}).get("data") or {}).items():
                    files[key] = str(value).encode()
            if "secret" in volume:
                secret = self._mounts["secrets"].get((namespace, volume["secret"]["secretName"]))
                folder = f"{API_KEYS_FOLDER}/" if volume.get("name") == API_KEYS_FOLDER else ""
                for key, value in ((secret or {}).get("data") or {}).items():
                    files[folder + key] = base64.b64decode(value)
        return files

    def _write_files(self, replica: Replica, files: Mapping[str, bytes]) -> None:
        if files == replica.files:
            return
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
        replica.files = dict(files)

    def _create(self, key: Key, deployment: dict[str, Any], now: float) -> Replica:
        namespace, name = key
        pod_name = f"{name}-{secrets.token_hex(3)}"
        directory = self.workdir / "pods" / pod_name
        directory.mkdir(parents=True, exist_ok=True)
        template = deployment["spec"]["template"]
        containers = [dict(c) for c in template["spec"]["containers"]]
        pre_stop_s, grace_s = termination(template["spec"])
        gpus = gpu_request(containers[0])
        # Without a GPU limit, or a GPU to ask for, a pod is bound as it is made; else the
        # scheduler's pass at the end of this one decides (`_schedule`), oldest pod first.
        bound = self.node_gpus is None or gpus is None
        replica = Replica(
            pod_name,
            namespace,
            name,
            directory,
            start_at=now + self.start_delay_s if bound else math.inf,
            template=template_hash(deployment),
            container=dict(containers[0]),
            pre_stop_s=pre_stop_s if self.pre_stop_s is None else self.pre_stop_s,
            grace_s=grace_s,
            created_at=now,
            toleration_s=unreachable_toleration_s(template["spec"]),
            gpus=gpus,
            bound=bound,
            bound_since=_timestamp() if bound else "",
        )
        replica.held = reserve_ports(4)
        ports = [sock.getsockname()[1] for sock in replica.held]
        replica.port, replica.grpc_port, replica.admin_port, metrics_port = ports
        named = {"http": replica.port, "grpc": replica.grpc_port, "admin": replica.admin_port}
        if "--metrics-port" in containers[0].get("args", []):
            replica.metrics_port = named["metrics"] = metrics_port
        containers[0]["ports"] = [
            {"name": name, "containerPort": port} for name, port in named.items()
        ]
        pod = pod_object(pod_name, deployment, containers, node=NODE_NAME if bound else None)
        self.api.call(f"/api/v1/namespaces/{namespace}/pods", "POST", pod)
        self.replicas[pod_name] = replica
        self._report_pod(replica, phase="Pending")
        return replica

    def _advance(self, replica: Replica, now: float) -> None:
        if not replica.started:
            if now >= replica.start_at:
                self._start(replica, now)
            return
        if replica.hosting is not None and not self._host_started(replica, now):
            return
        if self._exited(replica):
            # Crashed: CrashLoopBackOff, briefly; the same pod restarts its container.
            self._crashed(replica, now)
            return
        if self._liveness_failed(replica, now):
            return
        if replica.hosted_in_pass is not None:
            hosted = self._hosted.get(replica.name)
            ready = hosted is not None and hosted.ready
        else:
            ready = healthy(f"http://{replica.endpoint}/v2/health/ready")
        if ready and replica.live_probed_at == 0.0:
            replica.live_probed_at = now  # started up: liveness is probed from here
        if ready != replica.ready:
            replica.ready = ready
            self._report_pod(replica, phase="Running")

    def _liveness_failed(self, replica: Replica, now: float) -> bool:
        """Its container's livenessProbe (an httpGet), every `periodSeconds` from the first
        time the pod is ready (as a startupProbe's success, which the runtime's is): after
        `failureThreshold` failures in a row the container is killed and restarted, as the
        kubelet does — a runtime whose engine fails everything or hangs says so there, as does
        a process that stopped answering. Only for pods of their own process (the pod host's
        pods are the host's)."""
        probe = replica.container.get("livenessProbe") or {}
        path = (probe.get("httpGet") or {}).get("path")
        process = replica.process
        if path is None or process is None or replica.live_probed_at == 0.0:
            return False  # not started up (its startupProbe): liveness waits for that
        if now < replica.live_probed_at + float(probe.get("periodSeconds", 10)):
            return False
        replica.live_probed_at = now
        url = f"http://{replica.endpoint}{path}"
        if healthy(url, timeout_s=float(probe.get("timeoutSeconds", 1))):
            replica.live_failures = 0
            return False
        replica.live_failures += 1
        if replica.live_failures < int(probe.get("failureThreshold", 3)):
            return False
        process.kill()  # a frozen or wedged process gets no grace here either
        process.wait()
        self._crashed(replica, now)
        replica.last_exit = {
            "exitCode": 137,
            "reason": "Error",
            "message": f"Liveness probe failed: {replica.live_failures} times in a row ({path})",
        }
        replica.live_failures = 0
        replica.live_probed_at = 0.0
        self._report_pod(replica, phase="Running")
        return True

    def _advance_unreachable(self, replica: Replica, now: float) -> None:
        """A pod on a lost node: no kubelet probes, restarts or reports it (a probe would wait
        out its timeout every pass); the node controller marks it not Ready after the notice."""
        assert replica.unreachable is not None
        if replica.ready and now >= replica.unreachable.not_ready_at:
            replica.ready = False
            self._report_pod(replica, phase="Running")
            self.node_events.append((now, f"pod {replica.name}: not Ready (NodeNotReady)"))

    def _start(self, replica: Replica, now: float) -> None:
        container = replica.container
        command = container_command(
            container,
            port=replica.port,
            grpc_port=replica.grpc_port,
            admin_port=replica.admin_port,
            metrics_port=replica.metrics_port or None,
            models_dir=self.models_dir,
            directory=replica.directory,
        )
        env = container_env(container, replica)
        held, replica.held = replica.held, []
        if self.pod_host is not None and self._host_starts is not None and hostable(command):
            host = self.pod_host

            def put() -> None:
                release(held)  # its ports, the moment the host binds them
                host.put(replica.name, args=serve_flags(command), env=env)

            replica.hosting = self._host_starts.submit(put)
        else:
            release(held)
            with (replica.directory / "runtime.log").open("ab") as log:
                replica.process = subprocess.Popen(
                    command,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=False,
                )
            self.started_pids.append(replica.process.pid)
        replica.waiting = None
        self._report_pod(replica, phase="Running")

    def _host_started(self, replica: Replica, now: float) -> bool:
        """Whether the pod host has started the pod (its PUT answered): from this pass on it is
        hosted. One it refused crashed, as a runtime that exits at start does."""
        assert replica.hosting is not None
        if not replica.hosting.done():
            return False
        failed = replica.hosting.exception()
        replica.hosting = None
        if failed is None:
            replica.hosted_in_pass = self.passes  # this pass's listing may predate it
            return True
        if not isinstance(failed, HostRefused):  # not the pod's fault: the host did not answer
            self.errors.append(f"pod host: starting {replica.name}: {failed!r}")
        with (replica.directory / "runtime.log").open("a") as log:
            log.write(f"{failed}\n")
        self._crashed(replica, now)
        return False

    def _exited(self, replica: Replica) -> bool:
        if replica.process is not None:
            return replica.process.poll() is not None
        # A hosted pod is gone when a listing taken after the host took it lacks it.
        taken = replica.hosted_in_pass
        return taken is not None and taken < self.passes and replica.name not in self._hosted

    def _crashed(self, replica: Replica, now: float) -> None:
        exit_code = replica.process.returncode if replica.process is not None else 1
        message = log_tail(replica.directory / "runtime.log")
        if PORT_TAKEN in message and not self._stop.is_set():
            # One of its ports went to another socket between the runner letting it go and the
            # runtime binding it (pods share the loopback address here, where each has an IP of
            # its own on a cluster): every restart would fail the same way. Gone, as a pod
            # evicted from its node is: its ReplicaSet makes another, on new ports.
            self.node_events.append((now, f"pod {replica.name}: its ports are taken; replaced"))
            self._remove(replica, delete_pod=True)
            return
        replica.held = hold_ports(replica.ports)  # no other pod gets them meanwhile
        replica.ready = False
        replica.restarts += 1
        replica.process = None
        replica.hosted_in_pass = None
        replica.hosting = None
        back_off = min(10.0, 1.0 * replica.restarts)
        replica.start_at = now + back_off
        replica.last_exit = {"exitCode": exit_code, "reason": "Error", "message": message}
        replica.waiting = {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {back_off:g}s restarting failed container=runtime "
            f"pod={replica.name}",
        }
        self._report_pod(replica, phase="Running")

    def _remove(self, replica: Replica, *, delete_pod: bool) -> None:
        self.replicas.pop(replica.name, None)
        release(replica.held)
        replica.ready = False
        if replica.unreachable is not None:
            # On a lost node: no preStop, no SIGTERM, no drain; it just goes.
            if replica.process is not None:
                replica.process.kill()
                replica.process.wait()
                replica.process = None
            if replica.hosted_in_pass is not None and self.pod_host is not None:
                self.pod_host.delete(replica.name)  # a pod cut off goes at once
                replica.hosted_in_pass = None
        # The pre-stop pause: the endpoint leaves the Service (published at the end of this
        # pass) before SIGTERM makes the runtime refuse new requests and drain. Without one,
        # SIGTERM comes while the Service still sends to the pod, as on a cluster.
        now = time.monotonic()
        term_at = now + replica.pre_stop_s
        if replica.process is not None and replica.process.poll() is None:
            self.terminating.append((replica.process, term_at, now + replica.grace_s))
        if replica.hosting is not None:
            self._starting[replica.name] = replica.hosting
        if replica.hosted_in_pass is not None or replica.hosting is not None:
            self.leaving_host.append((replica.name, term_at))
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
        leaving = []
        for name, drain_at in self.leaving_host:
            starting = self._starting.get(name)
            if drain_at > now or (starting is not None and not starting.done()):
                leaving.append((name, drain_at))  # a pod the host is starting goes once started
            elif self.pod_host is not None:
                self._starting.pop(name, None)
                self.pod_host.delete(name)  # the host drains it as SIGTERM would
        self.leaving_host = leaving

    # -- reporting -------------------------------------------------------------------------
    def _report_pod(self, replica: Replica, *, phase: str) -> None:
        if replica.unreachable is not None:
            status = marked_not_ready(replica.reported)  # its kubelet's last word, and this
        elif not replica.bound:
            status = unscheduled_status(replica.unschedulable)
        else:
            status = pod_status(
                phase,
                ready=replica.ready,
                started=replica.started,
                restarts=replica.restarts,
                waiting=replica.waiting,
                last_exit=replica.last_exit,
                scheduled=scheduled_condition(since=replica.bound_since),
            )
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
        self, key: Key, deployment: dict[str, Any], mine: Sequence[Replica], template: str
    ) -> None:
        namespace, name = key
        ready = sum(r.ready for r in mine)
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(mine),
            "updatedReplicas": sum(r.template == template for r in mine),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": len(mine) - ready,
        }
        path = f"{namespace}/{name}"
        current = {k: deployment.get("status", {}).get(k) for k in status}
        if status == current and self._reported_deployments.get(path) == status:
            return
        self.api.call(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status",
            "PATCH",
            {"status": status},
            patch=True,
        )
        self._reported_deployments[path] = status

    def _publish(self, deployments: Mapping[Key, Any]) -> None:
        ready: dict[Key, list[str]] = {key: [] for key in deployments}
        scrape: list[tuple[str, Mapping[str, str]]] = []
        for replica in sorted(self.replicas.values(), key=lambda r: r.name):
            if not replica.started:
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


def _timestamp() -> str:
    """Now, as Kubernetes stamps a condition's lastTransitionTime (RFC 3339, to the second)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
