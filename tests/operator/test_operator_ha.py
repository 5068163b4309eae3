"""Two `batchpilot operator run --leader-elect` processes against the local Kubernetes API: one
reconciles, the other is a standby that answers liveness; SIGTERM hands over at once, SIGKILL
after the lease duration, and a leader that loses the Lease exits 1. Take-over times are printed
(pytest -s) and bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchpilot.operator.kinds import DEPLOYMENT, INFERENCESERVICE, LEASE
from batchpilot.operator.kube import KubeClient
from batchpilot.operator.leadership import LeaseRecord
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import (
    DURATION_S,
    NAMESPACE,
    RENEW_DEADLINE_S,
    RETRY_S,
    SLACK_S,
    client_for,
    free_port,
    probe,
    read,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEASE_NAME = "batchpilot-operator"
STOP_S = 1.0
"""A leader's SIGTERM to its release: kopf's stop, on a busy test machine."""
START_S = 15.0
"""A process's start (imports, kopf's startup), on a busy test machine."""


class Operator:
    def __init__(self, name: str, kubeconfig: Path, tmp: Path) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = tmp / f"{name}.log"
        env = {
            **os.environ,
            "POD_NAME": name,
            "POD_NAMESPACE": NAMESPACE,
            "BATCHPILOT_OPERATOR_LEASE_DURATION_SECONDS": str(DURATION_S),
            "BATCHPILOT_OPERATOR_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE_S),
            "BATCHPILOT_OPERATOR_RETRY_PERIOD_SECONDS": str(RETRY_S),
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
                 "--leader-elect", "--kubeconfig", str(kubeconfig),
                 "--liveness", f"http://127.0.0.1:{self.port}/healthz"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def liveness(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def exit_code(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit:\n{self.log()}")


class Cluster:
    def __init__(self, api: LocalKubernetesAPI, tmp: Path) -> None:
        self.api = api
        self.tmp = tmp
        self.kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        self.kube = client_for(api, tmp / "client-kubeconfig")
        self.operators: list[Operator] = []

    def start(self, name: str) -> Operator:
        operator = Operator(name, self.kubeconfig, self.tmp)
        self.operators.append(operator)
        return operator

    def holder(self) -> str | None:
        lease = self.kube.get(LEASE, NAMESPACE, LEASE_NAME)
        return None if lease is None else LeaseRecord.of(lease).holder

    def logs(self) -> str:
        return "\n".join(f"--- {o.name}\n{o.log()}" for o in self.operators)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with LocalKubernetesAPI(crds=[ROOT / "crds"], namespaces=[NAMESPACE]).threaded() as api:
        cluster = Cluster(api, tmp_path)
        try:
            yield cluster
        finally:
            for operator in cluster.operators:
                if operator.process.poll() is None:
                    operator.process.kill()
                    operator.process.wait(10)


def example_service() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
    doc["metadata"]["namespace"] = "default"
    return doc


def test_one_active_operator_hands_over_on_sigterm_and_after_a_crash(cluster: Cluster) -> None:
    a = cluster.start("operator-a")
    wait_until(lambda: cluster.holder() == "operator-a", timeout=START_S, what="a leading")
    b = cluster.start("operator-b")
    assert wait_until(lambda: probe(b.liveness), timeout=START_S, what="b's liveness") == (
        200,
        {"standby": True, "identity": "operator-b"},
    )
    wait_until(lambda: "is a candidate" in b.log(), what="b a candidate")

    # SIGTERM (a rolling upgrade): a stops kopf, releases; b takes over within a retry period.
    signalled = time.monotonic()
    a.process.send_signal(signal.SIGTERM)
    wait_until(lambda: cluster.holder() == "operator-b", timeout=10, every=0.02, what="b leading")
    took = time.monotonic() - signalled
    print(f"\ntake-over after SIGTERM: {took:.2f} s (retry {RETRY_S} s)")
    assert a.exit_code(10) == 0, cluster.logs()
    assert "released it" in a.log()
    assert took <= STOP_S + RETRY_S, cluster.logs()

    # The new leader reconciles.
    cluster.kube.create(example_service())
    wait_until(
        lambda: cluster.kube.get(DEPLOYMENT, "default", "resnet50"),
        timeout=START_S,
        what="the new leader creating the Deployment",
    )

    # SIGKILL (a node lost): no release; a standby takes over once the lease runs out.
    c = cluster.start("operator-c")
    wait_until(lambda: probe(c.liveness), timeout=START_S, what="c's liveness")
    wait_until(lambda: "is a candidate" in c.log(), what="c a candidate")
    killed = time.monotonic()
    b.process.kill()
    wait_until(
        lambda: cluster.holder() == "operator-c",
        timeout=DURATION_S + 10,
        every=0.02,
        what="c leading",
    )
    took = time.monotonic() - killed
    print(f"take-over after SIGKILL: {took:.2f} s (lease {DURATION_S} s, retry {RETRY_S} s)")
    assert DURATION_S - RETRY_S - SLACK_S <= took <= DURATION_S + RETRY_S + STOP_S, cluster.logs()
    assert LeaseRecord.of(read(cluster.kube, LEASE_NAME)).transitions == 2

    # The Lease taken from under the leader: it stops and exits 1, to restart as a standby.
    lease = read(cluster.kube, LEASE_NAME)
    lease["spec"]["holderIdentity"] = "intruder"
    cluster.kube.replace(lease)
    assert c.exit_code(10) == 1, cluster.logs()
    assert "lost the lease (the lease is intruder's now)" in c.log()
    assert "Traceback" not in cluster.logs(), cluster.logs()


def test_without_leader_election_there_is_no_lease(cluster: Cluster, tmp_path: Path) -> None:
    """The sandbox's way: a kubeconfig, no --leader-elect."""
    kube: KubeClient = cluster.kube
    log_path = tmp_path / "alone.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
             "--kubeconfig", str(cluster.kubeconfig)],
            env={**os.environ, "POD_NAMESPACE": NAMESPACE}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        kube.create(example_service())
        wait_until(
            lambda: kube.get(DEPLOYMENT, "default", "resnet50"),
            timeout=START_S,
            what="the Deployment",
        )
        assert cluster.holder() is None
        assert kube.get(INFERENCESERVICE, "default", "resnet50") is not None
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    assert "Traceback" not in log_path.read_text(), log_path.read_text()
