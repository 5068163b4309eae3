"""The runtime's settings: environment variables (BATCHPILOT_*), overridden by CLI flags.

In a pod the operator sets these through the Deployment's env and args; on a laptop the CLI
flags are enough. The InferenceService name and namespace label every metric series.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from batchpilot.api.batching import ASYNC_DEADLINE_MAX_S, ASYNC_DEADLINE_S

DRAIN_PARTS = {
    "drain_linger_s": "the linger is the end of the drain",
    "async_drain_hold_s": "the hold is part of the drain",
}
"""The settings that are parts of the drain, each no longer than its grace, and why."""


class RuntimeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATCHPILOT_", extra="ignore")

    model_path: Path = Field(description="ONNX model file")
    model_name: str = Field(default="", description="name in the v2 API; default: file stem")
    model_variant: Literal["original", "fp16", "int8"] = Field(
        default="original",
        description="serve <stem>.<variant>.onnx beside the model (made by `batchpilot optimize`)",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="gRPC (Open Inference Protocol v2) port; off: None",
    )
    admin_port: int = Field(
        default=8082,
        ge=0,
        le=65535,
        description="port of the admin endpoint (PUT /admin/batching), on the same host; the "
        "inference port never answers it",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="port of GET /metrics alone; None: /metrics on the inference port",
    )

    engine: Literal["onnx", "simulated", "torch"] = Field(
        default="onnx",
        description="onnx: onnxruntime; torch: a TorchScript or torch.export program (the torch "
        "extra); simulated: an accelerator's timing without one",
    )
    simulated_latency: str = Field(
        default="alpha_ms=5,beta_ms=1", description="t(b) of the simulated accelerator"
    )
    device: Literal["auto", "cpu", "gpu"] = "auto"
    intra_op_threads: int = Field(default=0, ge=0)
    inter_op_threads: int = Field(default=0, ge=0)
    graph_optimization: Literal["disabled", "basic", "extended", "all"] = "all"
    accelerator: Literal["default", "tensorrt"] = Field(
        default="default",
        description="tensorrt: onnxruntime's TensorRT provider first, where a GPU and it exist",
    )
    tensorrt_cache_dir: Path | None = Field(
        default=None, description="TensorRT engine cache; default: <tmp>/batchpilot-tensorrt"
    )
    instances: int = Field(
        default=1, ge=1, le=16, description="model instances: batches that may run at once"
    )

    max_batch_size: int = Field(default=8, ge=1)
    calibration_rows: int | None = Field(
        default=None,
        ge=1,
        description="rows of the larger batch timed at start-up (64 at most): the largest batch "
        "limit this server may be given; default: the batch limit at start",
    )
    burst_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="the largest batch a backlog of more rows than the limit may run at once, "
        "each request still in time (deadline admission only); default: never above the limit",
    )
    max_queue_delay_ms: float = Field(default=5.0, ge=0, le=10_000)
    early_start: bool = Field(
        default=True,
        description="start a batch before its delay is up once as many requests are outstanding "
        "as the most held at once recently (a closed loop's clients all queued); false: every "
        "batch fills or waits out its delay, as Triton's does",
    )
    queue_capacity: int = Field(default=1024, ge=1, description="requests waiting, at most")
    deadline_ms: float = Field(
        default=1000.0,
        ge=0,
        le=3_600_000,
        description="deadline of a request that does not set its own, from its arrival (0: "
        "none); the operator sets it from the SLA",
    )
    admission: Literal["deadline", "queue"] = Field(
        default="deadline",
        description="deadline: refuse at arrival what cannot finish in time; queue: the queue "
        "bound only",
    )
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="request line and headers of a request, at most; more: 431",
    )
    header_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="time from a request's first byte to the end of its headers; more: 408",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="longest pause between bytes of a request's body; more: 408",
    )
    min_body_bytes_per_s: int = Field(
        default=1024,
        ge=0,
        description="once a request's body has taken 5 s, the slowest it may have come on "
        "average, in bytes a second; slower: 408 (0: any)",
    )
    write_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="longest an answer may wait for its client to read any of it; more: the "
        "connection is closed",
    )
    keep_alive_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="how long a connection may sit without a request before it is closed",
    )
    max_connection_age_s: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="an HTTP connection this old (±10 %) is closed after its next answer, which "
        "says Connection: close, and a gRPC connection gets GOAWAY (at most half "
        "drain_grace_s: a drain lets gRPC connections go by age), so that clients reconnect "
        "and the Service spreads them over replicas added since (0: never)",
    )
    max_connections: int = Field(
        default=4096,
        ge=0,
        description="open HTTP connections on the inference port beyond which a request there "
        "gets 503 and its connection closes; the admin and metrics ports are not held to it "
        "(0: no limit)",
    )
    batching_config: Path | None = Field(
        default=None, description="JSON file with maxBatchSize/maxQueueDelayMs, re-read on change"
    )
    config_poll_s: float = Field(default=1.0, gt=0)
    api_keys: Path | None = Field(
        default=None,
        description="folder of API keys, one file per key named by its key id (a mounted "
        "Secret); set: inference needs a key; re-read on change",
    )
    access_config: Path | None = Field(
        default=None,
        description="the access document (allowed key ids, quotas), re-read on change; needs "
        "api_keys",
    )
    admin_token: SecretStr | None = None
    admin_token_file: Path | None = None
    drain_grace_s: float = Field(default=25.0, ge=0)
    drain_linger_s: float = Field(
        default=1.0,
        ge=0,
        description="on SIGTERM, how long the port stays open after the queue is empty, answering "
        "503; part of drain_grace_s",
    )
    async_drain_hold_s: float = Field(
        default=20.0,
        ge=0,
        description="on SIGTERM, how long the port stays open, from the signal, while finished "
        "async results have not been fetched (the other replicas pass fetches on here); part of "
        "drain_grace_s",
    )
    pipeline_config: Path | None = Field(
        default=None,
        description="JSON pre/post-processing pipeline (spec.pipeline of the InferenceService)",
    )
    pipeline_threads: int = Field(
        default=0, ge=0, le=256, description="threads for pre/post-processing (0: CPU count)"
    )
    async_result_ttl_s: float = Field(
        default=300.0, gt=0, le=86_400, description="how long a finished async result is kept"
    )
    async_capacity: int = Field(
        default=1024, ge=1, le=1_000_000, description="async jobs stored (pending or finished)"
    )
    async_max_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1,
        description="bytes of async results stored before submits get 429 too",
    )
    async_deadline_s: float = Field(
        default=ASYNC_DEADLINE_S,
        gt=0,
        le=ASYNC_DEADLINE_MAX_S,
        description="deadline of an async job that sets no timeout of its own, from its submit",
    )

    advertise_host: str = Field(
        default="",
        description="this replica's address as the other replicas of its service reach it (the "
        "pod IP; the operator sets it): with an admin token, async job ids name it, and a fetch of "
        "a job that reaches another replica is passed on here; empty: async results are fetched "
        "from the replica that took the job",
    )

    isvc_name: str = Field(default="", description="InferenceService this pod serves")
    isvc_namespace: str = Field(default="", description="its namespace")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _defaults(self) -> RuntimeSettings:
        ports = {
            "port": self.port,
            "grpc_port": self.grpc_port,
            "admin_port": self.admin_port,
            "metrics_port": self.metrics_port,
        }
        taken: dict[int, str] = {}
        for name, number in ports.items():
            if not number:  # unset, or 0: a free port the system picks
                continue
            if number in taken:
                raise ValueError(
                    f"{taken[number]} and {name} are both {number}: each listener needs a port "
                    "of its own"
                )
            taken[number] = name
        if self.access_config is not None and self.api_keys is None:
            raise ValueError(
                "access_config (allowed key ids and quotas) needs api_keys: the keys it is about"
            )
        if not self.model_name:
            self.model_name = self.model_path.stem
        # Parts of the drain fit inside its grace: set by hand, refused; a default, shrunk to it.
        for part, why in DRAIN_PARTS.items():
            seconds = getattr(self, part)
            if seconds <= self.drain_grace_s:
                continue
            if part in self.model_fields_set:
                raise ValueError(
                    f"{part} ({seconds:g} s) must fit inside drain_grace_s "
                    f"({self.drain_grace_s:g} s): {why}"
                )
            setattr(self, part, self.drain_grace_s)
        return self

    def token(self) -> str | None:
        """The admin token, from the variable or from a mounted Secret file."""
        if self.admin_token is not None:
            return self.admin_token.get_secret_value()
        if self.admin_token_file is not None:
            return self.admin_token_file.read_text().strip() or None
        return None
