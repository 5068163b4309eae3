"""API keys and quotas as spec: `spec.auth` rendered into the pods (the Secret mounted whole, the
runtime's flags, the access document in the ConfigMap), bad specs refused by the CRD and by the
spec with the reason, a missing or unusable Secret held in a condition with nothing applied, the
watch-fed cache keeping the Secret an InferenceService names as the check's verdict (never a
key), and the Secret's events reconciling whoever names it."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any, cast

import kopf
import pytest
from pydantic import ValidationError

from batchpilot.operator import handlers
from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.cache import WatchCache
from batchpilot.operator.children.apikeys import (
    API_KEYS_DIR,
    access_document,
    keys_secret_problem,
)
from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.keys_secret import CHECKED, slim_secret
from batchpilot.operator.handlers import names, ours
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, INFERENCESERVICE, SECRET
from batchpilot.operator.passes import Passes
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
        assert policy.allowed == frozenset({"batch", "storefront"})
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
        # Held until the Secret changes: its watch brings the next pass, no timer retries.
        assert outcome.waiting == ready["message"]
        assert outcome.retry_error is None
        assert outcome.permanent_error is None
        assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "ApiKeysSecretMissing")]
        assert cluster.reconcile().events == []  # said once

        cluster.kube.put_object(keys_secret(GOOD_KEYS))
        outcome = cluster.reconcile()
        assert outcome.waiting is None
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
        assert outcome.waiting == ready["message"]

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


def operator_cache(api: WatchedApi) -> WatchCache:
    """The cache as the operator configures it for Secrets (handlers.configure)."""
    return WatchCache(
        api,
        (INFERENCESERVICE, *CHILD_KINDS),
        keep=ours,
        slim={SECRET: slim_secret},
        packed=CHILD_KINDS,
        references=names,
    )


class TestTheSecretInMemory:
    """The watch keeps the Secret an InferenceService names, as the check's verdict (no key in
    the operator's memory), and says whom to reconcile when it changes."""

    def test_named_it_is_kept_from_the_watch_without_a_request(self) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        api.put_object(keys_secret(GOOD_KEYS))  # the user's: no operator labels
        cache = operator_cache(api)
        api.deliver(cache)  # the InferenceService first, then the Secret it names
        cache.mark_synced()
        assert cache.referrers(SECRET, NS, "model-keys") == ["resnet50"]
        assert cache.referrers(SECRET, NS, "other") == []
        found = cache.get_referenced(SECRET, NS, "model-keys")
        assert found is not None
        assert api.calls == []

    def test_what_is_kept_is_the_verdict_and_never_a_key(self) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        api.put_object(keys_secret(GOOD_KEYS))
        cache = operator_cache(api)
        api.deliver(cache)
        kept = cache.get_referenced(SECRET, NS, "model-keys")
        assert kept is not None
        assert "data" not in kept
        assert kept[CHECKED] == {"problem": None}
        for key in GOOD_KEYS.values():
            assert key not in json.dumps(kept)
            assert base64.b64encode(key.encode()).decode() not in json.dumps(kept)
        assert keys_secret_problem(owner(), kept) is None

        api.edit(SECRET, "model-keys", lambda s: s["data"].update({"storefront": "c2hvcnQ="}))
        api.deliver(cache)  # the watch brings the edit: a key too short
        kept = cache.get_referenced(SECRET, NS, "model-keys")
        assert kept is not None
        problem = keys_secret_problem(owner(), kept)
        assert problem is not None
        assert problem.reason == "ApiKeysSecretInvalid"
        assert "the key of 'storefront' has 5 characters" in problem.message
        assert keys_secret_problem(owner(), api.get(SECRET, NS, "model-keys")) == problem

    def test_listed_before_anything_named_it_it_is_read_once(self) -> None:
        api = WatchedApi()
        api.put_object(keys_secret(GOOD_KEYS))
        api.put_object(isvc(auth=AUTH))
        cache = operator_cache(api)
        api.deliver(cache)  # the Secret first: no one named it yet, so the cache dropped it
        cache.mark_synced()
        api.calls.clear()
        assert cache.get_referenced(SECRET, NS, "model-keys") is not None
        assert cache.get_referenced(SECRET, NS, "model-keys") is not None
        assert api.calls == ["get Secret"]

    def test_missing_it_is_asked_once_and_its_creation_comes_by_the_watch(self) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        cache = operator_cache(api)
        api.deliver(cache)
        cache.mark_synced()
        assert cache.get_referenced(SECRET, NS, "model-keys") is None
        assert cache.get_referenced(SECRET, NS, "model-keys") is None
        assert api.calls == ["get Secret"]  # once: from then on the watch would show it

        api.put_object(keys_secret(GOOD_KEYS))
        api.deliver(cache)
        assert cache.get_referenced(SECRET, NS, "model-keys") is not None
        api.remove(SECRET, "model-keys")
        api.deliver(cache)
        assert cache.get_referenced(SECRET, NS, "model-keys") is None
        assert api.calls == ["get Secret"]

    def test_named_no_more_it_is_dropped(self) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        api.put_object(keys_secret(GOOD_KEYS))
        cache = operator_cache(api)
        api.deliver(cache)
        before = len(cache)

        def rename(body: dict[str, Any]) -> None:
            body["spec"]["auth"]["apiKeys"]["secretName"] = "new-keys"

        api.edit(INFERENCESERVICE, "resnet50", rename)
        api.deliver(cache)
        assert cache.referrers(SECRET, NS, "model-keys") == []
        assert cache.referrers(SECRET, NS, "new-keys") == ["resnet50"]
        assert len(cache) == before - 1  # the old Secret went

        api.remove(INFERENCESERVICE, "resnet50")
        api.deliver(cache)
        assert cache.referrers(SECRET, NS, "new-keys") == []

    def test_the_operators_own_secret_is_kept_whole(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        token = cluster.kube.of(SECRET, NS, "resnet50-admin-token")
        assert slim_secret(token)["data"] == token["data"]  # the plan keeps the token
        assert "data" not in slim_secret(keys_secret(GOOD_KEYS))
        # Orphaned (`kubectl delete --cascade=orphan`): its labels say whose it is, and the
        # plan adopts it, token and all.
        del token["metadata"]["ownerReferences"]
        assert slim_secret(token)["data"] == token["data"]
        assert slim_secret(token)["metadata"]["labels"] == token["metadata"]["labels"]

    def test_the_reconciler_over_the_cache_makes_no_request_once_settled(self) -> None:
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        api.put_object(keys_secret(GOOD_KEYS))
        cache = operator_cache(api)
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
        assert reconciler.reconcile(copy.deepcopy(body)).waiting is None
        api.deliver(cache)
        api.calls.clear()
        reconciler.reconcile(copy.deepcopy(body))
        assert api.calls == []


def added(obj: dict[str, Any]) -> kopf.RawEvent:
    """A watch event as kopf hands it to a handler."""
    return {"type": "ADDED", "object": cast(kopf.RawBody, obj)}


class TestTheSecretsEventReconcilesWhoNamesIt:
    """The handlers' glue, called as kopf calls it: a Secret's event reaches the passes of the
    InferenceServices that name it, and no other Secret takes a worker."""

    def test_its_creation_lifts_the_hold(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: None)
        api = WatchedApi()
        api.put_object(isvc(auth=AUTH))
        cache = operator_cache(api)
        api.deliver(cache)
        memo = kopf.Memo(
            cache=cache,
            passes=Passes(cache),
            reconciler=Reconciler(
                cache,
                OperatorSettings(),
                learned_outside_s=learned_outside_s,
                clock=lambda: T0,
                read_referenced=cache.get_referenced,
            ),
        )
        outcome = handlers.reconcile_now(NS, "resnet50", memo)
        assert outcome is not None
        assert outcome.waiting is not None  # held: the resource's handler does not retry it

        created = api.put_object(keys_secret(GOOD_KEYS))
        unrelated = api.put_object(keys_secret(GOOD_KEYS, name="someone-elses"))
        api.deliver(cache)  # the index function runs first, for each event
        assert not handlers._names_it(event=added(unrelated), memo=memo)
        event = added(created)
        assert handlers._names_it(event=event, memo=memo)
        handlers._on_named_secret_event(event=event, memo=memo)
        body = api.of(INFERENCESERVICE, NS, "resnet50")
        assert body["status"]["conditions"][0]["reason"] == "Progressing"
        assert api.get(DEPLOYMENT, NS, "resnet50") is not None
