"""One way for an end-to-end test to run the sandbox on a service of the small MLP model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from batchpilot.sandbox.up import SandboxOptions, SandboxResult, run_sandbox


def run_mlp_sandbox(
    tmp_path: Path, mlp_model: Path, service: dict[str, Any], **options: Any
) -> tuple[SandboxResult, list[str]]:
    """`run_sandbox` on `service` (its model at `file:///models/mlp.onnx`, a copy of
    `mlp_model`), working in `tmp_path`, pods ready a second after they start, with `options`;
    its result and the lines it printed."""
    (tmp_path / "models").mkdir()
    shutil.copy(mlp_model, tmp_path / "models" / "mlp.onnx")
    lines: list[str] = []
    result = run_sandbox(
        SandboxOptions(service=service, workdir=tmp_path, start_delay_s=1.0, **options),
        out=lines.append,
    )
    return result, lines


def timeline(result: SandboxResult) -> str:
    """What befell the run's pods, the autopilot's decisions and the replicas a second, in time
    order: for a failing assertion's message."""
    rows = [(e_t, f"!! {what}") for e_t, what in result.node_events]
    rows += [
        (float(d["t_s"]), f">> {d['from']['replicas']}→{d['to']['replicas']}: {d['reason']}")
        for d in result.decisions
    ]
    rows += [(s.t_s, f"   replicas {s.desired}/{s.ready}") for s in result.samples]
    return "\n".join(f"{t:6.1f}s {what}" for t, what in sorted(rows, key=lambda r: r[0]))


def mlp_service(
    name: str,
    *,
    scaling: dict[str, Any],
    alpha_ms: float = 100,
    beta_ms: float = 10,
    device: str = "cpu",
    namespace: str = "default",
    batching: dict[str, Any] | None = None,
    **runtime: Any,
) -> dict[str, Any]:
    """An InferenceService of the simulated engine, t(b) = `alpha_ms` + `beta_ms`·b, serving the
    small MLP's signature with a 500 ms SLA; `runtime` adds to its spec.runtime (env,
    tolerations)."""
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "file:///models/mlp.onnx"},
            "runtime": {
                "device": device,
                "engine": "simulated",
                "simulatedLatency": {"alphaMs": alpha_ms, "betaMs": beta_ms},
                **runtime,
            },
            "sla": {"latencyP99Ms": 500},
            "scaling": scaling,
            "batching": batching or {"batchSize": 4, "maxQueueDelayMs": 10},
        },
    }
