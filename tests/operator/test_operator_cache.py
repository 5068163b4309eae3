"""The operator (kopf, in-process through KopfRunner) on the local Kubernetes API reads from its
watch-fed cache: idle passes make no request at all, someone else's edit or deletion of a child
is repaired from the watch event without a read, its own creates are never repeated, and an
operator that starts on objects that exist creates nothing.

Periodic passes are counted from the operator's log record for each one that is over
(periodic.py), so "no request" is asserted over passes that did run; every wait is on a
condition.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kopf.testing import KopfRunner

from batchpilot.operator import handlers, periodic
from batchpilot.operator.autopilot.pilot import learned_outside_s
from batchpilot.operator.kinds import INFERENCESERVICE
from batchpilot.operator.kube import LIST_PAGE
from batchpilot.operator.passes import Passes
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import client_for
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
CHILDREN = {
    "deployments.apps": ("/apis/apps/v1", "resnet50"),
    "services": ("/api/v1", "resnet50"),
    "configmaps": ("/api/v1", "resnet50-batching"),
    "secrets": ("/api/v1", "resnet50-admin-token"),
}
PASS_OVER = re.compile(r"^periodic pass over [^ ]+: over$")
TEST_AGENT = "batchpilot-tests"


class TimerPasses(logging.Handler):
    """Counts the operator's record of each periodic pass that is over."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._count = 0
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if PASS_OVER.match(record.getMessage()):
            with self._changed:
                self._count += 1
                self._changed.notify_all()

    @property
    def count(self) -> int:
        with self._changed:
            return self._count

    def wait_for(self, count: int, *, timeout: float = 30) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self._count >= count, timeout), (
                f"{count} periodic passes did not run within {timeout} s (ran {self._count})"
            )


@pytest.fixture(scope="module")
def timer_passes() -> Iterator[TimerPasses]:
    logger = logging.getLogger(periodic.__name__)
    handler, level = TimerPasses(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class Cluster:
    def __init__(self, api: LocalKubernetesAPI, kubeconfig: Path) -> None:
        self.api = api
        self.kubeconfig = kubeconfig

    def request(
        self,
        path: str,
        method: str = "GET",
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api.url + path,
            data=data,
            method=method,
            headers={"Content-Type": content_type, "User-Agent": TEST_AGENT},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def child(self, resource: str) -> dict[str, Any] | None:
        prefix, name = CHILDREN[resource]
        plural = resource.split(".")[0]
        return self.request(f"{prefix}/namespaces/{NS}/{plural}/{name}")  # type: ignore[no-any-return]

    def next_request(self) -> int:
        return self.api.call(lambda: max((r.id for r in self.api.emulator), default=-1) + 1)

    def reads_since(self, first: int) -> list[str]:
        """The operator's GETs of one object and lists since request `first` (watches are not
        reads; this test's own requests are not the operator's)."""
        verbs = {kmock.action.FETCH: "get", kmock.action.LIST: "list"}
        return self.api.call(
            lambda: [
                f"{verbs[r.action]} {r.resource.plural if r.resource else r.url.path}"
                for r in self.api.emulator
                if r.id >= first
                and r.method == kmock.method.GET
                and r.action in verbs
                and r.headers.get("User-Agent", "") != TEST_AGENT
            ]
        )

    def refused(self) -> list[str]:
        """Writes the API refused with a conflict (a create of what exists, a stale version)."""
        return [str(w) for w in self.api.writes if w.code == 409]


def example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    return doc


ISVCS = f"/apis/batchpilot.io/v1alpha1/namespaces/{NS}/inferenceservices"


def operator(kubeconfig: Path) -> KopfRunner:
    os.environ["KUBECONFIG"] = str(kubeconfig)
    return KopfRunner(
        ["run", "--all-namespaces", "--standalone", "-m", "batchpilot.operator.handlers"],
        timeout=60,
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    previous = os.environ.get("KUBECONFIG")
    with LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api:
        try:
            yield Cluster(api, api.write_kubeconfig(tmp_path / "kubeconfig"))
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous


def all_children(cluster: Cluster) -> bool:
    return all(cluster.child(resource) for resource in CHILDREN)


def ready_reason(cluster: Cluster) -> str | None:
    body = cluster.request(f"{ISVCS}/resnet50") or {}
    for condition in body.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return str(condition["reason"])
    return None


def check_runner(runner: KopfRunner) -> None:
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


def settle(cluster: Cluster, timer_passes: TimerPasses) -> None:
    """Until a periodic pass runs with no write meanwhile (the creation's Events are posted
    from kopf's queue, after the passes that made them)."""
    for _ in range(10):
        writes = cluster.api.writes.total
        timer_passes.wait_for(timer_passes.count + 1)
        if cluster.api.writes.total == writes:
            return
    pytest.fail("the operator never went quiet")


class TestRunning:
    def test_reads_come_from_the_watches_and_writes_happen_once(
        self, cluster: Cluster, timer_passes: TimerPasses
    ) -> None:
        with operator(cluster.kubeconfig) as runner:
            cluster.request(ISVCS, "POST", example())
            wait_until(lambda: all_children(cluster), what="every child")
            wait_until(lambda: ready_reason(cluster) == "Progressing", what="Ready=Progressing")

            # Its own creates, each once: the passes that child events set off right after
            # read the cache, which holds what each create answered.
            for resource in CHILDREN:  # one InferenceService: one create of each kind
                assert cluster.api.writes.count(resource, method="POST") == 1, resource
            assert cluster.refused() == []

            # Idle: two periodic passes, no write and no read of any kind.
            settle(cluster, timer_passes)
            writes, first = cluster.api.writes.total, cluster.next_request()
            timer_passes.wait_for(timer_passes.count + 2)
            assert cluster.api.writes.since(writes) == []
            assert cluster.reads_since(first) == []

            # Someone edits the Deployment: the watch event brings the edit and the repair
            # follows, without reading the Deployment.
            writes, first = cluster.api.writes.total, cluster.next_request()
            image = self._image(cluster)
            cluster.request(
                "/apis/apps/v1/namespaces/default/deployments/resnet50",
                "PATCH",
                {
                    "spec": {
                        "template": {"spec": {"containers": [{"name": "runtime", "image": "x"}]}}
                    }
                },
                content_type="application/merge-patch+json",
            )
            wait_until(lambda: self._image(cluster) == image, what="the Deployment restored")
            repairs = [str(w) for w in cluster.api.writes.since(writes) if w.method == "PUT"]
            assert repairs == ["PUT deployments.apps default/resnet50 -> 200"]
            assert cluster.reads_since(first) == []

            # Someone deletes the Service: created again, once, without a read.
            writes, first = cluster.api.writes.total, cluster.next_request()
            cluster.request("/api/v1/namespaces/default/services/resnet50", "DELETE")
            wait_until(lambda: cluster.child("services"), what="the Service recreated")
            timer_passes.wait_for(timer_passes.count + 1)  # and a periodic pass after it
            creates = [str(w) for w in cluster.api.writes.since(writes) if w.method == "POST"]
            assert [c for c in creates if "events" not in c] == ["POST services default -> 201"]
            assert cluster.reads_since(first) == []
            assert cluster.refused() == []
        check_runner(runner)

    @staticmethod
    def _image(cluster: Cluster) -> str | None:
        deployment = cluster.child("deployments.apps") or {}
        containers = deployment.get("spec", {}).get("template", {}).get("spec", {})
        found = containers.get("containers") or [{}]
        return found[0].get("image")  # type: ignore[no-any-return]


class TestListing:
    def test_every_list_of_a_collection_comes_in_pages(self, cluster: Cluster) -> None:
        """kopf's lists of what it watches (every Secret, ConfigMap, Deployment, … of the
        cluster) as the operator's own: a page at a time, so that a large cluster's Secrets are
        never one response held and parsed whole."""
        with operator(cluster.kubeconfig) as runner:
            cluster.request(ISVCS, "POST", example())
            # A handler ran: kopf runs none before every kind it watches has been listed.
            wait_until(lambda: all_children(cluster), what="every child")
            lists = cluster.api.call(
                lambda: [
                    (r.url.path, dict(r.params or {}))
                    for r in cluster.api.emulator
                    if r.action == kmock.action.LIST
                    and r.headers.get("User-Agent", "") != TEST_AGENT
                ]
            )
        check_runner(runner)
        listed = {path.rsplit("/", 1)[-1] for path, _ in lists}
        assert {"inferenceservices", "secrets", "configmaps", "deployments", "pods"} <= listed
        unpaged = [f"{path} {params}" for path, params in lists if "limit" not in params]
        assert unpaged == []
        assert {params["limit"] for _, params in lists} == {str(LIST_PAGE)}


class TestStarting:
    def test_an_operator_that_starts_on_existing_children_creates_nothing(
        self,
        cluster: Cluster,
        timer_passes: TimerPasses,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        # The reconciles alone: the autopilot's first round writes its own part of the status.
        off = handlers._SETTINGS.model_copy(update={"autopilot_enabled": False})
        monkeypatch.setattr(handlers, "_SETTINGS", off)
        # The InferenceService and its children as an earlier operator left them (the same
        # pass, through the plain client).
        body = cluster.request(ISVCS, "POST", example())
        kube = client_for(cluster.api, tmp_path / "client-kubeconfig")
        reconciler = Reconciler(kube, OperatorSettings(), learned_outside_s=learned_outside_s)
        assert Passes(kube).run(NS, body["metadata"]["name"], reconciler.reconcile) is not None
        assert all_children(cluster)
        status = copy.deepcopy(kube.get(INFERENCESERVICE, NS, "resnet50") or {}).get("status")

        writes = cluster.api.writes.total
        with operator(cluster.kubeconfig) as runner:
            timer_passes.wait_for(timer_passes.count + 2)
            children_written = [
                str(w)
                for w in cluster.api.writes.since(writes)
                if w.resource.split(".")[0] in {"deployments", "services", "configmaps", "secrets"}
            ]
            assert children_written == []
            assert cluster.refused() == []
            now = (cluster.request(f"{ISVCS}/resnet50") or {}).get("status")
            assert now == status
        check_runner(runner)
