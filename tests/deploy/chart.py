"""Renders the Helm chart with the real helm binary, and reads YAML the way the API server would.

helm comes from `make install` (.venv/bin/helm, fetched by hack/fetch-helm.sh); without it these
tests fail and say so, rather than skip: a skipped chart test would hide a broken install step.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "batchpilot"
RELEASE = "batchpilot"
NAMESPACE = "batchpilot-system"
KUBE_VERSIONS = ("1.29.0", "1.37.0")
"""The oldest Kubernetes the chart supports (CEL in the CRD) and the newest kubernetes-validate
has schemas for."""

Doc = dict[str, Any]


def helm_binary() -> str:
    beside_python = Path(sys.prefix) / "bin" / "helm"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("helm")
    if found is None:
        pytest.fail("helm is missing: run `make install` (hack/fetch-helm.sh puts it in .venv/bin)")
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, check=False, timeout=60
    )


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, as the API server's strict decoding does."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_all(text: str) -> list[Doc]:
    return [doc for doc in yaml.load_all(text, Loader=StrictLoader) if doc]


def load(path: Path) -> Doc:
    (doc,) = load_all(path.read_text())
    return doc


@functools.cache
def _render(values_json: str, kube_version: str, include_crds: bool) -> tuple[Doc, ...]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        json.dump(json.loads(values_json), values_file)
        values_file.flush()
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        args += ["--kube-version", kube_version, "--values", values_file.name]
        if include_crds:
            args.append("--include-crds")
        result = run_helm(*args)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return tuple(load_all(result.stdout))


class RenderError(Exception):
    """helm template refused the values."""


def render(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str = KUBE_VERSIONS[0],
    include_crds: bool = False,
) -> list[Doc]:
    docs = _render(json.dumps(values or {}, sort_keys=True), kube_version, include_crds)
    return json.loads(json.dumps(docs))  # a private copy: tests may change what they get


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def operator_deployment(docs: list[Doc]) -> Doc:
    return one(docs, "Deployment", f"{RELEASE}-operator")


# Non-default values that exercise every branch of the templates.
NAMESPACED: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "prometheus": {"url": "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"},
    "runtime": {
        "images": {
            "cpu": "registry.example.com/batchpilot/runtime:0.1.0",
            "gpu": "registry.example.com/batchpilot/runtime-gpu@sha256:" + "a" * 64,
            "torch": "registry.example.com/batchpilot/runtime-torch:0.1.0",
        },
        "imagePullPolicy": "Always",
        "imagePullSecrets": [{"name": "mirror"}, {"name": "mirror-2"}],
        "port": 9000,
        "storageInitializerImage": "kserve/storage-initializer:v0.14.1",
        "drainGraceSeconds": 40,
        "preStopSleepSeconds": 3,
        "nodeLossTolerationSeconds": 60,
        "rolloutInPlaceAfterSeconds": 300,
        "rolloutInPlaceMaxServices": 5,
    },
    "gpu": {
        "resource": "nvidia.com/mig-1g.10gb",
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A10"},
        "tolerations": [
            {"key": "gpu", "operator": "Equal", "value": "a10", "effect": "NoSchedule"}
        ],
        "utilizationSource": "dcgm",
    },
    "autopilot": {"intervalSeconds": 7.5, "metricsWindowSeconds": 120, "podMetricsFallback": False},
    "reconcileIntervalSeconds": 30,
    "operator": {
        "replicas": 3,
        "leaderElection": {
            "enabled": True,
            "leaseDurationSeconds": 30,
            "renewDeadlineSeconds": 20,
            "retryPeriodSeconds": 4,
        },
        "image": {
            "repository": "registry.example.com/batchpilot/operator",
            "digest": "sha256:" + "b" * 64,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "registry"}],
        "verbose": True,
        "healthPort": 9081,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "infra", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/team": "ml-platform"},
        "podLabels": {"team": "ml-platform"},
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
    "serviceAccount": {"annotations": {"example.com/role": "batchpilot"}},
    "monitoring": {
        "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
    },
    "networkPolicy": {"enabled": True, "apiServer": {"cidrs": ["10.96.0.1/32"], "ports": [443]}},
}
CLUSTERWIDE_MONITORED: dict[str, Any] = {
    "gpu": {"utilizationSource": "nvml"},
    "monitoring": {"serviceMonitor": {"enabled": True, "namespace": "monitoring"}},
    "networkPolicy": {"enabled": True},
}
BRING_YOUR_OWN_ACCOUNT: dict[str, Any] = {
    "rbac": {"create": False},
    "serviceAccount": {"create": False, "name": "batchpilot-operator"},
    "operator": {"image": {"tag": "0.1.1"}},
}
SINGLE_OPERATOR: dict[str, Any] = {
    "operator": {"replicas": 1, "leaderElection": {"enabled": False}},
}
"""One operator pod and no leader election: the chart before high availability."""
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": NAMESPACED,
    "clusterwide-monitored": CLUSTERWIDE_MONITORED,
    "bring-your-own-account": BRING_YOUR_OWN_ACCOUNT,
    "single-operator": SINGLE_OPERATOR,
}
DOWNWARD_API = {
    "metadata.name": f"{RELEASE}-operator-6f9c8d7b5-x2k4q",
    "metadata.namespace": NAMESPACE,
}
"""What the kubelet fills in for the operator pod's fieldRef variables."""


def leader_election_role(docs: list[Doc]) -> Doc | None:
    found = find(docs, "Role", f"{RELEASE}-operator-leader-election")
    return found[0] if found else None
