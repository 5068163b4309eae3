"""The NetworkPolicy: who may reach an InferenceService's pods, and on which port.

Each port has one audience. The model's callers (`spec.access.allowFrom`; by default the pods of
the InferenceService's own namespace) reach the HTTP and gRPC ports; the operator's pods alone
reach the admin port, where batch settings change; the service's own pods reach the HTTP port (a
replica passes the fetch of an async result on to the replica holding it); Prometheus alone (the
operator's `prometheus_peers`) reaches the metrics port. A policy with `Ingress` in its policyTypes
admits nothing it does not list, so everything else is refused — in clusters whose network plugin
enforces NetworkPolicies. An empty list of peers admits no one: a rule with no `from` would admit
everyone, so such a rule is left out rather than written empty.

`access_status` is the same rules in words, for `status.access` (what `kubectl describe` shows).
"""

from __future__ import annotations

from typing import Any

from batchpilot.operator.access_spec import AccessPeer, LabelSelector
from batchpilot.operator.children.common import Owner
from batchpilot.operator.settings import OperatorSettings

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by Kubernetes on every namespace (1.21+): selects a namespace by its name."""


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"port": port, "protocol": "TCP"} for port in ports]


def peer_document(peer: AccessPeer) -> dict[str, Any]:
    """The peer as the API server stores it: empty maps and lists left out (matchLabels,
    matchExpressions, an expression's values; they select the same), so the stored policy
    compares equal to the rendered one."""
    document: dict[str, Any] = {}
    for field, selector in (
        ("namespaceSelector", peer.namespace_selector),
        ("podSelector", peer.pod_selector),
    ):
        if selector is not None:
            document[field] = _compact(selector.dump())
    return document


def _compact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items() if v != {} and v != []}
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


def operator_peer(settings: OperatorSettings) -> dict[str, Any]:
    """The operator's pods, in the operator's namespace."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.operator_namespace}},
        "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
    }


def build_network_policy(owner: Owner, settings: OperatorSettings) -> dict[str, Any]:
    rules = [
        (
            [peer_document(peer) for peer in owner.spec.access.peers],
            _tcp(settings.runtime_port, settings.runtime_grpc_port),
        ),
        # The replicas pass fetches of async results on to the one holding the job.
        ([{"podSelector": {"matchLabels": dict(owner.selector)}}], _tcp(settings.runtime_port)),
        ([operator_peer(settings)], _tcp(settings.runtime_admin_port)),
        ([dict(peer) for peer in settings.prometheus_peers], _tcp(settings.runtime_metrics_port)),
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owner.metadata(owner.name),
        "spec": {
            "podSelector": {"matchLabels": owner.selector},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": ports} for peers, ports in rules if peers],
        },
    }


def describe_selector(selector: dict[str, Any] | LabelSelector | None) -> str:
    """A label selector in `kubectl get -l` syntax; `*` for one that selects everything."""
    if isinstance(selector, LabelSelector):
        selector = selector.dump()
    parts = [f"{key}={value}" for key, value in (selector or {}).get("matchLabels", {}).items()]
    for requirement in (selector or {}).get("matchExpressions", []):
        key, operator, values = (
            requirement["key"],
            requirement["operator"],
            requirement.get("values", []),
        )
        if operator == "Exists":
            parts.append(key)
        elif operator == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            parts.append(f"{key} {operator.lower()} ({','.join(values)})")
    return ",".join(parts) or "*"


def describe_peer(peer: dict[str, Any] | AccessPeer, *, namespace: str) -> str:
    """One NetworkPolicyPeer in words: `pods app=web in namespace team-a`."""
    if isinstance(peer, AccessPeer):
        peer = peer.dump()
    pods = peer.get("podSelector")
    namespaces = peer.get("namespaceSelector")
    who = "pods" if pods is None or _selects_all(pods) else f"pods {describe_selector(pods)}"
    if namespaces is None:
        return f"{who} in namespace {namespace}"
    if _selects_all(namespaces):
        return f"{who} in every namespace"
    return f"{who} in namespaces {describe_selector(namespaces)}"


def _selects_all(selector: dict[str, Any]) -> bool:
    return not selector.get("matchLabels") and not selector.get("matchExpressions")


def access_status(owner: Owner, settings: OperatorSettings) -> dict[str, Any]:
    """`status.access`: the rules the NetworkPolicy puts in force, in words."""
    peers = owner.spec.access.peers
    inference = [describe_peer(peer, namespace=owner.namespace) for peer in peers]
    metrics = [describe_peer(peer, namespace=owner.namespace) for peer in settings.prometheus_peers]
    if owner.spec.access.allow_from is None:
        text = "this namespace"
    elif not peers:
        text = "no one"
    else:
        text = "; ".join(inference)
    return {
        "networkPolicy": owner.name,
        "inference": {
            "ports": [settings.runtime_port, settings.runtime_grpc_port],
            "from": inference or ["no one"],
        },
        "admin": {
            "ports": [settings.runtime_admin_port],
            "from": [describe_peer(operator_peer(settings), namespace=owner.namespace)],
        },
        "metrics": {"ports": [settings.runtime_metrics_port], "from": metrics or ["no one"]},
        "text": text,
    }
