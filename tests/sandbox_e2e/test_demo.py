"""The sandbox end to end: `batchpilot sandbox up` run programmatically on a short scenario.

A service starts outside its SLA — batch 1, one replica, offered about twice what one replica
carries at batch 1 and all that its largest batch carries, even for a backlog — and the
autopilot must bring it inside: at the end SLAMet=True, the P99
the load generator measured over the final seconds is within the SLA, and every request either
succeeded or was shed with a counted 503. Then nothing the sandbox started may still run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from batchpilot.runtime.loadgen import SHED_KINDS
from batchpilot.sandbox.up import SandboxOptions, run_sandbox

pytestmark = pytest.mark.slow

SLA_MS = 150.0


def service() -> dict[str, Any]:
    # t(b) = 20 + 2·b ms: 45 rps per replica at batch 1, 83 rps at batch 2, the most a batch
    # takes (`maxBatchSize`, the runtime's burst size too): 80 rps need the second replica.
    return {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "overloaded", "namespace": "default"},
        "spec": {
            "model": {"uri": "file:///models/resnet50-signature.onnx"},
            "runtime": {
                "device": "cpu",
                "engine": "simulated",
                "simulatedLatency": {"alphaMs": 20, "betaMs": 2},
            },
            "sla": {"latencyP99Ms": SLA_MS},
            "scaling": {"minReplicas": 1, "maxReplicas": 2, "maxBatchSize": 2},
            "batching": {"batchSize": 1, "maxQueueDelayMs": 2},
        },
    }


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(f"{cmdline.parent.name}: {args[:200]}")
    return found


@pytest.mark.timeout(175)
def test_the_autopilot_brings_an_overloaded_service_inside_its_sla(tmp_path: Path) -> None:
    started = time.monotonic()
    lines: list[str] = []
    result = run_sandbox(
        SandboxOptions(
            service=service(),
            scenario="0:80",  # ~1.8x the batch-1 capacity of one replica, from the start
            duration_s=60,
            workdir=tmp_path,
            start_delay_s=1.0,
            plot=tmp_path / "run.png",
        ),
        out=lines.append,
    )
    log = "\n".join(lines)
    load = result.load
    assert load, f"no load report; output:\n{log}"

    # Outside the SLA at first: the overload is real and batch 1 was the starting point.
    assert any(s.sla_met == "False" for s in result.samples), log
    assert result.decisions, log
    assert result.decisions[0]["from"] == {"replicas": 1, "batchSize": 1}, log
    # Inside at the end.
    conditions = {c["type"]: c["status"] for c in result.status.get("conditions", [])}
    assert conditions.get("SLAMet") == "True", log
    assert result.final_p99_ms is not None, log
    assert result.final_p99_ms <= SLA_MS, log
    # Every request accounted for: succeeded, refused at once with a counted 503, or (a few
    # admitted ones that still missed their deadline) answered 504.
    assert set(load["errors"]) <= {*SHED_KINDS, "504"}, load["errors"]
    assert load["failed"] <= 0.01 * load["scheduled"], (load["errors"], log)
    assert load["succeeded"] + load["shed"] + load["failed"] == load["scheduled"], load
    # The overload at the start is refused at once rather than queued into a collapse, and the
    # summary says how many, and how the admitted requests fared.
    assert load["shed"] > 0, log
    assert "refused at once while capacity caught up" in log, log
    assert "the runtimes shed, by reason: " in log, log
    assert "admitted requests' latency over the run" in log, log
    assert (tmp_path / "run.png").stat().st_size > 10_000
    # The operator's own metrics, scraped as the chart's PodMonitor has them scraped: it led,
    # ran autopilot rounds over the one service, and counted the Events it posted.
    operator = result.operator_metrics
    assert operator.get("batchpilot_operator_active") == 1, operator
    assert operator.get("batchpilot_operator_autopilot_rounds_total", 0) > 10, operator
    assert operator.get("batchpilot_operator_autopilot_services") == 1, operator
    assert operator.get("batchpilot_operator_events_total", 0) >= 1, operator
    assert operator.get("batchpilot_operator_prometheus_up") == 1, operator

    # Nothing left behind.
    assert result.started_pids
    assert processes_mentioning(str(tmp_path)) == []
    assert time.monotonic() - started < 180
