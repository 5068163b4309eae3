"""Names and labels shared by every child of an InferenceService."""

from __future__ import annotations

from dataclasses import dataclass

from batchpilot.operator.spec import API_VERSION, KIND, InferenceServiceSpec

MANAGED_BY = "batchpilot"
ISVC_LABEL = "batchpilot.io/inferenceservice"
BATCHING_FILE = "batching.json"
BATCHING_DIR = "/etc/batchpilot/batching"
PIPELINE_FILE = "pipeline.json"
"""The pipeline document (spec.pipeline), in the same ConfigMap as the batch settings."""
ACCESS_FILE = "access.json"
"""The access document (spec.auth: allowed key ids, quotas), in the same ConfigMap: live."""
TOKEN_FILE = "admin-token"
TOKEN_DIR = "/var/run/secrets/batchpilot"


@dataclass(frozen=True, slots=True)
class Owner:
    """The InferenceService a child belongs to."""

    name: str
    namespace: str
    uid: str
    spec: InferenceServiceSpec

    @property
    def model_name(self) -> str:
        return self.spec.model.name or self.name

    @property
    def selector(self) -> dict[str, str]:
        return {ISVC_LABEL: self.name}

    @property
    def labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "batchpilot-runtime",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            ISVC_LABEL: self.name,
        }

    @property
    def configmap_name(self) -> str:
        return f"{self.name}-batching"

    @property
    def secret_name(self) -> str:
        return f"{self.name}-admin-token"

    @property
    def owner_reference(self) -> dict[str, object]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str) -> dict[str, object]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": dict(self.labels),
            "ownerReferences": [self.owner_reference],
        }


def owned_by(child: dict[str, object], uid: str) -> bool:
    """Whether `child` is controlled by the owner with `uid`."""
    metadata = child.get("metadata")
    refs = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    return any(
        isinstance(ref, dict) and ref.get("uid") == uid and ref.get("controller")
        for ref in refs or []
    )
