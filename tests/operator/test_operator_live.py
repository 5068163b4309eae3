"""The operator (kopf, in-process through KopfRunner) against the local Kubernetes API, driven
with the real kubectl: what a platform team does, and what it sees.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner

from batchpilot.operator import telemetry
from batchpilot.sandbox import LocalKubernetesAPI
from batchpilot.sandbox import store as sandbox_store
from tests.operator.test_telemetry import counted_for
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHILD_RESOURCES = (
    "deployments.apps",
    "services",
    "configmaps",
    "secrets",
    "poddisruptionbudgets.policy",
)


class Cluster:
    def __init__(self, api: LocalKubernetesAPI, kubeconfig: Path, tmp: Path) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.tmp = tmp

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=30,
            input=stdin,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout + result.stderr

    def apply(self, doc: dict[str, Any], *, check: bool = True) -> str:
        return self.kubectl(
            "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(doc), check=check
        )

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", "get", kind, name, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return json.loads(out.stdout) if out.returncode == 0 else None

    def child_writes(self) -> int:
        return sum(self.api.writes.count(resource) for resource in CHILD_RESOURCES)


def containing(text: str, part: str) -> str | None:
    return text if part in text else None


def example(name: str = "resnet50-gpu.yaml", **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    for key, value in changes.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return doc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster")
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        previous = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(kubeconfig)
        try:
            with KopfRunner(
                ["run", "--all-namespaces", "--standalone", "-m", "batchpilot.operator.handlers"],
                timeout=60,
            ) as runner:
                yield Cluster(api, kubeconfig, tmp)
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous
        assert runner.exception is None, runner.output
        assert "Traceback" not in runner.output, runner.output


def ready_reason(cluster: Cluster, name: str) -> str | None:
    body = cluster.get("inferenceservice", name) or {}
    for condition in body.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return str(condition["reason"])
    return None


class TestLifecycle:
    def test_apply_creates_children_owned_by_the_service(self, cluster: Cluster) -> None:
        cluster.apply(example())
        deployment = wait_until(
            lambda: cluster.get("deployment", "resnet50"), what="the Deployment"
        )
        owner = cluster.get("inferenceservice", "resnet50")
        assert owner is not None
        for kind, name in [
            ("deployment", "resnet50"),
            ("service", "resnet50"),
            ("configmap", "resnet50-batching"),
            ("secret", "resnet50-admin-token"),
        ]:
            child = wait_until(lambda k=kind, n=name: cluster.get(k, n), what=f"{kind} {name}")
            (ref,) = child["metadata"]["ownerReferences"]
            assert ref["uid"] == owner["metadata"]["uid"], kind
            assert ref["controller"] is True
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        wait_until(
            lambda: ready_reason(cluster, "resnet50") == "Progressing", what="Ready=Progressing"
        )

    def test_kubectl_get_reads_like_a_dashboard(self, cluster: Cluster) -> None:
        def said() -> str | None:
            out = cluster.kubectl("get", "inferenceservices")
            row = out.splitlines()[1:2]
            return out if row and row[0].split()[4:6] == ["-", "<100ms"] else None

        out = wait_until(said, what="the printer columns, the autopilot's first round in them")
        header, row = out.splitlines()[:2]
        assert header.split() == [
            "NAME", "READY", "REPLICAS", "BATCH", "P99", "SLA", "QPS", "GPU", "SLA-MET", "SLO",
            "AGE",
        ]  # fmt: skip
        # The autopilot's first round comes as soon as the operator has listed the fleet; no
        # Prometheus answers here, so the metrics columns say so.
        assert row.split()[:6] == ["resnet50", "False", "0/1", "1", "-", "<100ms"]

    def test_describe_shows_conditions_and_events(self, cluster: Cluster) -> None:
        out = wait_until(
            lambda: containing(
                cluster.kubectl("describe", "inferenceservice", "resnet50"),
                "created Deployment resnet50",
            ),
            what="Events in describe",
        )
        assert re.search(r"Reason:\s+Progressing", out)
        assert re.search(r"Type:\s+Ready", out)
        assert "waiting for a replica to become ready" in out
        assert re.search(r"Normal\s+Created\s+\S+\s+\S+\s+created Service resnet50", out)

    def test_the_events_posted_are_in_the_operators_metrics(self, cluster: Cluster) -> None:
        created = telemetry.REGISTRY.get_sample_value(
            "batchpilot_operator_events_total",
            {
                "isvc_namespace": "default",
                "isvc": "resnet50",
                "type": "Normal",
                "reason": "Created",
            },
        )
        assert created is not None
        assert created >= 4  # at least the Deployment, Service, ConfigMap and Secret

    def test_a_spec_update_reaches_the_deployment(self, cluster: Cluster) -> None:
        cluster.apply(example(runtime={"image": "registry.local/runtime-gpu:2"}))
        wait_until(
            lambda: (
                (d := cluster.get("deployment", "resnet50"))
                and d["spec"]["template"]["spec"]["containers"][0]["image"]
                == "registry.local/runtime-gpu:2"
            ),
            what="the new image on the Deployment",
        )

    def test_drift_is_restored(self, cluster: Cluster) -> None:
        cluster.kubectl(
            "patch",
            "deployment",
            "resnet50",
            "--type=json",
            "-p",
            '[{"op": "replace", "path": "/spec/template/spec/containers/0/image", '
            '"value": "someone/else:latest"}]',
        )
        wait_until(
            lambda: (
                (d := cluster.get("deployment", "resnet50"))
                and d["spec"]["template"]["spec"]["containers"][0]["image"]
                == "registry.local/runtime-gpu:2"
            ),
            what="the Deployment restored",
        )
        cluster.kubectl("delete", "service", "resnet50")
        wait_until(lambda: cluster.get("service", "resnet50"), what="the Service recreated")

    def test_an_idle_pass_makes_no_writes(self, cluster: Cluster) -> None:
        # Let the last changes settle, then watch several periodic passes (every 2 s).
        wait_until(lambda: cluster.get("service", "resnet50"), what="the Service")
        time.sleep(1)
        before_children = cluster.child_writes()
        before_all = cluster.api.writes.total
        time.sleep(5)  # two or three periodic reconcile passes; nothing may change
        assert cluster.child_writes() == before_children
        assert cluster.api.writes.total == before_all, cluster.api.writes.by_resource()

    def test_delete_takes_the_children_with_it(self, cluster: Cluster) -> None:
        assert counted_for("default", "resnet50") != {}
        cluster.kubectl("delete", "inferenceservice", "resnet50")
        for kind, name in [
            ("deployment", "resnet50"),
            ("service", "resnet50"),
            ("configmap", "resnet50-batching"),
            ("secret", "resnet50-admin-token"),
        ]:
            wait_until(lambda k=kind, n=name: cluster.get(k, n) is None, what=f"{kind} gone")
        # ... and its Events' series leave the operator's metrics.
        wait_until(lambda: counted_for("default", "resnet50") == {}, what="its series gone")


class TestChurn:
    def test_services_created_and_deleted_leave_no_series_and_no_children(
        self, cluster: Cluster
    ) -> None:
        # Passes a child's deletion brings may read a deleted service from the cache a moment
        # longer: they created its children again (for the garbage collector to delete) and
        # posted Events the forgetting on its deletion had already dropped — series and
        # memories grew with every service created and deleted.
        names = [f"churn-{i}" for i in range(4)]
        for round_ in range(2):
            for name in names:
                doc = example()
                doc["metadata"]["name"] = name
                cluster.apply(doc)
            for name in names:
                wait_until(lambda n=name: counted_for("default", n), what=f"{name}'s Events")
            for name in names:
                cluster.kubectl("delete", "inferenceservice", name)
            for name in names:
                wait_until(lambda n=name: cluster.get("deployment", n) is None, what="gone")
            # the periodic round (every 2 s here) keeps the memory of the services there are
            wait_until(
                lambda: all(counted_for("default", n) == {} for n in names),
                what=f"round {round_}: the deleted services' series gone",
            )
        assert all(cluster.get("deployment", n) is None for n in names)


class TestForeignObjects:
    def test_an_object_that_is_not_ours_is_left_alone_with_a_warning(
        self, cluster: Cluster
    ) -> None:
        foreign = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "orientation", "namespace": "default", "labels": {"team": "web"}},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 9000}]},
        }
        cluster.apply(foreign)
        cluster.apply(example("orientation-cpu.yaml"))
        wait_until(
            lambda: ready_reason(cluster, "orientation") == "ChildConflict",
            what="Ready=ChildConflict",
        )
        service = cluster.get("service", "orientation")
        assert service is not None
        assert service["spec"]["selector"] == {"app": "theirs"}
        assert "ownerReferences" not in service["metadata"]
        out = cluster.kubectl("describe", "inferenceservice", "orientation")
        assert "ChildConflict" in out
        assert "Warning" in out
        cluster.kubectl("delete", "inferenceservice", "orientation")
        assert cluster.get("service", "orientation") is not None  # still theirs


class TestRecreatedUnderItsName:
    def test_a_service_deleted_orphaning_its_children_and_applied_again_adopts_them(
        self, cluster: Cluster
    ) -> None:
        doc = example()
        doc["metadata"]["name"] = "restored"
        cluster.apply(doc)
        wait_until(lambda: cluster.get("deployment", "restored"), what="the Deployment")
        cluster.kubectl("scale", "deployment", "restored", "--replicas=3")
        wait_until(lambda: cluster.get("poddisruptionbudget", "restored"), what="its PDB")
        old = cluster.get("inferenceservice", "restored")
        assert old is not None
        cluster.kubectl("delete", "inferenceservice", "restored", "--cascade=orphan")
        wait_until(
            lambda: (
                (d := cluster.get("deployment", "restored"))
                and not d["metadata"].get("ownerReferences")
            ),
            what="the Deployment orphaned",
        )

        cluster.apply(doc)
        new = wait_until(lambda: cluster.get("inferenceservice", "restored"), what="it again")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        deployment = wait_until(
            lambda: (
                (d := cluster.get("deployment", "restored"))
                and (d["metadata"].get("ownerReferences") or [{}])[0].get("uid")
                == new["metadata"]["uid"]
                and d
            ),
            what="the Deployment adopted",
        )
        assert deployment["spec"]["replicas"] == 3  # not minReplicas
        wait_until(
            lambda: ready_reason(cluster, "restored") == "Progressing", what="Ready=Progressing"
        )
        for kind, name in [
            ("service", "restored"),
            ("configmap", "restored-batching"),
            ("secret", "restored-admin-token"),
            ("networkpolicy", "restored"),
            ("poddisruptionbudget", "restored"),
        ]:
            child = cluster.get(kind, name)
            assert child is not None, kind
            (ref,) = child["metadata"]["ownerReferences"]
            assert ref["uid"] == new["metadata"]["uid"], kind
        out = cluster.kubectl("describe", "inferenceservice", "restored")
        assert "adopted Deployment restored" in out
        assert "ChildConflict" not in out
        cluster.kubectl("delete", "inferenceservice", "restored")
        wait_until(lambda: cluster.get("deployment", "restored") is None, what="its Deployment")


SPOT = {"key": "corp.example.com/spot", "operator": "Exists", "effect": "NoSchedule"}


def add_the_spot_toleration(rt: Any, body: Any, *, name: str) -> Any:
    """What a mutating webhook (Kyverno's rule for Deployments from a Pod policy) does to the
    Deployment `name`: one more toleration."""
    metadata = body.get("metadata", {}) if isinstance(body, dict) else {}
    if getattr(rt, "kind", None) == "Deployment" and metadata.get("name") == name:
        pod = body["spec"]["template"]["spec"]
        if SPOT not in pod.setdefault("tolerations", []):
            pod["tolerations"].append(dict(SPOT))
    return body


class TestAdmissionWebhook:
    def test_a_deployment_a_webhook_changes_is_written_once_not_every_pass(
        self, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        create, update = sandbox_store.Store.create, sandbox_store.Store.update

        def admitted_create(self: Any, rt: Any, namespace: Any, body: Any, **kw: Any) -> Any:
            return create(self, rt, namespace, add_the_spot_toleration(rt, body, name="spot"), **kw)

        def admitted_update(
            self: Any, rt: Any, namespace: Any, name: str, body: Any, **kw: Any
        ) -> Any:
            if kw.get("subresource") is None:
                body = add_the_spot_toleration(rt, body, name="spot")
            return update(self, rt, namespace, name, body, **kw)

        monkeypatch.setattr(sandbox_store.Store, "create", admitted_create)
        monkeypatch.setattr(sandbox_store.Store, "update", admitted_update)
        doc = example()
        doc["metadata"]["name"] = "spot"
        cluster.apply(doc)
        deployment = wait_until(lambda: cluster.get("deployment", "spot"), what="the Deployment")
        assert SPOT in deployment["spec"]["template"]["spec"]["tolerations"]
        wait_until(lambda: cluster.get("service", "spot"), what="the Service")
        time.sleep(1)
        before = cluster.api.writes.count("deployments.apps", name="spot", method="PUT")
        time.sleep(5)  # two or three periodic passes (every 2 s)
        assert cluster.api.writes.count("deployments.apps", name="spot", method="PUT") == before
        out = cluster.kubectl("describe", "inferenceservice", "spot")
        assert "ChangedOnAdmission" in out
        assert "Updated" not in out
        cluster.kubectl("delete", "inferenceservice", "spot")


# (case, change to the spec, what kubectl must print)
INVALID = [
    ("no-sla", {"sla": None}, "spec.sla: Required value"),
    ("zero-latency", {"sla": {"latencyP99Ms": 0}}, "spec.sla.latencyP99Ms"),
    ("bad-uri", {"model": {"uri": "ftp://models/x.onnx"}}, "spec.model.uri"),
    ("bad-device", {"runtime": {"device": "tpu"}}, 'spec.runtime.device: Unsupported value: "tpu"'),
    ("bad-mode", {"scaling": {"mode": "yolo"}}, "spec.scaling.mode: Unsupported value"),
    (
        "min-above-max",
        {"scaling": {"minReplicas": 5, "maxReplicas": 2}},
        "minReplicas must not exceed",
    ),
    ("zero-max", {"scaling": {"maxReplicas": 0}}, "spec.scaling.maxReplicas"),
    (
        "band-inverted",
        {"sla": {"latencyP99Ms": 100, "gpuUtilization": {"min": 90, "max": 80}}},
        "gpuUtilization.min must be below",
    ),
    (
        "util-over-100",
        {"sla": {"latencyP99Ms": 100, "gpuUtilization": {"min": 70, "max": 120}}},
        "spec.sla.gpuUtilization.max",
    ),
    (
        "batch-over-ceiling",
        {"scaling": {"maxBatchSize": 8}, "batching": {"batchSize": 16}},
        "batchSize must not exceed",
    ),
    ("negative-delay", {"batching": {"maxQueueDelayMs": -1}}, "spec.batching.maxQueueDelayMs"),
    ("latency-as-text", {"sla": {"latencyP99Ms": "fast"}}, "spec.sla.latencyP99Ms: Invalid value"),
    (
        "tensorrt-on-cpu",
        {"runtime": {"device": "cpu", "accelerator": "tensorrt"}},
        "runtime.accelerator tensorrt needs runtime.device gpu",
    ),
    ("bad-variant", {"model": {"uri": "file:///m.onnx", "variant": "int4"}}, "spec.model.variant"),
    ("no-instances", {"runtime": {"instances": 0}}, "spec.runtime.instances"),
    (
        "image-and-text",
        {
            "pipeline": {
                "preprocess": {
                    "image": {"input": "data"},
                    "text": {"tokenizer": "tokenizer.json"},
                }
            }
        },
        "preprocess takes exactly one of image or text",
    ),
    (
        "softmax-for-nms",
        {"pipeline": {"postprocess": {"softmax": {}, "nms": {"boxes": "b", "scores": "s"}}}},
        "softmax applies to topK",
    ),
    (
        "rgb-mean-of-two",
        {"pipeline": {"preprocess": {"image": {"input": "data", "mean": [0.5, 0.5]}}}},
        "mean needs 1 value, or one per channel",
    ),
    ("empty-pipeline", {"pipeline": {}}, "a pipeline needs preprocess, postprocess or both"),
    (
        "objective-100",
        {"sla": {"latencyP99Ms": 100, "objectivePercent": 100}},
        "sla.objectivePercent must be below 100: an objective of 100 % leaves no error budget",
    ),
    (
        "objective-40",
        {"sla": {"latencyP99Ms": 100, "objectivePercent": 40}},
        "spec.sla.objectivePercent in body should be greater than or equal to 50",
    ),
    (
        "window-in-weeks",
        {"sla": {"latencyP99Ms": 100, "window": "1w"}},
        "sla.window is a whole number and one unit - s, m, h or d",
    ),
    (
        "window-of-29-days",
        {"sla": {"latencyP99Ms": 100, "window": "29d"}},
        "sla.window must be between 5m and 28d",
    ),
    (
        "window-of-4-minutes",
        {"sla": {"latencyP99Ms": 100, "window": "4m"}},
        "sla.window must be between 5m and 28d",
    ),
]


@pytest.mark.parametrize(("case", "change", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_specs_are_refused_with_a_reason(
    cluster: Cluster, case: str, change: dict[str, Any], message: str
) -> None:
    doc = example()
    doc["metadata"]["name"] = f"bad-{case}"
    for key, value in change.items():
        if value is None:
            doc["spec"].pop(key)
        else:
            doc["spec"][key] = value
    out = cluster.apply(doc, check=False)
    assert "is invalid" in out, out
    assert message in out, out
    assert cluster.get("inferenceservice", f"bad-{case}") is None
