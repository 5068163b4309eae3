"""The project's own CRD (crds/inferenceservice.yaml) in the sandbox: it installs, the shipped
examples pass it, and bad specs are refused with readable messages. Skipped until it exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from batchpilot.sandbox import errors
from batchpilot.sandbox.crds import load_documents
from batchpilot.sandbox.store import Store, new_store

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "inferenceservice.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

pytestmark = pytest.mark.skipif(not CRD.exists(), reason="crds/inferenceservice.yaml not there yet")


@pytest.fixture
def store() -> Store:
    created = new_store(kmock.ObjectsArray(), seed=3)
    for crd in load_documents([CRD]):
        created.install_crd(crd)
    return created


def inference_services() -> list[dict[str, Any]]:
    found = []
    for path in EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "InferenceService":
                found.append(document)
    return found


def test_the_crd_is_served(store: Store) -> None:
    served = store.registry.get("batchpilot.io", "v1alpha1", "inferenceservices")
    assert served is not None
    assert served.status
    assert served.scale is not None


@pytest.mark.parametrize("example", inference_services(), ids=lambda doc: doc["metadata"]["name"])
def test_the_examples_are_accepted(store: Store, example: dict[str, Any]) -> None:
    rt = store.registry.get("batchpilot.io", "v1alpha1", "inferenceservices")
    assert rt is not None
    namespace = example["metadata"].get("namespace", "default")
    store.ensure_namespace(namespace)
    created, warnings = store.create(rt, namespace, example, field_validation="Strict")
    assert warnings == ()
    assert created["metadata"]["generation"] == 1


def test_a_bad_spec_is_refused_with_a_readable_message(store: Store) -> None:
    rt = store.registry.get("batchpilot.io", "v1alpha1", "inferenceservices")
    assert rt is not None
    bad = {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "bad"},
        "spec": {
            "model": {"uri": "file:///m.onnx"},
            "sla": {"latencyP99Ms": 100},
            "scaling": {"maxReplicas": 0},
        },
    }
    with pytest.raises(errors.ApiError) as caught:
        store.create(rt, "default", bad)
    assert caught.value.code == 422
    assert (
        "spec.scaling.maxReplicas: Invalid value: 0: spec.scaling.maxReplicas in body should be"
        " greater than or equal to 1"
    ) in caught.value.message
