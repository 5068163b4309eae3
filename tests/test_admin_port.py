"""The admin endpoint and the metrics on ports of their own: a caller of the model, on the
inference port, never reaches the endpoint that changes batch settings, whatever token it holds;
the operator's push reaches it on the port the Deployment names `admin`. Real processes, real
HTTP."""

from __future__ import annotations

import copy
import json
import socket
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchpilot.operator.autopilot.push import push_batching
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.configmap import batching_document
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.service import build_service
from batchpilot.operator.kube import KubeClient
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.settings import RuntimeSettings
from tests.runtime_process import (
    RuntimeProcess,
    free_port,
    refused_start,
    runtime_process,
    send,
)

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "admin-s3cret"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(mlp_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    log_dir = tmp_path_factory.mktemp("admin-port")
    token_file = log_dir / "admin-token"
    token_file.write_text(TOKEN + "\n")
    metrics_port = free_port()
    with runtime_process(
        mlp_model,
        "--engine", "simulated",
        "--simulated-latency", "alpha_ms=1,beta_ms=0",
        "--max-batch-size", "8",
        "--admin-token-file", str(token_file),
        "--metrics-port", str(metrics_port),
        log_dir=log_dir,
    ) as running:  # fmt: skip
        yield running


def in_force(server: RuntimeProcess) -> Any:
    return send(server, "GET", "/admin/batching", port=server.admin_port).json()


class TestEachPortAnswersItsOwnPaths:
    def test_the_inference_port_refuses_admin_paths_even_with_the_token(
        self, server: RuntimeProcess
    ) -> None:
        before = in_force(server)
        change = b'{"maxBatchSize": 2}'
        assert send(server, "PUT", "/admin/batching", change, AUTHORIZED).status == 404
        assert send(server, "GET", "/admin/batching").status == 404
        assert in_force(server) == before  # nothing changed
        assert before["maxBatchSize"] == 8

    def test_the_admin_port_serves_no_inference(self, server: RuntimeProcess) -> None:
        admin = server.admin_port
        assert send(server, "GET", "/v2/health/ready").status == 200
        assert send(server, "GET", "/v2/health/ready", port=admin).status == 404
        assert send(server, "GET", "/v2/models/mlp", port=admin).status == 404
        infer = json.dumps({"inputs": []}).encode()
        assert send(server, "POST", "/v2/models/mlp/infer", infer, port=admin).status == 404

    def test_metrics_only_on_the_metrics_port(self, server: RuntimeProcess) -> None:
        metrics_port = server.metrics_port
        assert metrics_port is not None
        reply = send(server, "GET", "/metrics", port=metrics_port)
        assert reply.status == 200
        assert b"batchpilot_batching_max_batch_size" in reply.body
        assert send(server, "GET", "/metrics").status == 404
        assert send(server, "GET", "/metrics", port=server.admin_port).status == 404
        assert send(server, "GET", "/admin/batching", port=metrics_port).status == 404

    def test_the_admin_port_takes_changes_with_the_token_only(self, server: RuntimeProcess) -> None:
        admin = server.admin_port
        change = b'{"maxBatchSize": 4}'
        assert send(server, "PUT", "/admin/batching", change, port=admin).status == 401
        reply = send(server, "PUT", "/admin/batching", change, AUTHORIZED, port=admin)
        assert reply.status == 200
        assert in_force(server)["maxBatchSize"] == 4
        reply = send(
            server, "PUT", "/admin/batching", b'{"maxBatchSize": 8}', AUTHORIZED, port=admin
        )
        assert reply.status == 200


def resnet_owner() -> Owner:
    doc = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
    return Owner(
        name=doc["metadata"]["name"],
        namespace=doc["metadata"]["namespace"],
        uid="uid-1",
        spec=InferenceServiceSpec.model_validate(doc["spec"]),
    )


def pod_of(deployment: dict[str, Any], server: RuntimeProcess) -> dict[str, Any]:
    """A ready pod of the operator's Deployment, its container ports those of `server` (a
    kubelet would give each pod its own address; here every listener has its own port)."""
    template = copy.deepcopy(deployment["spec"]["template"])
    (container,) = template["spec"]["containers"]
    actual = {"http": server.port, "admin": server.admin_port}
    container["ports"] = [
        {**port, "containerPort": actual.get(port["name"], port["containerPort"])}
        for port in container["ports"]
    ]
    return {
        "metadata": {"name": "resnet50-abc", **template["metadata"]},
        "spec": template["spec"],
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


class _Response:
    def __init__(self, data: bytes) -> None:
        self.status = 200
        self.data = data

    def read(self) -> bytes:
        return self.data


class PodListApi:
    """Stands in for kubernetes.client.ApiClient under `KubeClient`: every call lists `pods`."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def param_serialize(self, *, method: str, resource_path: str, **_: Any) -> tuple[Any, ...]:
        return method, resource_path, {}, None

    def call_api(self, *_: Any, **__: Any) -> _Response:
        return _Response(json.dumps({"items": self.pods}).encode())


class TestTheOperatorReachesTheAdminPort:
    def test_the_deployment_names_the_admin_port_and_the_service_leaves_it_out(self) -> None:
        settings = OperatorSettings()
        deployment = build_deployment(resnet_owner(), settings, replicas=1)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["admin"] == settings.runtime_admin_port == 8082
        assert ports["metrics"] == settings.runtime_metrics_port
        args = container["args"]
        assert args[args.index("--admin-port") + 1] == str(ports["admin"])
        assert args[args.index("--metrics-port") + 1] == str(ports["metrics"])
        assert len(set(ports.values())) == len(ports)
        service = build_service(resnet_owner())
        targets = {p["targetPort"] for p in service["spec"]["ports"]}
        numbers = {p["port"] for p in service["spec"]["ports"]}
        assert "admin" not in targets
        assert settings.runtime_admin_port not in numbers
        assert targets == {"http", "grpc", "metrics"}

    def test_the_push_reaches_the_admin_port_of_a_running_pod(self, server: RuntimeProcess) -> None:
        deployment = build_deployment(resnet_owner(), OperatorSettings(), replicas=1)
        kube = KubeClient(PodListApi([pod_of(deployment, server)]))
        (endpoint,) = kube.ready_pod_endpoints("default", {"batchpilot.io/inferenceservice": "x"})
        assert endpoint == f"127.0.0.1:{server.admin_port}"
        document = batching_document(batch_size=3, max_queue_delay_ms=2.5, deadline_ms=400)
        push_batching(endpoint, token=TOKEN, document=document)
        assert in_force(server) == {"maxBatchSize": 3, "maxQueueDelayMs": 2.5, "deadlineMs": 400.0}
        assert "batching changed by admin endpoint: max_batch_size 8 -> 3" in server.log()

        # The same push to the inference port is refused: it has no admin endpoint.
        with pytest.raises(urllib.error.HTTPError) as refused:
            push_batching(f"127.0.0.1:{server.port}", token=TOKEN, document=document)
        assert refused.value.code == 404
        restore = batching_document(batch_size=8, max_queue_delay_ms=5, deadline_ms=1000)
        push_batching(endpoint, token=TOKEN, document=restore)


class TestPortsAreChecked:
    @pytest.mark.parametrize(
        ("ports", "message"),
        [
            ({"port": 8080, "admin_port": 8080}, "port and admin_port are both 8080"),
            ({"grpc_port": 8082}, "grpc_port and admin_port are both 8082"),
            ({"metrics_port": 8080}, "port and metrics_port are both 8080"),
            ({"admin_port": 9000, "metrics_port": 9000}, "admin_port and metrics_port are both"),
        ],
    )
    def test_two_listeners_on_one_port_are_refused(
        self, ports: dict[str, int], message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            RuntimeSettings(model_path=Path("m.onnx"), **ports)  # type: ignore[arg-type]

    def test_ports_0_are_free_ports_each(self) -> None:
        settings = RuntimeSettings(model_path=Path("m.onnx"), port=0, admin_port=0)
        assert (settings.port, settings.admin_port) == (0, 0)

    def test_an_admin_port_in_use_stops_the_start_with_the_reason(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            log = refused_start(
                "--model", str(mlp_model), "--engine", "simulated", "--admin-port", str(port),
                log_path=tmp_path / "refused.log",
            )  # fmt: skip
        assert f"the admin port 127.0.0.1:{port}" in log
        assert "in use" in log
