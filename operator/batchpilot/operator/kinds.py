"""Where each kind the operator touches lives in the REST API. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from batchpilot.operator.spec import GROUP, PLURAL, VERSION


@dataclass(frozen=True, slots=True)
class Kind:
    """Where a kind lives in the REST API."""

    kind: str
    group_version: str
    plural: str

    def collection(self, namespace: str) -> str:
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


DEPLOYMENT = Kind("Deployment", "apps/v1", "deployments")
SERVICE = Kind("Service", "v1", "services")
CONFIGMAP = Kind("ConfigMap", "v1", "configmaps")
SECRET = Kind("Secret", "v1", "secrets")
PDB = Kind("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets")
POD = Kind("Pod", "v1", "pods")
INFERENCESERVICE = Kind("InferenceService", f"{GROUP}/{VERSION}", PLURAL)
KINDS = {k.kind: k for k in (DEPLOYMENT, SERVICE, CONFIGMAP, SECRET, PDB, POD, INFERENCESERVICE)}
