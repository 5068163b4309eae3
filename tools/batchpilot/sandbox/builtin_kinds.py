"""The built-in kinds the sandbox serves, with the names and subresources kubectl expects.

Enough of Kubernetes for the operator's children (Deployments, Services, ConfigMaps, Secrets,
PodDisruptionBudgets), kopf's machinery (Namespaces, Events, CRDs, Leases), kubectl's short
names and the `all` category, and a Helm chart's RBAC objects. Objects of built-in kinds are
stored as sent: the real server's defaulting and validation of built-in kinds are not
reproduced (only object metadata is checked), and no controllers run — a Deployment's status
stays empty unless a test writes it.
"""

from __future__ import annotations

from batchpilot.sandbox.resources import ResourceType, ScaleSpec

_WORKLOAD_SCALE = ScaleSpec(selector_from_spec=True)


def _rt(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    status: bool = False,
    scale: ScaleSpec | None = None,
    generation: bool = False,
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        singular=kind.lower(),
        short_names=short,
        categories=categories,
        status=status,
        scale=scale,
        generation=generation,
    )


def builtin_types() -> list[ResourceType]:
    return [
        # core/v1
        _rt("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",), status=True),
        _rt("", "v1", "configmaps", "ConfigMap", short=("cm",)),
        _rt("", "v1", "secrets", "Secret"),
        _rt("", "v1", "services", "Service", short=("svc",), categories=("all",), status=True),
        _rt("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
        _rt("", "v1", "pods", "Pod", short=("po",), categories=("all",), status=True),
        _rt("", "v1", "events", "Event", short=("ev",)),
        _rt("", "v1", "endpoints", "Endpoints", short=("ep",)),
        _rt(
            "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), status=True
        ),
        _rt("", "v1", "nodes", "Node", namespaced=False, short=("no",), status=True),
        # apps/v1
        _rt(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            short=("deploy",),
            categories=("all",),
            status=True,
            scale=_WORKLOAD_SCALE,
            generation=True,
        ),
        _rt(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            short=("rs",),
            categories=("all",),
            status=True,
            scale=_WORKLOAD_SCALE,
            generation=True,
        ),
        _rt(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            short=("sts",),
            categories=("all",),
            status=True,
            scale=_WORKLOAD_SCALE,
            generation=True,
        ),
        _rt(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            short=("ds",),
            categories=("all",),
            status=True,
            generation=True,
        ),
        _rt("apps", "v1", "controllerrevisions", "ControllerRevision"),
        # policy, autoscaling, batch, networking
        _rt(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            short=("pdb",),
            status=True,
            generation=True,
        ),
        _rt(
            "autoscaling",
            "v2",
            "horizontalpodautoscalers",
            "HorizontalPodAutoscaler",
            short=("hpa",),
            categories=("all",),
            status=True,
            generation=True,
        ),
        _rt("batch", "v1", "jobs", "Job", categories=("all",), status=True, generation=True),
        _rt(
            "batch",
            "v1",
            "cronjobs",
            "CronJob",
            short=("cj",),
            categories=("all",),
            status=True,
            generation=True,
        ),
        _rt(
            "networking.k8s.io",
            "v1",
            "ingresses",
            "Ingress",
            short=("ing",),
            status=True,
            generation=True,
        ),
        _rt(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            short=("netpol",),
            generation=True,
        ),
        # events.k8s.io/v1: the same Events as core v1, through the newer API
        ResourceType(
            group="events.k8s.io",
            version="v1",
            plural="events",
            kind="Event",
            namespaced=True,
            singular="event",
            short_names=("ev",),
            storage_group="",
            storage_version="v1",
            storage_plural="events",
        ),
        _rt("coordination.k8s.io", "v1", "leases", "Lease"),
        _rt(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            short=("crd", "crds"),
            categories=("api-extensions",),
            status=True,
            generation=True,
        ),
        # rbac.authorization.k8s.io/v1, for charts
        _rt("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        _rt("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        _rt("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
        _rt(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            namespaced=False,
        ),
    ]


CRDS = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = ("", "v1", "namespaces")
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
