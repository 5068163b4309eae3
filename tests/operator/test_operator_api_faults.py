"""`batchpilot operator run` on the API server's worst day: the local Kubernetes API stays honest,
and the test's fault proxy in front of it (fault_proxy.py) fails what the operator sends — watch
streams cut or answered 410 Gone, answers lost after the write happened, a minute of 503s — while
the test changes things behind the operator's back, straight on the API.

What must hold: the children end up as the spec says, each once; nothing the operator missed
while its watches were down stays missed; the process rides out an outage and catches up, and
its log says so once — a WARNING when it begins, a reminder a minute, an INFO when it is over —
not an ERROR for every failed try. Every wait is on a condition, bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchpilot.sandbox import LocalKubernetesAPI
from batchpilot.sandbox.pods import API
from tests.operator.election_support import free_port, probe
from tests.operator.fault_proxy import Answer, Delay, Fault, FaultProxy, Gone, LoseAnswer
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
START_S = 30.0
"""The operator's start (imports, kopf's initial lists) on a busy test machine."""
PASS_S = 10.0
"""Within a periodic pass (2 s in the tests) or a retry (10 s), with room for a busy machine."""
ISVCS = f"/apis/batchpilot.io/v1alpha1/namespaces/{NS}/inferenceservices"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
CHILDREN = {
    "deployment": (DEPLOYMENTS, ""),
    "service": (f"/api/v1/namespaces/{NS}/services", ""),
    "configmap": (f"/api/v1/namespaces/{NS}/configmaps", "-batching"),
    "secret": (f"/api/v1/namespaces/{NS}/secrets", "-admin-token"),
}


class Cluster:
    """The local API, the fault proxy in front of it, and the operator talking through it."""

    def __init__(self, api: LocalKubernetesAPI, proxy: FaultProxy, tmp: Path) -> None:
        self.api = api
        self.proxy = proxy
        self.rest = API(api.url)  # the test's own hands, straight to the API; 404 reads None
        self.log_path = tmp / "operator.log"
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        self.metrics_port = free_port()
        kubeconfig = proxy.write_kubeconfig(tmp / "kubeconfig")
        env = {
            **os.environ,
            "BATCHPILOT_OPERATOR_AUTOPILOT_ENABLED": "false",  # the reconciles alone
            "BATCHPILOT_OPERATOR_METRICS_PORT": str(self.metrics_port),
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
                 "--kubeconfig", str(kubeconfig), "--liveness", self.liveness,
                 "--metrics-address", "127.0.0.1"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def api_outage(self) -> float | None:
        """The operator's `batchpilot_operator_api_outage` gauge; None where not served yet."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return None
        found = re.search(r"^batchpilot_operator_api_outage (\S+)$", text, re.MULTILINE)
        return None if found is None else float(found[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def logged_since(self, offset: int, level: str) -> list[str]:
        """The lines of `level` (WARNING, ERROR, …) logged past `offset` (a length of `log()`)."""
        return [
            line
            for line in self.log()[offset:].splitlines()
            if line.split(" ", 3)[2:3] == [level]  # "date time LEVEL name: message"
        ]

    def create(self, name: str) -> None:
        self.rest.call(ISVCS, "POST", inference_service(name))

    def child(self, kind: str, name: str) -> dict[str, Any] | None:
        collection, suffix = CHILDREN[kind]
        found: dict[str, Any] | None = self.rest.call(f"{collection}/{name}{suffix}")
        return found

    def children_of(self, name: str) -> dict[str, int]:
        """How many objects of each child kind belong to `name` (by its label)."""
        counts = {}
        for kind, (collection, _) in CHILDREN.items():
            items = self.rest.call(
                f"{collection}?labelSelector=batchpilot.io/inferenceservice={name}"
            )
            counts[kind] = len(items["items"])
        return counts

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        found = self.rest.call(f"/api/v1/namespaces/{NS}/events") or {"items": []}
        return [
            event
            for event in found["items"]
            if event.get("reason") == reason and event.get("involvedObject", {}).get("name") == name
        ]

    def ready(self, name: str) -> tuple[str, str] | None:
        body = self.rest.call(f"{ISVCS}/{name}") or {}
        status = body.get("status") or {}
        if status.get("observedGeneration") != body.get("metadata", {}).get("generation"):
            return None
        for condition in status.get("conditions", []):
            if condition["type"] == "Ready":
                return condition["status"], condition["reason"]
        return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def inference_service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}},
    }


@contextlib.contextmanager
def running(tmp: Path) -> Iterator[Cluster]:
    with (
        LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded() as api,
        FaultProxy(api.url).threaded() as proxy,
    ):
        cluster = Cluster(api, proxy, tmp)
        try:
            # kopf's watches are open once every kind's initial list is done
            wait_until(lambda: proxy.open_watches() >= 7, timeout=START_S, what="the watches")
            yield cluster
        finally:
            cluster.stop()
        assert "Traceback" not in cluster.log(), cluster.log()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("faults")) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def no_faults_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").proxy.clear()


class TestWatchesThatCannotResume:
    def test_a_child_deleted_meanwhile_is_restored(self, cluster: Cluster) -> None:
        """The Deployments' watch is cut; its resumption is answered 410 Gone (the API server's
        watch cache has moved on), so kopf lists them again — and the list does not show the
        Deployment someone deleted in between, which no DELETED event will ever report."""
        cluster.create("relisted")
        wait_until(lambda: cluster.child("deployment", "relisted"), what="the Deployment")
        held = Fault(Delay(1.5, then=Gone()), path="^/apis/apps/v1/deployments$", watch=True)
        cluster.proxy.add(held)
        cut_at = time.monotonic()
        assert cluster.proxy.cut_watches() >= 7
        wait_until(
            lambda: any(
                at > cut_at for at in cluster.proxy.arrived(path="^/apis/apps/v1/deployments$")
            ),
            what="the Deployments' watch resuming (held by the proxy)",
        )
        cluster.rest.call(f"{DEPLOYMENTS}/relisted", "DELETE")
        wait_until(lambda: held.taken >= 1, what="the resumption answered 410")
        cluster.proxy.remove(held)
        wait_until(
            lambda: cluster.child("deployment", "relisted"),
            timeout=PASS_S,
            what="the deleted Deployment created again",
        )
        assert cluster.children_of("relisted") == {
            "deployment": 1, "service": 1, "configmap": 1, "secret": 1
        }  # fmt: skip


class TestWritesTheApiServerFails:
    def test_a_create_whose_answer_is_lost_is_made_once_and_not_reported(
        self, cluster: Cluster
    ) -> None:
        """The Deployment is created, the connection drops before the answer: the pass cannot
        know. It is tried again (409: it exists, read afresh, nothing more to do) — no failure in
        `Ready`, no Warning, no traceback in the log."""
        logged, began = len(cluster.log()), time.monotonic()
        cluster.proxy.add(Fault(LoseAnswer(), path="/deployments$", method="POST", times=1))
        cluster.create("lost-answer")
        wait_until(
            lambda: cluster.ready("lost-answer") == ("False", "Progressing"),
            timeout=PASS_S,
            what="Ready=False (Progressing): everything applied",
        )
        assert [
            s.outcome for s in cluster.proxy.seen(method="POST", path="/deployments$", since=began)
        ][:1] == ["lost"]
        assert cluster.children_of("lost-answer") == {
            "deployment": 1, "service": 1, "configmap": 1, "secret": 1
        }  # fmt: skip
        assert cluster.events("lost-answer", "ApplyFailed") == []
        assert "Traceback" not in cluster.log()[logged:], cluster.log()[logged:]

    def test_a_throttled_create_waits_for_retry_after_and_is_not_reported(
        self, cluster: Cluster
    ) -> None:
        """API Priority and Fairness turns the Deployment's create away twice with 429 and
        `Retry-After: 3`. The other children's events, the periodic pass and the handler's retry
        all come sooner: none may ask before the 3 s are up."""
        began = time.monotonic()
        cluster.proxy.add(
            Fault(Answer(429, retry_after=3), path="/deployments$", method="POST", times=2)
        )
        cluster.create("throttled")
        wait_until(
            lambda: cluster.child("deployment", "throttled"),
            timeout=3 * PASS_S,
            what="the Deployment, once let through",
        )
        asked = cluster.proxy.seen(method="POST", path="/deployments$", since=began)
        assert [s.outcome for s in asked] == ["429", "429", "201"]
        gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(asked)]
        print(f"\ncreates asked {', '.join(f'{gap:.2f}' for gap in gaps)} s apart")
        assert min(gaps) >= 3 - 0.05, gaps
        wait_until(
            lambda: cluster.ready("throttled") == ("False", "Progressing"),
            timeout=PASS_S,
            what="Ready=False (Progressing)",
        )
        assert cluster.events("throttled", "ApplyFailed") == []


OUTAGE = "batchpilot.operator.outage_log: API server outage"
"""How the operator's log begins each statement about an outage (outage_log.py)."""


class TestTheLogThroughAnOutage:
    def test_writes_failed_for_a_while_are_one_warning_and_one_info(self, cluster: Cluster) -> None:
        """The API server fails every request but the watches (503) while a child is deleted and
        the spec edited: the operator's own requests fail at every pass (every 2 s), the
        resource's handler fails (a kopf.TemporaryError, an ERROR of kopf's) and kopf's patch of
        the InferenceService is retried. The log says it once, and once when it is over."""
        cluster.create("unwritable")
        wait_until(
            lambda: cluster.ready("unwritable") == ("False", "Progressing"),
            timeout=PASS_S,
            what="Ready=False (Progressing): everything applied",
        )
        logged, began = len(cluster.log()), time.monotonic()
        failing = cluster.proxy.add(Fault(Answer(503), watch=False))
        cluster.rest.call(f"{DEPLOYMENTS}/unwritable", "DELETE")
        cluster.rest.call(
            f"{ISVCS}/unwritable", "PATCH", {"spec": {"sla": {"latencyP99Ms": 120}}}, patch=True
        )

        def refused() -> bool:
            creates = cluster.proxy.seen(method="POST", path="/deployments$", since=began)
            patches = cluster.proxy.seen(
                method="PATCH", path="/inferenceservices/unwritable$", since=began
            )
            return len(creates) >= 3 and len(patches) >= 4  # kopf's: 0, 1, 2, 4 s

        wait_until(
            refused,
            timeout=3 * PASS_S,
            what="the Deployment's create refused three times, and kopf's patch four",
        )
        # and the operator's own metrics say so, for an alert that does not read logs
        assert cluster.api_outage() == 1
        cluster.proxy.remove(failing)
        wait_until(
            lambda: cluster.child("deployment", "unwritable"),
            timeout=PASS_S,
            what="the Deployment created again",
        )
        assert cluster.logged_since(logged, "ERROR") == []
        wait_until(
            lambda: f"{OUTAGE} over" in cluster.log()[logged:],
            timeout=2 * PASS_S,  # kopf's patch is retried every 10 s
            what="the log saying the outage is over",
        )
        print(f"\n{time.monotonic() - began:.1f} s of refused writes, logged:")
        print("\n".join(line for line in cluster.log()[logged:].splitlines() if OUTAGE in line))
        assert cluster.logged_since(logged, "ERROR") == []  # nor since
        assert cluster.api_outage() == 0
        (warning,) = cluster.logged_since(logged, "WARNING")
        assert f"{OUTAGE}: it answered 503 to " in warning
        (over,) = [line for line in cluster.logged_since(logged, "INFO") if OUTAGE in line]
        assert "the operator's own requests" in over
        assert re.search(
            r"the patch(es)? of inferenceservices.batchpilot.io default/unwritable", over
        )


OUTAGE_S = 60.0
"""Longer than kopf's own retries of a request (eight, 54 s), after which it gave up."""


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[Cluster]:
    """An operator of its own: the outage would hold up every other test's."""
    with running(tmp_path) as cluster:
        yield cluster


def test_a_minute_without_the_api_server_is_ridden_out_and_caught_up_with(alone: Cluster) -> None:
    """Every request answered 503 for a minute and more: the operator keeps running and
    answering liveness, catches up once the API server is back, and its log says it once: a
    WARNING when the first watch fails, a reminder a minute in, an INFO when every watch is
    answered again — no ERROR (before: one for every failed try of each of the ten watches,
    110 in a minute)."""
    cluster = alone
    cluster.create("before")
    wait_until(lambda: cluster.child("deployment", "before"), what="the Deployment")
    logged, began = len(cluster.log()), time.monotonic()
    cluster.proxy.add(Fault(Answer(503)))
    cluster.proxy.cut_watches()
    # Meanwhile, behind the operator's back: a child deleted, a service created.
    cluster.rest.call(f"{DEPLOYMENTS}/before", "DELETE")
    cluster.create("during")

    answers = []

    def outage_over() -> bool:
        answers.append(probe(cluster.liveness))
        return cluster.process.poll() is not None or time.monotonic() - began >= OUTAGE_S

    wait_until(outage_over, timeout=OUTAGE_S + 10, every=2, what="the outage's end")
    assert cluster.process.poll() is None, cluster.log()
    assert {answer and answer[0] for answer in answers} == {200}, answers
    assert cluster.logged_since(logged, "ERROR") == []
    wait_until(
        lambda: len(cluster.logged_since(logged, "WARNING")) == 2,
        timeout=PASS_S,  # the first try failed a minute or more after the WARNING: kopf's 60th s
        what="the outage's WARNING and its reminder a minute in",
    )
    lasted = time.monotonic() - began
    asked = cluster.proxy.seen(since=began)
    print(f"\n{len(asked)} requests in {lasted:.0f} s of 503s ({len(asked) / lasted:.1f}/s)")
    cluster.proxy.clear()

    recovered = time.monotonic()
    wait_until(
        lambda: cluster.child("deployment", "before") and cluster.child("deployment", "during"),
        timeout=30,
        what="what changed during the outage, caught up with",
    )
    print(f"caught up {time.monotonic() - recovered:.1f} s after the API server came back")
    for name in ("before", "during"):
        wait_until(
            lambda n=name: cluster.ready(n) == ("False", "Progressing"),
            timeout=PASS_S,
            what=f"{name}'s status caught up",
        )
        assert cluster.children_of(name) == {
            "deployment": 1, "service": 1, "configmap": 1, "secret": 1
        }  # fmt: skip
    wait_until(
        lambda: f"{OUTAGE} over" in cluster.log()[logged:],
        timeout=PASS_S,
        what="the log saying the outage is over",
    )
    print("\n".join(line for line in cluster.log()[logged:].splitlines() if OUTAGE in line))
    assert cluster.logged_since(logged, "ERROR") == []
    began_line, reminder = cluster.logged_since(logged, "WARNING")
    assert f"{OUTAGE}: it answered 503 to the watch of " in began_line
    assert re.search(
        rf"{OUTAGE}, 6\d s so far: \d+ failed tries; failing: the watches of ", reminder
    )
    (over,) = [line for line in cluster.logged_since(logged, "INFO") if OUTAGE in line]
    assert re.search(
        rf"{OUTAGE} over: the watches of .+ answered again after \d+ s, \d+ failed", over
    )
