"""Event reasons the operator reports, as named constants (`kubectl describe` shows them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CREATED = "Created"
UPDATED = "Updated"
DELETED = "Deleted"
CHILD_CONFLICT = "ChildConflict"
ADOPTED = "Adopted"
"""A child the operator made for a gone InferenceService of this name (orphaned, or restored) was
made this one's, its values in force kept (`children.common.adoptable`)."""
CHANGED_ON_ADMISSION = "ChangedOnAdmission"
"""The API server stored a child otherwise than the operator sent it (an admission webhook added or
changed fields): kept as stored while the rendering is the same (`plan.Admitted`). Posted when a
rendering is first stored so, not on every pass."""
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
API_KEYS_SECRET_MISSING = "ApiKeysSecretMissing"
API_KEYS_SECRET_INVALID = "ApiKeysSecretInvalid"
"""The spec is held back (nothing applied) until the API keys' Secret it names can be used; also
the Ready condition's reason. The Secret's watch brings the next pass (handlers.py)."""

REPLICAS_FAILING = "ReplicasFailing"
"""Replicas are not ready and Kubernetes says why (pods that cannot be created, are not
scheduled, cannot pull their image, crash): posted when what it says changes."""

ROLLING_IN_PLACE = "RollingInPlace"
"""A rollout's surge pod found no room (no GPU free) for `rollout_in_place_after_seconds`: the
rollout replaces one replica at a time instead (`rollout.IN_PLACE`)."""
WAITING_TO_ROLL_IN_PLACE = "WaitingToRollInPlace"
"""A rollout would go in place, but `rollout_in_place_max_services` other services' rollouts
are going in place already: it keeps its surge, its old pods serving, until a turn frees
(`rollout.in_place_turn`). Posted when the wait starts; the message names those services."""

REPLACED_SLOW_REPLICA = "ReplacedSlowReplica"
"""A replica's batches ran slower than its peers' for a while: its pod was deleted for the
ReplicaSet to start another (`autopilot.stragglers`). The message names the pod and its node."""

EXPOSURE_NOT_APPLIED = "ExposureNotApplied"
"""The cluster does not serve a kind spec.exposure needs (no Gateway API): the rest is applied."""
EXPOSURE_REFUSED = "ExposureRefused"
"""The Gateway refused a route (its status.parents): posted when it starts refusing, not on every
pass."""


@dataclass(frozen=True, slots=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
