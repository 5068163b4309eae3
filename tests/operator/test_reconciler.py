"""One reconcile pass: children converge to the spec; a pass with nothing to do writes nothing."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.children.common import ISVC_LABEL
from batchpilot.operator.children.configmap import batching_document, batching_in
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, NETWORK_POLICY, PDB, SECRET, SERVICE
from batchpilot.operator.kube import ready_pod_endpoints
from batchpilot.operator.plan import RESTARTED_AT, quantity
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.rollout import IN_PLACE, SURGE, rolling_in_place
from batchpilot.operator.settings import OperatorSettings
from tests.operator.fake_kube import FakeKube

NS = "vision"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def isvc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"uri": "pvc://models/resnet50.onnx"},
        "runtime": {"device": "gpu"},
        "sla": {"latencyP99Ms": 100},
        "scaling": {"mode": "auto", "minReplicas": 1, "maxReplicas": 4, "maxBatchSize": 32},
        "batching": {"batchSize": 1, "maxQueueDelayMs": 5},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value}
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet50", "namespace": NS, "uid": "isvc-uid", "generation": 1},
        "spec": base,
        "status": {},
    }


class Cluster:
    """The fake API plus the InferenceService's status, updated as the operator would."""

    def __init__(
        self,
        body: dict[str, Any],
        *,
        settings: OperatorSettings | None = None,
        kube: FakeKube | None = None,
    ) -> None:
        self.kube = kube or FakeKube()
        self.body = body
        self.now = T0
        self.pods: list[dict[str, Any]] = []
        """What the cache holds of the service's pods."""
        self.reconciler = Reconciler(
            self.kube,
            settings or OperatorSettings(),
            learned_outside_s=learned_outside_s,
            clock=lambda: self.now,
            read_pods=lambda namespace, selector: [
                pod
                for pod in self.pods
                if pod["metadata"]["namespace"] == namespace
                and selector.items() <= pod["metadata"]["labels"].items()
            ],
            read_rolling_in_place=self.rolling_in_place,
        )

    def rolling_in_place(self) -> set[tuple[str, str]]:
        """The Deployments rolling in place, fleet-wide, as the watch-fed cache lists them."""
        return {
            (namespace, name)
            for (kind, namespace, name), obj in self.kube.objects.items()
            if kind == "Deployment" and rolling_in_place(obj)
        }

    def reconcile(self) -> Any:
        outcome = self.reconciler.reconcile(copy.deepcopy(self.body))
        self.body["status"] = {**self.body.get("status", {}), **outcome.status}
        return outcome

    def writes_of(self, fn: Any) -> list[tuple[str, str, str]]:
        before = len(self.kube.writes)
        fn()
        return self.kube.writes[before:]


class TestCreate:
    def test_creates_every_child_with_an_owner_reference(self) -> None:
        cluster = Cluster(isvc())
        outcome = cluster.reconcile()
        assert [w[:2] for w in cluster.kube.writes] == [
            ("create", "NetworkPolicy"),
            ("create", "Secret"),
            ("create", "ConfigMap"),
            ("create", "Deployment"),
            ("create", "Service"),
        ]
        for kind, name in [
            (NETWORK_POLICY, "resnet50"),
            (SECRET, "resnet50-admin-token"),
            (CONFIGMAP, "resnet50-batching"),
            (DEPLOYMENT, "resnet50"),
            (SERVICE, "resnet50"),
        ]:
            child = cluster.kube.of(kind, NS, name)
            (ref,) = child["metadata"]["ownerReferences"]
            assert ref["uid"] == "isvc-uid"
            assert ref["controller"] is True
            assert child["metadata"]["labels"][ISVC_LABEL] == "resnet50"
        assert [e.reason for e in outcome.events] == ["Created"] * 5

    def test_status_reports_progress_until_a_replica_is_ready(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        status = cluster.body["status"]
        assert status["observedGeneration"] == 1
        assert status["replicasText"] == "0/1"
        assert status["url"] == "http://resnet50.vision.svc/v2/models/resnet50"
        (ready,) = status["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == (
            "Ready",
            "False",
            "Progressing",
        )

        deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
        deployment["status"] = {"readyReplicas": 1, "replicas": 1}
        cluster.now = T0 + timedelta(seconds=30)
        cluster.reconcile()
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("True", "Available")
        assert ready["lastTransitionTime"] == "2026-11-30T12:00:30Z"
        assert cluster.body["status"]["replicasText"] == "1/1"


def crashing_pod(name: str) -> dict[str, Any]:
    """A runtime pod in a crash loop, as the kubelet reports it (`FallbackToLogsOnError`)."""
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {ISVC_LABEL: "resnet50"}},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "runtime",
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 1,
                            "message": "ERROR model /models/model.onnx cannot be served: model "
                            "file /models/model.onnx does not exist\n",
                        }
                    },
                }
            ],
        },
    }


class TestReadySaysWhy:
    def test_a_crash_loop_is_the_ready_conditions_reason_with_one_warning(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        cluster.pods = [crashing_pod("resnet50-a")]
        outcome = cluster.reconcile()
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "CrashLoopBackOff")
        assert ready["message"] == (
            "1 of 1 pods CrashLoopBackOff: runtime: exit code 1: ERROR model /models/model.onnx "
            "cannot be served: model file /models/model.onnx does not exist"
        )
        assert [(e.type, e.reason, e.message) for e in outcome.events] == [
            ("Warning", "ReplicasFailing", ready["message"])
        ]
        # Said once: the next pass, with nothing new, writes and posts nothing.
        again = cluster.reconcile()
        assert again.events == []
        assert again.status == {}

    def test_ready_replicas_with_missing_ones_stay_available_and_say_why(self) -> None:
        cluster = Cluster(isvc(scaling={"minReplicas": 2}))
        cluster.reconcile()
        deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
        deployment["status"] = {
            "readyReplicas": 1,
            "replicas": 2,
            "conditions": [
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": 'pods "resnet50-b" is forbidden: exceeded quota: gpus',
                }
            ],
        }
        cluster.reconcile()
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("True", "Available")
        assert ready["message"] == (
            '1 of 2 replicas ready; pods cannot be created: pods "resnet50-b" is forbidden: '
            "exceeded quota: gpus"
        )
        deployment["status"] = {"readyReplicas": 2, "replicas": 2}
        cluster.reconcile()
        (ready,) = cluster.body["status"]["conditions"]
        assert ready["message"] == "2 of 2 replicas ready"

    def test_pods_starting_are_progress_not_trouble(self) -> None:
        cluster = Cluster(isvc())
        cluster.pods = [
            {
                "metadata": {"name": "p", "namespace": NS, "labels": {ISVC_LABEL: "resnet50"}},
                "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
            }
        ]
        outcome = cluster.reconcile()
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["reason"], ready["message"]) == (
            "Progressing",
            "waiting for a replica to become ready",
        )
        assert "ReplicasFailing" not in [e.reason for e in outcome.events]


def test_a_rollout_restart_survives_the_deployment_being_replaced() -> None:
    """`kubectl rollout restart` writes a time into the pod template; a replacement of the
    Deployment (here a spec edit; also the switch to an in-place rollout while the restart's
    surge pod waits for a GPU) that dropped it rolled the pods back to the template of before."""
    cluster = Cluster(isvc(scaling={"mode": "off"}))
    cluster.reconcile()
    deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
    template = deployment["spec"]["template"]["metadata"]
    template.setdefault("annotations", {})[RESTARTED_AT] = "2026-12-07T20:00:00Z"
    cluster.body["spec"]["runtime"]["env"] = [{"name": "LOG_LEVEL", "value": "debug"}]
    cluster.reconcile()
    replaced = cluster.kube.of(DEPLOYMENT, NS, "resnet50")
    container = replaced["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "LOG_LEVEL", "value": "debug"} in container["env"]  # it was replaced
    annotations = replaced["spec"]["template"]["metadata"]["annotations"]
    assert annotations[RESTARTED_AT] == "2026-12-07T20:00:00Z"


class TestARolloutWithNoRoom:
    """A spec change rolls the pods; on a cluster with no GPU free the surge pod waits."""

    @staticmethod
    def no_room_since(since: datetime) -> dict[str, Any]:
        scheduled = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            "lastTransitionTime": since.isoformat().replace("+00:00", "Z"),
        }
        labels = {ISVC_LABEL: "resnet50"}
        meta = {"name": "resnet50-new-a", "namespace": NS, "labels": labels}
        return {"metadata": meta, "status": {"conditions": [scheduled]}}

    def test_after_the_wait_it_rolls_in_place_then_with_a_surge_again(self) -> None:
        cluster = Cluster(isvc(scaling={"minReplicas": 3, "maxReplicas": 3, "mode": "off"}))
        cluster.reconcile()
        deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
        assert deployment["spec"]["strategy"]["rollingUpdate"] == SURGE
        # mid-rollout: one pod of the new template, unschedulable, beside the three serving
        deployment["status"] = {"replicas": 4, "updatedReplicas": 1, "readyReplicas": 3}
        cluster.pods = [self.no_room_since(cluster.now)]
        cluster.now += timedelta(seconds=119)
        outcome = cluster.reconcile()
        assert (
            cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["strategy"]["rollingUpdate"]
            == SURGE
        )
        assert "RollingInPlace" not in [e.reason for e in outcome.events]

        cluster.now += timedelta(seconds=1)  # 120 s without room: the operator's default
        outcome = cluster.reconcile()
        deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
        assert deployment["spec"]["strategy"]["rollingUpdate"] == IN_PLACE
        (said,) = [e for e in outcome.events if e.reason == "RollingInPlace"]
        assert said.type == "Warning"
        assert "no room for 120 s" in said.message

        # an old pod went, its GPU took the new one; the rollout goes on in place, said once
        deployment["status"] = {"replicas": 3, "updatedReplicas": 2, "readyReplicas": 2}
        cluster.pods = []
        outcome = cluster.reconcile()
        assert deployment["spec"]["strategy"]["rollingUpdate"] == IN_PLACE
        assert "RollingInPlace" not in [e.reason for e in outcome.events]

        deployment["status"] = {"replicas": 3, "updatedReplicas": 3, "readyReplicas": 3}
        cluster.reconcile()  # over: the next rollout starts with a surge again
        assert (
            cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["strategy"]["rollingUpdate"]
            == SURGE
        )


def strategy(cluster: Cluster, namespace: str = NS, name: str = "resnet50") -> dict[str, Any]:
    found: dict[str, Any] = cluster.kube.objects[("Deployment", namespace, name)]["spec"][
        "strategy"
    ]["rollingUpdate"]
    return found


class TestTurnsToRollInPlace:
    """An upgrade of the operator rolls every service at once: on a full cluster no more than
    `rollout_in_place_max_services` of those rollouts go in place at a time, fleet-wide; the
    others wait with their surge, every old pod serving."""

    OTHER = ("text", "bert")

    def two_services(self, *, max_services: int = 1) -> Cluster:
        """resnet50 mid-rollout, its surge pod unschedulable 120 s, while another service's
        rollout goes in place (its Deployment as the watch-fed cache holds it)."""
        settings = OperatorSettings(rollout_in_place_max_services=max_services)
        cluster = Cluster(
            isvc(scaling={"minReplicas": 3, "maxReplicas": 3, "mode": "off"}), settings=settings
        )
        cluster.reconcile()
        namespace, name = self.OTHER
        cluster.kube.put_object(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": 2, "strategy": {"rollingUpdate": dict(IN_PLACE)}},
                "status": {"replicas": 2, "updatedReplicas": 1, "readyReplicas": 1},
            }
        )
        deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
        deployment["status"] = {"replicas": 4, "updatedReplicas": 1, "readyReplicas": 3}
        cluster.pods = [TestARolloutWithNoRoom.no_room_since(cluster.now)]
        cluster.now += timedelta(seconds=120)
        return cluster

    def test_it_waits_its_turn_with_its_surge_then_goes_in_place(self) -> None:
        cluster = self.two_services(max_services=1)
        outcome = cluster.reconcile()
        assert strategy(cluster) == SURGE  # held: its three old pods serve
        assert "RollingInPlace" not in [e.reason for e in outcome.events]
        (said,) = [e for e in outcome.events if e.reason == "WaitingToRollInPlace"]
        assert said.type == "Normal"
        assert said.message == (
            "the rollout's new pod has found no room for 120 s; 1 other service is rolling in "
            "place (rolloutInPlaceMaxServices 1): text/bert; this one waits its turn, with a "
            "surge: its old pods serve until one of those rollouts is over"
        )
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("True", "Available")
        assert ready["message"] == (
            "3 of 3 replicas ready; the rollout's new pod has found no room for 120 s; 1 other "
            "service is rolling in place (rolloutInPlaceMaxServices 1), this one waits its turn"
        )

        # said once: the next pass, with nothing new, writes and posts nothing
        cluster.now += timedelta(seconds=60)
        again = cluster.reconcile()
        assert (again.events, again.status) == ([], {})

        # the other rollout is over: the next pass (a timer's, a wake-up's) takes the turn
        other = cluster.kube.objects[("Deployment", *self.OTHER)]
        other["status"] = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}
        outcome = cluster.reconcile()
        assert strategy(cluster) == IN_PLACE
        assert "RollingInPlace" in [e.reason for e in outcome.events]
        (ready,) = cluster.body["status"]["conditions"]
        assert ready["message"] == "3 of 3 replicas ready"

    def test_under_the_limit_it_goes_in_place_at_once(self) -> None:
        cluster = self.two_services(max_services=2)
        outcome = cluster.reconcile()
        assert strategy(cluster) == IN_PLACE
        assert "WaitingToRollInPlace" not in [e.reason for e in outcome.events]

    def test_no_limit_at_zero(self) -> None:
        cluster = self.two_services(max_services=0)
        cluster.reconcile()
        assert strategy(cluster) == IN_PLACE

    def test_one_rolling_in_place_keeps_going_whatever_the_others(self) -> None:
        cluster = self.two_services(max_services=1)
        # in place already (a pass of a limit since lowered, or of the leader before), beside
        # two others: it does not flip back mid-rollout
        deployment = cluster.kube.objects[("Deployment", NS, "resnet50")]
        deployment["spec"]["strategy"]["rollingUpdate"] = dict(IN_PLACE)
        deployment["status"] = {"replicas": 3, "updatedReplicas": 2, "readyReplicas": 2}
        other = cluster.kube.objects[("Deployment", *self.OTHER)]
        cluster.kube.put_object({**other, "metadata": {"name": "t5", "namespace": "text"}})
        assert len(cluster.rolling_in_place()) == 3
        cluster.pods = []
        outcome = cluster.reconcile()
        assert strategy(cluster) == IN_PLACE
        assert "WaitingToRollInPlace" not in [e.reason for e in outcome.events]
        assert "waits its turn" not in cluster.body["status"]["conditions"][0]["message"]

    def test_two_passes_at_once_cannot_both_take_the_last_turn(self) -> None:
        """The count is what the Deployments say; between a pass's count and its write, the
        turn it took is counted too."""

        class Racing(FakeKube):
            """Runs the other service's pass while this one writes its Deployment in place."""

            during: Any = None

            def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
                if self.during is not None and obj["kind"] == "Deployment":
                    during, self.during = self.during, None
                    during()
                return super().replace(obj)

        settings = OperatorSettings(rollout_in_place_max_services=1)
        kube = Racing()
        first = Cluster(
            isvc(scaling={"minReplicas": 3, "maxReplicas": 3, "mode": "off"}),
            settings=settings,
            kube=kube,
        )
        second_body = isvc(scaling={"minReplicas": 3, "maxReplicas": 3, "mode": "off"})
        second_body["metadata"].update(name="bert", uid="bert-uid")
        second = Cluster(second_body, settings=settings, kube=kube)
        second.reconciler = first.reconciler  # one operator
        for cluster, name in ((first, "resnet50"), (second, "bert")):
            cluster.reconcile()
            deployment = kube.objects[("Deployment", NS, name)]
            deployment["status"] = {"replicas": 4, "updatedReplicas": 1, "readyReplicas": 3}
            pod = TestARolloutWithNoRoom.no_room_since(T0)
            pod["metadata"]["labels"] = {ISVC_LABEL: name}
            first.pods.append(pod)
        first.now = T0 + timedelta(seconds=120)
        second.now, second.pods = first.now, first.pods
        seconds: list[Any] = []
        kube.during = lambda: seconds.append(second.reconcile())
        first.reconcile()
        assert strategy(first) == IN_PLACE
        assert strategy(second, NS, "bert") == SURGE
        (outcome,) = seconds
        assert "WaitingToRollInPlace" in [e.reason for e in outcome.events]
        assert "vision/resnet50" in outcome.events[-1].message


class TestDoNothing:
    def test_a_second_pass_with_nothing_changed_makes_zero_writes(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        cluster.now += timedelta(minutes=5)
        writes = cluster.writes_of(cluster.reconcile)
        outcome = cluster.reconcile()
        assert writes == []
        assert outcome.status == {}
        assert outcome.events == []

    def test_what_the_api_server_normalizes_is_not_drift(self) -> None:
        """Quantities kept in canonical form and empty values dropped, as the API server stores
        them: a spec written otherwise must not rewrite the Deployment every pass."""
        runtime = {
            "device": "gpu",
            "resources": {"requests": {"cpu": 2, "memory": "1024Mi"}, "limits": {"cpu": "2.5"}},
            "env": [{"name": "FOO", "value": ""}],
            "tolerations": [{"key": "k", "operator": "Exists", "effect": ""}],
        }
        cluster = Cluster(isvc(runtime=runtime))
        cluster.reconcile()
        pod = cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        container["resources"]["requests"].update(cpu="2", memory="1Gi")
        container["resources"]["limits"]["cpu"] = "2500m"
        for var in container["env"]:
            if var.get("value") == "":
                del var["value"]
        for toleration in pod["tolerations"]:
            if toleration.get("effect") == "":
                del toleration["effect"]
        assert cluster.writes_of(cluster.reconcile) == []
        container["resources"]["limits"]["cpu"] = "3"  # a value changed is drift still
        assert cluster.writes_of(cluster.reconcile) == [("replace", "Deployment", "resnet50")]

    @pytest.mark.parametrize(
        ("text", "value"),
        [
            (2, "2"), ("500m", "0.5"), ("0.5", "0.5"), ("1Gi", str(2**30)), ("1024Mi", str(2**30)),
            ("1e3", "1000"), ("1k", "1000"), ("2.5E-3", "0.0025"), (".5", "0.5"),
        ],
    )  # fmt: skip
    def test_a_quantity_is_read_as_kubernetes_reads_it(self, text: int | str, value: str) -> None:
        assert quantity(text) == Decimal(value)

    @pytest.mark.parametrize("text", ["", "1.5 Gi", "2GB", "ten", True, None, 1.5])
    def test_what_is_no_quantity_is_none(self, text: object) -> None:
        assert quantity(text) is None

    def test_server_assigned_fields_are_not_drift(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        service = cluster.kube.of(SERVICE, NS, "resnet50")
        assert service["spec"]["clusterIP"] == "10.96.0.10"  # the fake API server defaulted it
        assert cluster.writes_of(cluster.reconcile) == []


class TestDrift:
    def test_an_edited_deployment_is_restored(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        stored = cluster.kube.objects[("Deployment", NS, "resnet50")]
        stored["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:latest"
        writes = cluster.writes_of(cluster.reconcile)
        assert writes == [("replace", "Deployment", "resnet50")]
        restored = cluster.kube.of(DEPLOYMENT, NS, "resnet50")
        assert restored["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
            "ghcr.io/batchpilot/runtime-gpu"
        )
        # What the server and other controllers own survives the replace.
        assert restored["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"

    def test_a_deleted_child_is_recreated(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        del cluster.kube.objects[("Service", NS, "resnet50")]
        assert cluster.writes_of(cluster.reconcile) == [("create", "Service", "resnet50")]

    def test_a_spec_change_updates_the_children(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        cluster.body["spec"]["runtime"]["image"] = "registry.local/runtime:2"
        cluster.body["metadata"]["generation"] = 2
        writes = cluster.writes_of(cluster.reconcile)
        assert writes == [("replace", "Deployment", "resnet50")]
        container = cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["template"]["spec"][
            "containers"
        ][0]
        assert container["image"] == "registry.local/runtime:2"
        assert cluster.body["status"]["observedGeneration"] == 2


def add_a_toleration(obj: dict[str, Any]) -> None:
    """A Kyverno rule generated for Deployments from a Pod policy: one more toleration."""
    if obj["kind"] == "Deployment":
        pod = obj["spec"]["template"]["spec"]
        pod.setdefault("tolerations", []).append({"key": "team", "operator": "Exists"})


def rewrite_the_registry(obj: dict[str, Any]) -> None:
    """A registry-rewriting policy: every image pulled through the mirror."""
    if obj["kind"] == "Deployment":
        for container in obj["spec"]["template"]["spec"]["containers"]:
            container["image"] = "mirror.corp/" + container["image"].split("/", 1)[-1]


def image_of(cluster: Cluster) -> str:
    deployment = cluster.kube.of(DEPLOYMENT, NS, "resnet50")
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


class TestAdmissionWebhooks:
    """What a mutating webhook changes of the operator's own writes is accepted, once."""

    def test_a_field_a_webhook_adds_is_written_once_not_every_pass(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        outcome = cluster.reconcile()
        (said,) = [e for e in outcome.events if e.reason == "ChangedOnAdmission"]
        assert said.message.startswith("the API server stored Deployment resnet50 otherwise")
        assert "spec.template.spec.tolerations" in said.message
        for _ in range(3):
            cluster.now += timedelta(minutes=1)
            assert cluster.writes_of(cluster.reconcile) == []
            assert cluster.reconcile().events == []

    def test_a_webhook_rewriting_the_image_is_accepted_and_a_persons_edit_still_put_back(
        self,
    ) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = rewrite_the_registry
        cluster.reconcile()
        assert image_of(cluster).startswith("mirror.corp/batchpilot/runtime-gpu")
        assert cluster.writes_of(cluster.reconcile) == []
        # Someone else sets an image: put back, through the webhook again, once.
        stored = cluster.kube.objects[("Deployment", NS, "resnet50")]
        stored["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:latest"
        outcome = cluster.reconcile()
        assert cluster.kube.writes[-1] == ("replace", "Deployment", "resnet50")
        assert image_of(cluster).startswith("mirror.corp/batchpilot/runtime-gpu")
        assert [e.reason for e in outcome.events] == ["Updated"]  # its change was said before
        assert cluster.writes_of(cluster.reconcile) == []

    def test_a_spec_change_is_written_through_the_webhook_once(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        cluster.reconcile()
        cluster.body["spec"]["runtime"]["image"] = "registry.local/runtime:2"
        outcome = cluster.reconcile()
        assert cluster.kube.writes[-1] == ("replace", "Deployment", "resnet50")
        assert image_of(cluster) == "registry.local/runtime:2"
        assert [e.reason for e in outcome.events] == ["Updated", "ChangedOnAdmission"]
        assert cluster.writes_of(cluster.reconcile) == []

    def test_replicas_the_autopilot_moves_are_no_reason_to_write(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        cluster.reconcile()
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 3
        assert cluster.writes_of(cluster.reconcile) == [
            ("create", "PodDisruptionBudget", "resnet50")
        ]
        # Moved out of the spec's bounds, though, it is clamped back.
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 9
        assert cluster.writes_of(cluster.reconcile)[0] == ("replace", "Deployment", "resnet50")
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["replicas"] == 4

    def test_an_operator_that_starts_writes_once_more_then_settles(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        cluster.reconcile()
        cluster.reconciler = Cluster(cluster.body, kube=cluster.kube).reconciler  # a new leader
        assert cluster.writes_of(cluster.reconcile) == [("replace", "Deployment", "resnet50")]
        assert cluster.writes_of(cluster.reconcile) == []

    def test_a_deleted_service_is_forgotten(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        cluster.reconcile()
        cluster.reconciler.forget(NS, "bert")  # another service: nothing of this one goes
        assert cluster.writes_of(cluster.reconcile) == []
        cluster.reconciler.forget(NS, "resnet50")
        assert cluster.writes_of(cluster.reconcile) == [("replace", "Deployment", "resnet50")]

    def test_a_service_named_like_anothers_child_forgets_nothing_of_it(self) -> None:
        # "resnet50-batching" is the name of resnet50's ConfigMap: forgetting a service of that
        # name dropped what was remembered of resnet50's Deployment's write.
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        cluster.reconcile()
        cluster.reconciler.forget(NS, "resnet50-batching")
        cluster.reconciler.forget(NS, "resnet50-admin-token")
        assert cluster.writes_of(cluster.reconcile) == []

    def test_what_is_kept_is_of_the_services_there_are(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.admission = add_a_toleration
        cluster.reconcile()
        cluster.reconciler.forget_all_but([(NS, "resnet50"), (NS, "bert")])
        assert cluster.writes_of(cluster.reconcile) == []
        cluster.reconciler.forget_all_but([(NS, "bert")])
        assert cluster.writes_of(cluster.reconcile) == [("replace", "Deployment", "resnet50")]


class TestAutopilotOwnership:
    def test_in_auto_mode_replicas_and_batching_in_force_are_kept(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        # The autopilot scaled to 3 replicas and batch 8.
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 3
        cluster.kube.objects[("ConfigMap", NS, "resnet50-batching")]["data"]["batching.json"] = (
            batching_document(
                batch_size=8,
                max_queue_delay_ms=4,
                deadline_ms=100,
                sla_ms=100,
                objective_percent=99,
                burst_batch_size=32,
            )
        )
        writes = cluster.writes_of(cluster.reconcile)
        # Only the disruption budget is new: 3 replicas now warrant one.
        assert writes == [("create", "PodDisruptionBudget", "resnet50")]
        budget = cluster.kube.objects[("PodDisruptionBudget", NS, "resnet50")]["spec"]
        # One replica at a time; one not ready (crash-looping) never holds a node drain up.
        assert budget["maxUnavailable"] == 1
        assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["replicas"] == 3
        assert cluster.body["status"]["batchSize"] == 8
        assert cluster.body["status"]["maxQueueDelayMs"] == 4

    def test_a_batching_document_without_the_service_level_gets_it_and_keeps_the_rest(
        self,
    ) -> None:
        # Written by an older operator, or before the SLA, the objective or the largest batch
        # size changed.
        cluster = Cluster(isvc(sla={"latencyP99Ms": 100, "objectivePercent": 99.9}))
        cluster.reconcile()
        configmap = cluster.kube.objects[("ConfigMap", NS, "resnet50-batching")]
        configmap["data"]["batching.json"] = batching_document(
            batch_size=8, max_queue_delay_ms=4, deadline_ms=100
        )
        assert cluster.writes_of(cluster.reconcile) == [
            ("replace", "ConfigMap", "resnet50-batching")
        ]
        document = json.loads(
            cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")["data"]["batching.json"]
        )
        assert document == {
            "maxBatchSize": 8,
            "maxQueueDelayMs": 4.0,
            "deadlineMs": 100.0,
            "slaMs": 100.0,
            "objectivePercent": 99.9,
            "burstBatchSize": 32,
        }

    def test_the_burst_size_is_the_largest_batch_in_mode_auto_only(self) -> None:
        for mode, burst in (("auto", 32), ("recommend", None), ("off", None)):
            cluster = Cluster(
                isvc(scaling={"mode": mode, "minReplicas": 1, "maxReplicas": 4, "maxBatchSize": 32})
            )
            cluster.reconcile()
            document = json.loads(
                cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")["data"]["batching.json"]
            )
            assert document.get("burstBatchSize") == burst, mode

    def test_the_pods_deadline_is_the_sla_less_the_latency_learned_outside_the_batcher(
        self,
    ) -> None:
        cluster = Cluster(isvc(sla={"latencyP99Ms": 100}))
        cluster.reconcile()

        def deadline() -> float:
            configmap = cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")
            return float(json.loads(configmap["data"]["batching.json"])["deadlineMs"])

        assert deadline() == 100
        assert cluster.body["status"]["deadlineMs"] == 100
        # the autopilot learned 12 ms outside the batcher: 88 ms left for the batcher
        cluster.body["status"]["autopilot"] = {"overheadMs": 12.0, "recommendations": []}
        cluster.reconcile()
        assert deadline() == 88
        assert cluster.body["status"]["deadlineMs"] == 88
        # a wobble of a millisecond rewrites nothing
        cluster.body["status"]["autopilot"]["overheadMs"] = 12.9
        assert cluster.writes_of(cluster.reconcile) == []

    def test_values_outside_the_spec_bounds_are_clamped(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 40
        cluster.reconcile()
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["replicas"] == 4  # maxReplicas

    @pytest.mark.parametrize("mode", ["off", "recommend"])
    def test_outside_auto_mode_the_batch_in_force_stays_until_batching_is_edited(
        self, mode: str
    ) -> None:
        """Turned from auto (to watch the autopilot in an incident, to hand the replicas to an
        HPA), a service fell to `batching`'s starting point — batch 1 under the load its
        replicas were sized for at 16. The settings in force stay until `batching` is edited."""
        cluster = Cluster(isvc(batching={"batchSize": 1}))
        cluster.reconcile()
        cluster.kube.objects[("ConfigMap", NS, "resnet50-batching")]["data"]["batching.json"] = (
            batching_document(batch_size=16, max_queue_delay_ms=5, deadline_ms=100, sla_ms=100)
        )  # the autopilot's
        cluster.reconcile()
        assert cluster.body["status"]["batchSize"] == 16
        cluster.body["spec"]["scaling"]["mode"] = mode
        cluster.reconcile()
        assert cluster.body["status"]["batchSize"] == 16
        assert batching_in(cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")).batch_size == 16
        cluster.body["spec"]["scaling"]["maxBatchSize"] = 8
        cluster.reconcile()
        assert cluster.body["status"]["batchSize"] == 8  # within the spec's bounds all the same
        cluster.body["spec"]["batching"]["batchSize"] = 4  # a person's choice now
        cluster.reconcile()
        assert cluster.body["status"]["batchSize"] == 4
        assert batching_in(cluster.kube.of(CONFIGMAP, NS, "resnet50-batching")).batch_size == 4

    @pytest.mark.parametrize("mode", ["off", "recommend"])
    def test_outside_auto_mode_the_spec_decides_the_batch_and_others_the_replicas(
        self, mode: str
    ) -> None:
        """Scaled by someone else (a person acting on a recommendation, an HPA): kept within
        the spec's bounds, where it was put back to `minReplicas` on every pass."""
        cluster = Cluster(isvc(scaling={"mode": mode, "minReplicas": 2}, batching={"batchSize": 4}))
        cluster.reconcile()
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["replicas"] == 2
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 3
        cluster.reconcile()
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["replicas"] == 3
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 40
        cluster.reconcile()
        assert cluster.kube.of(DEPLOYMENT, NS, "resnet50")["spec"]["replicas"] == 4  # maxReplicas
        assert cluster.body["status"]["batchSize"] == 4

    def test_the_disruption_budget_follows_the_replica_count(self) -> None:
        cluster = Cluster(isvc(scaling={"minReplicas": 2}))
        cluster.reconcile()
        assert cluster.kube.of(PDB, NS, "resnet50")["spec"]["maxUnavailable"] == 1
        cluster.body["spec"]["scaling"]["minReplicas"] = 1
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 1
        assert ("delete", "PodDisruptionBudget", "resnet50") in cluster.writes_of(cluster.reconcile)

    def test_the_admin_token_is_generated_once_and_kept(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        token = cluster.kube.of(SECRET, NS, "resnet50-admin-token")["data"]["admin-token"]
        cluster.reconcile()
        assert cluster.kube.of(SECRET, NS, "resnet50-admin-token")["data"]["admin-token"] == token


class TestForeignObjects:
    def test_an_object_we_do_not_control_is_left_alone_with_a_warning(self) -> None:
        cluster = Cluster(isvc())
        foreign = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "resnet50", "namespace": NS, "labels": {"team": "other"}},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 9000}]},
        }
        cluster.kube.put_object(foreign)
        outcome = cluster.reconcile()
        service = cluster.kube.of(SERVICE, NS, "resnet50")
        assert service["spec"]["selector"] == {"app": "theirs"}
        assert ("create", "Service", "resnet50") not in cluster.kube.writes
        (warning,) = [e for e in outcome.events if e.type == "Warning"]
        assert warning.reason == "ChildConflict"
        assert "Service resnet50 already exists and is not controlled" in warning.message
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "ChildConflict")
        # The warning is posted once, not on every pass.
        assert cluster.reconcile().events == []

    @pytest.mark.parametrize(
        ("kind", "name"),
        [("Secret", "resnet50-admin-token"), ("ConfigMap", "resnet50-batching")],
    )
    def test_a_foreign_object_the_pods_would_mount_holds_the_deployment(
        self, kind: str, name: str
    ) -> None:
        cluster = Cluster(isvc())
        data = {"admin-token": "dGhlaXJz"} if kind == "Secret" else {"a": "b"}
        cluster.kube.put_object(
            {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": NS}}
            | {"data": data}
        )
        cluster.reconcile()
        assert ("create", "Deployment", "resnet50") not in cluster.kube.writes
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "ChildConflict")
        assert f"{kind} {name} already exists" in ready["message"]
        assert "The Deployment waits until then" in ready["message"]
        # once it is gone, the next pass creates ours and the Deployment that mounts it
        del cluster.kube.objects[(kind, NS, name)]
        cluster.reconcile()
        assert ("create", kind, name) in cluster.kube.writes
        assert ("create", "Deployment", "resnet50") in cluster.kube.writes

    def test_a_foreign_service_does_not_hold_the_pods(self) -> None:
        cluster = Cluster(isvc())
        theirs = {"name": "resnet50", "namespace": NS}
        cluster.kube.put_object({"apiVersion": "v1", "kind": "Service", "metadata": theirs})
        cluster.reconcile()
        assert ("create", "Deployment", "resnet50") in cluster.kube.writes
        (ready,) = cluster.body["status"]["conditions"]
        assert "waits" not in ready["message"]


class TestAdoption:
    def test_a_service_recreated_under_its_name_adopts_its_orphans_as_they_are(self) -> None:
        cluster = Cluster(isvc())
        cluster.reconcile()
        cluster.kube.objects[("Deployment", NS, "resnet50")]["spec"]["replicas"] = 3
        cluster.reconcile()  # the disruption budget 3 replicas warrant
        # `kubectl delete --cascade=orphan`, then the same manifest applied again: a new uid.
        for obj in cluster.kube.objects.values():
            obj["metadata"].pop("ownerReferences", None)
        cluster.body = isvc()
        cluster.body["metadata"]["uid"] = "isvc-uid-2"
        outcome = cluster.reconcile()
        assert {w[0] for w in cluster.kube.writes[-6:]} == {"replace"}
        assert [e.reason for e in outcome.events] == ["Adopted"] * 6
        (ready,) = cluster.body["status"]["conditions"]
        assert ready["reason"] != "ChildConflict"
        deployment = cluster.kube.of(DEPLOYMENT, NS, "resnet50")
        assert deployment["metadata"]["ownerReferences"][0]["uid"] == "isvc-uid-2"
        assert deployment["spec"]["replicas"] == 3
        assert cluster.writes_of(cluster.reconcile) == []


class TestWritesTheAPIServerRefuses:
    REFUSAL = (
        'Deployment.apps "resnet50" is invalid: spec.template.spec.containers[0].resources.'
        'requests: Invalid value: "4": must be less than or equal to cpu limit of 2'
    )

    def test_ready_says_why_and_the_warning_is_posted_once(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.refused["Deployment"] = self.REFUSAL
        outcome = cluster.reconcile()
        assert outcome.retry_error is not None
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
        assert self.REFUSAL in ready["message"]
        assert cluster.body["status"]["observedGeneration"] == 1
        assert [e.reason for e in outcome.events if e.type == "Warning"] == ["ApplyFailed"]
        again = cluster.reconcile()  # the retry, or a child's watch event
        assert again.retry_error is not None
        assert [e for e in again.events if e.type == "Warning"] == []

    def test_a_write_that_goes_through_again_clears_it(self) -> None:
        cluster = Cluster(isvc())
        cluster.kube.refused["Deployment"] = self.REFUSAL
        cluster.reconcile()
        del cluster.kube.refused["Deployment"]
        outcome = cluster.reconcile()
        assert outcome.retry_error is None
        (ready,) = cluster.body["status"]["conditions"]
        assert ready["reason"] == "Progressing"


class TestSpecsThatCannotWork:
    def test_a_spec_that_does_not_parse_is_a_permanent_error_with_a_reason(self) -> None:
        body = isvc()
        body["spec"]["scaling"]["minReplicas"] = 9  # above maxReplicas 4
        cluster = Cluster(body)
        outcome = cluster.reconcile()
        assert outcome.permanent_error is not None
        assert "minReplicas must not exceed" in outcome.permanent_error
        assert cluster.kube.writes == []
        (ready,) = cluster.body["status"]["conditions"]
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert [e.reason for e in outcome.events] == ["InvalidSpec"]

    def test_an_s3_model_without_a_storage_initializer_is_refused_with_the_fix(self) -> None:
        cluster = Cluster(isvc(model={"uri": "s3://bucket/resnet50.onnx"}))
        outcome = cluster.reconcile()
        assert outcome.permanent_error is not None
        assert "storage initializer" in outcome.permanent_error
        (ready,) = cluster.body["status"]["conditions"]
        assert ready["reason"] == "UnsupportedModel"
        assert cluster.kube.writes == []


def test_ready_pod_endpoints_take_ready_pods_and_their_admin_port() -> None:
    def pod(ip: str, ready: str, *, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": ip}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-30T12:00:00Z"
        return {
            "metadata": meta,
            "spec": {
                "containers": [
                    {
                        "ports": [
                            {"name": "http", "containerPort": 8080},
                            {"name": "admin", "containerPort": 8082},
                        ]
                    }
                ]
            },
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
        }

    pods = [
        pod("10.0.0.1", "True"),
        pod("10.0.0.2", "False"),
        pod("10.0.0.3", "True", deleting=True),
    ]
    assert ready_pod_endpoints(pods) == ["10.0.0.1:8082"]
    assert ready_pod_endpoints(pods, port_name="http") == ["10.0.0.1:8080"]
