"""The fleet as the operator lists it itself (stock.py): what the autopilot's rounds read, in four
lists, before kopf has listed anything — against the local Kubernetes API, through the fault
proxy, which records every request the operator's client makes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchpilot.operator import kube as kube_module
from batchpilot.operator.cache import WatchCache, slim_pod
from batchpilot.operator.children.common import ISVC_LABEL, MANAGED_BY
from batchpilot.operator.handlers import ours
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, INFERENCESERVICE, POD, SERVICE
from batchpilot.operator.kube import KubeClient
from batchpilot.operator.plan import CHILD_KINDS
from batchpilot.operator.stock import take_stock
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import client_for
from tests.operator.fault_proxy import Answer, Fault, FaultProxy
from tests.operator.test_reconciler import isvc

TEAMS = ("team-a", "team-b")


def service(namespace: str, name: str, mode: str) -> dict[str, Any]:
    body = isvc(scaling={"mode": mode})
    body["metadata"] = {"name": name, "namespace": namespace}
    body.pop("status")
    return body


def labelled(kind: str, api_version: str, namespace: str, name: str, **labels: str) -> Any:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
    }


OURS = {"app.kubernetes.io/managed-by": MANAGED_BY}


def deployment(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    body = labelled("Deployment", "apps/v1", namespace, name, **labels)
    body["spec"] = {
        "replicas": 2,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "runtime", "image": "runtime:1"}]},
        },
    }
    return body


def pod(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    body = labelled("Pod", "v1", namespace, name, **labels)
    body["spec"] = {"containers": [{"name": "runtime", "image": "runtime:1"}]}
    return body


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKubernetesAPI]:
    with LocalKubernetesAPI(crds=["crds"], namespaces=TEAMS).threaded() as server:
        kube = client_for(server, tmp_path_factory.mktemp("fleet") / "kubeconfig")
        for namespace, name, mode in (
            ("team-a", "a", "auto"),
            ("team-a", "quiet", "off"),
            ("team-b", "b", "recommend"),
        ):
            kube.create(service(namespace, name, mode))
        kube.create(deployment("team-a", "a", **OURS, **{ISVC_LABEL: "a"}))
        kube.create(deployment("team-a", "stranger"))  # someone else's: not the operator's
        kube.create(
            labelled("ConfigMap", "v1", "team-a", "a-batching", **OURS, **{ISVC_LABEL: "a"})
        )
        kube.create(pod("team-a", "a-1", **OURS, **{ISVC_LABEL: "a"}))
        kube.create(pod("team-a", "a-2", **OURS, **{ISVC_LABEL: "a"}))
        kube.create(pod("team-a", "loose", **OURS))  # the operator's label, no service's
        yield server


@pytest.fixture
def proxy(api: LocalKubernetesAPI) -> Iterator[FaultProxy]:
    with FaultProxy(api.url).threaded() as proxy:
        yield proxy


@pytest.fixture
def cache(proxy: FaultProxy, tmp_path: Path) -> WatchCache:
    kube: KubeClient = client_for(proxy, tmp_path / "kubeconfig")  # type: ignore[arg-type]
    return WatchCache(
        kube,
        (INFERENCESERVICE, *CHILD_KINDS, POD),
        keep=ours,
        slim={POD: slim_pod},
        packed=CHILD_KINDS,
        index_label=ISVC_LABEL,
    )


def asked(proxy: FaultProxy, since: float = 0.0) -> list[str]:
    return [f"{seen.path}?{seen.query}" for seen in proxy.seen(method="GET", since=since)]


def test_four_lists_name_the_piloted_services_and_answer_the_rounds_reads(
    proxy: FaultProxy, cache: WatchCache
) -> None:
    assert sorted(take_stock(cache, []) or []) == [("team-a", "a"), ("team-b", "b")]
    lists = asked(proxy)
    assert len(lists) == 4  # one a kind, every namespace at once
    assert all("/namespaces/" not in path for path in lists)
    since = time.monotonic()
    # What a tick reads comes from memory, a miss included: no request.
    assert cache.get(INFERENCESERVICE, "team-a", "quiet") is not None
    assert cache.get(DEPLOYMENT, "team-a", "a") is not None
    assert cache.get(DEPLOYMENT, "team-a", "stranger") is None  # not the operator's child
    assert cache.get(CONFIGMAP, "team-a", "a-batching") is not None
    assert cache.get(CONFIGMAP, "team-b", "b-batching") is None
    pods = cache.pods("team-a", {ISVC_LABEL: "a"})
    assert sorted(p["metadata"]["name"] for p in pods) == ["a-1", "a-2"]
    assert cache.get(POD, "team-a", "loose") is None  # no service's: the lists left it out
    assert asked(proxy, since) == []
    # A kind the rounds do not read is asked as before kopf's lists: a miss may be an object.
    assert cache.get(SERVICE, "team-a", "a") is None
    assert len(asked(proxy, since)) == 1


def test_the_namespaces_kopf_watches_are_the_ones_listed(
    proxy: FaultProxy, cache: WatchCache
) -> None:
    assert take_stock(cache, ["team-b"]) == [("team-b", "b")]
    assert all("/namespaces/team-b/" in path for path in asked(proxy))  # and nowhere else
    assert cache.get(DEPLOYMENT, "team-a", "a") is None  # outside what the operator watches


def test_namespace_patterns_are_left_to_kopf(proxy: FaultProxy, cache: WatchCache) -> None:
    assert take_stock(cache, ["team-*"]) is None
    assert take_stock(cache, ["!kube-system"]) is None
    assert asked(proxy) == []


def test_a_list_that_fails_leaves_the_round_to_kopfs_lists(
    proxy: FaultProxy, cache: WatchCache, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with proxy.failing(Fault(Answer(403), "/pods", "GET")):
        assert take_stock(cache, []) is None
    assert "waits for kopf's lists" in caplog.text
    since = time.monotonic()
    cache.pods("team-a", {ISVC_LABEL: "a"})  # pods were not listed: asked
    assert len(asked(proxy, since)) == 1


def test_lists_are_paged(
    proxy: FaultProxy, cache: WatchCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_module, "LIST_PAGE", 1)
    assert sorted(take_stock(cache, []) or []) == [("team-a", "a"), ("team-b", "b")]
    pages = [path for path in asked(proxy) if "/inferenceservices" in path]
    assert len(pages) == 3  # three services, one a page
    assert sum("continue=" in path for path in pages) == 2
    assert len(cache.pods("team-a", {ISVC_LABEL: "a"})) == 2


def test_kopfs_own_list_later_drops_what_went_in_between(
    api: LocalKubernetesAPI, proxy: FaultProxy, cache: WatchCache, tmp_path: Path
) -> None:
    take_stock(cache, [])
    kube = client_for(api, tmp_path / "direct")
    kube.create(pod("team-b", "brief", **OURS, **{ISVC_LABEL: "b"}))
    take_stock(cache, [])
    kube.delete(POD, "team-b", "brief")
    # kopf's initial list of pods, as relists.py tells it: its keys and its version
    listed = kube._call("GET", POD.collection(None) + "?labelSelector=" + ISVC_LABEL)
    assert listed is not None
    keys = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in listed["items"]}
    gone = cache.relisted(POD, None, keys, listed["metadata"]["resourceVersion"])
    assert [p["metadata"]["name"] for p in gone] == ["brief"]
    assert cache.pods("team-b", {ISVC_LABEL: "b"}) == []
