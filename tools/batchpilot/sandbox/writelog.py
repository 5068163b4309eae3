"""A record of every write request, so tests can say "this reconcile pass wrote nothing".

A level-triggered operator does nothing when nothing changed; the way to prove it is to count
the POST/PUT/PATCH/DELETE requests that reach the API during an idle pass. Each request is
recorded as it arrives at the sandbox — successful or not — with the resource it addressed.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class WriteRecord:
    method: str
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None
    content_type: str
    code: int

    @property
    def resource(self) -> str:
        """`deployments.apps`, `configmaps`, `inferenceservices.batchpilot.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def __str__(self) -> str:
        where = "/".join(p for p in (self.namespace, self.name, self.subresource) if p)
        return f"{self.method} {self.resource} {where} -> {self.code}"

    def matches(
        self,
        resource: str | None = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        method: str | None = None,
    ) -> bool:
        if resource is not None:
            plural, _, group = resource.partition(".")
            if plural != self.plural or (group and group != self.group):
                return False
        if namespace is not None and namespace != self.namespace:
            return False
        if name is not None and name != self.name:
            return False
        if subresource is not None and subresource != (self.subresource or ""):
            return False
        return method is None or method.upper() == self.method


class WriteLog:
    """Write requests in arrival order (the newest `limit` of them, when limited)."""

    def __init__(self, *, limit: int | None = None) -> None:
        self._records: collections.deque[WriteRecord] = collections.deque(maxlen=limit)
        self._total = 0

    def record(self, entry: WriteRecord) -> None:
        self._records.append(entry)
        self._total += 1

    def __iter__(self) -> Iterator[WriteRecord]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    @property
    def total(self) -> int:
        """Every write ever recorded (also those dropped by `limit`), for `since()` marks."""
        return self._total

    def count(
        self,
        resource: str | None = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        method: str | None = None,
    ) -> int:
        """How many writes match; `resource` is `plural` or `plural.group`; subresource "" is
        the object itself."""
        return sum(
            1
            for entry in self
            if entry.matches(
                resource, namespace=namespace, name=name, subresource=subresource, method=method
            )
        )

    def by_resource(self) -> dict[str, int]:
        """Counts per `resource[/subresource]`, e.g. `{"deployments.apps": 1, "x.io/status": 2}`."""
        counts: dict[str, int] = {}
        for entry in self:
            key = entry.resource + (f"/{entry.subresource}" if entry.subresource else "")
            counts[key] = counts.get(key, 0) + 1
        return counts

    def since(self, mark: int) -> list[WriteRecord]:
        """The writes after a mark taken from `total`."""
        records = list(self._records)
        newer = self._total - mark
        return records[-newer:] if newer > 0 else []

    def clear(self) -> None:
        self._records.clear()
