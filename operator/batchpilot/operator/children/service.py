"""The Service in front of the runtime pods (REST on port 80, gRPC on 8081, metrics on 8083
for a ServiceMonitor), and the addresses clients use. The pods' admin port is not on it: callers
of the model have no route to the endpoint that changes batch settings."""

from __future__ import annotations

from typing import Any

from batchpilot.operator.children.common import Owner

SERVICE_PORT = 80
GRPC_SERVICE_PORT = 8081
METRICS_SERVICE_PORT = 8083


def build_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(owner.name),
        "spec": {
            "type": "ClusterIP",
            "selector": owner.selector,
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "grpc",
                    "port": GRPC_SERVICE_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {
                    "name": "metrics",
                    "port": METRICS_SERVICE_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def service_url(owner: Owner) -> str:
    """The in-cluster v2 endpoint of the model."""
    return f"http://{owner.name}.{owner.namespace}.svc/v2/models/{owner.model_name}"


def grpc_address(owner: Owner) -> str:
    """The in-cluster address of the v2 gRPC service (inference.GRPCInferenceService)."""
    return f"{owner.name}.{owner.namespace}.svc:{GRPC_SERVICE_PORT}"
