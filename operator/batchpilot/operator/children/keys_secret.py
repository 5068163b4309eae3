"""The API keys' Secret as the operator keeps it: the check's verdict, never the keys.

The operator watches Secrets so that creating, fixing or breaking the Secret that an
InferenceService's `spec.auth.apiKeys.secretName` names reconciles that InferenceService at once
(handlers.py). The watch-fed cache keeps each such Secret between passes; kept whole, every
service's keys would sit in the operator's memory for as long as it runs, to serve one check. So
a Secret the operator does not control is kept as what the check needs and no more: its name,
resourceVersion and whether the runtime can use it (`problem`, worded without a key), worked out
once from the watch's copy, which then goes. The operator's own Secrets (the admin token, a child
of an InferenceService) are kept whole: the plan keeps their token. So is one with the
operator's labels and no InferenceService controlling it, an admin token a gone InferenceService
left behind: the plan adopts it by its labels (`common.adoptable`), its token kept.

Pure: the Secret is an argument.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from batchpilot.api.access import MAX_KEYS, key_id_problem, key_problem
from batchpilot.operator.children.common import ISVC_LABEL, MANAGED_BY
from batchpilot.operator.spec import KIND

CHECKED = "batchpilot.io/keysChecked"
"""Where a kept Secret holds the verdict instead of its data: {"problem": str | None}."""
_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")


def keys_problem(name: str, data: Mapping[str, Any] | None) -> str | None:
    """Why a Secret named `name` holding `data` (base64 values, as the API gives them) cannot
    be the API keys' Secret; None: it can. Never shows a key."""
    data = data or {}
    problems: list[str] = []
    if not data:
        problems.append("it holds no keys")
    elif len(data) > MAX_KEYS:
        problems.append(f"it holds {len(data)} keys, at most {MAX_KEYS}")
    for key_id, encoded in sorted(data.items()):
        problem = key_id_problem(key_id)
        if problem is None:
            try:
                problem = key_problem(key_id, base64.b64decode(encoded, validate=True))
            except (binascii.Error, TypeError, ValueError):
                problem = f"the value of {key_id!r} is not base64"
        if problem is not None:
            problems.append(problem)
    if not problems:
        return None
    return (
        f"the API keys' Secret {name} cannot be used: {'; '.join(problems[:5])}"
        + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
        + "; nothing of this spec is applied until it is fixed"
    )


def checked_problem(secret: Mapping[str, Any]) -> str | None:
    """`keys_problem` of a Secret, whole or as `slim_secret` keeps it."""
    checked = secret.get(CHECKED)
    if isinstance(checked, Mapping):
        problem = checked.get("problem")
        return None if problem is None else str(problem)
    name = str((secret.get("metadata") or {}).get("name", ""))
    return keys_problem(name, secret.get("data"))


def controlled_by_an_inferenceservice(secret: Mapping[str, Any]) -> bool:
    refs = (secret.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(ref, Mapping) and ref.get("kind") == KIND and ref.get("controller")
        for ref in refs
    )


def labelled_as_a_child(secret: Mapping[str, Any]) -> bool:
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and ISVC_LABEL in labels


def slim_secret(secret: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a Secret: the operator's own whole (less managedFields), and one
    labelled as its own (which the plan may adopt); any other as its metadata and the keys
    check's verdict."""
    meta = secret.get("metadata") or {}
    if controlled_by_an_inferenceservice(secret) or labelled_as_a_child(secret):
        return {**secret, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {k: meta[k] for k in _KEPT_METADATA if k in meta},
        CHECKED: {"problem": keys_problem(str(meta.get("name", "")), secret.get("data"))},
    }


def keys_secret_name(body: Mapping[str, Any]) -> str | None:
    """The Secret an InferenceService's body names in `spec.auth.apiKeys.secretName`, read
    without validating the spec (the watch calls this for every event; the pass validates)."""
    auth = (body.get("spec") or {}).get("auth")
    api_keys = auth.get("apiKeys") if isinstance(auth, Mapping) else None
    name = api_keys.get("secretName") if isinstance(api_keys, Mapping) else None
    return name if isinstance(name, str) and name else None
