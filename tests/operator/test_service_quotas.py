"""Service-wide quotas: the limits `spec.auth.quotas` writes are the service's, each ready replica
enforcing its share; the share follows scaling and reaches the running pods through their admin
port at once, without rolling them. The division on its own, the document and the status in
words, the CRD's refusals, the reconcile pass at the push boundary, and the push into a runtime
served over real HTTP."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from pydantic import ValidationError

from batchpilot.api.access import MIN_RATE_RPS, AccessDocument, QuotaDocument
from batchpilot.operator import handlers
from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.autopilot.push import AccessPusher, PushDocument, push_access
from batchpilot.operator.children.apikeys import access_document, auth_status
from batchpilot.operator.children.common import ACCESS_FILE, Owner
from batchpilot.operator.children.configmap import build_configmap
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.quota_share import serving_replicas, share, shared
from batchpilot.operator.children.secret import token_in
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, SECRET
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.access import parse_access
from batchpilot.sandbox import errors
from tests.access_runtime import KeyedRuntime, keyed_runtime
from tests.operator.crd_store import crd_store, create_isvc
from tests.operator.test_reconciler import NS, Cluster, isvc

STOREFRONT = "storefront-0123456789abcdef"
BATCH = "batch-jobs-0123456789abcdef"
QUOTAS: dict[str, Any] = {
    "default": {"requestsPerSecond": 50, "burst": 100},
    "perKey": [{"keyId": "batch", "requestsPerSecond": 5, "burst": 5}],
    "total": {"requestsPerSecond": 400, "burst": 400},
}


def auth(**quotas: Any) -> dict[str, Any]:
    return {"apiKeys": {"secretName": "model-keys"}, "quotas": {**QUOTAS, **quotas}}


def owner(**quotas: Any) -> Owner:
    spec = {"model": {"uri": "pvc://m/resnet50.onnx"}, "sla": {"latencyP99Ms": 100}}
    return Owner(
        "resnet50",
        NS,
        "uid-1",
        InferenceServiceSpec.model_validate({**spec, "auth": auth(**quotas)}),
    )


def limit(rate: float, burst: int) -> QuotaDocument:
    return {"requestsPerSecond": rate, "burst": burst}


def document(of: Owner, replicas: int) -> AccessDocument:
    text = access_document(of, serving_replicas=replicas)
    assert text is not None
    parse_access(text.encode())  # every share is one the runtime takes
    doc: AccessDocument = json.loads(text)
    return doc


class TestTheShare:
    def test_rates_and_bursts_are_divided_by_the_replicas_that_serve(self) -> None:
        assert share(limit(400, 400), 4) == limit(100, 100)
        assert share(limit(50, 100), 2) == limit(25, 50)
        assert share(limit(400, 400), 3) == limit(133.333, 133)  # 6 significant digits

    def test_a_burst_is_rounded_to_the_nearest_request_and_never_below_one(self) -> None:
        assert share(limit(10, 5), 2)["burst"] == 3  # 2.5 → 3
        assert share(limit(10, 7), 4)["burst"] == 2  # 1.75 → 2
        assert share(limit(10, 5), 4)["burst"] == 1  # 1.25 → 1
        assert share(limit(10, 1), 4)["burst"] == 1  # 0.25 → 1: a bucket of 0 admits nothing

    def test_a_rate_stays_one_the_runtime_takes(self) -> None:
        assert share(limit(0.01, 1), 4) == limit(0.01, 1)  # 0.0025 → the smallest rate, 0.01

    def test_one_replica_gets_the_whole_limit(self) -> None:
        assert share(limit(2.5, 3), 1) == limit(2.5, 3)

    def test_the_document_is_divided_whole_and_the_allowed_keys_kept(self) -> None:
        doc: AccessDocument = {
            "allowedKeyIds": ["batch", "storefront"],
            "defaultQuota": limit(50, 100),
            "keyQuotas": [{"keyId": "batch", "requestsPerSecond": 5, "burst": 5}],
            "totalQuota": limit(400, 400),
        }
        assert shared(doc, 2) == {
            "allowedKeyIds": ["batch", "storefront"],
            "defaultQuota": limit(25, 50),
            "keyQuotas": [{"keyId": "batch", "requestsPerSecond": 2.5, "burst": 3}],
            "totalQuota": limit(200, 200),
        }
        assert shared({}, 3) == {}

    @pytest.mark.parametrize(
        ("deployment", "replicas"),
        [
            (None, 1),
            ({"status": {}}, 1),
            ({"status": {"readyReplicas": 0}}, 1),
            ({"status": {"readyReplicas": 1}}, 1),
            ({"status": {"readyReplicas": 3}, "spec": {"replicas": 5}}, 3),
        ],
    )
    def test_the_replicas_that_serve_are_the_ready_ones_and_at_least_one(
        self, deployment: dict[str, Any] | None, replicas: int
    ) -> None:
        assert serving_replicas(deployment) == replicas


class TestTheDocumentAndTheStatus:
    def test_service_scope_divides_replica_scope_does_not(self) -> None:
        assert document(owner(), 4)["totalQuota"] == limit(100, 100)
        assert document(owner(), 4)["defaultQuota"] == limit(12.5, 25)
        assert document(owner(scope="service"), 1)["totalQuota"] == limit(400, 400)
        for replicas in (1, 4):
            assert document(owner(scope="replica"), replicas) == document(owner(), 1)

    def test_the_configmap_holds_the_share(self) -> None:
        configmap = build_configmap(
            owner(), batch_size=4, max_queue_delay_ms=5, deadline_ms=100, serving_replicas=2
        )
        assert json.loads(configmap["data"][ACCESS_FILE])["totalQuota"] == limit(200, 200)

    def test_the_status_says_the_service_limit_and_each_replicas_share(self) -> None:
        status = auth_status(owner(), serving_replicas=4)
        assert status == {
            "secretName": "model-keys",
            "quotaScope": "service",
            "servingReplicas": 4,
            "text": "API keys from Secret model-keys: every key; limits: "
            "each key 50 requests/s for the service, 12.5 per replica across 4 replicas "
            "(burst 100, 25 per replica); "
            "batch 5 requests/s for the service, 1.25 per replica across 4 replicas "
            "(burst 5, 1 per replica); "
            "in total 400 requests/s for the service, 100 per replica across 4 replicas "
            "(burst 400, 100 per replica)",
        }
        one = auth_status(owner(default=None, perKey=None), serving_replicas=1)
        assert one is not None
        assert one["text"].endswith(
            "in total 400 requests/s for the service, 400 per replica across 1 replica "
            "(burst 400, 400 per replica)"
        )

    def test_the_status_says_where_the_smallest_share_raised_the_limit(self) -> None:
        tiny = {"requestsPerSecond": MIN_RATE_RPS, "burst": 1}
        status = auth_status(owner(default=None, perKey=None, total=tiny), serving_replicas=1000)
        assert status is not None
        assert status["text"].endswith(
            f"in total {MIN_RATE_RPS:g} requests/s for the service, {MIN_RATE_RPS:g} per replica "
            f"across 1000 replicas (burst 1, 1 per replica); {MIN_RATE_RPS * 1000:g} requests/s "
            f"in all: a replica's share is {MIN_RATE_RPS:g} at the least"
        )

    def test_replica_scope_says_per_replica(self) -> None:
        status = auth_status(owner(scope="replica", perKey=None), serving_replicas=4)
        assert status == {
            "secretName": "model-keys",
            "quotaScope": "replica",
            "text": "API keys from Secret model-keys: every key; per replica: "
            "each key 50 requests/s, burst 100; in total 400 requests/s, burst 400",
        }

    def test_a_new_share_does_not_roll_the_pods(self) -> None:
        """The pod template holds no hash of the access document: a scale event, which changes
        each replica's share, must not restart the service."""
        settings = OperatorSettings()
        templates = [
            build_deployment(o, settings, replicas=3)["spec"]["template"]
            for o in (owner(), owner(total={"requestsPerSecond": 7}), owner(scope="replica"))
        ]
        assert templates[0] == templates[1] == templates[2]
        assert "access" not in json.dumps(templates[0].get("metadata", {}))


class TestTheCrd:
    def test_scope_is_service_or_replica(self) -> None:
        store = crd_store(NS)
        for scope in ("service", "replica"):
            created = create_isvc(store, NS, {"auth": auth(scope=scope)}, name=f"m-{scope}")
            assert created["spec"]["auth"]["quotas"]["scope"] == scope
        with pytest.raises(errors.ApiError) as caught:
            create_isvc(store, NS, {"auth": auth(scope="cluster")}, name="m-bad")
        assert caught.value.code == 422
        message = caught.value.message
        assert "spec.auth.quotas.scope" in message
        assert '"service"' in message
        assert '"replica"' in message

    def test_the_spec_refuses_it_too_and_defaults_to_service(self) -> None:
        with pytest.raises(ValidationError, match="'service' or 'replica'"):
            owner(scope="cluster")
        written = owner().spec.auth
        assert written is not None
        assert written.quotas.scope == "service"


# --- The reconcile pass, at the push boundary ---------------------------------------------------


def keys_secret() -> dict[str, Any]:
    keys = {"storefront": STOREFRONT, "batch": BATCH}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "model-keys", "namespace": NS},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
    }


class ReadyPods:
    """The pods' admin endpoints the watch-fed cache would list as ready."""

    def __init__(self) -> None:
        self.endpoints: list[str] = []
        self.ready_since: dict[str, float] = {}
        """When a pod became ready (seconds since the epoch); unknown where absent."""

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        assert (namespace, selector) == (NS, {"batchpilot.io/inferenceservice": "resnet50"})
        return list(self.endpoints)

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, float | None]:
        return {e: self.ready_since.get(e) for e in self.ready_pod_endpoints(namespace, selector)}


class Pushes:
    """Records each push; an endpoint in `failing` raises, as an unreachable pod would. With
    `through`, each push is also made for real."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.failing: set[str] = set()
        self.token: str | None = None
        self.through: PushDocument | None = None

    def __call__(self, endpoint: str, *, token: str, document: str) -> None:
        self.token = token
        if endpoint in self.failing:
            raise ConnectionRefusedError("connection refused")
        self.sent.append((endpoint, json.loads(document)))
        if self.through is not None:
            self.through(endpoint, token=token, document=document)

    def take(self) -> list[tuple[str, Any]]:
        """(endpoint, the total quota's share) of each push since the last call."""
        taken = [(endpoint, doc["totalQuota"]) for endpoint, doc in self.sent]
        self.sent.clear()
        return taken


class PushingCluster(Cluster):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.pods = ReadyPods()
        self.pushes = Pushes()
        self.reconciler = Reconciler(
            self.kube,
            OperatorSettings(),
            learned_outside_s=learned_outside_s,
            clock=lambda: self.now,
            push_access=AccessPusher(self.kube, pods=self.pods, push=self.pushes),
        )
        self.kube.put_object(keys_secret())

    def ready(self, *endpoints: str) -> None:
        """`endpoints` are the ready pods, and the Deployment's status says so."""
        self.pods.endpoints = list(endpoints)
        deployment = self.kube.objects[("Deployment", NS, "resnet50")]
        deployment["status"] = {"readyReplicas": len(endpoints), "replicas": len(endpoints)}


P1, P2 = "10.0.0.1:8082", "10.0.0.2:8082"


class TestThePushFollowsTheSpecAndTheReplicas:
    def test_scaling_up_and_down_sends_each_pod_its_new_share_once(self) -> None:
        cluster = PushingCluster(isvc(auth=auth()))
        cluster.reconcile()  # children created, no pod ready yet: nothing to send
        assert cluster.pushes.take() == []
        cluster.ready(P1)
        cluster.reconcile()
        assert cluster.pushes.take() == [(P1, limit(400, 400))]
        assert cluster.pushes.token == token_in(cluster.kube.of(SECRET, NS, "resnet50-admin-token"))
        cluster.reconcile()
        assert cluster.pushes.take() == []  # nothing changed: nothing sent

        deployment_version = cluster.kube.of(DEPLOYMENT, NS, "resnet50")["metadata"]
        cluster.ready(P1, P2)  # 1 → 2 ready replicas: each enforces half
        outcomes: list[Any] = []
        writes = cluster.writes_of(lambda: outcomes.append(cluster.reconcile()))
        assert cluster.pushes.take() == [(P1, limit(200, 200)), (P2, limit(200, 200))]
        assert [e for e in outcomes[0].events if e.type == "Warning"] == []
        assert [w for w in writes if w[1] == "Deployment"] == []  # the pods do not roll
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["metadata"] == deployment_version
        assert cluster.body["status"]["auth"]["servingReplicas"] == 2
        assert "200 per replica across 2 replicas" in cluster.body["status"]["auth"]["text"]
        cluster.reconcile()
        assert cluster.pushes.take() == []

        cluster.ready(P2)  # scaled down: the one left enforces the whole limit again
        cluster.reconcile()
        assert cluster.pushes.take() == [(P2, limit(400, 400))]

    def test_the_configmap_holds_what_was_sent_so_a_new_pod_starts_with_its_share(
        self,
    ) -> None:
        """The ConfigMap is the durable copy: after a scale it holds the same divided document
        the pods were sent (a new pod starts from it, and a file arriving later undoes nothing);
        a scale writes the ConfigMap alone, and the pass after it writes nothing."""

        def in_configmap() -> Any:
            data = cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")["data"][ACCESS_FILE]
            return json.loads(data)

        cluster = PushingCluster(isvc(auth=auth()))
        cluster.reconcile()
        assert in_configmap()["totalQuota"] == limit(400, 400)
        cluster.ready(P1, P2)
        writes = cluster.writes_of(cluster.reconcile)
        assert [w[1:] for w in writes if w[1] != "InferenceService"] == [
            ("ConfigMap", "resnet50-batching")
        ]
        sent = cluster.pushes.take()
        assert in_configmap()["totalQuota"] == limit(200, 200)
        assert [document for _, document in sent] == [limit(200, 200)] * 2
        assert sent == [(P1, in_configmap()["totalQuota"]), (P2, in_configmap()["totalQuota"])]
        assert [w for w in cluster.writes_of(cluster.reconcile) if w[1] != "InferenceService"] == []

    def test_a_deleted_inferenceservice_is_forgotten(self) -> None:
        """What was given to its pods lives only in the operator's memory: the delete handler
        drops it (else it would stay until a restart, one entry per deleted service)."""
        cluster = PushingCluster(isvc(auth=auth()))
        cluster.reconciler = Reconciler(
            cluster.kube,
            OperatorSettings(),
            learned_outside_s=learned_outside_s,
            clock=lambda: cluster.now,
            push_access=(
                pusher := AccessPusher(cluster.kube, pods=cluster.pods, push=cluster.pushes)
            ),
        )
        cluster.reconcile()  # the children
        cluster.ready(P1)
        cluster.reconcile()
        assert cluster.pushes.take() == [(P1, limit(400, 400))]
        assert len(pusher) == 1
        handlers.deleted(
            name="resnet50", namespace=NS, body=kopf.Body({}), memo=kopf.Memo(access_pusher=pusher)
        )
        assert len(pusher) == 0

    def test_a_spec_change_is_sent_to_every_ready_pod(self) -> None:
        cluster = PushingCluster(isvc(auth=auth()))
        cluster.reconcile()
        cluster.ready(P1, P2)
        cluster.reconcile()
        cluster.pushes.take()
        cluster.body["spec"]["auth"]["quotas"]["total"] = {"requestsPerSecond": 100}
        cluster.reconcile()
        assert cluster.pushes.take() == [(P1, limit(50, 50)), (P2, limit(50, 50))]

    def test_replica_scope_is_not_divided(self) -> None:
        cluster = PushingCluster(isvc(auth=auth(scope="replica")))
        cluster.reconcile()
        cluster.ready(P1, P2)
        cluster.reconcile()
        assert cluster.pushes.take() == [(P1, limit(400, 400)), (P2, limit(400, 400))]

    def test_a_pod_that_cannot_be_reached_is_warned_about_once_and_the_pass_goes_on(
        self,
    ) -> None:
        cluster = PushingCluster(isvc(auth=auth()))
        cluster.reconcile()
        cluster.pushes.failing.add(P2)
        cluster.ready(P1, P2)
        outcome = cluster.reconcile()
        assert outcome.retry_error is None
        assert outcome.permanent_error is None
        (warning,) = [e for e in outcome.events if e.type == "Warning"]
        assert warning.reason == "ApplyFailed"
        assert f"could not be sent to {P2} (connection refused)" in warning.message
        assert "read it from the ConfigMap" in warning.message
        assert cluster.pushes.take() == [(P1, limit(200, 200))]
        # no push storm: not tried again until the document changes
        assert [e for e in cluster.reconcile().events if e.type == "Warning"] == []
        assert cluster.pushes.take() == []

    def test_without_auth_nothing_is_sent(self) -> None:
        cluster = PushingCluster(isvc())
        cluster.reconcile()
        cluster.ready(P1)
        cluster.reconcile()
        assert cluster.pushes.take() == []


# --- Into a runtime over real HTTP -----------------------------------------------------------


@pytest.fixture
def runtime_of(
    tmp_path: Path, mlp_model: Path
) -> Iterator[tuple[PushingCluster, KeyedRuntime, Path]]:
    """A cluster whose one ready pod is a runtime served over HTTP, with the admin token the
    operator generated and the access document of its first ConfigMap as the mounted file."""
    cluster = PushingCluster(isvc(auth=auth()))
    cluster.reconcile()
    token = token_in(cluster.kube.of(SECRET, NS, "resnet50-admin-token"))
    assert token is not None
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "storefront").write_text(STOREFRONT)
    (keys / "batch").write_text(BATCH)
    access = tmp_path / "access.json"
    configmap = cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")
    access.write_text(configmap["data"][ACCESS_FILE])
    cluster.pushes.through = push_access
    with keyed_runtime(mlp_model, keys=keys, access=access, token=token) as runtime:
        yield cluster, runtime, access


class TestIntoARunningRuntime:
    def test_a_quota_change_is_in_force_at_once_without_the_file(
        self, runtime_of: tuple[PushingCluster, KeyedRuntime, Path]
    ) -> None:
        cluster, runtime, access = runtime_of
        mounted = access.read_bytes()
        cluster.ready(f"127.0.0.1:{runtime.admin_port}")
        cluster.reconcile()
        assert [runtime.infer(BATCH) for _ in range(3)] == [200, 200, 200]  # burst 5
        cluster.body["spec"]["auth"]["quotas"]["perKey"] = [
            {"keyId": "batch", "requestsPerSecond": 0.01, "burst": 1}
        ]
        outcome = cluster.reconcile()  # the pass returns once the pod has it
        assert [e for e in outcome.events if e.type == "Warning"] == []
        # over its new, lower limit right away: of what its bucket held, one request fits it
        assert [runtime.infer(BATCH) for _ in range(2)] == [200, 429]
        assert runtime.infer(STOREFRONT) == 200
        assert runtime.reloads("admin", "applied") == 2
        assert access.read_bytes() == mounted  # not through the file

    def test_scaling_to_two_ready_pods_halves_what_the_runtime_enforces(
        self, runtime_of: tuple[PushingCluster, KeyedRuntime, Path]
    ) -> None:
        cluster, runtime, _ = runtime_of
        endpoint = f"127.0.0.1:{runtime.admin_port}"
        cluster.ready(endpoint)
        cluster.reconcile()
        in_force = runtime.send("GET", "/admin/access", admin=True).json()
        assert in_force["totalQuota"] == limit(400, 400)
        cluster.ready(endpoint, "127.0.0.1:1")  # a second pod, unreachable here: warned, not fatal
        outcome = cluster.reconcile()
        in_force = runtime.send("GET", "/admin/access", admin=True).json()
        assert in_force["totalQuota"] == limit(200, 200)
        assert in_force["defaultQuota"] == limit(25, 50)
        assert [e.reason for e in outcome.events if e.type == "Warning"] == ["ApplyFailed"]
