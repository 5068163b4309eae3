"""The pod host: many simulated runtime pods served by one process, each on its own ports.

A real host process on loopback, driven through its control API as the pod runner drives it,
with pods on the tiny MLP model whose flags are what `container_command` makes of a container
(loopback host, a port per listener, the batching file and admin token in the pod's folder).
Each pod must answer as a runtime process would, for its own model, labels, token and file
alone; a deleted pod drains as a SIGTERM'd runtime does (what is in flight is answered, then
its ports refuse); what a runtime would refuse to start is a 400 with the reason; SIGTERM on
the host drains every pod and exits 0.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchpilot.sandbox.podhost import ONLY_SIMULATED
from batchpilot.sandbox.prometheus import free_ports
from tests.test_server_process import mlp_rows, v2_request
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

NAMESPACE = "sandbox"
PODS = ("alpha", "beta", "gamma")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """One request on its own connection; `body` other than bytes goes as JSON."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path, body=data, headers=dict(headers or {}))
        response = conn.getresponse()
        return Answer(response.status, response.read())
    finally:
        conn.close()


def refuses(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


@dataclass
class HostProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def control(self, method: str, path: str, body: Any = None) -> Answer:
        return call(self.port, method, path, body)

    def listing(self) -> dict[str, Any]:
        answer = self.control("GET", "/pods")
        assert answer.status == 200, answer
        pods: dict[str, Any] = answer.json()["pods"]
        return pods

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass(frozen=True)
class HostedPod:
    name: str
    port: int
    admin_port: int
    metrics_port: int
    directory: Path
    args: list[str]
    env: dict[str, str]

    @property
    def token(self) -> dict[str, str]:
        return {"Authorization": f"Bearer token-{self.name}"}

    def infer(self, model: str | None = None) -> Answer:
        body, headers = v2_request(mlp_rows(2, seed=3))
        return call(self.port, "POST", f"/v2/models/{model or self.name}/infer", body, headers)

    def batching(self) -> Any:
        return call(self.admin_port, "GET", "/admin/batching").json()


def pod_spec(
    name: str, model: Path, workdir: Path, *extra: str, env: Mapping[str, str] | None = None
) -> HostedPod:
    """A pod as the runner hands it over: the container's flags (`extra` first), then the
    rewritten ones, in `container_command`'s order; the container's env."""
    directory = workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "admin-token").write_text(f"token-{name}\n")
    (directory / "batching.json").write_text('{"maxBatchSize": 8, "maxQueueDelayMs": 2}')
    port, grpc_port, admin_port, metrics_port = free_ports(4)
    args = [
        "--name", name,
        "--engine", "simulated", "--simulated-latency", "alpha_ms=1,beta_ms=0.1",
        *extra,
        "--model", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--batching-config", str(directory / "batching.json"),
        "--admin-token-file", str(directory / "admin-token"),
        "--grpc-port", str(grpc_port),
        "--admin-port", str(admin_port),
        "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    container_env = {
        "BATCHPILOT_ISVC_NAME": name,
        "BATCHPILOT_ISVC_NAMESPACE": NAMESPACE,
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    return HostedPod(name, port, admin_port, metrics_port, directory, args, container_env)


def put(host: HostProcess, pod: HostedPod) -> Answer:
    return host.control("PUT", f"/pods/{pod.name}", {"args": pod.args, "env": pod.env})


@contextlib.contextmanager
def pod_host(workdir: Path, env: Mapping[str, str] | None = None) -> Iterator[HostProcess]:
    """The host as a process on a free control port (`env` added to its environment);
    SIGTERM'd (then killed) on exit."""
    (port,) = free_ports(1)
    log_path = workdir / f"podhost-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.sandbox.podhost",
             "--control-port", str(port), "--log-level", "info"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip
    host = HostProcess(process, port, log_path)
    try:

        def healthy() -> bool:
            assert process.poll() is None, f"the host exited:\n{host.log()}"
            with contextlib.suppress(OSError):
                return host.control("GET", "/healthz").status == 200
            return False

        wait_until(healthy, timeout=30, what="the pod host's /healthz", every=0.05)
        yield host
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("podhost")


@pytest.fixture(scope="module")
def host(workdir: Path, mlp_model: Path) -> Iterator[HostProcess]:
    # Settings in the host's own environment, which no pod may take for its own.
    env = {"BATCHPILOT_MODEL_PATH": str(mlp_model), "BATCHPILOT_ISVC_NAME": "the-host"}
    with pod_host(workdir, env) as running:
        yield running


@pytest.fixture(scope="module")
def pods(host: HostProcess, mlp_model: Path, workdir: Path) -> dict[str, HostedPod]:
    made = {name: pod_spec(name, mlp_model, workdir) for name in PODS}
    for pod in made.values():
        answer = put(host, pod)
        assert answer.status == 201, (answer, host.log())
    return made


def scrape(port: int) -> list[Any]:
    answer = call(port, "GET", "/metrics")
    assert answer.status == 200
    return [
        sample
        for family in text_string_to_metric_families(answer.body.decode())
        for sample in family.samples
    ]


def value(port: int, name: str) -> float:
    return float(sum(s.value for s in scrape(port) if s.name == name))


class TestEachPodServesAsItsOwnProcess:
    def test_inference_on_each_port_answers_with_that_pods_model(
        self, pods: dict[str, HostedPod]
    ) -> None:
        for pod in pods.values():
            answer = pod.infer()
            assert answer.status == 200, answer
            assert answer.json()["model_name"] == pod.name
        # Another pod's model is not served on this one's port.
        assert pods["alpha"].infer(model="beta").status == 404

    def test_an_admin_change_reaches_that_pod_alone(self, pods: dict[str, HostedPod]) -> None:
        alpha, beta = pods["alpha"], pods["beta"]
        change = b'{"maxBatchSize": 3}'
        assert call(alpha.admin_port, "PUT", "/admin/batching", change, beta.token).status == 401
        assert call(alpha.admin_port, "PUT", "/admin/batching", change, alpha.token).status == 200
        assert alpha.batching()["maxBatchSize"] == 3
        assert beta.batching()["maxBatchSize"] == 8
        assert pods["gamma"].batching()["maxBatchSize"] == 8
        # The admin endpoint is on the admin port only, as in a runtime.
        assert call(alpha.port, "PUT", "/admin/batching", change, alpha.token).status == 404
        restore = b'{"maxBatchSize": 8}'
        assert call(alpha.admin_port, "PUT", "/admin/batching", restore, alpha.token).status == 200

    def test_each_metrics_port_carries_that_pods_labels_only(
        self, pods: dict[str, HostedPod]
    ) -> None:
        for pod in pods.values():
            samples = scrape(pod.metrics_port)
            # The host process's own series, as each runtime reports its process's.
            assert {"process_cpu_seconds_total", "process_open_fds"} <= {s.name for s in samples}
            labelled = [s for s in samples if "isvc" in s.labels]
            assert labelled
            assert {s.labels["isvc"] for s in labelled} == {pod.name}  # from the pod's env
            assert {s.labels["model"] for s in labelled} == {pod.name}
            assert {s.labels["namespace"] for s in labelled} == {NAMESPACE}
            assert call(pod.port, "GET", "/metrics").status == 404  # it has a metrics port

    def test_the_listing_gives_every_pods_readiness_as_its_own_endpoint_does(
        self, host: HostProcess, pods: dict[str, HostedPod]
    ) -> None:
        listing = host.listing()
        for pod in pods.values():
            entry = listing[pod.name]
            ready = call(pod.port, "GET", "/v2/health/ready").status == 200
            assert (entry["state"], entry["ready"], ready) == ("running", True, True)
            assert entry["ports"] == {
                "inference": pod.port,
                "admin": pod.admin_port,
                "metrics": pod.metrics_port,
            }

    def test_the_batching_file_is_watched_per_pod(self, pods: dict[str, HostedPod]) -> None:
        gamma = pods["gamma"]
        (gamma.directory / "batching.json").write_text('{"maxBatchSize": 5}')
        wait_until(
            lambda: gamma.batching()["maxBatchSize"] == 5,
            timeout=10,
            what="gamma's batching file in force",
        )
        assert pods["beta"].batching()["maxBatchSize"] == 8

    def test_putting_a_pod_again_is_200_with_the_same_args_and_409_with_others(
        self, host: HostProcess, pods: dict[str, HostedPod]
    ) -> None:
        beta = pods["beta"]
        assert put(host, beta).status == 200
        changed = host.control(
            "PUT", "/pods/beta", {"args": [*beta.args, "--max-batch-size", "4"], "env": beta.env}
        )
        assert changed.status == 409, changed
        assert beta.infer().status == 200  # untouched


class TestWhatARuntimeWouldRefuseIs400:
    @pytest.mark.parametrize(
        ("extra", "reason"),
        [
            (("--engine", "onnx"), ONLY_SIMULATED),
            (("--max-batch-size", "many"), "invalid flags"),
            (("--no-such-flag",), "invalid flags"),
            (("--drain-grace-s", "1", "--drain-linger-s", "5"), "invalid settings"),
        ],
        ids=["onnx-engine", "bad-value", "unknown-flag", "invalid-settings"],
    )
    def test_bad_pods_are_refused_with_the_reason(
        self,
        host: HostProcess,
        mlp_model: Path,
        workdir: Path,
        extra: tuple[str, ...],
        reason: str,
    ) -> None:
        pod = pod_spec("refused", mlp_model, workdir, *extra)
        answer = put(host, pod)
        assert answer.status == 400, answer
        assert reason in answer.json()["detail"]
        assert "refused" not in host.listing()
        assert refuses(pod.port)

    def test_a_model_that_cannot_be_served_is_refused(
        self, host: HostProcess, workdir: Path
    ) -> None:
        pod = pod_spec("missing", workdir / "no-such-model.onnx", workdir)
        answer = put(host, pod)
        assert answer.status == 400, answer
        assert "cannot be served" in answer.json()["detail"]

    def test_a_pods_settings_come_from_its_env_never_the_hosts(
        self, host: HostProcess, mlp_model: Path, workdir: Path
    ) -> None:
        # No --model: the host's environment names one, the pod's does not.
        pod = pod_spec("from-env", mlp_model, workdir)
        at = pod.args.index("--model")
        args = pod.args[:at] + pod.args[at + 2 :]
        answer = host.control("PUT", "/pods/from-env", {"args": args, "env": pod.env})
        assert answer.status == 400, answer
        assert "model_path" in answer.json()["detail"]
        env = {**pod.env, "BATCHPILOT_MODEL_PATH": str(mlp_model)}
        answer = host.control("PUT", "/pods/from-env", {"args": args, "env": env})
        assert answer.status == 201, answer
        assert pod.infer().status == 200
        assert host.control("DELETE", "/pods/from-env").status == 202
        wait_until(lambda: "from-env" not in host.listing(), timeout=15, what="the pod to go")

    def test_deleting_an_unknown_pod_is_404(self, host: HostProcess) -> None:
        assert host.control("DELETE", "/pods/nobody").status == 404


class TestDeleteDrainsThePod:
    def test_a_request_in_flight_is_answered_then_the_ports_refuse(
        self, host: HostProcess, pods: dict[str, HostedPod], mlp_model: Path, workdir: Path
    ) -> None:
        # Batches of 600 ms, no start-up timing (queue admission), a short linger.
        pod = pod_spec(
            "slow", mlp_model, workdir,
            "--simulated-latency", "alpha_ms=600,beta_ms=0",
            "--admission", "queue", "--drain-linger-s", "0.2",
        )  # fmt: skip
        assert put(host, pod).status == 201
        answers: list[Answer] = []
        client = threading.Thread(target=lambda: answers.append(pod.infer()))
        client.start()
        wait_until(
            lambda: value(pod.metrics_port, "batchpilot_arrivals_total") == 1,
            timeout=10,
            what="the request to arrive",
            every=0.02,
        )
        assert host.control("DELETE", "/pods/slow").status == 202
        entry = host.listing().get("slow")
        assert entry is None or (entry["state"], entry["ready"]) == ("terminating", False)
        client.join(timeout=15)
        assert [a.status for a in answers] == [200]
        wait_until(lambda: "slow" not in host.listing(), timeout=15, what="the pod to go")
        assert all(refuses(port) for port in (pod.port, pod.admin_port, pod.metrics_port))
        # The others serve on.
        assert all(other.infer().status == 200 for other in pods.values())
        assert host.control("DELETE", "/pods/slow").status == 404


class TestACutOffPodAnswersNothing:
    def test_it_holds_every_request_unanswered_until_deleted_then_goes_at_once(
        self, host: HostProcess, pods: dict[str, HostedPod], mlp_model: Path, workdir: Path
    ) -> None:
        """A pod on a node that died (`--lose-node`): what it holds and what it is sent waits
        unanswered, as on a frozen process; a DELETE then removes it at once, undrained."""
        pod = pod_spec(
            "dark", mlp_model, workdir,
            "--simulated-latency", "alpha_ms=300,beta_ms=0", "--admission", "queue",
        )  # fmt: skip
        assert put(host, pod).status == 201
        outcomes: list[Answer | Exception] = []

        def client() -> None:
            try:
                outcomes.append(pod.infer())
            except OSError as exc:
                outcomes.append(exc)

        in_flight = threading.Thread(target=client)
        in_flight.start()
        wait_until(
            lambda: value(pod.metrics_port, "batchpilot_arrivals_total") == 1,
            timeout=10,
            what="the request to arrive",
            every=0.02,
        )
        assert host.control("PUT", "/pods/dark/unreachable").status == 200
        assert host.listing()["dark"]["reachable"] is False
        in_flight.join(timeout=1.5)  # its batch took 300 ms; its answer is held
        assert in_flight.is_alive()
        conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=0.5)
        conn.request("GET", "/v2/health/ready")  # a new request: accepted, never answered
        with pytest.raises(TimeoutError):
            conn.getresponse()
        conn.close()
        assert all(other.infer().status == 200 for other in pods.values())

        assert host.control("DELETE", "/pods/dark").status == 202
        wait_until(lambda: "dark" not in host.listing(), timeout=2, what="the pod gone at once")
        in_flight.join(timeout=5)
        assert not in_flight.is_alive()
        assert len(outcomes) == 1
        assert isinstance(outcomes[0], OSError), outcomes  # cut, never answered
        assert all(refuses(port) for port in (pod.port, pod.admin_port, pod.metrics_port))
        assert host.control("PUT", "/pods/dark/unreachable").status == 404


def test_sigterm_drains_every_pod_and_exits_0(mlp_model: Path, tmp_path: Path) -> None:
    with pod_host(tmp_path) as host:
        pods = [pod_spec(name, mlp_model, tmp_path, "--drain-linger-s", "0.1") for name in PODS]
        for pod in pods:
            assert put(host, pod).status == 201
        host.process.send_signal(signal.SIGTERM)
        assert host.process.wait(timeout=30) == 0, host.log()
    for pod in pods:
        assert refuses(pod.port)
