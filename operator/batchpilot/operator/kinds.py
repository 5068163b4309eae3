"""Where each kind the operator touches lives in the REST API. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from batchpilot.operator.spec import GROUP, PLURAL, VERSION


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """Where a kind lives in the REST API."""

    kind: str
    group_version: str
    plural: str

    def collection(self, namespace: str | None) -> str:
        """The kind's objects in `namespace`; None: in every namespace (a list's path only)."""
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if namespace is None:
            return f"{prefix}/{self.plural}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


DEPLOYMENT = ResourceKind("Deployment", "apps/v1", "deployments")
SERVICE = ResourceKind("Service", "v1", "services")
CONFIGMAP = ResourceKind("ConfigMap", "v1", "configmaps")
SECRET = ResourceKind("Secret", "v1", "secrets")
PDB = ResourceKind("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets")
NETWORK_POLICY = ResourceKind("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies")
HTTP_ROUTE = ResourceKind("HTTPRoute", "gateway.networking.k8s.io/v1", "httproutes")
GRPC_ROUTE = ResourceKind("GRPCRoute", "gateway.networking.k8s.io/v1", "grpcroutes")
"""The Gateway API's routes (standard channel, v1): served only where its CRDs are installed."""
INGRESS = ResourceKind("Ingress", "networking.k8s.io/v1", "ingresses")
POD = ResourceKind("Pod", "v1", "pods")
INFERENCESERVICE = ResourceKind("InferenceService", f"{GROUP}/{VERSION}", PLURAL)
LEASE = ResourceKind("Lease", "coordination.k8s.io/v1", "leases")
"""The operator's own leader-election lock (leadership.py), in its own namespace."""
KINDS = {
    k.kind: k
    for k in (
        DEPLOYMENT,
        SERVICE,
        CONFIGMAP,
        SECRET,
        PDB,
        NETWORK_POLICY,
        HTTP_ROUTE,
        GRPC_ROUTE,
        INGRESS,
        POD,
        INFERENCESERVICE,
        LEASE,
    )
}
