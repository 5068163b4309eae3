"""Server-side defaults of the built-in kinds an operator creates, as kube-apiserver sets them.

A real server fills in what a manifest leaves out — a Deployment's strategy and revision
history, its pods' restartPolicy and dnsPolicy, each container's imagePullPolicy and
termination-message fields, a Service's clusterIP and port protocols, a Secret's `type` (and
turns `stringData` into base64 `data`). An operator that compares its desired object with the
live one must expect these, or it rewrites the object on every pass. The sandbox applies the
same defaults on every write, so that mistake shows up here and not first in a cluster; and,
as on a real server, a write whose defaulted result equals what is stored changes nothing.

Covered: Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs (pod templates), Pods,
Services, Secrets, PodDisruptionBudgets need none. Not covered: the rest of the defaults of
other kinds and fields (probes' handlers beyond HTTP, ephemeral containers, ...).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Mapping
from typing import Any

from batchpilot.sandbox.resources import ResourceType

_PROBE_DEFAULTS = {
    "timeoutSeconds": 1,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
}


def _image_pull_policy(image: Any) -> str:
    name = str(image or "")
    if "@" in name:
        return "IfNotPresent"
    last = name.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _probe(probe: dict[str, Any]) -> None:
    for key, value in _PROBE_DEFAULTS.items():
        probe.setdefault(key, value)
    if isinstance(probe.get("httpGet"), dict):
        probe["httpGet"].setdefault("scheme", "HTTP")


def _container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("imagePullPolicy", _image_pull_policy(container.get("image")))
    container.setdefault("resources", {})
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    for env in container.get("env") or []:
        field_ref = (env.get("valueFrom") or {}).get("fieldRef") if isinstance(env, dict) else None
        if isinstance(field_ref, dict):
            field_ref.setdefault("apiVersion", "v1")
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        if isinstance(container.get(key), dict):
            _probe(container[key])


def pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                _container(container)
    for volume in spec.get("volumes") or []:
        if not isinstance(volume, dict):
            continue
        for source in ("configMap", "secret"):
            if isinstance(volume.get(source), dict):
                volume[source].setdefault("defaultMode", 420)


def _template(obj: dict[str, Any]) -> None:
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        pod_spec(template["spec"])


def _deployment(obj: dict[str, Any], _: Mapping[str, Any] | None) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", "25%")
        rolling.setdefault("maxSurge", "25%")
    _template(obj)


def _replicaset(obj: dict[str, Any], _: Mapping[str, Any] | None) -> None:
    obj.setdefault("spec", {}).setdefault("replicas", 1)
    _template(obj)


def _statefulset(obj: dict[str, Any], _: Mapping[str, Any] | None) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
    if strategy.get("type") == "RollingUpdate":
        strategy.setdefault("rollingUpdate", {"partition": 0})
    _template(obj)


def _pod_template_only(obj: dict[str, Any], _: Mapping[str, Any] | None) -> None:
    _template(obj)


def _pod(obj: dict[str, Any], _: Mapping[str, Any] | None) -> None:
    pod_spec(obj.setdefault("spec", {}))


def _service(obj: dict[str, Any], old: Mapping[str, Any] | None) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        old_spec = (old or {}).get("spec") or {}
        if not spec.get("clusterIP") and old_spec.get("clusterIP"):
            spec["clusterIP"] = old_spec["clusterIP"]  # as the server keeps an allocated IP
            spec.setdefault("clusterIPs", copy.deepcopy(old_spec.get("clusterIPs")))
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            if "port" in port:
                port.setdefault("targetPort", port["port"])


def _secret(obj: dict[str, Any], _: Mapping[str, Any] | None) -> None:
    obj.setdefault("type", "Opaque")
    string_data = obj.pop("stringData", None)
    if isinstance(string_data, Mapping):
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


_DEFAULTERS: dict[tuple[str, str], Callable[[dict[str, Any], Mapping[str, Any] | None], None]] = {
    ("apps", "deployments"): _deployment,
    ("apps", "replicasets"): _replicaset,
    ("apps", "statefulsets"): _statefulset,
    ("apps", "daemonsets"): _pod_template_only,
    ("batch", "jobs"): _pod_template_only,
    ("", "pods"): _pod,
    ("", "services"): _service,
    ("", "secrets"): _secret,
}


def apply(rt: ResourceType, obj: dict[str, Any], old: Mapping[str, Any] | None = None) -> None:
    """Default a built-in object in place (`old`: the stored object, on updates)."""
    defaulter = _DEFAULTERS.get((rt.group, rt.plural))
    if defaulter is not None and not rt.custom:
        defaulter(obj, old)


class ClusterIPs:
    """Hands out Service IPs from 10.96.0.0/12, as the API server's allocator does."""

    def __init__(self) -> None:
        self._next = 10

    def allocate(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("type") == "ExternalName":
            return
        if spec.get("clusterIP") in (None, ""):
            number = self._next
            self._next += 1
            spec["clusterIP"] = f"10.96.{number // 256 % 256}.{number % 256}"
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
