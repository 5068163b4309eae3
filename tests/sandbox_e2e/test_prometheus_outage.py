"""The sandbox end to end: Prometheus goes away, and the load triples while it is away.

A service of the simulated engine carries 15 rps on one replica; 10 s into the load Prometheus
is stopped (`--prometheus-outage`), and 15 s later the load steps to 45 rps, which needs three
replicas. With Prometheus gone the autopilot reads the pods' own counters: it must add the
replicas the step needs, saying from what, and remove none while Prometheus is away; once
Prometheus is back its answers rule again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchpilot.sandbox.up import PrometheusOutage
from tests.sandbox_e2e.mlp_sandbox import mlp_service, run_mlp_sandbox, timeline

pytestmark = pytest.mark.slow

DOWN_AT_S, DOWN_FOR_S, STEP_AT_S = 10.0, 35.0, 25.0
FROM_PODS = "Prometheus did not answer; from the pods' own metrics"


def service() -> dict[str, Any]:
    # t(b) = 100 + 10·b ms: at batch ≤ 4 a replica carries 21 rps inside 400 ms (the SLA's
    # headroom): 15 rps need one, 45 rps three.
    return mlp_service("blind", scaling={"minReplicas": 1, "maxReplicas": 4, "maxBatchSize": 4})


@pytest.mark.timeout(180)
def test_a_step_while_prometheus_is_away_gets_its_replicas(tmp_path: Path, mlp_model: Path) -> None:
    result, lines = run_mlp_sandbox(
        tmp_path,
        mlp_model,
        service(),
        scenario=f"0:15,{STEP_AT_S:g}:45",
        arrivals="uniform",
        duration_s=DOWN_AT_S + DOWN_FOR_S + 10,
        prometheus_outage=PrometheusOutage(DOWN_AT_S, DOWN_FOR_S),
    )
    log = "\n".join(lines) + f"\n\n{timeline(result)}"
    assert result.load, log
    assert result.prometheus_down is not None, log
    down, up = result.prometheus_down
    assert up is not None, log

    during = [d for d in result.decisions if down < float(d["t_s"]) <= up]
    # The step's replicas, from the pods, while Prometheus is away.
    from_pods = [d for d in during if d["reason"].startswith(FROM_PODS)]
    assert from_pods, log
    assert all(d["to"]["replicas"] > d["from"]["replicas"] for d in from_pods), log
    assert max(d["to"]["replicas"] for d in from_pods) >= 3, log
    # Nothing removed while it is away.
    assert all(d["to"]["replicas"] >= d["from"]["replicas"] for d in during), log
    # Served: by the end of the outage the replicas carry the step.
    last = [s for s in result.samples if up - 5 <= s.t_s <= up]
    assert last, log
    assert all(s.ready >= 3 for s in last), log
    print(
        f"Prometheus down {down:.1f}–{up:.1f} s; from the pods: "
        + ", ".join(
            f"{d['t_s']} s {d['from']['replicas']}→{d['to']['replicas']}" for d in from_pods
        )
    )
