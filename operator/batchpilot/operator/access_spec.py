"""`spec.access` and `spec.auth`: who may reach a model's pods over the network (label selectors
of NetworkPolicy peers) and who may call it, how fast (API keys from a Secret, token-bucket
quotas). Apart from `spec` so that the spec stays readable; the same rules as the CRD's
(`crds/inferenceservice.yaml`), with the same messages. Pure: pydantic only.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from batchpilot.api.access import (
    KEY_ID_MESSAGE,
    KEY_ID_PATTERN,
    MAX_BURST,
    MAX_KEYS,
    MAX_RATE_RPS,
    MIN_RATE_RPS,
)
from batchpilot.operator.spec_base import SpecModel

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters
that starts and ends alphanumeric (`app`, `kubernetes.io/metadata.name`). No backslashes, so
that the CRD's CEL rules can carry it as it is."""
LABEL_KEY_MAX = 317
"""253 for the prefix, 1 for the slash, 63 for the name."""
LABEL_PREFIX_MAX = 253
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
"""A label value: empty, or at most 63 characters that start and end alphanumeric."""
LABEL_KEY_MESSAGE = (
    "a label key is an optional DNS prefix of at most 253 characters and '/', then at most 63 "
    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit (e.g. team or "
    "kubernetes.io/metadata.name)"
)
LABEL_VALUE_MESSAGE = (
    "a label value is empty or at most 63 letters, digits, '-', '_' or '.', starting and "
    "ending with a letter or digit"
)
SELECTOR_OPERATOR_MESSAGE = (
    "operator In and NotIn need at least one value; Exists and DoesNotExist take none"
)
PEER_MESSAGE = "each allowFrom entry needs namespaceSelector, podSelector or both"


def check_label_key(key: str) -> str:
    prefix, slash, _ = key.rpartition("/")
    too_long = len(key) > LABEL_KEY_MAX or (bool(slash) and len(prefix) > LABEL_PREFIX_MAX)
    if too_long or re.fullmatch(LABEL_KEY_PATTERN, key) is None:
        raise ValueError(f"{key!r}: {LABEL_KEY_MESSAGE}")
    return key


def check_label_value(value: str) -> str:
    if re.fullmatch(LABEL_VALUE_PATTERN, value) is None:
        raise ValueError(f"{value!r}: {LABEL_VALUE_MESSAGE}")
    return value


class LabelSelectorRequirement(SpecModel):
    """metav1.LabelSelectorRequirement."""

    key: str = Field(max_length=LABEL_KEY_MAX)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = Field(default=None, max_length=64)

    @field_validator("key")
    @classmethod
    def _valid_key(cls, key: str) -> str:
        return check_label_key(key)

    @field_validator("values")
    @classmethod
    def _valid_values(cls, values: list[str] | None) -> list[str] | None:
        for value in values or []:
            check_label_value(value)
        return values

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        if (self.operator in {"In", "NotIn"}) != bool(self.values):
            raise ValueError(f"matchExpressions {self.key}: {SELECTOR_OPERATOR_MESSAGE}")
        return self


class LabelSelector(SpecModel):
    """metav1.LabelSelector: every matchLabels pair and every expression must hold; empty
    selects everything."""

    match_labels: dict[str, str] | None = Field(default=None, max_length=32)
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=32)

    @field_validator("match_labels")
    @classmethod
    def _valid_labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (labels or {}).items():
            check_label_key(key)
            check_label_value(value)
        return labels


class AccessPeer(SpecModel):
    """Who may call: NetworkPolicyPeer semantics. namespaceSelector alone: every pod in the
    namespaces it selects; podSelector alone: the pods it selects in the InferenceService's own
    namespace; both: the pods it selects in the namespaces it selects."""

    namespace_selector: LabelSelector | None = None
    pod_selector: LabelSelector | None = None

    @model_validator(mode="after")
    def _selects_something(self) -> AccessPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError(PEER_MESSAGE)
        return self


OWN_NAMESPACE = AccessPeer(pod_selector=LabelSelector())
"""The default peer: every pod in the InferenceService's own namespace."""


class AccessSpec(SpecModel):
    allow_from: list[AccessPeer] | None = Field(default=None, max_length=64)
    """Who may call the model (its HTTP and gRPC ports). Absent: the pods of the
    InferenceService's own namespace; empty: no one (only the operator and Prometheus reach the
    pods, on their own ports)."""

    @property
    def peers(self) -> list[AccessPeer]:
        return [OWN_NAMESPACE] if self.allow_from is None else list(self.allow_from)


SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Secret's name: a DNS subdomain (no backslashes, so the CRD's CEL rule carries it as is)."""
SECRET_NAME_MESSAGE = (
    "secretName names a Secret in this namespace: lowercase letters, digits, '-' and '.', "
    "starting and ending with a letter or digit"
)
QUOTA_KEY_MESSAGE = "each keyId has one quota in quotas.perKey"


def _key_id(value: str) -> str:
    if re.fullmatch(KEY_ID_PATTERN, value) is None:
        raise ValueError(f"{value!r}: {KEY_ID_MESSAGE}")
    return value


class ApiKeysSpec(SpecModel):
    """The keys' Secret: each entry's name is a key id, its value the key."""

    secret_name: str = Field(min_length=1, max_length=253)
    allowed_key_ids: list[str] | None = Field(default=None, max_length=MAX_KEYS)
    """The key ids that may call this model; absent: every key in the Secret."""

    @field_validator("secret_name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if re.fullmatch(SECRET_NAME_PATTERN, value) is None:
            raise ValueError(SECRET_NAME_MESSAGE)
        return value

    @field_validator("allowed_key_ids")
    @classmethod
    def _valid_ids(cls, ids: list[str] | None) -> list[str] | None:
        for key_id in ids or []:
            _key_id(key_id)
        return ids


class QuotaSpec(SpecModel):
    """A token bucket: `burst` requests at once, then `requestsPerSecond` — for the service, or
    on each replica (`QuotasSpec.scope`)."""

    requests_per_second: float = Field(ge=MIN_RATE_RPS, le=MAX_RATE_RPS)
    burst: int | None = Field(default=None, ge=1, le=MAX_BURST)
    """Absent: one second's worth of requests."""


class KeyQuotaSpec(QuotaSpec):
    key_id: str = Field(max_length=63)

    @field_validator("key_id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return _key_id(value)


QuotaScope = Literal["service", "replica"]


class QuotasSpec(SpecModel):
    scope: QuotaScope = "service"
    """`service`: the limits are the service's — each of the N replicas that serve enforces its
    share (the rates and bursts divided by N), so that together they enforce the limit written.
    `replica`: each replica enforces the whole limit on the requests it receives (with N
    replicas, up to N times the limit)."""
    default: QuotaSpec | None = None
    """Each key's limit unless `perKey` names it; absent: no per-key limit."""
    per_key: list[KeyQuotaSpec] | None = Field(default=None, max_length=MAX_KEYS)
    total: QuotaSpec | None = None
    """The limit over every key together."""

    @model_validator(mode="after")
    def _one_quota_per_key(self) -> QuotasSpec:
        ids = [quota.key_id for quota in self.per_key or []]
        if len(ids) != len(set(ids)):
            raise ValueError(QUOTA_KEY_MESSAGE)
        return self


class AuthSpec(SpecModel):
    """Callers with identities: API keys, and how fast each may call."""

    api_keys: ApiKeysSpec
    quotas: QuotasSpec = QuotasSpec()
