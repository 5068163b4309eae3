"""The sandbox's API store with the project's CRD installed: where the tests of each spec field
check what the CRD's schema and CEL rules refuse, and with which message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock

from batchpilot.sandbox.crds import load_documents
from batchpilot.sandbox.store import Store, new_store

CRDS = Path(__file__).resolve().parents[2] / "crds" / "inferenceservice.yaml"


def crd_store(namespace: str) -> Store:
    created = new_store(kmock.ObjectsArray(), seed=3)
    for crd in load_documents([CRDS]):
        created.install_crd(crd)
    created.ensure_namespace(namespace)
    return created


def create_isvc(
    store: Store, namespace: str, spec: dict[str, Any], *, name: str = "m"
) -> dict[str, Any]:
    """An InferenceService for a model file with a 100 ms SLA and `spec`'s fields besides,
    created with strict field validation."""
    rt = store.registry.get("batchpilot.io", "v1alpha1", "inferenceservices")
    assert rt is not None
    body = {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, **spec},
    }
    created, _ = store.create(rt, namespace, body, field_validation="Strict")
    return created
