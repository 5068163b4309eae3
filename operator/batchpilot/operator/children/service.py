"""The Service in front of the runtime pods, and the URL clients use."""

from __future__ import annotations

from typing import Any

from batchpilot.operator.children.common import Owner

SERVICE_PORT = 80


def build_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(owner.name),
        "spec": {
            "type": "ClusterIP",
            "selector": owner.selector,
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def service_url(owner: Owner) -> str:
    """The in-cluster v2 endpoint of the model."""
    return f"http://{owner.name}.{owner.namespace}.svc/v2/models/{owner.model_name}"
