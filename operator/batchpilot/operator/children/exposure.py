"""The way in from outside the cluster (`spec.exposure`): a Gateway API HTTPRoute and GRPCRoute
attached to a named Gateway, or an Ingress where the cluster has no Gateway API.

Each reaches the model only through the Service's inference ports — the HTTPRoute and the
Ingress its HTTP port, the GRPCRoute its gRPC port — never metrics (the admin port is not on the
Service at all). A canary (`exposure.canary`: another InferenceService of the namespace, a new
model version) shares each route by weight: two backendRefs, weights 100 - w and w. An Ingress
has no portable weights, so the spec refuses a canary with one (see `exposure_spec`).

Request timeouts follow the SLA: twice the P99 latency, and at least a second more than it —
never shorter than the SLA, so that the gateway cuts off only requests that are lost anyway (the
runtime refuses at arrival, with a 503, a request predicted to miss its deadline). The HTTPRoute
carries it as `timeouts.request` (Gateway API 1.2 standard channel; extended support, so an
implementation without it says so in the route's status); the Ingress as ingress-nginx's
`proxy-read-timeout` and `proxy-send-timeout` annotations, in whole seconds, which other Ingress
controllers ignore. GRPCRoute has no timeout field: gRPC clients send their deadline.

`exposure_status` says what is in force, for `status.exposure` (`kubectl describe`).
"""

from __future__ import annotations

import math
from typing import Any

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.service import GRPC_SERVICE_PORT, SERVICE_PORT
from batchpilot.operator.exposure_spec import GatewayExposure, IngressExposure

GATEWAY_API = "gateway.networking.k8s.io/v1"
TIMEOUT_MARGIN_MS = 1000
"""The least a route's timeout exceeds the SLA by."""
NGINX_READ_TIMEOUT = "nginx.ingress.kubernetes.io/proxy-read-timeout"
NGINX_SEND_TIMEOUT = "nginx.ingress.kubernetes.io/proxy-send-timeout"
_UNITS_MS = (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def request_timeout_ms(sla_ms: int) -> int:
    """The route's request timeout: twice the SLA, and at least the margin more than it."""
    return sla_ms + max(sla_ms, TIMEOUT_MARGIN_MS)


def gateway_duration(ms: int) -> str:
    """`ms` as a Gateway API Duration (GEP-2257): up to four whole numbers with units h, m, s
    and ms, largest first (1500 → "1s500ms", 1_200_000 → "20m")."""
    if ms <= 0:
        return "0s"
    parts = []
    for unit, size in _UNITS_MS:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def backends(owner: Owner) -> list[tuple[str, int]]:
    """(Service, weight) of each backend: this InferenceService's, and the canary's if any."""
    exposure = owner.spec.exposure
    canary = exposure.canary if exposure is not None else None
    if canary is None:
        return [(owner.name, 100)]
    return [(owner.name, 100 - canary.weight), (canary.service, canary.weight)]


def _backend_refs(owner: Owner, port: int) -> list[dict[str, Any]]:
    return [
        {"group": "", "kind": "Service", "name": name, "port": port, "weight": weight}
        for name, weight in backends(owner)
    ]


def _parent_ref(gateway: GatewayExposure) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": gateway.name,
    }
    if gateway.namespace is not None:
        ref["namespace"] = gateway.namespace
    if gateway.section_name is not None:
        ref["sectionName"] = gateway.section_name
    return ref


def _gateway(owner: Owner) -> GatewayExposure | None:
    exposure = owner.spec.exposure
    return exposure.gateway if exposure is not None else None


def _ingress(owner: Owner) -> IngressExposure | None:
    exposure = owner.spec.exposure
    return exposure.ingress if exposure is not None else None


def _route_spec(gateway: GatewayExposure, rule: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRefs": [_parent_ref(gateway)]}
    if gateway.hostnames:
        spec["hostnames"] = list(gateway.hostnames)
    spec["rules"] = [rule]
    return spec


def build_http_route(owner: Owner) -> dict[str, Any] | None:
    """The HTTPRoute to the Service's HTTP port; None unless exposed through a Gateway."""
    gateway = _gateway(owner)
    if gateway is None:
        return None
    timeout = gateway_duration(request_timeout_ms(owner.spec.sla.latency_p99_ms))
    rule = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": _backend_refs(owner, SERVICE_PORT),
        "timeouts": {"request": timeout},
    }
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": owner.metadata(owner.name),
        "spec": _route_spec(gateway, rule),
    }


def build_grpc_route(owner: Owner) -> dict[str, Any] | None:
    """The GRPCRoute to the Service's gRPC port; None unless exposed through a Gateway (with
    `grpc`)."""
    gateway = _gateway(owner)
    if gateway is None or not gateway.grpc:
        return None
    return {
        "apiVersion": GATEWAY_API,
        "kind": "GRPCRoute",
        "metadata": owner.metadata(owner.name),
        "spec": _route_spec(gateway, {"backendRefs": _backend_refs(owner, GRPC_SERVICE_PORT)}),
    }


def ingress_annotations(owner: Owner) -> dict[str, str]:
    """ingress-nginx's timeouts, in whole seconds rounded up (never below the SLA)."""
    seconds = str(math.ceil(request_timeout_ms(owner.spec.sla.latency_p99_ms) / 1000))
    return {NGINX_READ_TIMEOUT: seconds, NGINX_SEND_TIMEOUT: seconds}


def build_ingress(owner: Owner) -> dict[str, Any] | None:
    """The Ingress to the Service's HTTP port; None unless exposed through an Ingress."""
    ingress = _ingress(owner)
    if ingress is None:
        return None
    metadata = owner.metadata(owner.name)
    metadata["annotations"] = ingress_annotations(owner)
    spec: dict[str, Any] = {}
    if ingress.class_name is not None:
        spec["ingressClassName"] = ingress.class_name
    if ingress.tls_secret_name is not None:
        spec["tls"] = [{"hosts": [ingress.host], "secretName": ingress.tls_secret_name}]
    spec["rules"] = [
        {
            "host": ingress.host,
            "http": {
                "paths": [
                    {
                        "path": ingress.path,
                        "pathType": "Prefix",
                        "backend": {"service": {"name": owner.name, "port": {"name": "http"}}},
                    }
                ]
            },
        }
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": metadata,
        "spec": spec,
    }


def _weights_text(owner: Owner) -> str:
    pairs = backends(owner)
    if len(pairs) == 1:
        return pairs[0][0]
    return ", ".join(f"{weight}% {name}" for name, weight in pairs)


def exposure_status(owner: Owner) -> dict[str, Any] | None:
    """`status.exposure`: the way in that the spec puts in force; None when not exposed."""
    gateway, ingress = _gateway(owner), _ingress(owner)
    weights = [{"service": name, "weight": weight} for name, weight in backends(owner)]
    if gateway is not None:
        where = f"{gateway.namespace or owner.namespace}/{gateway.name}"
        if gateway.section_name is not None:
            where += f" listener {gateway.section_name}"
        hosts = list(gateway.hostnames or [])
        routes = [f"HTTPRoute {owner.name}"] + ([f"GRPCRoute {owner.name}"] if gateway.grpc else [])
        return {
            "via": "Gateway API",
            "gateway": where,
            "routes": routes,
            "hostnames": hosts,
            "backends": weights,
            "requestTimeout": gateway_duration(request_timeout_ms(owner.spec.sla.latency_p99_ms)),
            "text": f"{', '.join(hosts) or 'every host'} via gateway {where}: "
            f"{_weights_text(owner)}",
        }
    if ingress is not None:
        scheme = "https" if ingress.tls_secret_name is not None else "http"
        return {
            "via": "Ingress",
            "routes": [f"Ingress {owner.name}"],
            "hostnames": [ingress.host],
            "backends": weights,
            "requestTimeout": f"{ingress_annotations(owner)[NGINX_READ_TIMEOUT]}s",
            "text": f"{scheme}://{ingress.host}{ingress.path} via Ingress "
            f"{ingress.class_name or '(default class)'}: {owner.name}",
        }
    return None


def not_served_message(kind: str) -> str:
    """Why the exposure is not applied when the API server does not serve `kind`."""
    if kind == "HTTPRoute":
        return (
            "the cluster has no Gateway API (HTTPRoute, gateway.networking.k8s.io/v1); install "
            "its CRDs or use spec.exposure.ingress. Nothing of spec.exposure was applied"
        )
    if kind == "GRPCRoute":
        return (
            "the cluster's Gateway API has no GRPCRoute (gateway.networking.k8s.io/v1, Gateway "
            "API 1.1 or later); upgrade it, or set spec.exposure.gateway.grpc to false. Nothing "
            "of spec.exposure was applied"
        )
    return f"the cluster does not serve {kind}; nothing of spec.exposure was applied"
