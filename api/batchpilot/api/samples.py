"""The runtime's own counters and gauges as JSON: `GET /admin/metrics` on a pod's admin port.

Prometheus is where the autopilot reads a service's metrics. When it does not answer — down,
overloaded by the same surge the services are, its storage wiped — the autopilot would only
hold, and a service overloaded meanwhile would get no replica. So the operator can read the
pods themselves: this document is each `batchpilot_*` sample the pod's `/metrics` exposes (the
same registry), as `{"samples": [[name, {label: value}, number], ...]}` — JSON the operator reads
without a Prometheus text parser, on the port the NetworkPolicy already opens to it alone.
Non-finite values are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

PREFIX = "batchpilot_"
"""Only the runtime's own series: not the process collector's."""

Sample = tuple[str, dict[str, str], float]
"""(name, labels, value): a counter's `_total`, a histogram's `_bucket`/`_sum`/`_count`, a
gauge, as the exposition names them."""


def samples_doc(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> dict[str, Any]:
    """The document, from a registry's samples (others than the runtime's, and non-finite
    values, left out)."""
    return {
        "samples": [
            [name, dict(labels), value]
            for name, labels, value in samples
            if name.startswith(PREFIX) and math.isfinite(value)
        ]
    }


def read_samples(doc: Any) -> list[Sample]:
    """The samples of a document; raises ValueError where it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise ValueError('expected {"samples": [[name, {labels}, value], ...]}')
    samples: list[Sample] = []
    for entry in doc["samples"]:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError(f"a sample is [name, {{labels}}, value], not {entry!r}")
        name, labels, value = entry
        if (
            not isinstance(name, str)
            or not isinstance(labels, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise ValueError(f"a sample is [name, {{labels}}, value], not {entry!r}")
        samples.append((name, labels, float(value)))
    return samples
