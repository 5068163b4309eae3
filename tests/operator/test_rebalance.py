"""A replica that joins: the replicas that were serving are asked to retire their connections.

The reconciler's pass with `ConnectionRebalancer` over a fake cluster (`tests.operator.
test_reconciler.Cluster`) whose ready pods a test sets; the POSTs are recorded, and made for real
against a runtime process in `TestIntoARunningRuntime`.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.autopilot.push import JOINED_S, ConnectionRebalancer
from batchpilot.operator.cache import slim_pod
from batchpilot.operator.children.secret import token_in
from batchpilot.operator.kinds import SECRET
from batchpilot.operator.kube import ready_pods
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from tests.operator.test_reconciler import NS, Cluster, isvc
from tests.operator.test_service_quotas import ReadyPods

P1, P2, P3 = "10.0.0.1:8082", "10.0.0.2:8082", "10.0.0.3:8082"


class Posts:
    """Records each POST; an endpoint in `failing` raises, as an unreachable pod would."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.failing: set[str] = set()
        self.token: str | None = None

    def __call__(self, endpoint: str, *, token: str, document: str) -> None:
        self.token = token
        if endpoint in self.failing:
            raise ConnectionRefusedError("connection refused")
        self.sent.append(endpoint)

    def take(self) -> list[str]:
        taken, self.sent = self.sent, []
        return taken


class RebalancingCluster(Cluster):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.pods = ReadyPods()
        self.posts = Posts()
        self.rebalancer = ConnectionRebalancer(
            self.kube, pods=self.pods, post=self.posts, clock=lambda: self.now.timestamp()
        )
        self.reconciler = Reconciler(
            self.kube,
            OperatorSettings(),
            learned_outside_s=learned_outside_s,
            clock=lambda: self.now,
            rebalance=self.rebalancer,
        )

    def ready(self, *endpoints: str) -> list[str]:
        """`endpoints` are the ready pods; a pass; whom it asked to retire their connections."""
        self.pods.endpoints = list(endpoints)
        self.reconcile()
        return self.posts.take()


def test_the_pods_that_were_serving_are_asked_when_one_joins() -> None:
    cluster = RebalancingCluster(isvc())
    assert cluster.ready() == []
    assert cluster.ready(P1) == []  # the first replica: nobody has connections to give
    assert cluster.ready(P1, P2) == [P1]
    assert cluster.posts.token == token_in(cluster.kube.of(SECRET, NS, "resnet50-admin-token"))
    assert cluster.ready(P1, P2) == []  # nothing new: nothing asked
    assert cluster.ready(P1) == []  # one left: the clients it had reconnect anyway
    assert cluster.ready(P1, P3) == [P1]
    assert cluster.ready(P1, P2, P3) == [P1, P3]


def test_a_rollout_step_asks_the_pods_that_stay() -> None:
    cluster = RebalancingCluster(isvc())
    cluster.ready(P1, P2)
    assert cluster.ready(P2, P3) == [P2]  # P1 replaced by P3 in one step


def test_after_the_operator_starts_the_first_pass_only_looks() -> None:
    cluster = RebalancingCluster(isvc())
    assert cluster.ready(P1, P2) == []  # were they ready before? not known: not asked
    assert cluster.ready(P1, P2, P3) == [P1, P2]


class TestWithNothingRemembered:
    """After a start or a takeover, when each pod became ready says who joined whom."""

    def since(self, cluster: RebalancingCluster, **ago_s: float) -> None:
        now = cluster.now.timestamp()
        cluster.pods.ready_since = {
            {"p1": P1, "p2": P2, "p3": P3}[pod]: now - ago for pod, ago in ago_s.items()
        }

    def test_a_replica_that_joined_while_no_operator_led_is_given_its_share(self) -> None:
        cluster = RebalancingCluster(isvc())
        self.since(cluster, p1=3600, p2=3600, p3=5)
        assert cluster.ready(P1, P2, P3) == [P1, P2]
        assert cluster.ready(P1, P2, P3) == []  # asked once

    def test_replicas_that_all_joined_together_have_no_one_to_ask(self) -> None:
        cluster = RebalancingCluster(isvc())
        self.since(cluster, p1=5, p2=5)
        assert cluster.ready(P1, P2) == []  # a new service: its clients connected to both

    def test_a_replica_that_joined_long_ago_has_had_its_share_by_age(self) -> None:
        cluster = RebalancingCluster(isvc())
        self.since(cluster, p1=3600, p2=JOINED_S + 1)
        assert cluster.ready(P1, P2) == []


def test_when_a_pod_became_ready_is_its_ready_conditions_time_and_the_cache_keeps_it() -> None:
    pod = {
        "metadata": {"name": "resnet50-abc", "namespace": NS, "managedFields": [{}]},
        "spec": {"containers": [{"ports": [{"name": "admin", "containerPort": 8082}]}]},
        "status": {
            "podIP": "10.0.0.9",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "x"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"},
            ],
        },
    }
    at = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
    assert ready_pods([pod]) == ready_pods([slim_pod(pod)]) == {"10.0.0.9:8082": at}
    unknown = copy.deepcopy(pod)
    del unknown["status"]["conditions"][1]["lastTransitionTime"]
    assert ready_pods([unknown]) == {"10.0.0.9:8082": None}


def test_a_pod_that_cannot_be_reached_costs_the_pass_nothing() -> None:
    cluster = RebalancingCluster(isvc())
    cluster.ready(P1, P2)
    cluster.posts.failing = {P1}
    cluster.pods.endpoints = [P1, P2, P3]
    outcome = cluster.reconcile()
    assert cluster.posts.take() == [P2]
    assert [e for e in outcome.events if e.type == "Warning"] == []  # its connections age out


def test_a_deleted_inferenceservice_is_forgotten() -> None:
    cluster = RebalancingCluster(isvc())
    cluster.ready(P1, P2)
    assert len(cluster.rebalancer) == 1
    cluster.rebalancer.forget(NS, "resnet50")
    assert len(cluster.rebalancer) == 0
    assert cluster.ready(P1, P2, P3) == []  # looked at afresh
