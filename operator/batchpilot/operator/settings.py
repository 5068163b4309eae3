"""The operator's settings, from the environment (BATCHPILOT_OPERATOR_*), set by the Helm chart.

Everything a platform team decides once for the cluster lives here — runtime images, where
Prometheus is, which namespaces to watch, how GPU nodes are selected — so InferenceService specs
only say what differs per service.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATCHPILOT_OPERATOR_", extra="ignore")

    runtime_image_cpu: str = "ghcr.io/batchpilot/runtime:0.1.0"
    runtime_image_gpu: str = "ghcr.io/batchpilot/runtime-gpu:0.1.0"
    runtime_image_torch: str = "ghcr.io/batchpilot/runtime-torch:0.1.0"
    """For PyTorch programs (`model.format` torchscript or torch-export), on either device: the
    runtime with the torch extra, CUDA's PyTorch, which runs on the CPU where there is no GPU."""
    storage_initializer_image: str | None = Field(
        default=None,
        description="image that fetches s3:// models: args [URI, DEST] (KServe's contract)",
    )
    image_pull_policy: str = "IfNotPresent"
    runtime_image_pull_secrets: list[str] = Field(default_factory=list)
    """Secrets (by name, in each InferenceService's namespace) the runtime pods pull their
    images with, unless the spec names its own (`runtime.imagePullSecrets`)."""
    gpu_resource: str = "nvidia.com/gpu"
    gpu_node_selector: dict[str, str] = Field(default_factory=dict)
    gpu_tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    )
    runtime_port: int = 8080
    runtime_grpc_port: int = 8081
    """The runtime's gRPC port (container and Service port "grpc")."""
    runtime_admin_port: int = 8082
    """The runtime's admin endpoint (container port "admin"): the operator pushes batch settings
    there. Not on the Service; the InferenceService's NetworkPolicy admits the operator alone."""
    runtime_metrics_port: int = 8083
    """The runtime's /metrics (container and Service port "metrics"); the NetworkPolicy admits
    Prometheus alone (`prometheus_peers`)."""
    drain_grace_seconds: int = Field(default=25, ge=1)
    """How long a runtime pod may take to finish queued requests on SIGTERM."""
    pre_stop_sleep_seconds: int = Field(default=5, ge=0)
    """Time for endpoints to drop a terminating pod before it stops accepting requests."""
    node_loss_toleration_seconds: int = Field(default=30, ge=0, le=86400)
    """How long a runtime pod stays bound to a node that stopped answering (or reports itself
    not ready) before Kubernetes evicts it and its ReplicaSet starts a replacement elsewhere:
    Kubernetes' default is 300 s, five minutes in which the pod serves nothing and is not
    replaced. A spec that tolerates those taints itself (`runtime.tolerations`) keeps its own."""
    rollout_in_place_after_seconds: int = Field(default=120, ge=0, le=86400)
    """How long a rollout's new pod may wait unschedulable (a cluster with no GPU free for the
    surge) before the rollout replaces one replica at a time in place instead, one fewer serving
    meanwhile; only with two replicas or more. 0: never, the rollout waits for room."""
    rollout_in_place_max_services: int = Field(default=2, ge=0, le=10000)
    """How many services' rollouts may go in place at once, fleet-wide; the others wait their
    turn with their surge pods pending, every old pod serving (`rollout.in_place_turn`). An
    upgrade of the operator, or a change of a runtime-wide setting, rolls every service at once:
    on a full cluster, without a limit, every service of two replicas or more would have one
    down at the same time. 2 rather than 1: a rollout in place whose new pods never become ready
    (an image that crashes) keeps its turn until someone fixes it, and with one turn it would
    hold every other service's rollout too. 0: no limit."""

    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    prometheus_peers: list[dict[str, Any]] = Field(
        default_factory=lambda: [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
    )
    """Where Prometheus runs, as NetworkPolicyPeers: the pods every InferenceService's
    NetworkPolicy lets scrape the metrics port (empty: none)."""
    operator_namespace: str = Field(
        default_factory=lambda: os.environ.get("POD_NAMESPACE") or "default",
        description="the operator's own namespace (POD_NAMESPACE, the downward API)",
    )
    operator_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {
            "app.kubernetes.io/name": "batchpilot",
            "app.kubernetes.io/instance": "batchpilot",
            "app.kubernetes.io/component": "operator",
        }
    )
    """Labels of the operator's pods (the chart's, installed as release `batchpilot`): with
    `operator_namespace`, who the NetworkPolicies let reach the runtime's admin port."""
    namespaces: list[str] = Field(default_factory=list, description="empty: all namespaces")
    autopilot_enabled: bool = True
    """False: no InferenceService is piloted, whatever its mode — the children are reconciled,
    replicas and batch settings stay where they are. The fleet's switch for an incident or an
    upgrade of the operator; a service's own is `spec.scaling.mode`."""
    autopilot_interval_seconds: float = Field(default=15, gt=0)
    autopilot_workers: int = Field(default=8, ge=1, le=64)
    """How many services' ticks run at once in each of the autopilot's rounds (their API writes
    and pushes to pods overlap; each decision is pure and takes about a millisecond)."""
    metrics_window_seconds: int = Field(default=60, ge=10)
    pod_metrics_fallback: bool = True
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Serve the operator's own metrics (`telemetry`) on this port; 0: none (the chart: 8084)."""
    """Where Prometheus does not answer, read the ready pods' own counters on their admin port
    and add the replicas they show the load needs (never remove any on them). False: hold."""
    recent_window_seconds: int = Field(default=30, ge=2)
    """The fast signal's window: arrivals over the last this many seconds, to see a rise before
    the metrics window does. At least two Prometheus scrapes must fit in it."""
    seasonal_period_seconds: int = Field(default=86_400, ge=0)
    """The period of the traffic's recurring pattern (a day; a week is 604800): the autopilot
    plans ahead for a rise that came at this time in each of the last `seasonal_periods`
    periods. 0 turns the forecast off. Needs that much Prometheus history (retention)."""
    seasonal_periods: int = Field(default=2, ge=1, le=7)
    """How many past periods must all show a rise for it to count as a pattern."""
    seasonal_lookahead_seconds: int = Field(default=300, ge=30)
    """How far past this time, in each past period, a rise counts: at least the reaction
    horizon (two intervals and a cold start), plus the minutes a pattern drifts by."""
    utilization_source: Literal["busy", "nvml", "dcgm"] = "busy"
    """Device utilization from the runtime's busy-time counter, its NVML gauge, or DCGM."""
    reconcile_interval_seconds: float = Field(default=60, gt=0)
    """Periodic level-triggered pass, catching drift that no watch event reports."""

    leader_election: bool | None = None
    """Reconcile only while holding the Lease below, so that several replicas can run with one
    active. None: on with in-cluster credentials (in a pod), off with a kubeconfig (the sandbox,
    a laptop); `batchpilot operator run --leader-elect/--no-leader-elect` wins over both."""
    lease_name: str = "batchpilot-operator"
    lease_namespace: str = Field(
        default_factory=lambda: os.environ.get("POD_NAMESPACE") or "default",
        description="default: the pod's own namespace (POD_NAMESPACE, the downward API)",
    )
    lease_duration_seconds: int = Field(default=15, ge=1)
    """How long a standby waits, after it last saw the Lease change, before taking it over."""
    renew_deadline_seconds: float = Field(default=10, gt=0)
    """How long the leader keeps reconciling without renewing the Lease; past it, it stops and
    exits for a standby. Shorter than the lease duration: the difference is the time the old
    leader has to stop before anyone may take over."""
    retry_period_seconds: float = Field(default=2, gt=0)
    """How often a standby tries to take the Lease, and the leader renews it."""

    @model_validator(mode="after")
    def _lease_timing(self) -> Self:
        # client-go's rules (leaderelection.NewLeaderElector).
        if not self.lease_duration_seconds > self.renew_deadline_seconds:
            raise ValueError("lease_duration_seconds must be longer than renew_deadline_seconds")
        if not self.renew_deadline_seconds > 1.2 * self.retry_period_seconds:
            raise ValueError("renew_deadline_seconds must be over 1.2 × retry_period_seconds")
        return self
