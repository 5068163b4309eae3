"""The gate's metrics, by key id and never by key, on the runtime's registry.

- `batchpilot_requests_by_key_total` (counter by `key_id`, `outcome`): what the gate decided —
  `admitted`, `unauthenticated` (401), `forbidden` (403), `over_quota` (429). `key_id` is an id
  of the key table in force, or `unknown` for a request without a key or with a key no entry
  holds, so the label set is bounded by the Secret.
- `batchpilot_api_keys` (gauge): keys in the table in force.
- `batchpilot_access_reloads_total` (counter by `source`: keys, access — the files — or admin,
  the operator's `PUT /admin/access`; `result`: applied, refused): changes taken while serving; a
  refused one left the previous table or policy in force. A file re-published with the content it
  had is not counted: it changes nothing.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AccessMetrics:
    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        names = list(labels)
        self._labels = labels
        self._by_key = Counter(
            "batchpilot_requests_by_key",
            "Requests at the API key gate, by key id and what the gate decided",
            [*names, "key_id", "outcome"],
            registry=registry,
        )
        self._children: dict[tuple[str, str], Counter] = {}
        self.keys = Gauge(
            "batchpilot_api_keys", "API keys in the table in force", names, registry=registry
        ).labels(**labels)
        self._reloads = Counter(
            "batchpilot_access_reloads",
            "API key or access changes taken while serving, from the files or the admin "
            "endpoint, by result (refused: the previous ones stay in force)",
            [*names, "source", "result"],
            registry=registry,
        )

    def count(self, key_id: str, outcome: str) -> None:
        child = self._children.get((key_id, outcome))
        if child is None:
            child = self._children[(key_id, outcome)] = self._by_key.labels(
                **self._labels, key_id=key_id, outcome=outcome
            )
        child.inc()

    def reloaded(self, source: str, applied: bool) -> None:
        self._reloads.labels(
            **self._labels, source=source, result="applied" if applied else "refused"
        ).inc()
