"""The sandbox's kubelet on its own: a Deployment made by hand, no operator.

It must start what the Deployment asks for (after the start-up delay), report the Pod and the
Deployment status, hand the runtime its ConfigMap (and later changes of it), restart a process
that crashes, and stop processes when the replicas go down — and leave nothing running.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from batchpilot.sandbox import LocalKubernetesAPI
from batchpilot.sandbox.hosting import pod_host_process
from batchpilot.sandbox.podrunner import (
    API,
    API_KEYS_FOLDER,
    Endpoints,
    PodRunner,
    container_command,
    publish_folder,
)
from batchpilot.sandbox.pods import termination
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


def deployment(replicas: int) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "batchpilot", "batchpilot.io/inferenceservice": "m"}
    container = {
        "name": "runtime",
        "image": "runtime",
        "args": ["runtime", "serve", "--model", "/models/resnet50-signature.onnx",
                 "--name", "m", "--host", "0.0.0.0", "--port", "8080",
                 "--engine", "simulated", "--simulated-latency", "alpha_ms=2,beta_ms=1",
                 "--batching-config", "/etc/batchpilot/batching/batching.json",
                 "--admin-token-file", "/var/run/secrets/batchpilot/admin-token"],
        "env": [{"name": "BATCHPILOT_ISVC_NAME", "value": "m"},
                {"name": "BATCHPILOT_ADVERTISE_HOST",
                 "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "m", "namespace": NS, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"batchpilot.io/inferenceservice": "m"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {"name": "batching", "configMap": {"name": "m-batching"}},
                        {"name": "admin-token", "secret": {"secretName": "m-admin-token"}},
                    ],
                },
            },
        },
    }


def batching(max_batch: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "m-batching", "namespace": NS},
        "data": {"batching.json": json.dumps({"maxBatchSize": max_batch})},
    }


def seeded(url: str) -> API:
    """The API with what the Deployment mounts: its batching ConfigMap (batch 4) and the admin
    token's Secret."""
    rest = API(url)
    rest.call(f"/api/v1/namespaces/{NS}/configmaps", "POST", batching(4))
    token = base64.b64encode(b"sandbox-token").decode()
    rest.call(f"/api/v1/namespaces/{NS}/secrets", "POST", {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "m-admin-token", "namespace": NS},
        "data": {"admin-token": token},
    })  # fmt: skip
    return rest


def ready_replicas(rest: API) -> int | None:
    return (rest.call(f"{DEPLOYMENTS}/m") or {}).get("status", {}).get("readyReplicas")


@contextmanager
def running(url: str, tmp_path: Path, **options: Any) -> Iterator[PodRunner]:
    """A pod runner for the API at `url`, playing the kubelet on its own thread until the block
    ends."""
    runner = PodRunner(url, workdir=tmp_path, models_dir=ROOT / "examples" / "models", **options)
    runner.run_in_thread()
    try:
        yield runner
    finally:
        runner.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_container_args_are_made_local_and_the_rest_kept(tmp_path: Path) -> None:
    container = deployment(1)["spec"]["template"]["spec"]["containers"][0]
    command = container_command(container, port=1234, models_dir=tmp_path, directory=tmp_path)
    args = command[3:]
    assert args[:2] == ["runtime", "serve"]
    assert args[args.index("--model") + 1] == str(tmp_path / "resnet50-signature.onnx")
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == "1234"
    assert args[args.index("--batching-config") + 1] == str(tmp_path / "batching.json")
    assert args[args.index("--simulated-latency") + 1] == "alpha_ms=2,beta_ms=1"
    assert args.count("--port") == 1


def test_a_pod_serving_grpc_gets_its_own_local_grpc_port(tmp_path: Path) -> None:
    container = deployment(1)["spec"]["template"]["spec"]["containers"][0]
    container = {**container, "args": [*container["args"], "--grpc-port", "8081"]}
    command = container_command(
        container, port=1234, grpc_port=4321, models_dir=tmp_path, directory=tmp_path
    )
    args = command[3:]
    assert args[args.index("--grpc-port") + 1] == "4321"
    assert args.count("--grpc-port") == 1
    without = container_command(container, port=1234, models_dir=tmp_path, directory=tmp_path)
    assert "--grpc-port" not in without


def test_every_pod_gets_its_own_admin_and_metrics_ports(tmp_path: Path) -> None:
    container = deployment(1)["spec"]["template"]["spec"]["containers"][0]
    pod_args = ["--admin-port", "8082", "--metrics-port", "8083"]
    container = {**container, "args": [*container["args"], *pod_args]}
    command = container_command(
        container,
        port=1234,
        admin_port=4322,
        metrics_port=4323,
        models_dir=tmp_path,
        directory=tmp_path,
    )
    args = command[3:]
    assert args[args.index("--admin-port") + 1] == "4322"
    assert args[args.index("--metrics-port") + 1] == "4323"
    assert args.count("--admin-port") == args.count("--metrics-port") == 1


def test_the_runner_plays_the_kubelet(tmp_path: Path) -> None:
    published: list[Endpoints] = []
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(1))
        with running(api.url, tmp_path, start_delay_s=0.5, on_endpoints=published.append) as runner:
            wait_until(lambda: ready_replicas(rest) == 1, timeout=30, what="readyReplicas 1")
            pods = rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
            assert len(pods) == 1
            pod = pods[0]
            ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
            assert ready["Ready"] == "True"
            assert pod["status"]["podIP"] == "127.0.0.1"
            ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
            port, admin_port = ports["http"], ports["admin"]
            assert published[-1].ready[(NS, "m")] == [f"127.0.0.1:{port}"]

            def runtime_batch() -> int:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/admin/batching") as r:
                    return int(json.loads(r.read())["maxBatchSize"])

            assert runtime_batch() == 4  # the ConfigMap, handed over as a file
            rest.call(f"/api/v1/namespaces/{NS}/configmaps/m-batching", "PUT", batching(8))
            wait_until(lambda: runtime_batch() == 8, timeout=10, what="the ConfigMap change")

            # A crash: the same pod restarts its container.
            first_pid = runner.pids()[0]
            os.kill(first_pid, signal.SIGKILL)

            def restarted() -> bool:
                pod = rest.call(f"/api/v1/namespaces/{NS}/pods/{pods[0]['metadata']['name']}")
                status = pod["status"]
                return bool(
                    status["containerStatuses"][0]["restartCount"] == 1
                    and status["containerStatuses"][0]["ready"]
                )

            wait_until(restarted, timeout=30, what="the restarted container, ready")

            # The pod template changes: a rolling update, the new pod ready before the old goes.
            changed = deployment(1)
            args = changed["spec"]["template"]["spec"]["containers"][0]["args"]
            args[args.index("alpha_ms=2,beta_ms=1")] = "alpha_ms=3,beta_ms=1"
            mark = len(published)
            rest.call(f"{DEPLOYMENTS}/m", "PUT", changed)
            old_name = pods[0]["metadata"]["name"]

            def rolled() -> bool:
                names = [
                    p["metadata"]["name"]
                    for p in rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
                ]
                status = (rest.call(f"{DEPLOYMENTS}/m") or {}).get("status", {})
                return bool(
                    old_name not in names
                    and len(names) == 1
                    and status.get("readyReplicas") == 1
                    and status.get("updatedReplicas") == 1
                )

            wait_until(rolled, timeout=30, what="the rolling update")
            # Never without a ready endpoint while it rolled.
            assert all(e.ready.get((NS, "m")) for e in published[mark:])

            # Scale to zero: the pod goes, its process drains and exits.
            rest.call(f"{DEPLOYMENTS}/m", "PATCH", {"spec": {"replicas": 0}}, patch=True)
            wait_until(
                lambda: not rest.call(f"/api/v1/namespaces/{NS}/pods")["items"],
                timeout=10,
                what="the pod deleted",
            )
            wait_until(lambda: not runner.pids(), timeout=30, what="the process gone")
    assert runner.started_pids
    assert not [pid for pid in runner.started_pids if alive(pid)]


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [
        ({"containers": [{}]}, (0.0, 30.0)),
        (
            {
                "terminationGracePeriodSeconds": 35,
                "containers": [{"lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}],
            },
            (5.0, 35.0),
        ),
        (
            {
                "containers": [
                    {"lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 2.5"]}}}}
                ]
            },
            (2.5, 30.0),
        ),
        ({"containers": [{"lifecycle": {"preStop": {"sleep": {"seconds": 7}}}}]}, (7.0, 30.0)),
        (
            {
                "terminationGracePeriodSeconds": 3,
                "containers": [{"lifecycle": {"preStop": {"sleep": {"seconds": 7}}}}],
            },
            (3.0, 3.0),
        ),
        (
            {"containers": [{"lifecycle": {"preStop": {"httpGet": {"path": "/stop", "port": 1}}}}]},
            (0.0, 30.0),
        ),
    ],
    ids=["none", "exec-sleep", "shell-sleep", "sleep-action", "capped-by-grace", "http-hook"],
)
def test_the_pre_stop_pause_and_the_grace_period_come_from_the_pod_spec(
    pod_spec: dict[str, Any], expected: tuple[float, float]
) -> None:
    assert termination(pod_spec) == expected


def test_a_removed_pod_leaves_the_endpoints_at_once_and_drains_after_its_pre_stop_sleep(
    tmp_path: Path,
) -> None:
    """As the kubelet does: the endpoint goes when the pod is deleted, SIGTERM (readiness turns
    503 as the runtime starts draining) only after the container's preStop sleep, so the
    Service has stopped sending to the pod before it refuses anything."""
    pre_stop_s = 4
    two = deployment(2)
    pod_spec = two["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = 30
    pod_spec["containers"][0]["lifecycle"] = {
        "preStop": {"exec": {"command": ["sleep", str(pre_stop_s)]}}
    }
    published: list[Endpoints] = []
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", two)
        with running(api.url, tmp_path, start_delay_s=0.1, on_endpoints=published.append):
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="readyReplicas 2")
            before = set(published[-1].ready[(NS, "m")])
            rest.call(f"{DEPLOYMENTS}/m", "PATCH", {"spec": {"replicas": 1}}, patch=True)
            deleted_at = time.monotonic()
            left = wait_until(
                lambda: len(published[-1].ready[(NS, "m")]) == 1 and published[-1],
                timeout=10,
                what="the endpoint gone",
            )
            endpoint_gone_s = time.monotonic() - deleted_at
            (removed,) = before - set(left.ready[(NS, "m")])

            def draining() -> bool:
                url = f"http://{removed}/v2/health/ready"
                try:
                    with urllib.request.urlopen(url, timeout=2):
                        return False
                except OSError:  # 503 while draining, then the port closes
                    return True

            wait_until(draining, timeout=30, what="the removed pod draining", every=0.05)
            sigterm_s = time.monotonic() - deleted_at
            assert endpoint_gone_s < 2.0
            assert sigterm_s >= pre_stop_s - 0.1, sigterm_s


def test_a_pod_with_api_keys_reads_a_folder_of_its_own(tmp_path: Path) -> None:
    container = deployment(1)["spec"]["template"]["spec"]["containers"][0]
    pod_args = ["--api-keys", "/var/run/secrets/batchpilot-api-keys", "--access-config", "/x.json"]
    container = {**container, "args": [*container["args"], *pod_args]}
    args = container_command(container, port=1234, models_dir=tmp_path, directory=tmp_path)[3:]
    assert args[args.index("--api-keys") + 1] == str(tmp_path / API_KEYS_FOLDER)
    assert args[args.index("--access-config") + 1] == str(tmp_path / "access.json")
    assert args.count("--api-keys") == 1


def test_the_keys_folder_is_updated_as_the_kubelet_updates_a_secret(tmp_path: Path) -> None:
    folder = tmp_path / API_KEYS_FOLDER
    publish_folder(folder, {"alice": b"a" * 20, "bob": b"b" * 20})
    first = os.readlink(folder / "..data")
    assert (folder / "alice").read_bytes() == b"a" * 20
    publish_folder(folder, {"alice": b"a" * 20, "bob": b"b" * 20})
    assert os.readlink(folder / "..data") == first  # unchanged: nothing written
    publish_folder(folder, {"alice": b"c" * 20})
    assert sorted(p for p in os.listdir(folder) if not p.startswith("..")) == ["alice"]
    assert (folder / "alice").read_bytes() == b"c" * 20
    assert (folder / "alice").is_symlink()
    assert not (folder / first).exists()  # the old version is gone


def test_simulated_pods_run_in_the_pod_host(tmp_path: Path) -> None:
    """With a pod host, simulated pods start no process of their own: the host serves them on
    their own ports, and the runner still plays the kubelet for them (readiness, the ConfigMap,
    scaling, a pod the host refuses counted as a crashing container)."""
    published: list[Endpoints] = []
    with (
        LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api,
        pod_host_process(tmp_path / "host") as host,
    ):
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(2))
        with running(
            api.url,
            tmp_path,
            start_delay_s=0.2,
            on_endpoints=published.append,
            pod_host=host.client,
        ) as runner:
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="readyReplicas 2")
            assert runner.pids() == []  # no process per pod
            hosted = host.client.pods()
            pods = rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
            assert sorted(hosted) == sorted(p["metadata"]["name"] for p in pods)
            assert all(p.ready for p in hosted.values())
            ports = [
                {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
                for pod in pods
            ]
            assert sorted(published[-1].ready[(NS, "m")]) == sorted(
                f"127.0.0.1:{p['http']}" for p in ports
            )

            def batch_of(admin_port: int) -> int:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/admin/batching") as r:
                    return int(json.loads(r.read())["maxBatchSize"])

            assert [batch_of(p["admin"]) for p in ports] == [4, 4]
            rest.call(f"/api/v1/namespaces/{NS}/configmaps/m-batching", "PUT", batching(8))
            wait_until(
                lambda: [batch_of(p["admin"]) for p in ports] == [8, 8],
                timeout=10,
                what="the ConfigMap change in both hosted pods",
            )

            body = json.dumps(
                {"inputs": [{"name": "images", "shape": [1, 3, 224, 224], "datatype": "FP32",
                             "data": [0.0] * (3 * 224 * 224)}]}
            ).encode()  # fmt: skip
            request = urllib.request.Request(
                f"http://127.0.0.1:{ports[0]['http']}/v2/models/m/infer", data=body, method="POST"
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200

            # The pods' IP from the downward API: an async job taken by one hosted pod is
            # fetched through the other, which passes the fetch on.
            submit = urllib.request.Request(
                f"http://127.0.0.1:{ports[0]['http']}/v2/models/m/infer/async",
                data=body,
                method="POST",
            )
            with urllib.request.urlopen(submit, timeout=10) as response:
                job_id = json.loads(response.read())["id"]
            fetched = f"http://127.0.0.1:{ports[1]['http']}/v2/models/m/infer/async/{job_id}"
            with urllib.request.urlopen(f"{fetched}?wait_s=10", timeout=20) as response:
                assert response.status == 200
                assert json.loads(response.read())["outputs"]

            rest.call(f"{DEPLOYMENTS}/m", "PATCH", {"spec": {"replicas": 0}}, patch=True)
            wait_until(lambda: not host.client.pods(), timeout=30, what="the host drained both")

            # A pod the host refuses (its model file is missing) crash-loops, as a process would.
            broken = deployment(1)
            args = broken["spec"]["template"]["spec"]["containers"][0]["args"]
            args[args.index("/models/resnet50-signature.onnx")] = "/models/missing.onnx"
            rest.call(f"{DEPLOYMENTS}/m", "PUT", broken)

            def crash_looping() -> bool:
                items = rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
                return any(
                    p["status"]["containerStatuses"][0]["restartCount"] >= 1
                    for p in items
                    if p.get("status", {}).get("containerStatuses")
                )

            wait_until(crash_looping, timeout=30, what="the refused pod restarting")
            assert not host.client.pods()


def test_a_runtime_that_cannot_start_is_reported_as_the_kubelet_would(tmp_path: Path) -> None:
    """A model that is not there: the runtime exits at start, and the pod says so — waiting in
    CrashLoopBackOff, its last exit carrying the log's tail (FallbackToLogsOnError), from which
    the operator's Ready condition takes the reason."""
    broken = deployment(1)
    args = broken["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("/models/resnet50-signature.onnx")] = "/models/missing.onnx"
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", broken)
        with running(api.url, tmp_path, start_delay_s=0.1):

            def crash_looping() -> dict[str, Any] | None:
                pods = rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
                statuses = pods[0].get("status", {}).get("containerStatuses") if pods else None
                waiting = (statuses or [{}])[0].get("state", {}).get("waiting", {})
                return statuses[0] if waiting.get("reason") == "CrashLoopBackOff" else None

            container = wait_until(crash_looping, timeout=30, what="CrashLoopBackOff")
            last = container["lastState"]["terminated"]
            assert last["exitCode"] != 0
            said = last["message"].splitlines()[-1]
            assert said.endswith("models/missing.onnx does not exist"), said
            assert container["restartCount"] >= 1
            assert ready_replicas(rest) in (None, 0)


def stopped(pid: int) -> bool:
    """Whether the process is frozen (SIGSTOP): its state in /proc is T."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def test_pods_on_a_lost_node_answer_nothing_then_go_not_ready_then_are_evicted(
    tmp_path: Path,
) -> None:
    """As Kubernetes plays a node that dies: its pods' processes answer nothing but stay Ready
    and in the endpoints for the notice; then their Ready condition turns False (NodeNotReady)
    and they leave the endpoints and readyReplicas, still counted and not replaced, never
    probed or restarted; a scale-down meanwhile takes one of them before a ready pod; at their
    eviction the rest are killed and deleted, and the ReplicaSet replaces them."""
    notice_s, eviction_s = 4.0, 4.0
    published: list[Endpoints] = []
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(3))
        with running(
            api.url, tmp_path, start_delay_s=0.1, poll_s=0.1, on_endpoints=published.append
        ) as runner:
            wait_until(lambda: ready_replicas(rest) == 3, timeout=60, what="readyReplicas 3")
            pods = {r.name: r for r in runner.replicas.values()}
            oldest = sorted(pods.values(), key=lambda r: r.created_at)
            passes = runner.passes
            lost_at = time.monotonic()
            lost = runner.lose_node(NS, "m", count=2, notice_s=notice_s, eviction_s=eviction_s)
            assert lost == [r.name for r in oldest[:2]]
            (kept,) = set(pods) - set(lost)
            frozen = {name: pods[name].port for name in lost}
            pid = {name: r.process.pid for name, r in pods.items() if r.process is not None}
            lost_pids = [pid[name] for name in lost]
            wait_until(lambda: all(stopped(pid) for pid in lost_pids), timeout=2, what="SIGSTOP")
            with pytest.raises(TimeoutError):  # a request hangs until the client gives up
                urllib.request.urlopen(
                    f"http://127.0.0.1:{frozen[lost[0]]}/v2/health/ready", timeout=0.5
                )

            # The notice: nothing knows yet.
            time.sleep(max(0.0, lost_at + notice_s / 2 - time.monotonic()))
            assert ready_replicas(rest) == 3
            assert len(published[-1].ready[(NS, "m")]) == 3
            # Nothing probes the frozen pods: a pass does not wait on them (a probe's timeout
            # is 0.5 s, a pass 0.1 s apart).
            gap_s = (time.monotonic() - lost_at) / max(1, runner.passes - passes)
            assert gap_s < 0.45, gap_s

            def noticed() -> bool:
                return ready_replicas(rest) == 1

            wait_until(noticed, timeout=notice_s + 5, what="the lost pods not Ready")
            assert time.monotonic() - lost_at >= notice_s - 0.1
            assert published[-1].ready[(NS, "m")] == [f"127.0.0.1:{pods[kept].port}"]
            for name in lost:
                pod = rest.call(f"/api/v1/namespaces/{NS}/pods/{name}")
                ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
                assert (ready["status"], ready["reason"]) == ("False", "NodeNotReady")
                assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
            status = rest.call(f"{DEPLOYMENTS}/m")["status"]
            assert (status["replicas"], status["readyReplicas"]) == (3, 1)
            assert len(rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]) == 3  # none replaced
            assert all(stopped(pid) for pid in lost_pids)  # nor restarted

            # A scale-down takes a not-ready pod, one of the lost, before the ready one.
            rest.call(f"{DEPLOYMENTS}/m", "PATCH", {"spec": {"replicas": 2}}, patch=True)

            def names() -> set[str]:
                return {
                    p["metadata"]["name"]
                    for p in rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
                }

            wait_until(lambda: len(names()) == 2, timeout=10, what="the scale-down")
            assert kept in names()
            (scaled_away,) = set(lost) - names()
            (evicted,) = set(lost) & names()
            assert not alive(pid[scaled_away])  # killed as it went

            # The eviction: the last lost pod is killed and deleted, and replaced from cold.
            wait_until(
                lambda: evicted not in names(),
                timeout=notice_s + eviction_s + 5,
                what="the eviction",
            )
            assert time.monotonic() - lost_at >= notice_s + eviction_s - 0.1
            assert not any(alive(pid) for pid in lost_pids)
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="the replacement ready")
            assert len(names() - {kept}) == 1
            assert [what.split(": ")[1] for _, what in runner.node_events] == [
                *["its node stops answering; not Ready in 4 s, evicted 4 s later"] * 2,
                *["not Ready (NodeNotReady)"] * 2,
                "evicted and deleted",
            ]

            # A frozen pod at shutdown is killed at once, not after a SIGTERM's grace.
            runner.lose_node(NS, "m", count=1, notice_s=60, eviction_s=60)
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 5
    assert not [pid for pid in runner.started_pids if alive(pid)]


def test_a_hosted_pod_on_a_lost_node_is_cut_off_by_the_host_and_evicted(tmp_path: Path) -> None:
    with (
        LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api,
        pod_host_process(tmp_path / "host") as host,
    ):
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(2))
        with running(
            api.url, tmp_path, start_delay_s=0.1, poll_s=0.1, pod_host=host.client
        ) as runner:
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="readyReplicas 2")
            (lost,) = runner.lose_node(NS, "m", count=1, notice_s=1, eviction_s=2)
            port = runner.replicas[lost].port
            with pytest.raises(TimeoutError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=0.5)
            wait_until(lambda: ready_replicas(rest) == 1, timeout=5, what="the lost pod not Ready")
            assert lost in host.client.pods()  # not replaced, not removed: only not Ready
            wait_until(lambda: lost not in host.client.pods(), timeout=5, what="the eviction")
            assert rest.call(f"/api/v1/namespaces/{NS}/pods/{lost}") is None
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="the replacement")


def gpu_deployment(name: str, replicas: int, *, strategy: dict[str, int]) -> dict[str, Any]:
    """`deployment(replicas)` named `name`, each pod asking for one GPU, rolling with
    `strategy`."""
    made = deployment(replicas)
    made["metadata"]["name"] = name
    made["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": dict(strategy)}
    container = made["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return made


def pods_of(rest: API, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
        if p["metadata"]["ownerReferences"][0]["name"] == name
    ]


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return dict(condition)


def test_a_pod_finds_no_gpu_on_a_full_node_until_one_is_freed(tmp_path: Path) -> None:
    """The node's two GPUs are taken by one Deployment's pods: another's pod waits Pending and
    Unschedulable, in the scheduler's words, and starts once the first Deployment goes."""
    surge = {"maxSurge": 1, "maxUnavailable": 0}
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", gpu_deployment("m", 2, strategy=surge))
        with running(api.url, tmp_path, start_delay_s=0.1, node_gpus=2) as runner:
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="readyReplicas 2")
            assert {p["spec"]["nodeName"] for p in pods_of(rest, "m")} == {"sandbox"}
            assert all(scheduled(p)["status"] == "True" for p in pods_of(rest, "m"))
            rest.call(DEPLOYMENTS, "POST", gpu_deployment("late", 1, strategy=surge))

            def unschedulable() -> dict[str, Any] | None:
                pods = pods_of(rest, "late")
                # a pod just created may have no status yet
                return pods[0] if pods and pods[0].get("status", {}).get("conditions") else None

            pod = wait_until(unschedulable, timeout=10, what="the late pod unschedulable")
            assert pod["status"]["phase"] == "Pending"
            assert "nodeName" not in pod["spec"]
            condition = scheduled(pod)
            assert condition["status"] == "False"
            assert condition["reason"] == "Unschedulable"
            assert condition["message"] == (
                "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
            )
            assert condition["lastTransitionTime"].endswith("Z")
            late = rest.call(f"{DEPLOYMENTS}/late")["status"]
            assert (late["replicas"], late["readyReplicas"]) == (1, 0)

            rest.call(f"{DEPLOYMENTS}/m", "DELETE")
            wait_until(
                lambda: (
                    (rest.call(f"{DEPLOYMENTS}/late") or {}).get("status", {}).get("readyReplicas")
                    == 1
                ),
                timeout=30,
                what="the late pod ready once GPUs are free",
            )
            (pod,) = pods_of(rest, "late")
            assert scheduled(pod)["status"] == "True"
            assert pod["spec"]["nodeName"] == "sandbox"
            assert any("scheduled" in what for _, what in runner.node_events)


def test_a_rollout_in_place_frees_the_gpu_its_surge_pod_waits_for(tmp_path: Path) -> None:
    """Two replicas on a node of two GPUs: a rollout with a surge stalls, its new pod waiting
    for a GPU; turned in place (maxSurge 0, maxUnavailable 1), an old pod goes first and the
    new one takes its GPU, one at a time, one replica serving throughout."""
    surge = {"maxSurge": 1, "maxUnavailable": 0}
    published: list[Endpoints] = []
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", gpu_deployment("m", 2, strategy=surge))
        with running(
            api.url, tmp_path, start_delay_s=0.1, node_gpus=2, on_endpoints=published.append
        ):
            wait_until(lambda: ready_replicas(rest) == 2, timeout=30, what="readyReplicas 2")
            old = {p["metadata"]["name"] for p in pods_of(rest, "m")}
            changed = gpu_deployment("m", 2, strategy=surge)
            args = changed["spec"]["template"]["spec"]["containers"][0]["args"]
            args[args.index("alpha_ms=2,beta_ms=1")] = "alpha_ms=3,beta_ms=1"
            rest.call(f"{DEPLOYMENTS}/m", "PUT", changed)
            mark = len(published)

            def waiting() -> bool:
                return any(
                    p.get("status", {}).get("conditions") and scheduled(p)["status"] == "False"
                    for p in pods_of(rest, "m")
                )

            wait_until(waiting, timeout=10, what="the surge pod unschedulable")
            time.sleep(2)  # and it stays so: the rollout is stuck
            status = rest.call(f"{DEPLOYMENTS}/m")["status"]
            assert (status["replicas"], status["updatedReplicas"], status["readyReplicas"]) == (
                3,
                1,
                2,
            )
            assert old <= {p["metadata"]["name"] for p in pods_of(rest, "m")}

            in_place = {"maxSurge": 0, "maxUnavailable": 1}
            rest.call(
                f"{DEPLOYMENTS}/m",
                "PATCH",
                {"spec": {"strategy": {"rollingUpdate": in_place}}},
                patch=True,
            )

            def rolled() -> bool:
                names = {p["metadata"]["name"] for p in pods_of(rest, "m")}
                status = (rest.call(f"{DEPLOYMENTS}/m") or {}).get("status", {})
                return bool(
                    not names & old
                    and len(names) == 2
                    and status.get("readyReplicas") == 2
                    and status.get("updatedReplicas") == 2
                )

            wait_until(rolled, timeout=30, what="the rollout in place")
            # One replica served throughout; never more pods than GPUs bound.
            assert all(e.ready.get((NS, "m")) for e in published[mark:])
            assert all(len(e.ready.get((NS, "m"), [])) <= 2 for e in published[mark:])


def test_a_pod_whose_liveness_probe_fails_is_killed_and_restarted(tmp_path: Path) -> None:
    """A runtime that stops answering (frozen: SIGSTOP, as a wedged process or an engine the
    runtime says fails everything) fails its livenessProbe; after failureThreshold failures in a
    row the container is killed and restarted, and the pod says why in its last state."""
    probed = deployment(1)
    container = probed["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"] = {
        "httpGet": {"path": "/v2/health/live", "port": "http"},
        "periodSeconds": 1,
        "failureThreshold": 2,
        "timeoutSeconds": 1,
    }
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", probed)
        with running(api.url, tmp_path, start_delay_s=0.1) as runner:
            wait_until(lambda: ready_replicas(rest) == 1, timeout=60, what="a ready replica")
            (replica,) = runner.replicas.values()
            assert replica.process is not None
            frozen = replica.process.pid
            os.kill(frozen, signal.SIGSTOP)

            def restarted() -> dict[str, Any] | None:
                pods = rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
                statuses = pods[0].get("status", {}).get("containerStatuses") or [{}]
                return statuses[0] if statuses[0].get("restartCount") == 1 else None

            status = wait_until(restarted, timeout=30, what="the container restarted")
            last = status["lastState"]["terminated"]
            assert last["exitCode"] == 137
            assert last["message"] == "Liveness probe failed: 2 times in a row (/v2/health/live)"
            assert not alive(frozen)
            wait_until(lambda: ready_replicas(rest) == 1, timeout=60, what="ready again")
            assert replica.process is not None
            assert replica.process.pid != frozen


def test_a_pod_deleted_through_the_api_is_stopped_and_replaced(tmp_path: Path) -> None:
    """`kubectl delete pod`, or the autopilot replacing a slow replica: its process is stopped
    as its kubelet stops it, and the ReplicaSet makes another."""
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(2))
        with running(api.url, tmp_path, start_delay_s=0.1, poll_s=0.1) as runner:
            wait_until(lambda: ready_replicas(rest) == 2, timeout=60, what="readyReplicas 2")
            victim = sorted(runner.replicas.values(), key=lambda r: r.created_at)[0]
            assert victim.process is not None
            pid = victim.process.pid
            rest.call(f"/api/v1/namespaces/{NS}/pods/{victim.name}", "DELETE")
            wait_until(lambda: not alive(pid), timeout=30, what="its process stopped")
            wait_until(
                lambda: ready_replicas(rest) == 2 and victim.name not in runner.replicas,
                timeout=60,
                what="a replacement ready",
            )
            listed = rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
            pods = {p["metadata"]["name"] for p in listed}
            assert victim.name not in pods
            assert len(pods) == 2
            assert [what for _, what in runner.node_events] == [
                f"pod {victim.name}: deleted through the API"
            ]


def test_a_throttled_pod_is_the_oldest_ready_one_and_keeps_serving(tmp_path: Path) -> None:
    """The sandbox's --throttle-pod: the oldest ready pod's runtime gets SIGUSR1 (its simulated
    device throttles, tests/test_server_process.py) and serves on; a pod throttles once."""
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(2))
        with running(api.url, tmp_path, start_delay_s=0.1, poll_s=0.1) as runner:
            wait_until(lambda: ready_replicas(rest) == 2, timeout=60, what="readyReplicas 2")
            oldest, newer = sorted(runner.replicas.values(), key=lambda r: r.created_at)
            assert runner.throttle(NS, "m") == oldest.name
            assert runner.throttle(NS, "m") == newer.name
            assert runner.throttle(NS, "m") is None  # both throttle already
            assert runner.throttle(NS, "other") is None
            for replica in (oldest, newer):
                url = f"http://127.0.0.1:{replica.port}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=5) as reply:
                    assert reply.status == 200
            assert [what for _, what in runner.node_events] == [
                f"pod {oldest.name}: its device throttles (batches 2× t(b))",
                f"pod {newer.name}: its device throttles (batches 2× t(b))",
            ]
    assert not [pid for pid in runner.started_pids if alive(pid)]


def test_hosted_pods_start_side_by_side_and_one_whose_port_was_taken_is_replaced(
    tmp_path: Path,
) -> None:
    """The pod host starts pods as a node's kubelet does, side by side: each pass hands new pods
    to it and goes on while they start up (their start-up timing takes a simulated device's
    time). A port taken by another socket between the runner letting it go and the pod binding
    it (pods share one address here) would fail every restart: the pod is replaced, as one
    evicted, and its ReplicaSet's next pod gets ports of its own."""
    with (
        LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api,
        pod_host_process(tmp_path / "host") as host,
    ):
        rest = seeded(api.url)
        rest.call(DEPLOYMENTS, "POST", deployment(3))
        with running(
            api.url, tmp_path, start_delay_s=1.0, poll_s=0.1, pod_host=host.client
        ) as runner:
            wait_until(lambda: len(runner.replicas) == 3, timeout=30, what="three pods made")
            with runner._lock:  # between passes: the pod waits for its start, its ports held
                victim = sorted(runner.replicas.values(), key=lambda r: r.name)[0]
                assert not victim.started
                for sock in victim.held:
                    sock.close()
                thief = socket.socket()
                thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                thief.bind(("127.0.0.1", victim.port))
                thief.listen()
            try:
                wait_until(
                    lambda: ready_replicas(rest) == 3 and victim.name not in runner.replicas,
                    timeout=60,
                    what="three ready, the pod whose port was taken replaced",
                )
            finally:
                thief.close()
            assert f"pod {victim.name}: its ports are taken; replaced" in [
                what for _, what in runner.node_events
            ]
            pods = {
                p["metadata"]["name"] for p in rest.call(f"/api/v1/namespaces/{NS}/pods")["items"]
            }
            assert victim.name not in pods
            assert len(pods) == 3
            assert sorted(host.client.pods()) == sorted(pods)
            assert runner.errors == []
