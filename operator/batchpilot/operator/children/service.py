"""The Service in front of the runtime pods (REST on port 80, gRPC on 8081), and the
addresses clients use."""

from __future__ import annotations

from typing import Any

from batchpilot.operator.children.common import Owner

SERVICE_PORT = 80
GRPC_SERVICE_PORT = 8081


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
            ],
        },
    }


def service_url(owner: Owner) -> str:
    """The in-cluster v2 endpoint of the model."""
    return f"http://{owner.name}.{owner.namespace}.svc/v2/models/{owner.model_name}"


def grpc_address(owner: Owner) -> str:
    """The in-cluster address of the v2 gRPC service (inference.GRPCInferenceService)."""
    return f"{owner.name}.{owner.namespace}.svc:{GRPC_SERVICE_PORT}"
