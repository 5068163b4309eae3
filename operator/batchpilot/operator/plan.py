"""Level-triggered reconcile, the pure half: desired children from the spec, compared with what
exists, gives the writes to make — none when nothing changed.

Who owns what:
- the spec and the operator's settings own every child field, and drift is put back;
- the autopilot owns the Deployment's `spec.replicas` and the batching ConfigMap's values while
  `scaling.mode` is `auto`: reconcile keeps the values in force (clamped into the spec's bounds)
  and only the autopilot moves them. In `recommend` and `off` the spec decides the batching as
  written, and the replica count is whoever else scales it (a person acting on a
  recommendation, an HPA): kept as found, clamped into the spec's bounds, `minReplicas` at
  creation;
- the admin token is generated once and kept;
- an object of a child's name that this InferenceService does not control is never touched,
  unless the operator made it for an InferenceService of this name that is gone (orphaned, or
  restored with a gone uid's ownerReference, `children.common.adoptable`): that one is adopted
  as a ReplicaSet adopts its orphans, its values in force kept as an owned child's are;
- what the API server made of the operator's own write (an admission webhook adding a
  toleration, rewriting the image's registry) is accepted while the rendering is the same and
  the child is as the server stored it (`Admitted`): the write is not made again every pass.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from batchpilot.operator.children.common import Owner, ours, owned_by
from batchpilot.operator.children.configmap import batching_edited, batching_in, build_configmap
from batchpilot.operator.children.deadline import default_deadline_ms
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.children.exposure import build_grpc_route, build_http_route, build_ingress
from batchpilot.operator.children.networkpolicy import build_network_policy
from batchpilot.operator.children.pdb import build_pdb
from batchpilot.operator.children.quota_share import serving_replicas
from batchpilot.operator.children.secret import build_secret, new_token, token_in
from batchpilot.operator.children.service import build_service
from batchpilot.operator.kinds import (
    CONFIGMAP,
    DEPLOYMENT,
    GRPC_ROUTE,
    HTTP_ROUTE,
    INGRESS,
    NETWORK_POLICY,
    PDB,
    SECRET,
    SERVICE,
    ResourceKind,
)
from batchpilot.operator.settings import OperatorSettings

Obj = dict[str, Any]
EXPOSURE_KINDS = (HTTP_ROUTE, GRPC_ROUTE, INGRESS)
"""The way in from outside (spec.exposure): applied as one, after the rest (see reconciler)."""
CHILD_KINDS = (NETWORK_POLICY, SECRET, CONFIGMAP, DEPLOYMENT, SERVICE, PDB, *EXPOSURE_KINDS)
"""In creation order: the pods' fence and what they mount exist before the pods, the Service
before the routes to it."""
POD_DEPENDENCIES = (NETWORK_POLICY, SECRET, CONFIGMAP)
"""What the pods mount (the admin token, the batching document) or are fenced by."""


@dataclass(frozen=True, slots=True)
class Owned:
    """The values reconcile keeps rather than derives."""

    replicas: int
    batch_size: int
    max_queue_delay_ms: float
    token: str
    deadline_ms: float | None = None
    """The pods' default deadline; None: the SLA itself."""
    serving_replicas: int = 1
    """The ready replicas, which share service-wide quotas (`children.quota_share`)."""
    in_place: bool = False
    """Whether the Deployment's rollout replaces pods in place, for want of room for a surge
    (`rollout.rolls_in_place`: it reads the pods, which the reconciler has)."""


@dataclass
class ChildrenPlan:
    """The writes that converge an InferenceService's children on the spec (none: converged)."""

    create: list[Obj] = field(default_factory=list)
    replace: list[Obj] = field(default_factory=list)
    delete: list[tuple[ResourceKind, str]] = field(default_factory=list)
    conflicts: list[tuple[ResourceKind, str]] = field(default_factory=list)
    """Children whose name is taken by an object this InferenceService does not control."""
    adopted: list[tuple[ResourceKind, str]] = field(default_factory=list)
    """Children the operator made for a gone InferenceService of this name, which their writes
    in `replace` make this one's (`children.common.adoptable`)."""
    held: bool = False
    """The Deployment's writes are held back: a child its pods depend on is in conflict."""
    rendered: dict[ResourceKind, Obj] = field(default_factory=dict)
    """Each created or replaced child as rendered, before the server's fields were kept: what
    `admitted` compares the write's answer with."""

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.replace) + len(self.delete)

    def split(self, kinds: tuple[ResourceKind, ...]) -> tuple[ChildrenPlan, ChildrenPlan]:
        """(the writes of other kinds, the writes of `kinds`)."""
        names = {kind.kind for kind in kinds}
        rest, these = ChildrenPlan(), ChildrenPlan()
        for obj in self.create:
            (these if obj["kind"] in names else rest).create.append(obj)
        for obj in self.replace:
            (these if obj["kind"] in names else rest).replace.append(obj)
        for kind, name in self.delete:
            (these if kind in kinds else rest).delete.append((kind, name))
        for kind, name in self.conflicts:
            (these if kind in kinds else rest).conflicts.append((kind, name))
        for kind, name in self.adopted:
            (these if kind in kinds else rest).adopted.append((kind, name))
        for kind, obj in self.rendered.items():
            (these if kind in kinds else rest).rendered[kind] = obj
        return rest, these


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def owned_values(
    owner: Owner,
    observed: dict[ResourceKind, Obj | None],
    *,
    token: str | None = None,
    outside_s: float | None = None,
) -> Owned:
    """Replicas, batching and token in force: kept from the children where they are ours (or
    adopted, `children.common.adoptable`: what a service re-created or restored under its name
    finds in force is what it goes on with, not `minReplicas` and batch 1). The
    deadline follows the SLA less `outside_s`, the latency the autopilot learned is spent
    outside the batcher (see `children.deadline`)."""
    spec = owner.spec
    scaling = spec.scaling
    replicas = scaling.min_replicas
    batch_size, delay_ms = spec.batching.batch_size, spec.batching.max_queue_delay_ms
    mine = {kind: obj for kind, obj in observed.items() if obj is not None and ours(obj, owner)}
    deployment = mine.get(DEPLOYMENT)
    if deployment is not None:
        current = deployment.get("spec", {}).get("replicas")
        if isinstance(current, int):
            replicas = _clamp(current, scaling.min_replicas, scaling.max_replicas)
    configmap = mine.get(CONFIGMAP)
    recorded = batching_in(configmap) if configmap is not None else None
    # The autopilot's settings in mode auto; outside it as well, until `batching` is edited: a
    # service turned to recommend (to watch the autopilot in an incident) or off fell to the
    # spec's starting point — batch 1 under the load its replicas were sized for at 16.
    unedited = configmap is not None and not batching_edited(configmap, owner)
    if recorded is not None and (scaling.mode == "auto" or unedited):
        batch_size = _clamp(recorded.batch_size, 1, scaling.max_batch_size)
        delay_ms = recorded.max_queue_delay_ms
    secret = mine.get(SECRET)
    # A token is kept from a Secret this service owns, or one adopted with the Deployment that
    # mounts it (the service's serving pods, orphaned or restored): a labelled Secret alone may
    # be planted by someone who may create Secrets and not read them, whose token would then
    # open the admin port (API keys, batching) — a new one is made.
    trusted = secret is not None and (
        owned_by(secret, owner.uid)
        or (deployment is not None and not owned_by(deployment, owner.uid))
    )
    kept = token_in(secret) if secret is not None and trusted else None
    return Owned(
        replicas=replicas,
        batch_size=batch_size,
        max_queue_delay_ms=delay_ms,
        token=kept or token or new_token(),
        deadline_ms=default_deadline_ms(
            sla_ms=spec.sla.latency_p99_ms,
            outside_s=outside_s,
            in_force_ms=None if recorded is None else recorded.deadline_ms,
        ),
        serving_replicas=serving_replicas(mine.get(DEPLOYMENT)),
    )


def desired_children(
    owner: Owner, settings: OperatorSettings, owned: Owned
) -> dict[ResourceKind, Obj | None]:
    """Every child as it should be; None for a child that should not exist."""
    return {
        NETWORK_POLICY: build_network_policy(owner, settings),
        SECRET: build_secret(owner, token=owned.token),
        CONFIGMAP: build_configmap(
            owner,
            batch_size=owned.batch_size,
            max_queue_delay_ms=owned.max_queue_delay_ms,
            deadline_ms=(
                owned.deadline_ms
                if owned.deadline_ms is not None
                else default_deadline_ms(sla_ms=owner.spec.sla.latency_p99_ms, outside_s=None)
            ),
            serving_replicas=owned.serving_replicas,
        ),
        DEPLOYMENT: build_deployment(
            owner, settings, replicas=owned.replicas, in_place=owned.in_place
        ),
        SERVICE: build_service(owner),
        PDB: build_pdb(owner, replicas=owned.replicas),
        HTTP_ROUTE: build_http_route(owner),
        GRPC_ROUTE: build_grpc_route(owner),
        INGRESS: build_ingress(owner),
    }


def contains(actual: Any, desired: Any, *, quantities: bool = False) -> bool:
    """Whether `actual` has every field of `desired` with the same value, as the API server
    stores it.

    Fields only in `actual` are what the API server defaulted or assigned; they do not count as
    drift. Nor does an empty value `desired` has (`""`, `[]`, `{}`) that `actual` lacks: the API
    server drops those (an env var's empty value, a toleration's empty effect). Lists must have
    the same length, and match item by item. Resource quantities (under `requests` and
    `limits`) are compared by value: the API server keeps them in canonical form (`2` as "2",
    "0.5" as "500m", "1024Mi" as "1Gi"), and a spec written otherwise is no drift.
    """
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(
            contains(actual[key], value, quantities=quantities or key in _QUANTITY_MAPS)
            if key in actual
            else value in _EMPTY
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(contains(a, d) for a, d in zip(actual, desired, strict=True))
        )
    if quantities and actual != desired:
        value = quantity(desired)
        return value is not None and value == quantity(actual)
    return bool(actual == desired)


_EMPTY: tuple[Any, ...] = ("", [], {})
_QUANTITY_MAPS = frozenset({"requests", "limits"})
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity's value (`2`, "500m", "1Gi", "1e3"); None where `value`
    is not one."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    found = _QUANTITY.match(str(value).strip())
    if found is None:
        return None
    number, suffix = Decimal(found[1]), found[2] or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:]))
    return number * _SUFFIXES[suffix]


_BODY_FIELDS = ("spec", "data", "type")


def converged(desired: Obj, actual: Obj) -> bool:
    meta, actual_meta = desired["metadata"], actual.get("metadata", {})
    return (
        contains(actual_meta.get("labels", {}), meta["labels"])
        and contains(actual_meta.get("annotations") or {}, meta.get("annotations", {}))
        and contains(actual_meta.get("ownerReferences", []), meta["ownerReferences"])
        and all(contains(actual.get(f), desired[f]) for f in _BODY_FIELDS if f in desired)
        # The API server adds no entries to a ConfigMap's or Secret's data: one the spec no
        # longer asks for (the pipeline or access document of a removed section) is drift.
        and ("data" not in desired or set(actual.get("data") or {}) == set(desired["data"]))
    )


@dataclass(frozen=True, slots=True)
class Admitted:
    """What the API server stored of the operator's last write of a child, where that was not
    what was sent: an admission webhook (Kyverno's pod-controller rules, a registry rewrite)
    added or changed fields. As fingerprints (`fingerprint`): the rendering sent, and the object
    the server stored.

    A later pass that renders the same child and finds it as stored is converged, though
    `contains` disagrees: writing it again would only be mutated again, each pass a write and an
    Event for ever. A person's edit changes what is stored and is put back, once more through the
    webhook; a new rendering (a spec edit) is written."""

    rendered: str
    stored: str
    changed: tuple[str, ...] = ()
    """Where the stored object differs from the rendering (the first few paths)."""


_KEPT_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {"Deployment": (("spec", "replicas"),)}
"""Rendered fields whose value is kept from the child (`owned_values`): the autopilot moves them
between passes, so they are compared apart from the fingerprints, as they are."""


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def fingerprint(obj: Obj, desired: Obj) -> str:
    """A hash of what of `obj` the operator renders in `desired`: the body (`spec`, `data`,
    `type`) whole, less the kept fields; the owner references; the labels and annotations
    `desired` has (others' are theirs). `fingerprint(desired, desired)`: the rendering's."""
    meta, wanted = obj.get("metadata") or {}, desired["metadata"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    body = {f: copy.deepcopy(obj.get(f)) for f in _BODY_FIELDS if f in desired}
    for *parents, last in _KEPT_PATHS.get(desired["kind"], ()):
        parent = _at(body, tuple(parents))
        if isinstance(parent, dict):
            parent.pop(last, None)
    projection = {
        "labels": {key: labels.get(key) for key in wanted["labels"]},
        "annotations": {key: annotations.get(key) for key in wanted.get("annotations") or {}},
        "ownerReferences": meta.get("ownerReferences") or [],
        "body": body,
    }
    text = json.dumps(projection, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def admitted(desired: Obj, answered: Obj) -> Admitted | None:
    """What the server made of a write of `desired` (`answered`, the write's answer) where it
    is not what was sent; None: stored as sent."""
    if converged(desired, answered):
        return None
    return Admitted(
        rendered=fingerprint(desired, desired),
        stored=fingerprint(answered, desired),
        changed=tuple(changed_paths(answered, desired)[:3]),
    )


def as_admitted(desired: Obj, actual: Obj, admitted: Admitted | None) -> bool:
    """Whether `actual` is what the server stored of the last write of this same rendering."""
    return (
        admitted is not None
        and admitted.rendered == fingerprint(desired, desired)
        and admitted.stored == fingerprint(actual, desired)
        and all(
            _at(actual, path) == _at(desired, path) for path in _KEPT_PATHS.get(desired["kind"], ())
        )
    )


def changed_paths(
    actual: Any, desired: Any, path: str = "", *, quantities: bool = False
) -> list[str]:
    """Where `actual` does not `contain` `desired`, as paths (`spec.template.spec.tolerations`)."""
    if contains(actual, desired, quantities=quantities):
        return []
    if isinstance(desired, dict) and isinstance(actual, dict):
        return [
            found
            for key, value in desired.items()
            for found in changed_paths(
                actual.get(key),
                value,
                f"{path}.{key}" if path else key,
                quantities=quantities or key in _QUANTITY_MAPS,
            )
            if key in actual or value not in _EMPTY
        ]
    if isinstance(desired, list) and isinstance(actual, list) and len(actual) == len(desired):
        return [
            found
            for index, (a, d) in enumerate(zip(actual, desired, strict=True))
            for found in changed_paths(a, d, f"{path}[{index}]")
        ]
    return [path]


RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
"""What `kubectl rollout restart` writes into the pod template: a restart a person asked for."""


def _keep_restart(result: Obj, actual: Obj) -> None:
    """Keep a `kubectl rollout restart` in the pod template the Deployment is replaced with: a
    replacement without it (a spec edit, the switch to an in-place rollout while the restart's
    surge pod waits for a GPU) rolled the pods back to the template of before, undoing the
    restart without a word."""
    live = ((actual.get("spec") or {}).get("template") or {}).get("metadata") or {}
    restarted = (live.get("annotations") or {}).get(RESTARTED_AT)
    if restarted is None:
        return
    template = result["spec"]["template"].setdefault("metadata", {})
    template.setdefault("annotations", {}).setdefault(RESTARTED_AT, restarted)


def replacement(desired: Obj, actual: Obj) -> Obj:
    """The object to PUT: our fields as desired, the server's and other owners' metadata kept."""
    result = copy.deepcopy(desired)
    actual_meta = actual.get("metadata", {})
    meta = result["metadata"]
    for key in ("resourceVersion", "uid", "creationTimestamp", "annotations", "finalizers"):
        if key in actual_meta:
            meta[key] = copy.deepcopy(actual_meta[key])
    meta["labels"] = {**actual_meta.get("labels", {}), **meta["labels"]}
    if "annotations" in desired["metadata"]:  # ours (the Ingress's timeouts) over the rest
        meta["annotations"] = {
            **(actual_meta.get("annotations") or {}),
            **desired["metadata"]["annotations"],
        }
    if desired["kind"] == "Deployment":
        _keep_restart(result, actual)
    if desired["kind"] == "Service":
        # Assigned by the API server once, immutable after.
        for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if key in actual.get("spec", {}):
                result["spec"][key] = copy.deepcopy(actual["spec"][key])
    return result


def plan(
    owner: Owner,
    settings: OperatorSettings,
    observed: dict[ResourceKind, Obj | None],
    owned: Owned,
    *,
    admitted: Mapping[ResourceKind, Admitted] | None = None,
) -> ChildrenPlan:
    """`admitted`: what the server stored of the last writes of these children, where not what
    was sent (`Admitted`)."""
    result = ChildrenPlan()
    admitted = admitted or {}
    for kind, desired in desired_children(owner, settings, owned).items():
        actual = observed.get(kind)
        name = desired["metadata"]["name"] if desired else _child_name(owner, kind)
        if actual is not None and not ours(actual, owner):
            result.conflicts.append((kind, name))
        elif desired is None:
            if actual is not None:
                result.delete.append((kind, name))
        elif actual is None:
            result.create.append(desired)
            result.rendered[kind] = desired
        elif not converged(desired, actual) and not as_admitted(
            desired, actual, admitted.get(kind)
        ):
            # An adopted child is never converged (its controller reference is another's, or
            # none): the replacement carries this owner's.
            if not owned_by(actual, owner.uid):
                result.adopted.append((kind, name))
            result.replace.append(replacement(desired, actual))
            result.rendered[kind] = desired
    if any(kind in POD_DEPENDENCIES for kind, _ in result.conflicts):
        # The pods would mount another's Secret or ConfigMap (its token, its batching), or run
        # outside their fence: the Deployment is neither created nor changed until it is ours.
        result.create = [obj for obj in result.create if obj["kind"] != DEPLOYMENT.kind]
        result.replace = [obj for obj in result.replace if obj["kind"] != DEPLOYMENT.kind]
        result.held = True
    return result


def _child_name(owner: Owner, kind: ResourceKind) -> str:
    return {SECRET: owner.secret_name, CONFIGMAP: owner.configmap_name}.get(kind, owner.name)


def child_names(owner: Owner) -> dict[ResourceKind, str]:
    return {kind: _child_name(owner, kind) for kind in CHILD_KINDS}
