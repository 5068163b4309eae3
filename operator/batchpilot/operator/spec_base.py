"""The base of every InferenceService spec model: camelCase in the resource, snake_case in Python,
frozen, unknown fields ignored (the API server's structural schema already pruned them). Pure:
pydantic only.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    def dump(self) -> dict[str, Any]:
        """The camelCase document, as it appears in the resource."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
