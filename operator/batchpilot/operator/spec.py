"""The InferenceService API as Python types: the spec users write and the status the operator
writes back. Field names, bounds and defaults mirror `crds/inferenceservice.yaml` (a test proves
they agree), so a spec the API server accepted always parses here.

Pure: pydantic only (the pipeline document is `batchpilot.api.pipeline`, the model the runtime
reads its `--pipeline-config` with, so operator and runtime read `spec.pipeline` with the same
code).
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator

from batchpilot.api.batching import ASYNC_DEADLINE_MAX_S
from batchpilot.api.pipeline import PipelineConfig
from batchpilot.operator.access_spec import (
    LABEL_KEY_MAX,
    SECRET_NAME_PATTERN,
    AccessSpec,
    AuthSpec,
    check_label_key,
    check_label_value,
)
from batchpilot.operator.exposure_spec import ExposureSpec
from batchpilot.operator.spec_base import SpecModel

GROUP = "batchpilot.io"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
API_VERSION = f"{GROUP}/{VERSION}"


TORCH_INT8_MESSAGE = (
    "model.variant int8 is an ONNX file made by batchpilot optimize: torchscript and torch-export "
    "programs serve original or fp16 (autocast)"
)
TORCH_ENGINE_MESSAGE = (
    "model.format torchscript and torch-export are served by the torch engine: runtime.engine "
    "must stay onnx (simulated reads an ONNX file's inputs and outputs)"
)
TORCH_ACCELERATOR_MESSAGE = (
    "runtime.accelerator tensorrt is onnxruntime's TensorRT provider: it needs model.format onnx"
)


MODEL_URI = re.compile(
    r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+|file:///.+|https?://[^/\s]+/\S+|s3://[^/\s]+/\S+)$"
)
MODEL_URI_MESSAGE = (
    "model.uri is pvc://CLAIM/PATH, file:///PATH, https://HOST/PATH, http://HOST/PATH or "
    "s3://BUCKET/KEY, without spaces (e.g. pvc://models/resnet50/model.onnx or "
    "s3://models/resnet50.onnx)"
)


def _matching(value: str, pattern: re.Pattern[str], message: str) -> str:
    """`value` where `pattern` matches it all; else the CRD's words for what it should be."""
    if pattern.fullmatch(value) is None:
        raise ValueError(message)
    return value


class ModelSource(SpecModel):
    uri: str = Field(max_length=2048)
    name: str | None = Field(default=None, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    variant: Literal["original", "fp16", "int8"] = "original"
    """Which file the runtime serves: the original, or a variant made by `batchpilot optimize`
    that sits beside it as STEM.VARIANT.onnx. For PyTorch programs fp16 is the same file under
    autocast."""
    format: Literal["onnx", "torchscript", "torch-export"] = "onnx"
    """What the file is, and so which engine serves it: onnx (onnxruntime, or the simulated
    engine), torchscript or torch-export (the torch engine, `--engine torch`, in the operator's
    torch runtime image unless `runtime.image` names one)."""

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        return _matching(value, MODEL_URI, MODEL_URI_MESSAGE)

    @model_validator(mode="after")
    def _int8_is_onnx(self) -> ModelSource:
        if self.format != "onnx" and self.variant == "int8":
            raise ValueError(TORCH_INT8_MESSAGE)
        return self

    @property
    def is_torch(self) -> bool:
        """A PyTorch program: the torch engine serves it."""
        return self.format != "onnx"

    @property
    def torch_suffix(self) -> str:
        return ".pt2" if self.format == "torch-export" else ".pt"

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    def pvc(self) -> tuple[str, str]:
        """(claim, path inside the claim) of a pvc:// URI."""
        claim, _, path = self.uri.removeprefix("pvc://").partition("/")
        return claim, path

    def file_path(self) -> str:
        return urlsplit(self.uri).path

    @property
    def file_name(self) -> str:
        """The last part of the URI's path: the model file's name. A query or a fragment (a
        presigned URL's signature) is no part of it."""
        return urlsplit(self.uri).path.rstrip("/").rsplit("/", 1)[-1]

    def sibling_uri(self, name: str) -> str:
        """The URI of a file named `name` in the model's folder (labels, tokenizer, variants):
        the folder's path and `name`, without the model's query or fragment (a presigned URL's
        signature is the model file's alone); for the model's own name, its URI as written."""
        if name == self.file_name:
            return self.uri
        parts = urlsplit(self.uri)
        folder = parts.path.rstrip("/").removesuffix(self.file_name)
        return urlunsplit((parts.scheme, parts.netloc, folder + name, "", ""))

    def variant_file_name(self, stem: str) -> str:
        """The file name of the served variant for a model file with this stem."""
        return f"{stem}.onnx" if self.variant == "original" else f"{stem}.{self.variant}.onnx"


class SimulatedLatency(SpecModel):
    alpha_ms: float = Field(ge=0, le=10_000)
    beta_ms: float = Field(ge=0, le=10_000)
    cv: float = Field(default=0.0, ge=0, le=2)


class AsyncInferenceSpec(SpecModel):
    result_ttl_seconds: int = Field(default=300, ge=1, le=86_400)
    capacity: int = Field(default=1024, ge=1, le=100_000)
    deadline_seconds: int | None = Field(default=None, ge=1, le=int(ASYNC_DEADLINE_MAX_S))
    """A job's deadline where its request sets none (None: the runtime's, `ASYNC_DEADLINE_S`);
    passed to the pods only when set, so that pods from before the field roll for nothing."""


OBJECT_NAME_MESSAGE = (
    "{field} names a {kind}: lowercase letters, digits, '-' and '.', starting and ending with a "
    "letter or digit"
)


def _object_name(value: str | None, field: str, kind: str) -> str | None:
    if value is not None and re.fullmatch(SECRET_NAME_PATTERN, value) is None:
        raise ValueError(OBJECT_NAME_MESSAGE.format(field=field, kind=kind))
    return value


class PullSecret(SpecModel):
    """core/v1 LocalObjectReference: a Secret of type kubernetes.io/dockerconfigjson here."""

    name: str = Field(min_length=1, max_length=253)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        _object_name(value, "imagePullSecrets[].name", "Secret in this namespace")
        return value


def _metadata_map(values: dict[str, str] | None, *, label_values: bool) -> dict[str, str] | None:
    for key, value in (values or {}).items():
        check_label_key(key)
        if label_values:
            check_label_value(value)
    return values


QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
    r"|(\.[0-9]+))))?$"
)
"""A resource quantity as Kubernetes writes one (500m, 2, 8Gi, 1e9), none negative."""


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A DNS label: a Service's or a claim's name."""
STANDARD_RESOURCE = re.compile(
    r"^(cpu|memory|ephemeral-storage|hugepages-[0-9]+([KMGTPE]i|[kMGTPE])?)$"
)
"""The resources a container asks for by their bare names."""
EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""An extended resource: a device plugin's, named with its domain (nvidia.com/gpu)."""
RESOURCE_NAME_MESSAGE = (
    "a container resource is cpu, memory, ephemeral-storage, hugepages-SIZE, or an extended "
    "resource named with its domain (e.g. nvidia.com/gpu, amd.com/gpu; not under kubernetes.io)"
)


def is_extended(resource: str) -> bool:
    """Whether `resource` is an extended resource (Kubernetes never overcommits one)."""
    return "/" in resource


def _resource_name(name: str) -> str:
    extended = (
        len(name) <= LABEL_KEY_MAX
        and "kubernetes.io/" not in name
        and not name.startswith("requests.")
        and EXTENDED_RESOURCE.fullmatch(name) is not None
    )
    if not extended and STANDARD_RESOURCE.fullmatch(name) is None:
        raise ValueError(f"{name!r}: {RESOURCE_NAME_MESSAGE}")
    return name


class ResourceClaim(SpecModel):
    """A container's use of one of the pod's claims (core/v1 ResourceClaim)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    request: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN
    )


class PodResourceClaim(SpecModel):
    """A device the pod claims through dynamic resource allocation (core/v1 PodResourceClaim):
    from a template, a claim per pod; by name, one claim every pod shares."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    resource_claim_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN
    )
    resource_claim_template_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN
    )

    @model_validator(mode="after")
    def _one_source(self) -> PodResourceClaim:
        if (self.resource_claim_name is None) == (self.resource_claim_template_name is None):
            raise ValueError(
                "a resourceClaims entry names either resourceClaimTemplateName (a claim per "
                "pod) or resourceClaimName (a claim every pod shares), not both and not neither"
            )
        return self


class Resources(SpecModel):
    """core/v1 ResourceRequirements."""

    limits: dict[str, int | str] | None = Field(default=None, max_length=32)
    requests: dict[str, int | str] | None = Field(default=None, max_length=32)
    claims: list[ResourceClaim] | None = Field(default=None, max_length=8)

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, int | str] | None) -> dict[str, int | str] | None:
        for name, value in (values or {}).items():
            _resource_name(name)
            negative = isinstance(value, int) and value < 0
            if negative or (isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value)):
                raise ValueError(
                    f"{name}: {value!r}: a resource quantity is a number with an optional unit, "
                    "none negative (e.g. 500m, 2, 1.5, 8Gi, 512Mi, 1e9)"
                )
        return values

    @field_validator("claims")
    @classmethod
    def _claims_once(cls, claims: list[ResourceClaim] | None) -> list[ResourceClaim] | None:
        uses = [(claim.name, claim.request) for claim in claims or []]
        if len(set(uses)) != len(uses):
            raise ValueError("each resources.claims entry (name and request) is named once")
        return claims

    @model_validator(mode="after")
    def _not_overcommitted(self) -> Resources:
        for name, request in (self.requests or {}).items():
            limit = (self.limits or {}).get(name)
            if is_extended(name) and limit is not None and str(limit) != str(request):
                raise ValueError(
                    "an extended resource (a name with a domain, e.g. nvidia.com/gpu) is never "
                    "overcommitted: where both are set, its request must equal its limit"
                )
        return self


IMAGE = re.compile(r"^[^\s]+$")
IMAGE_MESSAGE = (
    "runtime.image is an image reference without spaces "
    "(e.g. ghcr.io/acme/batchpilot-runtime:0.1.0)"
)
POD_ANNOTATIONS_MAX = 240 * 1024
"""Characters of the spec's pod annotations, keys and values: Kubernetes' 256 KiB for all of a
pod's, less room for the operator's own."""


class RuntimeSpec(SpecModel):
    device: Literal["gpu", "cpu"] = "gpu"
    engine: Literal["onnx", "simulated"] = "onnx"
    simulated_latency: SimulatedLatency | None = None
    instances: int = Field(default=1, ge=1, le=16)
    accelerator: Literal["default", "tensorrt"] = "default"
    async_inference: AsyncInferenceSpec = AsyncInferenceSpec()
    image: str | None = Field(default=None, max_length=1024)
    resources: Resources | None = None
    resource_claims: list[PodResourceClaim] | None = Field(default=None, max_length=8)
    node_selector: dict[str, str] | None = Field(default=None, max_length=32)
    tolerations: list[dict[str, Any]] | None = None
    env: list[dict[str, Any]] | None = None
    # Where and how the pods run: core/v1 PodSpec fields passed through as written.
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: list[dict[str, Any]] | None = Field(default=None, max_length=8)
    """A constraint without a labelSelector gets the pods' own selector (spread these pods)."""
    priority_class_name: str | None = Field(default=None, min_length=1, max_length=253)
    service_account_name: str | None = Field(default=None, min_length=1, max_length=253)
    image_pull_secrets: list[PullSecret] | None = Field(default=None, max_length=16)
    """Absent: the operator's default (`runtimeImagePullSecrets`); [] for none."""
    pod_labels: dict[str, str] | None = Field(default=None, max_length=32)
    """Under the operator's own labels, which win (the Deployment selects on them)."""
    pod_annotations: dict[str, str] | None = Field(default=None, max_length=32)
    """Under the operator's own annotations (scrape settings, the pipeline hash), which win."""

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return value if value is None else _matching(value, IMAGE, IMAGE_MESSAGE)

    @field_validator("priority_class_name")
    @classmethod
    def _priority_class(cls, value: str | None) -> str | None:
        return _object_name(value, "priorityClassName", "PriorityClass")

    @field_validator("service_account_name")
    @classmethod
    def _service_account(cls, value: str | None) -> str | None:
        return _object_name(value, "serviceAccountName", "ServiceAccount in this namespace")

    @field_validator("pod_labels", "node_selector")
    @classmethod
    def _labels(cls, values: dict[str, str] | None) -> dict[str, str] | None:
        return _metadata_map(values, label_values=True)

    @field_validator("pod_annotations")
    @classmethod
    def _annotations(cls, values: dict[str, str] | None) -> dict[str, str] | None:
        if sum(len(k) + len(v) for k, v in (values or {}).items()) > POD_ANNOTATIONS_MAX:
            raise ValueError(
                "podAnnotations must total at most 240 KiB, keys and values: Kubernetes holds "
                "a pod's annotations to 256 KiB, and the operator adds its own"
            )
        return _metadata_map(values, label_values=False)

    @model_validator(mode="after")
    def _tensorrt_on_gpu(self) -> RuntimeSpec:
        if self.accelerator == "tensorrt" and self.device != "gpu":
            raise ValueError("runtime.accelerator tensorrt needs runtime.device gpu")
        return self

    @field_validator("resource_claims")
    @classmethod
    def _claim_names_once(
        cls, claims: list[PodResourceClaim] | None
    ) -> list[PodResourceClaim] | None:
        names = [claim.name for claim in claims or []]
        if len(set(names)) != len(names):
            raise ValueError("each runtime.resourceClaims name is used once")
        return claims

    @model_validator(mode="after")
    def _claims_of_the_pod(self) -> RuntimeSpec:
        pods = {claim.name for claim in self.resource_claims or []}
        used = self.resources.claims if self.resources is not None else None
        if any(claim.name not in pods for claim in used or []):
            raise ValueError(
                "each runtime.resources.claims[].name must be the name of one of "
                "runtime.resourceClaims, the pod's claims its container uses (e.g. "
                "resourceClaims: [{name: gpu, resourceClaimTemplateName: single-gpu}] and "
                "resources.claims: [{name: gpu}])"
            )
        return self


class UtilizationBand(SpecModel):
    min: int = Field(default=70, ge=0, le=100)
    max: int = Field(default=95, ge=1, le=100)

    @model_validator(mode="after")
    def _ordered(self) -> UtilizationBand:
        if not self.min < self.max:
            raise ValueError("sla.gpuUtilization.min must be below sla.gpuUtilization.max")
        return self


WINDOW_PATTERN = r"^[1-9][0-9]{0,4}(s|m|h|d)$"
"""A whole number and one unit, as Prometheus writes durations: 30m, 6h, 7d."""
WINDOW_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
WINDOW_MIN_S = 5 * 60
WINDOW_MAX_S = 28 * 86_400


def window_seconds(window: str) -> int:
    """Seconds in a window written as WINDOW_PATTERN allows (`30m` → 1800)."""
    return int(window[:-1]) * WINDOW_UNITS_S[window[-1]]


class SLASpec(SpecModel):
    latency_p99_ms: int = Field(ge=1, le=600_000, alias="latencyP99Ms")
    gpu_utilization: UtilizationBand = UtilizationBand()
    objective_percent: float = Field(default=99, ge=50, le=100)
    """How often the SLA must hold: the share of the window whose P99 is inside it (the SLO)."""
    window: str = Field(default="1h", max_length=8)
    """The rolling window the objective is kept over, and its error budget spent in."""

    @field_validator("objective_percent")
    @classmethod
    def _below_100(cls, value: float) -> float:
        if value >= 100:
            raise ValueError(
                "sla.objectivePercent must be below 100: an objective of 100 % leaves no "
                "error budget"
            )
        return value

    @field_validator("window")
    @classmethod
    def _window_in_range(cls, value: str) -> str:
        if re.fullmatch(WINDOW_PATTERN, value) is None:
            raise ValueError(
                "sla.window is a whole number and one unit - s, m, h or d (30m, 1h, 6h, 7d)"
            )
        if not WINDOW_MIN_S <= window_seconds(value) <= WINDOW_MAX_S:
            raise ValueError("sla.window must be between 5m and 28d")
        return value

    @property
    def window_s(self) -> int:
        return window_seconds(self.window)


class ScalingSpec(SpecModel):
    mode: Literal["auto", "recommend", "off"] = "auto"
    min_replicas: int = Field(default=1, ge=1, le=1000)
    max_replicas: int = Field(default=8, ge=1, le=1000)
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    scale_down_delay_seconds: int = Field(default=300, ge=0, le=86_400)
    replace_slow_replicas: bool = True
    """Delete the pod of a replica slower than its peers (`autopilot.stragglers`); false: say
    so in the decision's reason only."""

    @model_validator(mode="after")
    def _ordered(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaling.minReplicas must not exceed scaling.maxReplicas")
        return self


class BatchingSpec(SpecModel):
    batch_size: int = Field(default=1, ge=1, le=4096)
    max_queue_delay_ms: float = Field(default=5, ge=0, le=10_000)


class InferenceServiceSpec(SpecModel):
    model: ModelSource
    runtime: RuntimeSpec = RuntimeSpec()
    sla: SLASpec
    scaling: ScalingSpec = ScalingSpec()
    batching: BatchingSpec = BatchingSpec()
    pipeline: PipelineConfig | None = None
    """Pre/post-processing around the model; the runtime's `--pipeline-config` document."""
    access: AccessSpec = AccessSpec()
    """Who may reach the pods over the network (the InferenceService's NetworkPolicy)."""
    auth: AuthSpec | None = None
    """API keys and quotas; absent: every caller the network admits may call, unlimited."""
    exposure: ExposureSpec | None = None
    """A route from outside the cluster (Gateway API or Ingress); absent: in-cluster only."""

    @model_validator(mode="after")
    def _engine_fits_the_format(self) -> InferenceServiceSpec:
        if self.model.is_torch and self.runtime.engine != "onnx":
            raise ValueError(TORCH_ENGINE_MESSAGE)
        if self.model.is_torch and self.runtime.accelerator != "default":
            raise ValueError(TORCH_ACCELERATOR_MESSAGE)
        return self

    @model_validator(mode="after")
    def _batch_within_ceiling(self) -> InferenceServiceSpec:
        if self.batching.batch_size > self.scaling.max_batch_size:
            raise ValueError("batching.batchSize must not exceed scaling.maxBatchSize")
        return self


class Condition(SpecModel):
    """metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str


DNS_LABEL = re.compile(DNS_LABEL_PATTERN)
