"""API keys and quotas as spec: `spec.auth` rendered into the pods (the Secret mounted whole, the
runtime's flags, the access document in the ConfigMap), bad specs refused by the CRD and by the
spec with the reason, a missing or unusable Secret held in a condition with nothing applied, and
the watch-fed cache reading the user's Secret once."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.cache import WatchCache
from batchpilot.operator.children.apikeys import API_KEYS_DIR, access_document
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.handlers import ours
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, INFERENCESERVICE, SECRET
from batchpilot.operator.plan import CHILD_KINDS
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.runtime.access import parse_access
from batchpilot.sandbox import errors
from batchpilot.sandbox.store import Store
from tests.operator.crd_store import crd_store, create_isvc
from tests.operator.test_cache import WatchedApi
from tests.operator.test_reconciler import NS, T0, Cluster, isvc

AUTH: dict[str, Any] = {
    "apiKeys": {"secretName": "model-keys", "allowedKeyIds": ["storefront", "batch"]},
    "quotas": {
        "default": {"requestsPerSecond": 50, "burst": 100},
        "perKey": [{"keyId": "batch", "requestsPerSecond": 2.5}],
        "total": {"requestsPerSecond": 400, "burst": 400},
    },
}


def owner(auth: dict[str, Any] | None = AUTH) -> Owner:
    spec = {"model": {"uri": "pvc://models/resnet50.onnx"}, "sla": {"latencyP99Ms": 100}}
    if auth is not None:
        spec["auth"] = auth
    return Owner("resnet50", NS, "uid-1", InferenceServiceSpec.model_validate(spec))


def keys_secret(keys: dict[str, str], name: str = "model-keys") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
    }


GOOD_KEYS = {"storefront": "s" * 32, "batch": "b" * 32}


class TestInThePods:
    def test_the_secret_is_mounted_whole_and_the_runtime_told_where(self) -> None:
        deployment = build_deployment(owner(), OperatorSettings(), replicas=1)
        pod = deployment["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "api-keys"]
        assert volume["secret"] == {"secretName": "model-keys", "defaultMode": 0o440}
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "api-keys"]
        # a whole volume: the kubelet updates it in place (a subPath mount it would not)
        assert mount == {"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True}
        args = container["args"]
        assert args[args.index("--api-keys") + 1] == API_KEYS_DIR
        assert args[args.index("--access-config") + 1] == "/etc/batchpilot/batching/access.json"

    def test_without_auth_nothing_changes(self) -> None:
        deployment = build_deployment(owner(None), OperatorSettings(), replicas=1)
        pod = deployment["spec"]["template"]["spec"]
        assert "api-keys" not in [v["name"] for v in pod["volumes"]]
        assert "--api-keys" not in pod["containers"][0]["args"]
        assert access_document(owner(None)) is None

    def test_the_access_document_is_what_the_runtime_reads(self) -> None:
        document = access_document(owner())
        assert document is not None
        assert json.loads(document) == {
            "allowedKeyIds": ["batch", "storefront"],
            "defaultQuota": {"requestsPerSecond": 50, "burst": 100},
            "keyQuotas": [{"keyId": "batch", "requestsPerSecond": 2.5, "burst": 3}],
            "totalQuota": {"requestsPerSecond": 400, "burst": 400},
        }
        policy = parse_access(document.encode())  # the runtime's own parser accepts it
        assert policy.allowed == {"batch", "storefront"}
        assert policy.per_key["batch"].burst == 3  # absent: one second's worth, rounded up


BAD_AUTH = [
    ({"quotas": {}}, "spec.auth.apiKeys: Required value"),
    ({"apiKeys": {}}, "spec.auth.apiKeys.secretName: Required value"),
    ({"apiKeys": {"secretName": "Model_Keys"}}, "secretName names a Secret in this namespace"),
    (
        {"apiKeys": {"secretName": "k", "allowedKeyIds": ["ok", "not ok"]}},
        "a key id is 1 to 63 letters",
    ),
    (
        {"apiKeys": {"secretName": "k"}, "quotas": {"default": {"requestsPerSecond": -5}}},
        "should be greater than or equal to 0.01",
    ),
    (
        {"apiKeys": {"secretName": "k"}, "quotas": {"total": {"requestsPerSecond": 1e9}}},
        "should be less than or equal to 100000",
    ),
    (
        {
            "apiKeys": {"secretName": "k"},
            "quotas": {"default": {"requestsPerSecond": 5, "burst": 0}},
        },
        "should be greater than or equal to 1",
    ),
    (
        {
            "apiKeys": {"secretName": "k"},
            "quotas": {"perKey": [{"keyId": "-x", "requestsPerSecond": 1}]},
        },
        "a key id is 1 to 63 letters",
    ),
    (
        {
            "apiKeys": {"secretName": "k"},
            "quotas": {
                "perKey": [
                    {"keyId": "a", "requestsPerSecond": 1},
                    {"keyId": "a", "requestsPerSecond": 2},
                ]
            },
        },
        "each keyId has one quota in quotas.perKey",
    ),
]
SPEC_MESSAGES = {
    "should be greater than or equal to 0.01": "greater than or equal to 0.01",
    "should be less than or equal to 100000": "less than or equal to 100000",
    "should be greater than or equal to 1": "greater than or equal to 1",
    "spec.auth.apiKeys: Required value": "Field required",
    "spec.auth.apiKeys.secretName: Required value": "Field required",
}


@pytest.fixture
def store() -> Store:
    return crd_store(NS)


def create(store: Store, auth: dict[str, Any]) -> dict[str, Any]:
    return create_isvc(store, NS, {"auth": auth})


class TestBadSpecsAreRefused:
    @pytest.mark.parametrize(("auth", "message"), BAD_AUTH)
    def test_by_the_crd(self, store: Store, auth: dict[str, Any], message: str) -> None:
        with pytest.raises(errors.ApiError) as caught:
            create(store, auth)
        assert caught.value.code == 422
        assert message in caught.value.message, caught.value.message
        assert "spec.auth" in caught.value.message

    @pytest.mark.parametrize(("auth", "message"), BAD_AUTH)
    def test_by_the_spec(self, auth: dict[str, Any], message: str) -> None:
        spec = {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, "auth": auth}
        with pytest.raises(ValidationError, match=SPEC_MESSAGES.get(message, message)):
            InferenceServiceSpec.model_validate(spec)

    def test_a_good_one_passes_both(self, store: Store) -> None:
        created = create(store, copy.deepcopy(AUTH))
        assert created["spec"]["auth"] == AUTH
        assert owner(AUTH).spec.auth is not None


class TestTheSecretBeforeAnything:
    def test_a_missing_secret_holds_the_spec_with_the_reason_and_writes_nothing(self) -> None:
        cluster = Cluster(isvc(auth=AUTH))
        outcome = cluster.reconcile()
        assert cluster.kube.writes == []  # nothing half-applied: not even the NetworkPolicy
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "ApiKeysSecretMissing")
        assert "Secret model-keys does not exist in namespace vision" in ready["message"]
        assert outcome.retry_error == ready["message"]  # tried again: the Secret may come
        assert outcome.permanent_error is None
        assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "ApiKeysSecretMissing")]
        assert cluster.reconcile().events == []  # said once

        cluster.kube.put_object(keys_secret(GOOD_KEYS))
        outcome = cluster.reconcile()
        assert outcome.retry_error is None
        assert ("create", "Deployment") in [w[:2] for w in cluster.kube.writes]
        configmap = cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")
        assert json.loads(configmap["data"]["access.json"])["allowedKeyIds"] == [
            "batch",
            "storefront",
        ]
        assert cluster.body["status"]["conditions"][0]["reason"] == "Progressing"
        assert cluster.body["status"]["auth"] == {
            "secretName": "model-keys",
            "allowedKeyIds": ["batch", "storefront"],
            "quotaScope": "service",
            "servingReplicas": 1,  # no replica ready yet: the first to be enforces it all
            "text": "API keys from Secret model-keys: key ids batch, storefront; limits: "
            "each key 50 requests/s for the service, 50 per replica across 1 replica "
            "(burst 100, 100 per replica); batch 2.5 requests/s for the service, 2.5 per replica "
            "across 1 replica (burst 3, 3 per replica); in total 400 requests/s for the service, "
            "400 per replica across 1 replica (burst 400, 400 per replica)",
        }

    def test_a_secret_the_runtime_would_refuse_holds_the_spec_without_showing_a_key(
        self,
    ) -> None:
        cluster = Cluster(isvc(auth=AUTH))
        cluster.kube.put_object(keys_secret({"storefront": "tooshort", "bad id": "x" * 20}))
        outcome = cluster.reconcile()
        assert cluster.kube.writes == []
        (ready,) = cluster.body["status"]["conditions"]
        assert ready["reason"] == "ApiKeysSecretInvalid"
        assert "'bad id': a key id is 1 to 63 letters" in ready["message"]
        assert "the key of 'storefront' has 8 characters" in ready["message"]
        assert "tooshort" not in ready["message"]
        assert outcome.retry_error is not None

    def test_a_secret_broken_later_leaves_the_running_children_alone(self) -> None:
        cluster = Cluster(isvc(auth=AUTH))
        cluster.kube.put_object(keys_secret(GOOD_KEYS))
        cluster.reconcile()
        cluster.kube.objects[("Secret", NS, "model-keys")]["data"] = {}
        cluster.body["spec"]["auth"]["quotas"]["default"]["requestsPerSecond"] = 1
        writes = cluster.writes_of(cluster.reconcile)
        assert writes == []  # the new quota waits for a usable Secret too
        assert "it holds no keys" in cluster.body["status"]["conditions"][0]["message"]
        deployment = cluster.kube.of(DEPLOYMENT, NS, "resnet50")
        assert "--api-keys" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    def test_removing_auth_unmounts_the_secret_and_drops_the_document(self) -> None:
        cluster = Cluster(isvc(auth=AUTH))
        cluster.kube.put_object(keys_secret(GOOD_KEYS))
        cluster.reconcile()
        del cluster.body["spec"]["auth"]
        cluster.reconcile()
        configmap = cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")
        assert "access.json" not in configmap["data"]
        pod = cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["template"]["spec"]
        assert "api-keys" not in [v["name"] for v in pod["volumes"]]
        assert cluster.body["status"]["auth"] is None  # the status patch removes it


class TestTheCacheReadsTheSecretOnce:
    def test_a_users_secret_is_read_from_the_api_once_then_kept_current_by_the_watch(
        self,
    ) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        api.put_object(keys_secret(GOOD_KEYS))  # the user's: no operator labels
        cache = WatchCache(api, (INFERENCESERVICE, *CHILD_KINDS), keep=ours)
        api.deliver(cache)
        cache.mark_synced()
        assert cache.get(SECRET, NS, "model-keys") is None  # not a child: not kept by the watch
        api.calls.clear()
        assert cache.get_referenced(SECRET, NS, "model-keys") is not None
        assert cache.get_referenced(SECRET, NS, "model-keys") is not None
        assert api.calls == ["get Secret"]  # once; then from memory

        api.edit(SECRET, "model-keys", lambda s: s["data"].update({"new": "bmV3" * 8}))
        api.deliver(cache)  # the watch brings the rotation; its name is known now
        found = cache.get_referenced(SECRET, NS, "model-keys")
        assert found is not None
        assert "new" in found["data"]
        assert api.calls == ["get Secret"]

    def test_the_reconciler_over_the_cache_makes_no_request_once_settled(self) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        api.put_object(keys_secret(GOOD_KEYS))
        cache = WatchCache(api, (INFERENCESERVICE, *CHILD_KINDS), keep=ours)
        api.deliver(cache)
        cache.mark_synced()
        reconciler = Reconciler(
            cache,
            OperatorSettings(),
            learned_outside_s=learned_outside_s,
            clock=lambda: T0,
            read_referenced=cache.get_referenced,
        )
        body = api.get(INFERENCESERVICE, NS, "resnet50")
        assert body is not None
        assert reconciler.reconcile(copy.deepcopy(body)).retry_error is None
        api.deliver(cache)
        api.calls.clear()
        reconciler.reconcile(copy.deepcopy(body))
        assert api.calls == []
