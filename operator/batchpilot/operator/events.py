"""Event reasons the operator reports, as named constants (`kubectl describe` shows them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CREATED = "Created"
UPDATED = "Updated"
DELETED = "Deleted"
CHILD_CONFLICT = "ChildConflict"
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"


@dataclass(frozen=True, slots=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
