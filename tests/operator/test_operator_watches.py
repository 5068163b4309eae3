"""`batchpilot operator run` against the local Kubernetes API, with its periodic pass an hour
away: what a Gateway writes in a route's status, and what someone does to an API keys' Secret,
reach the InferenceService's conditions through the watches alone, within seconds.

The API serves the Gateway API here (its own CRDs, vendored: tests/operator/gateway_api.py), and
this test plays the Gateway controller: it writes the routes' `status.parents` through the status
subresource, as one would, and the CRDs' schema checks what it writes. Nothing retries a held
spec on a timer (a missing Secret waits for the Secret's watch event), so with the periodic pass
an hour away a condition that changes within the bounded wait was changed by a watch event.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchpilot.sandbox import LocalKubernetesAPI
from batchpilot.sandbox.pods import API
from tests.operator.gateway_api import CRD_FILES
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
START_S = 30.0
"""The operator's start (imports, kopf's initial lists) on a busy test machine."""
WATCH_S = 5.0
"""An event to the condition it changes: a second or two, with room for a busy machine."""
ISVCS = f"/apis/batchpilot.io/v1alpha1/namespaces/{NS}/inferenceservices"
ROUTES = f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
GATEWAY = {"name": "edge", "namespace": "infra", "sectionName": "https"}
GOOD_KEYS = {"storefront": "s" * 32, "batch": "b" * 32}


class Cluster:
    def __init__(self, api: LocalKubernetesAPI, log_path: Path) -> None:
        self.api = api
        self.log_path = log_path
        self.rest = API(api.url)  # JSON over urllib; a 404 reads as None

    def request(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
        return self.rest.call(path, method, body)

    def merge(self, path: str, patch: dict[str, Any]) -> Any:
        return self.rest.call(path, "PATCH", patch, patch=True)

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        body = self.request(f"{ISVCS}/{name}") or {}
        for condition in body.get("status", {}).get("conditions", []):
            if condition["type"] == type_:
                return condition  # type: ignore[no-any-return]
        return {}

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        found = self.request(f"/api/v1/namespaces/{NS}/events") or {"items": []}
        return [
            event
            for event in found["items"]
            if event.get("reason") == reason and event.get("involvedObject", {}).get("name") == name
        ]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("watches")
    with LocalKubernetesAPI(crds=[ROOT / "crds", *CRD_FILES]).threaded() as api:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        env = {
            **os.environ,
            "BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS": "3600",
            "BATCHPILOT_OPERATOR_AUTOPILOT_ENABLED": "false",  # the reconciles alone
        }
        cluster = Cluster(api, tmp / "operator.log")
        with cluster.log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
                 "--kubeconfig", str(kubeconfig)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            yield cluster
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def inference_service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, **spec},
    }


def keys_secret(name: str, keys: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
    }


def gateway_status(generation: int, *, status: str = "True", reason: str = "Accepted") -> Any:
    """`status` as the Gateway's controller writes it for the parent infra/edge, listener https."""
    return {
        "status": {
            "parents": [
                {
                    "parentRef": {
                        "group": "gateway.networking.k8s.io",
                        "kind": "Gateway",
                        **GATEWAY,
                    },
                    "controllerName": "example.net/gateway-controller",
                    "conditions": [
                        {
                            "type": "Accepted",
                            "status": status,
                            "reason": reason,
                            "message": ""
                            if status == "True"
                            else "listener https: not from default",
                            "observedGeneration": generation,
                            "lastTransitionTime": "2026-12-01T00:00:00Z",
                        },
                        {
                            "type": "ResolvedRefs",
                            "status": "True",
                            "reason": "ResolvedRefs",
                            "message": "",
                            "observedGeneration": generation,
                            "lastTransitionTime": "2026-12-01T00:00:00Z",
                        },
                    ],
                }
            ]
        }
    }


def state(condition: dict[str, Any]) -> tuple[Any, Any]:
    return condition.get("status"), condition.get("reason")


def within_watch(condition: Any, *, what: str) -> None:
    """Wait at most `WATCH_S` for `condition`, and print how long it took (pytest -s)."""
    started = time.monotonic()
    wait_until(condition, timeout=WATCH_S, every=0.02, what=what)
    print(f"{what}: {time.monotonic() - started:.2f} s")


class TestTheGatewaysWord:
    def test_exposed_follows_what_the_gateway_writes_in_the_routes_status(
        self, cluster: Cluster
    ) -> None:
        name = "exposed"
        cluster.request(ISVCS, "POST", inference_service(name, exposure={"gateway": GATEWAY}))
        wait_until(
            lambda: state(cluster.condition(name, "Exposed")) == ("Unknown", "Pending"),
            timeout=START_S,
            what="Exposed=Unknown (Pending) once the routes are applied",
        )
        http, grpc = f"{ROUTES}/httproutes/{name}", f"{ROUTES}/grpcroutes/{name}"
        generation = cluster.request(http)["metadata"]["generation"]

        # The Gateway accepts both: a route's status write is a watch event of a child.
        cluster.merge(f"{http}/status", gateway_status(generation))
        cluster.merge(
            f"{grpc}/status", gateway_status(cluster.request(grpc)["metadata"]["generation"])
        )
        within_watch(
            lambda: state(cluster.condition(name, "Exposed")) == ("True", "Accepted"),
            what="Exposed=True (Accepted)",
        )
        body = cluster.request(f"{ISVCS}/{name}")
        assert body["status"]["exposure"]["routes"] == [
            f"HTTPRoute {name}: accepted",
            f"GRPCRoute {name}: accepted",
        ]

        # It refuses the HTTPRoute: False with its reason, and a Warning Event.
        refused = gateway_status(generation, status="False", reason="NotAllowedByListeners")
        cluster.merge(f"{http}/status", refused)
        within_watch(
            lambda: state(cluster.condition(name, "Exposed")) == ("False", "NotAllowedByListeners"),
            what="Exposed=False (NotAllowedByListeners)",
        )
        assert cluster.condition(name, "Exposed")["message"] == (
            f"HTTPRoute {name}: the Gateway infra/edge did not accept it: NotAllowedByListeners: "
            "listener https: not from default"
        )
        within_watch(lambda: cluster.events(name, "ExposureRefused"), what="the Warning Event")

        # A new SLA changes the routes (a new generation): what the Gateway said is of the old.
        cluster.merge(f"{http}/status", gateway_status(generation))
        within_watch(
            lambda: cluster.condition(name, "Exposed").get("status") == "True",
            what="accepted again",
        )
        cluster.merge(f"{ISVCS}/{name}", {"spec": {"sla": {"latencyP99Ms": 2000}}})
        within_watch(
            lambda: state(cluster.condition(name, "Exposed")) == ("Unknown", "Pending"),
            what="Pending for the changed routes",
        )
        assert cluster.request(http)["metadata"]["generation"] == generation + 1
        assert "Traceback" not in cluster.log(), cluster.log()


class TestTheApiKeysSecret:
    def test_creating_breaking_and_deleting_it_reconciles_at_once(self, cluster: Cluster) -> None:
        name, secret = "keyed", "keyed-keys"
        auth = {"apiKeys": {"secretName": secret}}
        cluster.request(ISVCS, "POST", inference_service(name, auth=auth))
        wait_until(
            lambda: cluster.condition(name, "Ready").get("reason") == "ApiKeysSecretMissing",
            timeout=START_S,
            what="Ready=False (ApiKeysSecretMissing)",
        )
        assert cluster.request(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}") is None

        # Created: the Secret's watch event reconciles it (nothing retries, the periodic pass
        # is an hour away).
        cluster.request(SECRETS, "POST", keys_secret(secret, GOOD_KEYS))
        within_watch(
            lambda: cluster.condition(name, "Ready").get("reason") == "Progressing",
            what="the hold lifted",
        )
        assert cluster.request(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}") is not None

        # Edited with a key too short: held again, with the reason.
        short = base64.b64encode(b"short").decode()
        cluster.merge(f"{SECRETS}/{secret}", {"data": {"storefront": short}})
        within_watch(
            lambda: cluster.condition(name, "Ready").get("reason") == "ApiKeysSecretInvalid",
            what="Ready=False (ApiKeysSecretInvalid)",
        )
        message = cluster.condition(name, "Ready")["message"]
        assert "the key of 'storefront' has 5 characters" in message
        assert "short" not in message.replace("5 characters", "")

        # Deleted: missing again.
        cluster.request(f"{SECRETS}/{secret}", "DELETE")
        within_watch(
            lambda: cluster.condition(name, "Ready").get("reason") == "ApiKeysSecretMissing",
            what="Ready=False (ApiKeysSecretMissing) again",
        )
        assert "Traceback" not in cluster.log(), cluster.log()
