"""The admin endpoint and the metrics on ports of their own: a caller of the model, on the
inference port, never reaches the endpoint that changes batch settings, whatever token it holds;
the operator's push reaches it on the port the Deployment names `admin`. Real processes, real
HTTP — and the access document over the same port (`PUT /admin/access`): the token, the reasons
for a bad document, limits changed live with each bucket keeping what it holds, and the mounted
file that wins only when its content changes (an in-process runtime, real HTTP, its file watcher
stepped by the test)."""

from __future__ import annotations

import copy
import json
import math
import socket
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchpilot.api.samples import read_samples
from batchpilot.operator.autopilot.pod_metrics import PodScraper
from batchpilot.operator.autopilot.push import push_batching
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.configmap import batching_document
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.service import build_service
from batchpilot.operator.kube import KubeClient
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.settings import RuntimeSettings
from tests.access_runtime import Answer, KeyedRuntime, keyed_runtime
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
MLP_BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
).encode()


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

    def test_the_admin_port_has_the_metrics_samples_as_json(self, server: RuntimeProcess) -> None:
        """What the operator reads when Prometheus does not answer: every batchpilot sample of
        /metrics, with its value."""
        metrics_port = server.metrics_port
        assert metrics_port is not None
        for _ in range(3):
            assert send(server, "POST", "/v2/models/mlp/infer", MLP_BODY).status == 200
        text = send(server, "GET", "/metrics", port=metrics_port).body.decode()
        doc = send(server, "GET", "/admin/metrics", port=server.admin_port).json()
        exposed = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("batchpilot_") and math.isfinite(sample.value)
        }
        read = {(name, tuple(sorted(labels.items()))): v for name, labels, v in read_samples(doc)}
        # The two reads a moment apart: the same series; counters no request moved, equal.
        assert set(read) == set(exposed)
        served = (
            "batchpilot_requests_total",
            (("isvc", ""), ("model", "mlp"), ("namespace", ""), ("outcome", "success")),
        )
        assert read[served] == exposed[served] >= 3
        assert not any(name.startswith("process_") for name, _ in read)

    def test_the_operators_reads_of_a_pod_make_a_window(self, server: RuntimeProcess) -> None:
        endpoint = f"127.0.0.1:{server.admin_port}"
        scraper = PodScraper(type("Pods", (), {"ready_pod_endpoints": lambda *_: [endpoint]})())
        owner = resnet_owner()
        assert scraper(owner, ready_replicas=1, at=0.0) is None  # the first read
        for _ in range(20):
            assert send(server, "POST", "/v2/models/mlp/infer", MLP_BODY).status == 200
        seen = scraper(owner, ready_replicas=1, at=1.0)
        assert seen is not None
        assert seen.reporting_replicas == 1
        assert seen.qps is not None
        assert seen.qps * seen.window_s == pytest.approx(20)
        assert seen.p99_s is not None
        assert 0 < seen.p99_s < 1.0
        assert seen.mean_batch == pytest.approx(1.0)
        assert seen.missing() == []
        # Every signal the decision plans with, from the samples the runtime names.
        assert seen.utilization is not None
        assert seen.utilization > 0
        assert seen.compute
        assert seen.compute[0].mean_batch == pytest.approx(1.0)
        assert seen.arrival_qps == pytest.approx(seen.qps)
        assert seen.outside_s is not None
        assert seen.startup

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


# --- The access document over the admin port --------------------------------------------------

ALICE = "alice-0123456789abcdef0123"
BOB = "bob-0123456789abcdef012345"


def keys_folder(folder: Path) -> Path:
    folder.mkdir()
    (folder / "alice").write_text(ALICE + "\n")
    (folder / "bob").write_text(BOB + "\n")
    return folder


@pytest.fixture
def keyed(mlp_model: Path, tmp_path: Path) -> Iterator[KeyedRuntime]:
    access = tmp_path / "access.json"
    # five requests, then one every 100 s: what a bucket holds is what was left of the five
    access.write_text(json.dumps({"defaultQuota": {"requestsPerSecond": 0.01, "burst": 5}}))
    with keyed_runtime(
        mlp_model, keys=keys_folder(tmp_path / "keys"), access=access, token=TOKEN
    ) as running:
        yield running


def put_access(runtime: KeyedRuntime, doc: Any, headers: dict[str, str] = AUTHORIZED) -> Answer:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return runtime.send("PUT", "/admin/access", body, headers, admin=True)


class TestAccessOverTheAdminPort:
    def test_changes_need_the_admin_token_like_the_batch_settings(
        self, keyed: KeyedRuntime
    ) -> None:
        doc = {"defaultQuota": {"requestsPerSecond": 1, "burst": 1}}
        before = keyed.send("GET", "/admin/access", admin=True).json()
        assert before == {"defaultQuota": {"requestsPerSecond": 0.01, "burst": 5}}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            refused = put_access(keyed, doc, headers)
            assert refused.status == 401, headers
            assert refused.headers["www-authenticate"].startswith("Bearer")
        assert keyed.send("GET", "/admin/access", admin=True).json() == before
        # the inference port has no admin endpoint, whatever token a caller holds
        wrong_port = keyed.send("PUT", "/admin/access", json.dumps(doc).encode(), AUTHORIZED)
        assert wrong_port.status == 404
        assert keyed.reloads("admin", "applied") == 0

    @pytest.mark.parametrize(
        ("body", "reason"),
        [
            (b"{not json", "not valid JSON"),
            (b'{"defaultQuota": {"requestsPerSecond": 0}}', "defaultQuota.requestsPerSecond must"),
            (b'{"totalQuota": {"requestsPerSecond": 5, "burst": 0}}', "totalQuota.burst must"),
            (b'{"quotas": {}}', "unknown access setting quotas"),
        ],
    )
    def test_a_bad_document_is_400_with_the_reason_and_changes_nothing(
        self, keyed: KeyedRuntime, body: bytes, reason: str
    ) -> None:
        before = keyed.gate.policy
        answer = put_access(keyed, body)
        assert answer.status == 400
        assert reason in answer.json()["error"]
        assert keyed.gate.policy is before
        assert keyed.reloads("admin", "refused") == 1

    def test_new_limits_apply_at_once_and_each_bucket_keeps_what_it_holds(
        self, keyed: KeyedRuntime
    ) -> None:
        assert [keyed.infer(ALICE) for _ in range(3)] == [200] * 3  # 2 of 5 left
        assert [keyed.infer(BOB) for _ in range(4)] == [200] * 4  # 1 of 5 left
        doc = {
            "defaultQuota": {"requestsPerSecond": 0.01, "burst": 3},
            "keyQuotas": [{"keyId": "alice", "requestsPerSecond": 0.01, "burst": 1}],
        }
        answer = put_access(keyed, doc)
        assert answer.status == 200
        assert answer.json() == doc
        assert keyed.send("GET", "/admin/access", admin=True).json() == doc
        assert keyed.reloads("admin", "applied") == 1
        # alice is over her new, lower limit right after the PUT: 1 of her 2 tokens fits it
        assert [keyed.infer(ALICE) for _ in range(2)] == [200, 429]
        # bob keeps the 1 he had, not a fresh bucket of 3
        assert [keyed.infer(BOB) for _ in range(2)] == [200, 429]

    def test_the_same_document_from_the_file_later_changes_nothing_and_a_new_one_wins(
        self, keyed: KeyedRuntime, tmp_path: Path
    ) -> None:
        pushed = {"defaultQuota": {"requestsPerSecond": 0.01, "burst": 2}}
        assert put_access(keyed, pushed).status == 200
        assert [keyed.infer(ALICE) for _ in range(2)] == [200, 200]
        in_force = keyed.gate.policy
        # the kubelet delivers the ConfigMap the operator wrote the same document into
        replace_file(tmp_path / "access.json", json.dumps(pushed, indent=2))
        assert keyed.watcher.check() is False
        assert keyed.gate.policy is in_force
        assert keyed.infer(ALICE) == 429  # her bucket was not refilled by the reload
        assert keyed.reloads("access", "applied") == 0
        # the file re-published with the rest of the ConfigMap, its content unchanged
        replace_file(tmp_path / "access.json", json.dumps(pushed, indent=2))
        assert keyed.watcher.check() is False
        # a file with a different document still wins
        replace_file(tmp_path / "access.json", json.dumps({"allowedKeyIds": ["bob"]}))
        assert keyed.watcher.check() is True
        assert keyed.reloads("access", "applied") == 1
        assert keyed.infer(ALICE) == 403
        assert keyed.infer(BOB) == 200

    def test_a_server_without_api_keys_says_there_is_nothing_to_change(
        self, server: RuntimeProcess
    ) -> None:
        doc = b'{"defaultQuota": {"requestsPerSecond": 1}}'
        for method, headers in (("GET", {}), ("PUT", AUTHORIZED)):
            reply = send(server, method, "/admin/access", doc, headers, port=server.admin_port)
            assert reply.status == 400, method
            assert "started without --api-keys" in reply.json()["error"]
        assert send(server, "PUT", "/admin/access", doc, port=server.admin_port).status == 401


def replace_file(path: Path, text: str) -> None:
    """Replace `path` by a new file (a new inode, as the kubelet's swap makes)."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.replace(path)
