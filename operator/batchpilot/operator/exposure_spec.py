"""`spec.exposure`: how a model is reached from outside the cluster — a Gateway API route to a
named Gateway, or an Ingress — and the canary InferenceService that shares its traffic.

Apart from `spec` so that the spec stays readable; the same rules as the CRD's
(`crds/inferenceservice.yaml`, `spec.exposure`), with the same messages. Pure: pydantic only.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from batchpilot.operator.spec_base import SpecModel

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
HOSTNAME_PATTERN = r"^([*][.])?[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""RFC 1123 host names, optionally a wildcard's `*.` first, as the Gateway API and Ingress take
them. Written without backslashes so that the CRD's CEL rules carry the same text."""
NOT_AN_ADDRESS_PATTERN = r"^[0-9.]+$"
PATH_SEGMENT = (
    r"[-A-Za-z0-9_~][-A-Za-z0-9._~]*|[.][-A-Za-z0-9_~][-A-Za-z0-9._~]*|[.][.][-A-Za-z0-9._~]+"
)
"""A path segment an Ingress's Prefix path may have: not '.' or '..' (kube-apiserver refuses
them, and '//')."""
PATH_PATTERN = r"^/((" + PATH_SEGMENT + r")(/|$))*$"

EXPOSURE_ONE_MESSAGE = (
    "exposure takes exactly one of gateway (a Gateway API HTTPRoute and GRPCRoute) or ingress "
    "(an Ingress)"
)
CANARY_INGRESS_MESSAGE = (
    "exposure.canary needs exposure.gateway: an Ingress has no portable way to split traffic "
    "by weight (the Gateway API's backendRefs weights do)"
)
CANARY_SELF_MESSAGE = "exposure.canary.service names another InferenceService, not this one"
CANARY_NAME_MESSAGE = (
    "exposure.canary.service names an InferenceService of this namespace: at most 63 lowercase "
    "letters, digits and '-', starting and ending with a letter or digit"
)
HOSTNAME_MESSAGE = (
    "a hostname is a DNS name of lowercase letters, digits, '-' and '.', optionally starting "
    "with '*.' (e.g. resnet.example.com or *.models.example.com); no IP address, port or scheme"
)
GATEWAY_NAME_MESSAGE = (
    "gateway.name names a Gateway: lowercase letters, digits, '-' and '.', starting and ending "
    "with a letter or digit"
)
GATEWAY_NAMESPACE_MESSAGE = (
    "gateway.namespace is a namespace name: at most 63 lowercase letters, digits and '-', "
    "starting and ending with a letter or digit"
)
SECTION_NAME_MESSAGE = (
    "gateway.sectionName names one of the Gateway's listeners: lowercase letters, digits, '-' "
    "and '.', starting and ending with a letter or digit"
)
CLASS_NAME_MESSAGE = (
    "ingress.className names an IngressClass: lowercase letters, digits, '-' and '.', starting "
    "and ending with a letter or digit"
)
TLS_SECRET_MESSAGE = (
    "ingress.tlsSecretName names a Secret of type kubernetes.io/tls in this namespace: "
    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
)
PATH_MESSAGE = (
    "ingress.path is an absolute path: '/' then segments of letters, digits, '-', '.', '_' and "
    "'~', one '/' between them and none of them '.' or '..' (e.g. / or /v2/models/resnet50)"
)
MAX_HOSTNAMES = 16
"""The Gateway API's limit on a route's hostnames."""


def _matches(pattern: str, value: str, message: str) -> str:
    if re.fullmatch(pattern, value) is None:
        raise ValueError(message)
    return value


def hostname(value: str) -> str:
    """`value` if it is a host name a route or an Ingress takes; else ValueError, the reason."""
    if re.fullmatch(HOSTNAME_PATTERN, value) is None or re.fullmatch(NOT_AN_ADDRESS_PATTERN, value):
        raise ValueError(f"{value!r}: {HOSTNAME_MESSAGE}")
    return value


class GatewayExposure(SpecModel):
    """Routes attached to a Gateway someone else runs: an HTTPRoute to the Service's HTTP port
    and a GRPCRoute to its gRPC port. TLS lives on the Gateway's listener, not here."""

    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(default=None, max_length=63)
    """The Gateway's namespace; absent: the InferenceService's. The Gateway's listener must
    allow routes from this namespace (`allowedRoutes`)."""
    section_name: str | None = Field(default=None, max_length=253)
    """One listener of the Gateway (e.g. the HTTPS one); absent: every listener that admits
    the route."""
    hostnames: list[str] | None = Field(default=None, max_length=MAX_HOSTNAMES)
    grpc: bool = True
    """Whether a GRPCRoute exposes the gRPC port too (it needs Gateway API 1.1 or later)."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _matches(DNS_SUBDOMAIN_PATTERN, value, GATEWAY_NAME_MESSAGE)

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, value: str | None) -> str | None:
        return (
            None if value is None else _matches(DNS_LABEL_PATTERN, value, GATEWAY_NAMESPACE_MESSAGE)
        )

    @field_validator("section_name")
    @classmethod
    def _valid_section(cls, value: str | None) -> str | None:
        return (
            None if value is None else _matches(DNS_SUBDOMAIN_PATTERN, value, SECTION_NAME_MESSAGE)
        )

    @field_validator("hostnames")
    @classmethod
    def _valid_hostnames(cls, values: list[str] | None) -> list[str] | None:
        for value in values or []:
            hostname(value)
        return values


class IngressExposure(SpecModel):
    """An Ingress (networking.k8s.io/v1) to the Service's HTTP port, for clusters without the
    Gateway API. gRPC is not exposed this way."""

    class_name: str | None = Field(default=None, max_length=253)
    """The IngressClass (ingressClassName); absent: the cluster's default class."""
    host: str = Field(min_length=1, max_length=253)
    path: str = Field(default="/", max_length=1024)
    """A path prefix the runtime serves as it is (no rewriting): `/` or e.g. `/v2/models/NAME`."""
    tls_secret_name: str | None = Field(default=None, max_length=253)
    """A kubernetes.io/tls Secret of this namespace: the Ingress terminates TLS for `host`."""

    @field_validator("class_name")
    @classmethod
    def _valid_class(cls, value: str | None) -> str | None:
        return None if value is None else _matches(DNS_SUBDOMAIN_PATTERN, value, CLASS_NAME_MESSAGE)

    @field_validator("host")
    @classmethod
    def _valid_host(cls, value: str) -> str:
        return hostname(value)

    @field_validator("path")
    @classmethod
    def _valid_path(cls, value: str) -> str:
        return _matches(PATH_PATTERN, value, PATH_MESSAGE)

    @field_validator("tls_secret_name")
    @classmethod
    def _valid_secret(cls, value: str | None) -> str | None:
        return None if value is None else _matches(DNS_SUBDOMAIN_PATTERN, value, TLS_SECRET_MESSAGE)


class CanarySpec(SpecModel):
    """Another InferenceService of this namespace (a new model version) that gets `weight`
    percent of the route's requests; this one gets the rest."""

    service: str = Field(min_length=1, max_length=63)
    weight: int = Field(ge=0, le=100)

    @field_validator("service")
    @classmethod
    def _valid_service(cls, value: str) -> str:
        return _matches(DNS_LABEL_PATTERN, value, CANARY_NAME_MESSAGE)


class ExposureSpec(SpecModel):
    gateway: GatewayExposure | None = None
    ingress: IngressExposure | None = None
    canary: CanarySpec | None = None

    @model_validator(mode="after")
    def _one_way_in(self) -> ExposureSpec:
        if (self.gateway is None) == (self.ingress is None):
            raise ValueError(EXPOSURE_ONE_MESSAGE)
        if self.canary is not None and self.gateway is None:
            raise ValueError(CANARY_INGRESS_MESSAGE)
        return self
