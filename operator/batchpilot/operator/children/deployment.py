"""The runtime Deployment: the pods that serve the model.

What belongs to whom: everything here comes from the spec and the operator's settings, except
`spec.replicas`, which the autopilot owns (the reconciler passes in the count in force). Batch
settings are not in the pod template at all — pods read them from the mounted ConfigMap and the
admin endpoint — so the autopilot changes the batch size without restarting a single pod.
The pipeline document, which the runtime reads only at start, rolls the pods through a hash
annotation on the pod template.

The runtime listens on four ports, each for one audience (the NetworkPolicy admits each its
own): `http` and `grpc` for the model's callers, `admin` for the operator's pushes of batch
settings, `metrics` for Prometheus. The Service carries the callers' ports and the metrics port,
never the admin port.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from batchpilot.operator.children.apikeys import api_keys_args, api_keys_volume
from batchpilot.operator.children.common import (
    BATCHING_DIR,
    BATCHING_FILE,
    PIPELINE_FILE,
    TOKEN_DIR,
    TOKEN_FILE,
    Owner,
)
from batchpilot.operator.children.configmap import pipeline_hash
from batchpilot.operator.children.node_loss import with_node_loss
from batchpilot.operator.rollout import IN_PLACE, SURGE
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import is_extended

MODEL_DIR = "/models"
PIPELINE_HASH_ANNOTATION = "batchpilot.io/pipeline-sha256"
"""On the pod template: the pipeline is read at start, so a new pipeline means new pods."""
RUNTIME_USER = 65532


TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"
"""A container that exits with an error and writes no termination message gets its log's tail
as the message: the runtime's reason for refusing a model reaches the pod's status, and from
there the InferenceService's Ready condition (`rollout`)."""


class UnsupportedModelSource(ValueError):
    """The model URI passed the schema but this operator cannot make pods read it."""


def model_files(owner: Owner) -> list[str]:
    """Files the runtime reads from the model's folder besides the model file: the pipeline's
    labels and tokenizer. They travel with the model (fetched beside it, or mounted with it)."""
    pipeline = owner.spec.pipeline
    if pipeline is None:
        return []
    named: list[str | None] = []
    if pipeline.preprocess is not None and pipeline.preprocess.text is not None:
        named.append(pipeline.preprocess.text.tokenizer)
    if pipeline.postprocess is not None:
        top_k, nms = pipeline.postprocess.top_k, pipeline.postprocess.nms
        named += [top_k.labels if top_k else None, nms.labels if nms else None]
    # Absolute paths point into the image; only files beside the model travel with it.
    return sorted({name for name in named if name and not name.startswith("/")})


def _model_volumes(
    owner: Owner, settings: OperatorSettings, image: str
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(model path in the container, volumes, mounts, init containers) for the model URI.

    The runtime finds a variant (STEM.fp16.onnx) and the pipeline's files beside the model path
    it is given, so for fetched models exactly those files are fetched into one folder.
    """
    source = owner.spec.model
    if source.scheme == "file":
        return source.file_path(), [], [], []
    if source.scheme == "pvc":
        claim, path = source.pvc()
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        mount = {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
        return f"{MODEL_DIR}/{path}", [volume], [mount], []
    # http(s):// and s3:// are fetched into an emptyDir before the runtime starts.
    target = f"{MODEL_DIR}/model.onnx"
    extra = model_files(owner)
    fetcher: dict[str, Any]
    if source.scheme in ("http", "https") and source.is_torch:
        # A PyTorch program is one file (FP16 is autocast, not a sibling file); a TorchScript
        # program fetched alone carries its signature inside (signature.json).
        target = f"{MODEL_DIR}/model{source.torch_suffix}"
        pairs = [source.uri, target]
        for name in extra:
            pairs += [source.sibling_uri(name), f"{MODEL_DIR}/{name}"]
        fetcher = {
            "name": "fetch-model",
            "image": image,
            "command": ["batchpilot"],
            "args": ["runtime", "fetch", *pairs],
        }
    elif source.scheme in ("http", "https"):
        stem = source.file_name.removesuffix(".onnx")
        served = (  # the original: the URI as written, whatever its file is called
            source.uri
            if source.variant == "original"
            else source.sibling_uri(source.variant_file_name(stem))
        )
        pairs = [served, f"{MODEL_DIR}/{source.variant_file_name('model')}"]
        for name in extra:
            pairs += [source.sibling_uri(name), f"{MODEL_DIR}/{name}"]
        fetcher = {
            "name": "fetch-model",
            "image": image,
            "command": ["batchpilot"],
            "args": ["runtime", "fetch", *pairs],
        }
    elif settings.storage_initializer_image:
        # KServe's initializer copies one object, or everything under a prefix: the folder when
        # the runtime needs more than the model file itself.
        # A TorchScript program's signature sidecar sits beside it.
        whole_folder = (
            (source.variant != "original" and not source.is_torch)
            or bool(extra)
            or source.format == "torchscript"
        )
        fetcher = {
            "name": "fetch-model",
            "image": settings.storage_initializer_image,
            "args": [source.sibling_uri("") if whole_folder else source.uri, MODEL_DIR],
        }
        target = f"{MODEL_DIR}/{source.file_name}"
    else:
        raise UnsupportedModelSource(
            f"model URI {source.uri} needs a storage initializer image for {source.scheme}://; "
            "set the operator's storageInitializerImage, or use pvc://, file:// or https://"
        )
    fetcher.update(
        volumeMounts=[{"name": "model", "mountPath": MODEL_DIR}],
        securityContext=_container_security(),
        resources={"requests": {"cpu": "100m", "memory": "128Mi"}},
        # A failed fetch's last log lines become its status message (Ready says why).
        terminationMessagePolicy=TERMINATION_MESSAGE_POLICY,
    )
    volume = {"name": "model", "emptyDir": {}}
    mount = {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
    return target, [volume], [mount], [fetcher]


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def drain_grace_s(owner: Owner, settings: OperatorSettings) -> int:
    """How long a pod may take to finish its queued requests on SIGTERM: the operator's setting,
    or the service's SLA and a second where that is longer — the requests it took on were
    promised an answer within their deadline, which follows the SLA (a drain cut shorter would
    fail them after the pod had taken them)."""
    return max(settings.drain_grace_seconds, math.ceil(owner.spec.sla.latency_p99_ms / 1000) + 1)


def runtime_args(owner: Owner, settings: OperatorSettings, model_path: str) -> list[str]:
    runtime = owner.spec.runtime
    args = [
        "runtime",
        "serve",
        "--model",
        model_path,
        "--name",
        owner.model_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(settings.runtime_port),
        "--admin-port",
        str(settings.runtime_admin_port),
        "--metrics-port",
        str(settings.runtime_metrics_port),
        "--device",
        runtime.device,
        "--engine",
        "torch" if owner.spec.model.is_torch else runtime.engine,
        "--batching-config",
        f"{BATCHING_DIR}/{BATCHING_FILE}",
        "--admin-token-file",
        f"{TOKEN_DIR}/{TOKEN_FILE}",
        "--drain-grace-s",
        str(drain_grace_s(owner, settings)),
        *api_keys_args(owner),
    ]
    args += [
        "--grpc-port",
        str(settings.runtime_grpc_port),
        "--instances",
        str(runtime.instances),
        "--variant",
        owner.spec.model.variant,
        "--accelerator",
        runtime.accelerator,
        "--async-result-ttl-s",
        str(runtime.async_inference.result_ttl_seconds),
        "--async-capacity",
        str(runtime.async_inference.capacity),
    ]
    if runtime.async_inference.deadline_seconds is not None:
        args += ["--async-deadline-s", str(runtime.async_inference.deadline_seconds)]
    if owner.spec.pipeline is not None:
        args += ["--pipeline-config", f"{BATCHING_DIR}/{PIPELINE_FILE}"]
    if runtime.engine == "simulated" and runtime.simulated_latency is not None:
        latency = runtime.simulated_latency
        timing = f"alpha_ms={latency.alpha_ms:g},beta_ms={latency.beta_ms:g}"
        args += ["--simulated-latency", timing + (f",cv={latency.cv:g}" if latency.cv else "")]
    return args


def runtime_image(owner: Owner, settings: OperatorSettings) -> str:
    """The spec's image, else the operator's for what serves the model: only the torch image has
    PyTorch (the others would crash-loop on `--engine torch`), onnxruntime's is per device."""
    runtime = owner.spec.runtime
    if runtime.image:
        return runtime.image
    if owner.spec.model.is_torch:
        return settings.runtime_image_torch
    return settings.runtime_image_gpu if runtime.device == "gpu" else settings.runtime_image_cpu


def _placement(owner: Owner, settings: OperatorSettings) -> dict[str, Any]:
    """The PodSpec fields that say where and how the pods run, as the spec wrote them: affinity,
    topology spread (a constraint without a labelSelector spreads these pods: it gets their
    selector), priority class, service account, image pull secrets (the operator's default when
    the spec names none)."""
    runtime = owner.spec.runtime
    fields: dict[str, Any] = {}
    if runtime.affinity:
        fields["affinity"] = copy.deepcopy(runtime.affinity)
    if runtime.topology_spread_constraints:
        fields["topologySpreadConstraints"] = [
            {"labelSelector": {"matchLabels": dict(owner.selector)}, **copy.deepcopy(constraint)}
            for constraint in runtime.topology_spread_constraints
        ]
    if runtime.priority_class_name is not None:
        fields["priorityClassName"] = runtime.priority_class_name
    if runtime.service_account_name is not None:
        fields["serviceAccountName"] = runtime.service_account_name
    pull_secrets = (
        [secret.name for secret in runtime.image_pull_secrets]
        if runtime.image_pull_secrets is not None
        else settings.runtime_image_pull_secrets
    )
    if pull_secrets:
        fields["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    return fields


DEFAULT_REQUESTS = {"cpu": "1", "memory": "1Gi"}
"""What the runtime container asks for where the spec names neither a request nor a limit."""


def _resources(spec: dict[str, Any], *, gpu: str | None) -> dict[str, Any]:
    """The runtime container's resources: the spec's, with `DEFAULT_REQUESTS` for what it sets
    neither a request nor a limit of — a limit alone is the request too, as Kubernetes makes it
    (a default request above a smaller limit would be refused) — and on a GPU, `gpu` (the
    extended resource's name) as the spec asks for it, one where it names neither `gpu` nor a
    claim (a device claimed through dynamic resource allocation is the GPU). An extended
    resource is never overcommitted: one asked for as a request alone gets it as its limit, which
    Kubernetes requires."""
    requests, limits = dict(spec.get("requests") or {}), dict(spec.get("limits") or {})
    for name, default in DEFAULT_REQUESTS.items():
        if name not in requests and name not in limits:
            requests[name] = default
    if gpu is not None and gpu not in requests and gpu not in limits and not spec.get("claims"):
        limits[gpu] = "1"
    for name, count in requests.items():
        if is_extended(name):
            limits.setdefault(name, count)
    found: dict[str, Any] = {"requests": requests} if requests else {}
    if limits:
        found["limits"] = limits
    if spec.get("claims"):
        found["claims"] = spec["claims"]
    return found


def build_deployment(
    owner: Owner, settings: OperatorSettings, *, replicas: int, in_place: bool = False
) -> dict[str, Any]:
    """The runtime's Deployment with `replicas`; its rollouts replace pods `IN_PLACE` where
    `in_place` (`rollout.rolls_in_place`), else with a `SURGE`."""
    runtime = owner.spec.runtime
    gpu = runtime.device == "gpu"
    image = runtime_image(owner, settings)
    model_path, volumes, mounts, init_containers = _model_volumes(owner, settings, image)
    key_volumes, key_mounts = api_keys_volume(owner)

    resources = _resources(
        runtime.resources.dump() if runtime.resources else {},
        gpu=settings.gpu_resource if gpu else None,
    )

    env = [
        {"name": "BATCHPILOT_ISVC_NAME", "value": owner.name},
        {"name": "BATCHPILOT_ISVC_NAMESPACE", "value": owner.namespace},
        # Async job ids name the pod that holds the job; the other replicas pass fetches on to it.
        {
            "name": "BATCHPILOT_ADVERTISE_HOST",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
        },
        *(runtime.env or []),
    ]
    container = {
        "name": "runtime",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "terminationMessagePolicy": TERMINATION_MESSAGE_POLICY,
        "command": ["batchpilot"],
        "args": runtime_args(owner, settings, model_path),
        "env": env,
        "ports": [
            {"name": "http", "containerPort": settings.runtime_port, "protocol": "TCP"},
            {"name": "grpc", "containerPort": settings.runtime_grpc_port, "protocol": "TCP"},
            {"name": "admin", "containerPort": settings.runtime_admin_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": settings.runtime_metrics_port, "protocol": "TCP"},
        ],
        "resources": resources,
        "startupProbe": _probe("/v2/health/live", period=2, failures=150),
        "readinessProbe": _probe("/v2/health/ready", period=2, failures=2),
        "livenessProbe": _probe("/v2/health/live", period=10, failures=3),
        "lifecycle": {
            "preStop": {"exec": {"command": ["sleep", str(settings.pre_stop_sleep_seconds)]}}
        },
        "securityContext": _container_security(),
        "volumeMounts": [
            *mounts,
            {"name": "batching", "mountPath": BATCHING_DIR, "readOnly": True},
            {"name": "admin-token", "mountPath": TOKEN_DIR, "readOnly": True},
            *key_mounts,
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            *volumes,
            {"name": "batching", "configMap": {"name": owner.configmap_name}},
            {"name": "admin-token", "secret": {"secretName": owner.secret_name}},
            *key_volumes,
            {"name": "tmp", "emptyDir": {}},
        ],
        # Drain (SIGTERM → queued requests finish) after the pre-stop pause, with room to exit.
        "terminationGracePeriodSeconds": settings.pre_stop_sleep_seconds
        + drain_grace_s(owner, settings)
        + 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER,
            "runAsGroup": RUNTIME_USER,
            "fsGroup": RUNTIME_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if runtime.resource_claims:
        pod_spec["resourceClaims"] = [claim.dump() for claim in runtime.resource_claims]
    node_selector = runtime.node_selector
    if node_selector is None and gpu:
        node_selector = settings.gpu_node_selector
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    tolerations = runtime.tolerations
    if tolerations is None and gpu:
        tolerations = settings.gpu_tolerations
    pod_spec["tolerations"] = with_node_loss(
        [dict(t) for t in tolerations or ()], settings.node_loss_toleration_seconds
    )
    pod_spec |= _placement(owner, settings)

    annotations = {
        **(runtime.pod_annotations or {}),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(settings.runtime_metrics_port),
        "prometheus.io/path": "/metrics",
    }
    if (digest := pipeline_hash(owner)) is not None:
        annotations[PIPELINE_HASH_ANNOTATION] = digest
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(owner.name),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": owner.selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": dict(IN_PLACE if in_place else SURGE),
            },
            "template": {
                "metadata": {
                    # The spec's labels under the operator's: the Deployment selects on these.
                    "labels": {**(runtime.pod_labels or {}), **owner.labels},
                    "annotations": annotations,
                },
                "spec": pod_spec,
            },
        },
    }
