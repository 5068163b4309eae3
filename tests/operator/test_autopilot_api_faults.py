"""The autopilot's round over a real API that fails (the local Kubernetes API behind the test's
fault proxy): what it does must be what its memory in `status.autopilot` says it did.

Why it matters: the scale-down waits until the stabilization window has recommended fewer
replicas all along, and the window is the recommendations kept in status. A scale-up whose
status write was lost (a 503, the operator killed between its two writes) left a memory from
before it: the next quiet tick found the window covered by the old, lower recommendations and
gave the new replicas back at once, 15 s after asking for them.

The round runs in-process (the fleet, the passes, the reconciler, the official client) with a
Prometheus played by the test; every read and write goes over HTTP through the proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.pilot import Autopilot, learned_outside_s
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.fleet import FleetPilot
from batchpilot.operator.kinds import DEPLOYMENT
from batchpilot.operator.passes import Passes
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.sandbox import LocalKubernetesAPI
from batchpilot.sandbox.pods import API
from tests.operator.election_support import client_for
from tests.operator.fault_proxy import Answer, Fault, FaultProxy
from tests.operator.test_reconciler import NS, T0, isvc

ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 15.0
START = 1_800_000_000.0
STATUS = f"/apis/batchpilot.io/v1alpha1/namespaces/{NS}/inferenceservices/resnet50/status"


def trickle(at: float, ready: int | None) -> Observation:
    """20 rps that one replica carries with room to spare (batches of t(b) = 4 + 2·b ms)."""
    return Observation(
        at=at, window_s=60, p99_s=0.015, p95_s=0.012, qps=20, rejected_qps=0,
        queue_p99_s=0.005, utilization=0.05, mean_batch=1.0,
        compute=(ComputePoint(1, 0.006, 1000), ComputePoint(2, 0.008, 100)),
        ready_replicas=ready,
    )  # fmt: skip


def overloaded(at: float, ready: int | None) -> Observation:
    """300 rps offered to one replica at batch 1: more replicas at once."""
    return replace(
        trickle(at, ready),
        p99_s=0.9, p95_s=0.6, qps=167, rejected_qps=133, queue_p99_s=0.85, utilization=1.0,
    )  # fmt: skip


@dataclass
class Round:
    """One round of Prometheus' answers, as the fleet reads them."""

    at: float
    load: str
    answers: dict[Any, Any] | None = None
    reading: str = "recorded"
    took_s: float = 0.0

    def __post_init__(self) -> None:
        self.answers = {}

    def observe(self, scope: Scope, *, ready_replicas: int | None) -> Observation:
        return (overloaded if self.load == "overloaded" else trickle)(self.at, ready_replicas)

    def lacks(self, scope: Scope) -> bool:
        return False  # every signal, every round


class Prometheus:
    def __init__(self) -> None:
        self.now = START
        self.load = "trickle"

    def round(self, at: float | None = None) -> Round:
        return Round(self.now, self.load)


class World:
    def __init__(self, api: LocalKubernetesAPI, proxy: FaultProxy, tmp: Path) -> None:
        self.api = API(api.url)  # the test's own hands, straight to the API
        self.proxy = proxy
        kube = client_for(proxy, tmp / "kubeconfig")  # type: ignore[arg-type]
        self.kube = kube
        self.prometheus = Prometheus()
        self.passes = Passes(kube)
        self.reconciler = Reconciler(kube, OperatorSettings(), learned_outside_s=learned_outside_s)
        self.autopilot = Autopilot(
            kube,
            observe=lambda scope, *, ready_replicas: None,
            pods=self,
            push=lambda endpoint, *, token, document: None,
            clock=lambda: T0 + timedelta(seconds=self.prometheus.now - START),
            seconds=lambda: self.prometheus.now,
        )
        self.fleet = FleetPilot(
            self.passes, self.autopilot, self.prometheus, post=lambda body, found: None, workers=1
        )

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return []

    def replicas(self) -> int:
        deployment = self.kube.get(DEPLOYMENT, NS, "resnet50")
        assert deployment is not None
        return int(deployment["spec"]["replicas"])

    def all_replicas_ready(self) -> None:
        """The Deployment's pods came up (the test plays the Deployment controller)."""
        replicas = self.replicas()
        self.api.call(
            f"/apis/apps/v1/namespaces/{NS}/deployments/resnet50/status",
            "PATCH",
            {"status": {"replicas": replicas, "readyReplicas": replicas}},
            patch=True,
        )

    def tick(self, load: str) -> bool:
        """One interval: the round, then the pods catch up. Whether the tick went through."""
        self.prometheus.now += INTERVAL_S
        self.prometheus.load = load
        report = self.fleet.run_round([(NS, "resnet50")])
        self.all_replicas_ready()
        return report.failed == 0


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with (
        LocalKubernetesAPI(crds=[ROOT / "crds"], namespaces=[NS]).threaded() as api,
        FaultProxy(api.url).threaded() as proxy,
    ):
        world = World(api, proxy, tmp_path)
        world.api.call(
            f"/apis/batchpilot.io/v1alpha1/namespaces/{NS}/inferenceservices", "POST", isvc()
        )
        assert world.passes.run(NS, "resnet50", world.reconciler.reconcile) is not None
        world.all_replicas_ready()
        yield world
        world.fleet.close()


def test_a_scale_up_whose_status_write_fails_is_not_given_back_at_once(world: World) -> None:
    # One replica serves a trickle for longer than the stabilization window (300 s): the
    # memory holds only recommendations of one replica.
    for tick in range(22):
        assert world.tick("trickle"), tick
        assert world.replicas() == 1, tick
    # A burst; the API server fails the round's status write.
    with world.proxy.failing(Fault(Answer(503), path=STATUS, method="PATCH", times=1)):
        assert not world.tick("overloaded")
    # The load falls at once. Whatever that tick did, nothing is given back within the
    # stabilization window (20 ticks of 15 s): the count never goes down.
    replicas = [world.replicas()]
    for _ in range(19):
        assert world.tick("trickle")
        replicas.append(world.replicas())
    assert replicas == sorted(replicas), replicas


def test_a_burst_acted_on_after_a_failed_write_is_remembered(world: World) -> None:
    for tick in range(22):
        assert world.tick("trickle"), tick
    with world.proxy.failing(Fault(Answer(503), path=STATUS, method="PATCH", times=1)):
        assert not world.tick("overloaded")
    # Nothing was done that the status does not remember: the replicas are as they were.
    assert world.replicas() == 1
    # The burst goes on: this round writes its memory, then scales up, and the new replicas
    # stay for the stabilization window.
    assert world.tick("overloaded")
    scaled = world.replicas()
    assert scaled > 1
    replicas = []
    for _ in range(19):
        assert world.tick("trickle")
        replicas.append(world.replicas())
    assert replicas == [scaled] * 19
