"""What the operator does to the Kubernetes API, derived from its code: the RBAC it needs.

Three sources, each read from the code rather than written down a second time:

1. kopf's handler registry (handlers.py's decorators): every resource kopf lists and watches
   for a handler, and patches for the InferenceService's own handlers (progress annotations,
   finalizer; its status through the status subresource when a handler writes status);
2. kopf's own needs, from the settings the operator's startup handler leaves kopf with and from
   `kopf.operator(...)` in run.py: CRD observation, namespace observation (only when serving a
   list of namespaces), Events, peering (none: standalone);
3. the operator's own client (kube.py): the reconciler, the autopilot, the child-event handler
   and the leader elector are run through scenarios against an in-memory API, and every call
   they make is
   replayed through the real `KubeClient` over a recording HTTP layer, so each (method, path)
   it would send becomes an (apiGroup, resource, verb). A static scan of the operator's modules
   finds every call site of the client, and the scenarios must reach every one of them — new
   API calls without a scenario here fail the test instead of slipping through.
"""

from __future__ import annotations

import ast
import base64
import copy
import importlib.util
import inspect
import json
import re
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import yaml

from batchpilot.operator import handlers
from batchpilot.operator import run as operator_run
from batchpilot.operator.autopilot.observation import ComputePoint, Observation, PodCompute
from batchpilot.operator.autopilot.pilot import Autopilot, learned_outside_s
from batchpilot.operator.autopilot.pod_metrics import PodScraper
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.push import AccessPusher, ConnectionRebalancer
from batchpilot.operator.election import LeaderElector
from batchpilot.operator.kinds import DEPLOYMENT, INFERENCESERVICE, ResourceKind
from batchpilot.operator.kube import KubeClient
from batchpilot.operator.leadership import Candidate
from batchpilot.operator.passes import Passes
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from tests.operator.fake_kube import FakeKube

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_PACKAGE = "batchpilot.operator"
KUBE_METHODS = frozenset(
    {
        "get",
        "create",
        "replace",
        "patch",
        "delete",
        "list_objects",
        "ready_pod_endpoints",
        "ready_pods",
    }
)
CLUSTER_SCOPED = frozenset(
    {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}
)
OWN_NAMESPACE = frozenset({("coordination.k8s.io", "leases")})
"""Resources the operator uses only in its own namespace (leader election), not in those it
serves."""


@dataclass(frozen=True, order=True)
class Access:
    """One RBAC permission: a verb on a resource (`plural` or `plural/subresource`) in a group."""

    group: str
    resource: str
    verb: str

    @property
    def cluster_scoped(self) -> bool:
        return (self.group, self.resource) in CLUSTER_SCOPED

    @property
    def own_namespace(self) -> bool:
        return (self.group, self.resource) in OWN_NAMESPACE


# ---- 3. the operator's own client ---------------------------------------------------------------


class _Response:
    def __init__(self, status: int, data: bytes) -> None:
        self.status = status
        self.data = data

    def read(self) -> bytes:
        return self.data


class RecordingApi:
    """Stands in for kubernetes.client.ApiClient under `KubeClient`: records each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    def param_serialize(
        self, *, method: str, resource_path: str, header_params: Any, body: Any, **_: Any
    ) -> tuple[str, str, Any, Any]:
        return method, resource_path, header_params, body

    def call_api(self, method: str, path: str, headers: Any, body: Any, **_: Any) -> _Response:
        self.requests.append((method, path))
        answer = {"items": []} if method == "GET" and "?" in path else dict(body or {})
        return _Response(200, json.dumps(answer).encode())


def access_of_request(method: str, path: str) -> Access:
    """The RBAC permission an HTTP request to the Kubernetes API needs."""
    parts = urllib.parse.urlsplit(path).path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/...
        group, rest = "", parts[2:]
    else:  # /apis/GROUP/VERSION/...
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, name, subresource = ([*rest, None, None])[:3]
    assert resource is not None
    verb = {
        "GET": "get" if name else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }[method]
    return Access(group, f"{resource}/{subresource}" if subresource else resource, verb)


class RecordingKube(FakeKube):
    """The in-memory API, which also replays every call through the real `KubeClient` (over a
    recording HTTP layer) and remembers where in the operator's code each call came from."""

    def __init__(self) -> None:
        super().__init__()
        self.api = RecordingApi()
        self.client = KubeClient(self.api)
        self.call_sites: set[tuple[str, int]] = set()
        self.ready_endpoints = ["10.0.0.7:8080"]

    def _replay(self, method: str, *args: Any, **kwargs: Any) -> None:
        caller = sys._getframe(2)
        self.call_sites.add((caller.f_code.co_filename, caller.f_lineno))
        getattr(self.client, method)(*args, **kwargs)

    def get(self, kind: ResourceKind, namespace: str, name: str) -> dict[str, Any] | None:
        self._replay("get", kind, namespace, name)
        return super().get(kind, namespace, name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._replay("create", copy.deepcopy(obj))
        return super().create(obj)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._replay("replace", copy.deepcopy(obj))
        return super().replace(obj)

    def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        self._replay("patch", kind, namespace, name, patch, subresource=subresource)
        return super().patch(kind, namespace, name, patch, subresource=subresource)

    def delete(self, kind: ResourceKind, namespace: str, name: str) -> None:
        self._replay("delete", kind, namespace, name)
        super().delete(kind, namespace, name)

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        self._replay("ready_pod_endpoints", namespace, selector)
        return list(self.ready_endpoints)

    def ready_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, float | None]:
        self._replay("ready_pods", namespace, selector)
        return dict.fromkeys(self.ready_endpoints)

    def accesses(self) -> set[Access]:
        return {access_of_request(method, path) for method, path in self.api.requests}


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T = 1_800_000_000.0


def example_isvc() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "resnet50-gpu.yaml").read_text())
    doc["metadata"].update(uid="isvc-uid", generation=1)
    doc["status"] = {}
    return dict(doc)


def overloaded(scope: Scope, *, ready_replicas: int | None) -> Observation:
    """Far more load than one replica at any batch size can carry: P99 9x the SLA, requests
    shed, the device saturated."""
    return Observation(
        at=T,
        window_s=60,
        p99_s=0.9,
        p95_s=0.6,
        qps=167,
        rejected_qps=5000,
        queue_p99_s=0.85,
        utilization=1.0,
        mean_batch=1.0,
        compute=(ComputePoint(1, 0.006, 10_000), ComputePoint(2, 0.008, 500)),
        ready_replicas=ready_replicas,
    )


def _autopilot(kube: RecordingKube) -> Autopilot:
    return Autopilot(
        kube,
        observe=overloaded,
        pods=kube,
        push=lambda endpoint, *, token, document: None,
        clock=lambda: NOW,
        seconds=lambda: T,
    )


def run_scenarios() -> RecordingKube:
    """Drive every path through which the operator calls the API."""
    kube = RecordingKube()
    body = example_isvc()
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    reconciler = Reconciler(
        kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: NOW
    )

    def reconcile() -> None:
        outcome = reconciler.reconcile(copy.deepcopy(body))
        body["status"] = {**body["status"], **outcome.status}

    reconcile()  # creates the children
    deployment = kube.objects[("Deployment", namespace, name)]
    deployment["status"] = {"readyReplicas": 1, "replicas": 1}

    autopilot = _autopilot(kube)  # overloaded: more replicas, bigger batches, pods told
    for _ in range(3):
        result = autopilot.tick(copy.deepcopy(body))
        body["status"] = {**body["status"], **result.status}
    reconcile()  # more than one replica: a PodDisruptionBudget

    for key, obj in list(kube.objects.items()):  # someone edits every child
        if key[0] != INFERENCESERVICE.kind:
            obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    reconcile()  # put back

    kube.objects[("Deployment", namespace, name)]["spec"]["replicas"] = 1
    reconcile()  # one replica again: the budget goes

    # Exposed through a Gateway, with a canary: the routes are created, edited back, and go when
    # the spec asks for an Ingress instead, which goes when spec.exposure does.
    gateway = {"gateway": {"name": "edge"}, "canary": {"service": "resnet50-v2", "weight": 10}}
    body["spec"]["exposure"] = gateway
    reconcile()
    for kind in ("HTTPRoute", "GRPCRoute"):
        kube.objects[(kind, namespace, name)]["spec"]["rules"] = []
    reconcile()
    body["spec"]["exposure"] = {"ingress": {"host": "resnet.example.com"}}
    reconcile()
    kube.objects[("Ingress", namespace, name)]["spec"]["rules"] = []
    reconcile()
    del body["spec"]["exposure"]
    reconcile()
    # A Gateway API without GRPCRoute: the HTTPRoute created in that pass is deleted again.
    kube.not_served.add("GRPCRoute")
    body["spec"]["exposure"] = gateway
    reconcile()
    assert ("HTTPRoute", namespace, name) not in kube.objects
    kube.not_served.clear()
    del body["spec"]["exposure"]

    # API keys with service-wide quotas: the keys Secret is read, the access document goes to
    # the ready pods' admin endpoints (their admin token read from the operator's Secret).
    keys = base64.b64encode(b"k" * 32).decode()
    kube.put_object({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "model-keys", "namespace": namespace},
        "data": {"storefront": keys},
    })  # fmt: skip
    body["spec"]["auth"] = {
        "apiKeys": {"secretName": "model-keys"},
        "quotas": {"default": {"requestsPerSecond": 10}},
    }
    keyed = Reconciler(
        kube,
        OperatorSettings(),
        learned_outside_s=learned_outside_s,
        clock=lambda: NOW,
        push_access=AccessPusher(kube, pods=kube, push=lambda endpoint, *, token, document: None),
    )
    body["status"] = {**body["status"], **keyed.reconcile(copy.deepcopy(body)).status}
    del body["spec"]["auth"]
    reconcile()

    # A replica joins the one serving: the serving one is asked to retire its connections, with
    # the admin token read from the operator's Secret.
    rebalancing = Reconciler(
        kube,
        OperatorSettings(),
        learned_outside_s=learned_outside_s,
        clock=lambda: NOW,
        rebalance=ConnectionRebalancer(
            kube, pods=kube, post=lambda endpoint, *, token, document: None
        ),
    )
    rebalancing.reconcile(copy.deepcopy(body))
    kube.ready_endpoints = ["10.0.0.7:8080", "10.0.0.8:8080"]
    rebalancing.reconcile(copy.deepcopy(body))

    # Prometheus does not answer: the pods' own metrics are read, at two ticks.
    blind = Autopilot(
        kube,
        observe=lambda scope, *, ready_replicas: None,
        pods=kube,
        push=lambda endpoint, *, token, document: None,
        clock=lambda: NOW,
        seconds=lambda: T,
        scrape=PodScraper(kube, fetch=lambda endpoint: []),
    )
    blind.prime(namespace, name)  # the first round of an outage: the service is read first
    for _ in range(2):
        blind.tick(copy.deepcopy(body))

    # An InferenceService whose status is not written yet (the operator restarted, say).
    kube.put_object({"kind": INFERENCESERVICE.kind, **copy.deepcopy(body), "status": {}})
    child = kube.get(DEPLOYMENT, namespace, name)
    handlers._on_child_event(  # a child changed: its owner is read, reconciled, its status patched
        event={"type": "MODIFIED", "object": child},
        memo=kopf.Memo(
            passes=Passes(kube),
            reconciler=Reconciler(
                kube, OperatorSettings(), learned_outside_s=learned_outside_s, clock=lambda: NOW
            ),
        ),
    )

    # Three replicas, one of them twice as slow as its peers for two minutes: its pod is read
    # back and deleted.
    kube.put_object({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{name}-7d9f8-slow1", "namespace": namespace,
                     "labels": {"batchpilot.io/inferenceservice": name}},
        "spec": {"nodeName": "gpu-3"},
    })  # fmt: skip
    clock = [T]

    def uneven(scope: Scope, *, ready_replicas: int | None) -> Observation:
        served = overloaded(scope, ready_replicas=ready_replicas)
        pods = [PodCompute(f"{name}-7d9f8-fast{i}", 1.0, 0.006, 3000) for i in range(2)]
        slow = PodCompute(f"{name}-7d9f8-slow1", 1.0, 0.012, 1500)
        return replace(served, at=clock[0], pods=(*pods, slow), recent_pods=(*pods, slow))

    kube.objects[("Deployment", namespace, name)]["status"] = {
        "readyReplicas": 3,
        "replicas": 3,
        "updatedReplicas": 3,
    }
    kube.objects[("Deployment", namespace, name)]["spec"]["replicas"] = 3
    replacing = Autopilot(
        kube,
        observe=uneven,
        pods=kube,
        push=lambda endpoint, *, token, document: None,
        clock=lambda: NOW,
        seconds=lambda: clock[0],
    )
    for _ in range(6):
        body["status"] = {**body["status"], **replacing.tick(copy.deepcopy(body)).status}
        clock[0] += 30
    assert ("Pod", namespace, f"{name}-7d9f8-slow1") not in kube.objects

    # Leader election: create the Lease, renew it, release it.
    settings = OperatorSettings()
    elector = LeaderElector(
        kube,
        Candidate("operator-a", settings.lease_name, settings.lease_namespace, 15),
        renew_deadline_s=settings.renew_deadline_seconds,
        retry_period_s=settings.retry_period_seconds,
    )
    assert elector.try_round()  # no Lease yet: created
    assert elector.try_round(leading=True)  # renewed
    assert elector.release()
    return kube


ENTRY_MODULES = ("batchpilot.operator.run", "batchpilot.operator.handlers")
"""What `batchpilot operator run` imports; the rest of the operator comes from their imports."""
CLIENT_MODULE = "batchpilot.operator.kube"
"""The client adapter: its own requests are what the scenarios record."""


def _imported(module_name: str, tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            # `from batchpilot.operator import conditions` names modules too.
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def operator_modules() -> dict[str, Path]:
    """The operator's modules that the operator process imports (statically, from the entry
    points, functions' local imports included), less the client adapter."""
    found: dict[str, Path] = {}
    todo = list(ENTRY_MODULES)
    while todo:
        name = todo.pop()
        if name in found or not name.startswith(OPERATOR_PACKAGE):
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # `from module import name`: a name, not a module
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin).resolve()
        found[name] = path
        todo.extend(_imported(name, ast.parse(path.read_text())))
    found.pop(CLIENT_MODULE, None)
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class CallSite:
    path: str
    first_line: int
    last_line: int
    text: str

    def hit_by(self, sites: set[tuple[str, int]]) -> bool:
        return any(
            path == self.path and self.first_line <= line <= self.last_line for path, line in sites
        )


def kube_call_sites() -> list[CallSite]:
    """Every call of a `Kube`/`Pods` method in the operator's code: `<...kube>.<method>(...)`
    or `<...pods>.<method>(...)` on the objects that hold the API client."""
    sites = []
    for module_path in operator_modules().values():
        path = str(module_path)
        tree = ast.parse(module_path.read_text())
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in KUBE_METHODS
            ):
                continue
            receiver = ast.unparse(node.func.value)
            if receiver.rsplit(".", 1)[-1].lstrip("_") in {"kube", "pods"}:
                sites.append(
                    CallSite(path, node.lineno, node.end_lineno or node.lineno, ast.unparse(node))
                )
    return sites


# ---- 1. and 2. kopf -----------------------------------------------------------------------------


def _startup_settings(monkeypatch: Any) -> kopf.OperatorSettings:
    """kopf's settings as the operator's startup handler(s) leave them."""
    monkeypatch.setattr(
        handlers.KubeClient, "from_environment", classmethod(lambda cls, **_: RecordingKube())
    )
    settings = kopf.OperatorSettings()
    for handler in kopf.get_default_registry()._activities.get_all_handlers():
        # The async ones start and stop the autopilot's loop: no settings, no API calls of
        # their own (its ticks are the `Kube` call sites below).
        if handler.fn.__module__.startswith(OPERATOR_PACKAGE) and not (
            inspect.iscoroutinefunction(handler.fn)
        ):
            handler.fn(settings=settings, memo=kopf.Memo())
    return settings


def _kopf_run_keywords() -> dict[str, str]:
    """The keyword arguments of the one `kopf.run(...)` or `kopf.operator(...)` call in run.py,
    as source text."""
    tree = ast.parse(inspect.getsource(operator_run))
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in {"kopf.run", "kopf.operator"}
    ]
    return {kw.arg: ast.unparse(kw.value) for kw in call.keywords if kw.arg}


def _resource_handlers() -> Iterator[tuple[str, Any]]:
    registry = kopf.get_default_registry()
    for kind, part in (
        ("watching", registry._watching),
        ("changing", registry._changing),
        ("spawning", registry._spawning),
        ("indexing", registry._indexing),
        ("webhooks", registry._webhooks),
    ):
        for handler in part.get_all_handlers():
            if handler.fn.__module__.startswith(OPERATOR_PACKAGE):  # not another test's
                yield kind, handler


def kopf_accesses(*, clusterwide: bool, monkeypatch: Any) -> set[Access]:
    settings = _startup_settings(monkeypatch)
    run_keywords = _kopf_run_keywords()
    assert run_keywords.get("standalone") == "True", (
        "kopf without standalone=True would need kopf's peering resources (kopf.dev "
        "kopfpeerings/clusterkopfpeerings) in the RBAC"
    )
    needed: set[Access] = set()
    posts_events = settings.posting.enabled
    for kind, handler in _resource_handlers():
        # An index (kopf's in-memory view from the same watch) needs what watching needs.
        assert kind in {"watching", "changing", "spawning", "indexing"}, (
            f"{kind} handlers need more RBAC"
        )
        selector = handler.selector
        group, plural = selector.group or "", selector.any_name
        assert re.fullmatch(r"[a-z0-9.-]+s", plural), f"not a plural: {plural}"
        needed |= {Access(group, plural, "list"), Access(group, plural, "watch")}
        source = inspect.getsource(handler.fn)
        posts_events = posts_events or "kopf.event(" in source
        if kind in {"changing", "spawning"}:
            # Progress and diff-base annotations, the finalizer.
            needed.add(Access(group, plural, "patch"))
            writes_status = "patch.status" in source or isinstance(
                settings.persistence.progress_storage,
                kopf.StatusProgressStorage | kopf.SmartProgressStorage,
            )
            if writes_status:
                needed.add(Access(group, f"{plural}/status", "patch"))
    if posts_events:
        needed.add(Access("", "events", "create"))
    if not settings.scanning.disabled:
        needed |= {
            Access("apiextensions.k8s.io", "customresourcedefinitions", "list"),
            Access("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        }
        if not clusterwide:
            needed |= {Access("", "namespaces", "list"), Access("", "namespaces", "watch")}
    return needed


def needed_accesses(*, clusterwide: bool, monkeypatch: Any) -> set[Access]:
    """Everything the operator needs, in the mode it runs in."""
    return kopf_accesses(clusterwide=clusterwide, monkeypatch=monkeypatch) | (
        run_scenarios().accesses()
    )


def rules_to_accesses(rules: list[dict[str, Any]]) -> set[Access]:
    granted = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    granted.add(Access(group, resource, verb))
    return granted


def table(accesses: set[Access]) -> str:
    """The accesses as a table, a row per resource (for failure messages and reports)."""
    rows: dict[tuple[str, str], list[str]] = {}
    for access in sorted(accesses):
        rows.setdefault((access.group or '""', access.resource), []).append(access.verb)
    return "\n".join(f"{g:<24} {r:<32} {', '.join(v)}" for (g, r), v in sorted(rows.items()))
