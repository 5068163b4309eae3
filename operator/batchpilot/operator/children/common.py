"""Names and labels shared by every child of an InferenceService."""

from __future__ import annotations

from dataclasses import dataclass

from batchpilot.operator.spec import API_VERSION, GROUP, KIND, InferenceServiceSpec

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


def configmap_name(name: str) -> str:
    """The batching ConfigMap's name of the InferenceService `name`."""
    return f"{name}-batching"


def secret_name(name: str) -> str:
    """The admin-token Secret's name of the InferenceService `name`."""
    return f"{name}-admin-token"


def child_object_names(name: str) -> frozenset[str]:
    """The names the children of the InferenceService `name` go by (each kind has one)."""
    return frozenset({name, configmap_name(name), secret_name(name)})


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
        return configmap_name(self.name)

    @property
    def secret_name(self) -> str:
        return secret_name(self.name)

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


def adoptable(child: dict[str, object], owner: Owner) -> bool:
    """Whether `child` is one the operator made for an InferenceService of `owner`'s name and no
    live owner controls: left behind by `kubectl delete --cascade=orphan` (no controller
    ownerReference), or put back by a restore with its controller ownerReference naming an
    InferenceService of this name that is gone (another uid: two InferenceServices of one name
    never exist at once in a namespace, and an ownerReference names an owner of its own
    namespace). Its labels say whose it is: `app.kubernetes.io/managed-by=batchpilot` and
    `batchpilot.io/inferenceservice=<name>`. An object without them, or controlled by anything
    else, is never adopted.

    What that trusts: the labels prove nothing of who wrote the object, only that whoever did
    can write objects of its kind in the namespace — as can whoever edits the children the
    operator owns. Adoption keeps what reconciling an owned child keeps (the replica count and
    the batch settings, clamped into the spec's bounds; the admin token only where the Deployment
    that mounts it is adopted with it: someone who may create Secrets but not read them could
    plant one, and its token opens the admin port) and rewrites the rest from the spec."""
    metadata = child.get("metadata")
    if not isinstance(metadata, dict):
        return False
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict) or not (
        labels.get("app.kubernetes.io/managed-by") == MANAGED_BY
        and labels.get(ISVC_LABEL) == owner.name
    ):
        return False
    controllers = [
        ref
        for ref in metadata.get("ownerReferences") or []
        if isinstance(ref, dict) and ref.get("controller")
    ]
    return all(
        ref.get("kind") == KIND
        and str(ref.get("apiVersion", "")).split("/")[0] == GROUP
        and ref.get("name") == owner.name
        and ref.get("uid") != owner.uid
        for ref in controllers
    )


def ours(child: dict[str, object], owner: Owner) -> bool:
    """Whether reconcile treats `child` as this InferenceService's: controlled by it, or
    `adoptable` (the next write makes it controlled)."""
    return owned_by(child, owner.uid) or adoptable(child, owner)
