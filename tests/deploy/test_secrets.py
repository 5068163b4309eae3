"""The runtime's admin token stays secret: it lives in the operator-managed Secret, reaches the
pods as a mounted file, and shows up nowhere else — not in the pod spec, the ConfigMap, the
InferenceService's status, its Events, or the operator's log."""

from __future__ import annotations

import base64
import copy
import json
import logging
from typing import Any

import pytest

from batchpilot.operator.autopilot.pilot import Autopilot, learned_outside_s
from batchpilot.operator.children.common import TOKEN_DIR, TOKEN_FILE
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from tests.deploy.operator_access import NOW, T, example_isvc, overloaded
from tests.operator.fake_kube import FakeKube


def test_the_admin_token_appears_only_in_its_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kube = FakeKube()
    body = example_isvc()
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    reconciler = Reconciler(
        kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: NOW
    )
    outcome = reconciler.reconcile(copy.deepcopy(body))
    body["status"] = outcome.status
    events: list[Any] = list(outcome.events)
    kube.objects[("Deployment", namespace, name)]["status"] = {"readyReplicas": 1}

    def refuse(endpoint: str, *, token: str, document: str) -> None:
        raise ConnectionError(f"connection to {endpoint} refused")

    autopilot = Autopilot(
        kube,
        observe=overloaded,
        pods=type("Pods", (), {"ready_pod_endpoints": lambda *_: ["10.0.0.7:8080"]})(),
        push=refuse,
        clock=lambda: NOW,
        seconds=lambda: T,
    )
    result = autopilot.tick(copy.deepcopy(body))
    events += result.events
    body["status"] = {**body["status"], **result.status}

    secret = kube.objects[("Secret", namespace, f"{name}-admin-token")]
    token = base64.b64decode(secret["data"][TOKEN_FILE]).decode()
    assert len(token) >= 32
    encoded = secret["data"][TOKEN_FILE]
    elsewhere = {key: obj for key, obj in kube.objects.items() if key[0] != "Secret"} | {
        ("status",): body["status"]
    }
    for key, obj in elsewhere.items():
        text = json.dumps(obj)
        assert token not in text, key
        assert encoded not in text, key
    for event in events:
        assert token not in event.message
    assert any(e.reason == "ApplyFailed" for e in events)  # the failing push was reported...
    for record in caplog.records:  # ...and nothing logged carries the token
        assert token not in record.getMessage()


def test_pods_read_the_token_from_a_mounted_file() -> None:
    kube = FakeKube()
    body = example_isvc()
    Reconciler(
        kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: NOW
    ).reconcile(body)
    deployment = kube.objects[("Deployment", "default", "resnet50")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert f"{TOKEN_DIR}/{TOKEN_FILE}" in container["args"]
    # No Secret in env (the pod's own IP is the one value from elsewhere).
    from_elsewhere = [e["valueFrom"] for e in container.get("env", []) if "valueFrom" in e]
    assert from_elsewhere == [{"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}]
    assert not [e for e in container.get("env", []) if "TOKEN" in e["name"]]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "resnet50-admin-token"
    assert pod["automountServiceAccountToken"] is False
