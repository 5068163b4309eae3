"""The fleet as the operator lists it itself: the autopilot's rounds before kopf's lists are in.

kopf runs no handler, and fills no index, before it has taken every object of its initial lists
through its machinery — about 3 ms an object: 17 s over the 6,000 objects of 1,000 services
(bench/README.md, "A leader that dies"). A standby that takes the lead over a fleet under load
would make no decision for that long on top of the Lease's expiry. Yet what the autopilot's
rounds read is four kinds — the InferenceServices, their Deployments and ConfigMaps, their pods —
and the API server lists each in one request (a page of 500 at a time). `take_stock` lists them
into the watch-fed cache (`WatchCache.take_stock`: a miss of a kind so listed is final, newer
versions from kopf's lists win, what kopf's lists no longer show goes) and names the services the
autopilot ticks; the fleet's loop rounds over them until kopf has listed the fleet
(handlers.py, `fleet_loop`).

Only where the operator watches every namespace or a list of plain names: kopf's namespace
patterns (`team-*`, `!kube-system`) say which namespaces to watch as they come and go, which a
list of our own would have to resolve the same way — there the rounds wait for kopf's lists.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from batchpilot.operator.cache import WatchCache
from batchpilot.operator.children.common import ISVC_LABEL, MANAGED_BY
from batchpilot.operator.fleet import autopiloted
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, INFERENCESERVICE, POD
from batchpilot.operator.kube import KubeError

log = logging.getLogger(__name__)

PATTERN_CHARACTERS = frozenset("*?[]!")
"""What makes a namespace kopf is told to watch a pattern rather than a name (fnmatch's globs,
and `!` for an exclusion)."""

OURS: dict[str, str | None] = {"app.kubernetes.io/managed-by": MANAGED_BY, ISVC_LABEL: None}
"""The children and pods the rounds read: the operator's, of an InferenceService."""


def take_stock(cache: WatchCache, namespaces: Sequence[str]) -> list[tuple[str, str]] | None:
    """List what the autopilot's rounds read into `cache` and return the services they tick
    (namespace, name) — or None where it cannot: the namespaces are patterns, or a list failed
    (logged; the rounds wait for kopf's lists then)."""
    if any(PATTERN_CHARACTERS & set(namespace) for namespace in namespaces):
        return None
    scope = tuple(namespaces) or None  # none named: every namespace
    try:
        services = cache.take_stock(INFERENCESERVICE, scope, {})
        for kind in (DEPLOYMENT, CONFIGMAP, POD):
            cache.take_stock(kind, scope, OURS)
    except KubeError as exc:
        log.warning(
            "listing the fleet for the autopilot's first round failed (%s): it waits for "
            "kopf's lists",
            exc,
        )
        return None
    return [key for key in map(_piloted, services) if key is not None]


def _piloted(service: dict[str, Any]) -> tuple[str, str] | None:
    meta = service.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        return None
    if not autopiloted(namespace, name, service.get("spec") or {}):
        return None
    return namespace, name
