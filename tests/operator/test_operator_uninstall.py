"""The operator (kopf, in-process through KopfRunner) against the local Kubernetes API, then gone,
as `helm uninstall` leaves a cluster: an InferenceService, its namespace and the CRD are deleted
with the real kubectl, and go. The operator puts no finalizer on an InferenceService, and takes
off the one an earlier operator put on.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner

from batchpilot.operator import periodic
from batchpilot.sandbox import LocalKubernetesAPI
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FINALIZER = "batchpilot.io/finalizer"
"""What an earlier operator's kopf timer put on every InferenceService."""
GONE_WITHIN_S = 5.0


class Cluster:
    def __init__(self, api: LocalKubernetesAPI, kubeconfig: Path) -> None:
        self.api = api
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=30,
            input=stdin,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def apply(self, doc: dict[str, Any]) -> None:
        self.kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(doc))

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        command = ["kubectl", f"--kubeconfig={self.kubeconfig}", "-n", namespace]
        result = subprocess.run(
            [*command, "get", kind, name, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return json.loads(result.stdout) if result.returncode == 0 else None

    def gone(self, kind: str, name: str, namespace: str) -> bool:
        return self.get(kind, name, namespace) is None


def service(name: str, namespace: str, **metadata: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / "resnet50-simulated.yaml").read_text()
    )
    doc["metadata"] = {"name": name, "namespace": namespace, **metadata}
    return doc


def finalizers(cluster: Cluster, name: str, namespace: str) -> list[str]:
    body = cluster.get("inferenceservice", name, namespace) or {}
    return list(body.get("metadata", {}).get("finalizers") or [])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    previous = os.environ.get("KUBECONFIG")
    with LocalKubernetesAPI(crds=[ROOT / "crds"], namespaces=["team", "vision"]).threaded() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        os.environ["KUBECONFIG"] = str(kubeconfig)
        try:
            yield Cluster(api, kubeconfig)
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous


def operator() -> KopfRunner:
    return KopfRunner(
        ["run", "--all-namespaces", "--standalone", "-m", "batchpilot.operator.handlers"],
        timeout=60,
    )


def check(runner: KopfRunner) -> None:
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


def reconciled(cluster: Cluster, name: str, namespace: str) -> bool:
    """Its children made, and a periodic pass (every 2 s in the tests) after its first."""
    body = cluster.get("inferenceservice", name, namespace) or {}
    return bool(body.get("status", {}).get("conditions")) and not cluster.gone(
        "deployment", name, namespace
    )


class TestWithTheOperatorGone:
    def test_deleting_a_service_its_namespace_or_the_crd_goes_through(
        self, cluster: Cluster, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger=periodic.__name__)
        with operator() as runner:
            for name, namespace in (("a", "team"), ("b", "team"), ("c", "vision")):
                cluster.apply(service(name, namespace))
            for name, namespace in (("a", "team"), ("b", "team"), ("c", "vision")):
                wait_until(
                    lambda n=name, ns=namespace: reconciled(cluster, n, ns),
                    what=f"{namespace}/{name} reconciled",
                )
            # Past two periodic passes over each (every 2 s in the tests): none puts a
            # finalizer on.
            wait_until(
                lambda: all(passes_over(caplog, key) >= 2 for key in ("team/a", "team/b")),
                what="two periodic passes over each",
            )
            assert [finalizers(cluster, n, "team") for n in ("a", "b")] == [[], []]
        check(runner)  # the operator is gone, as after `helm uninstall`

        # One InferenceService: it goes, and its children with it (owner references).
        cluster.kubectl("-n", "team", "delete", "inferenceservice", "a", "--wait=false")
        wait_until(
            lambda: cluster.gone("inferenceservice", "a", "team"),
            timeout=GONE_WITHIN_S,
            what="team/a deleted",
        )
        wait_until(
            lambda: cluster.gone("deployment", "a", "team"),
            timeout=GONE_WITHIN_S,
            what="team/a's Deployment deleted",
        )
        # A namespace: it goes, with the InferenceService in it.
        cluster.kubectl("delete", "namespace", "team", "--wait=false")
        wait_until(
            lambda: cluster.gone("inferenceservice", "b", "team"),
            timeout=GONE_WITHIN_S,
            what="team/b deleted with its namespace",
        )
        # The CRD: it goes, with every InferenceService left.
        cluster.kubectl("delete", "crd", "inferenceservices.batchpilot.io", "--wait=false")
        wait_until(
            lambda: cluster.gone("crd", "inferenceservices.batchpilot.io", "default"),
            timeout=GONE_WITHIN_S,
            what="the CRD deleted",
        )
        wait_until(
            lambda: cluster.gone("deployment", "c", "vision"),
            timeout=GONE_WITHIN_S,
            what="vision/c's Deployment deleted with the CRD",
        )

    def test_the_finalizer_an_earlier_operator_put_on_is_taken_off(self, cluster: Cluster) -> None:
        # As an earlier operator (its kopf timer) left them; another controller's stays.
        cluster.apply(service("a", "team", finalizers=[FINALIZER]))
        cluster.apply(service("b", "team", finalizers=[FINALIZER, "example.com/keep"]))
        with operator() as runner:
            for name in ("a", "b"):
                wait_until(
                    lambda n=name: reconciled(cluster, n, "team"), what=f"team/{name} reconciled"
                )
            wait_until(
                lambda: (
                    finalizers(cluster, "a", "team") == []
                    and finalizers(cluster, "b", "team") == ["example.com/keep"]
                ),
                what="the operator's finalizer taken off, the other controller's kept",
            )
        check(runner)
        cluster.kubectl("-n", "team", "delete", "inferenceservice", "a", "--wait=false")
        wait_until(
            lambda: cluster.gone("inferenceservice", "a", "team"),
            timeout=GONE_WITHIN_S,
            what="team/a deleted",
        )


def passes_over(caplog: pytest.LogCaptureFixture, key: str) -> int:
    """The periodic passes over `key` (namespace/name) that are over (periodic.py's record)."""
    said = f"periodic pass over {key}: over"
    return sum(1 for record in list(caplog.records) if record.getMessage() == said)
