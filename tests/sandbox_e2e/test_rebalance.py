"""The sandbox end to end, behind a Service that balances connections: replicas that join under
load get their share of kept-alive clients, because the operator asks the serving ones to retire
their connections.

The Service proxy plays kube-proxy (`service_balance="connection"`): each client connection stays
on the pod it first reached until the pod closes it. The load generator keeps a pool of kept-alive
connections, opened while one replica served, so without more a replica the autopilot adds would
get only the connections opened after it. The runtimes' own connection age is off
(`BATCHPILOT_MAX_CONNECTION_AGE_S=0`), so only the operator's `POST /admin/connections/retire`
(`ConnectionRebalancer`) can move them: once the autopilot has scaled the service out, every ready
replica must serve a real share of the requests, and the operator's log must say it asked.

Process pods (the default), not the pod host: a hosted pod has no `/admin/connections/retire`
(the host does not hand its pods their open connections).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from batchpilot.sandbox.liveview import Sample
from tests.sandbox_e2e.mlp_sandbox import mlp_service, run_mlp_sandbox, timeline
from tests.sandbox_e2e.test_demo import processes_mentioning

pytestmark = pytest.mark.slow

RPS = 45
"""t(b) = 100 + 10·b ms: at batch ≤ 4 a replica serves at most 28 rps, 21 rps inside the SLA's
headroom: 45 rps need two or three of them (test_node_loss.py's service)."""
DURATION_S = 65.0
SETTLE_S = 3.0
"""From the last replica's joining to the window measured: the retired connections have moved
by their next request (under a second at this rate), the slack is Prometheus' scrapes."""
ASKED = re.compile(r"(\d+) replica\(s\) joined; asking (\d+) serving to retire their connections")


def service() -> dict[str, Any]:
    return mlp_service(
        "rebalanced",
        scaling={"minReplicas": 1, "maxReplicas": 3, "maxBatchSize": 4},
        # Connections never retire by age: only the operator's request moves them.
        env=[{"name": "BATCHPILOT_MAX_CONNECTION_AGE_S", "value": "0"}],
    )


def final_stretch(samples: list[Sample]) -> list[Sample]:
    """The samples at the end of the run in which the replicas, all ready, did not change."""
    stretch: list[Sample] = []
    for sample in reversed(samples):
        if sample.ready != sample.desired or (
            stretch and (sample.desired, sample.ready) != (stretch[0].desired, stretch[0].ready)
        ):
            break
        stretch.insert(0, sample)
    return stretch


@pytest.mark.timeout(150)
def test_replicas_added_under_load_get_a_share_of_kept_alive_clients(
    tmp_path: Path, mlp_model: Path
) -> None:
    started = time.monotonic()
    result, lines = run_mlp_sandbox(
        tmp_path,
        mlp_model,
        service(),
        scenario=f"0:{RPS}",
        duration_s=DURATION_S,
        service_balance="connection",
    )
    operator_log = (tmp_path / "operator.log").read_text(errors="replace")
    asked = [m.group(0) for m in ASKED.finditer(operator_log)]
    log = "\n".join(lines) + f"\n\n{timeline(result)}\n\nasked: {asked}"
    assert result.load, log

    # Scaled out, and settled for a while before the end.
    stretch = final_stretch(result.samples)
    assert stretch, log
    replicas = stretch[0].ready
    assert replicas >= 2, log
    start_s, end_s = stretch[0].t_s + SETTLE_S, stretch[-1].t_s
    assert end_s - start_s >= 15, log

    # Every ready replica serves a real share: at least half of an even split.
    served = {
        pod: count
        for pod, count in result.served_between(start_s, end_s).items()
        if any(t >= end_s - 3 for t, _ in result.served_by_pod[pod])  # still there at the end
    }
    total = sum(served.values())
    shares = {pod: round(count / total, 3) for pod, count in served.items()} if total else {}
    log += f"\n\nserved from {start_s:.1f} s to {end_s:.1f} s: {served} {shares}"
    assert len(served) == replicas, log
    assert total >= 0.5 * RPS * (end_s - start_s), log
    assert all(share >= 0.5 / replicas for share in shares.values()), log
    # ... because the operator asked the serving replicas to retire their connections.
    assert asked, log

    assert result.started_pids
    assert processes_mentioning(str(tmp_path)) == []
    print(
        f"{replicas} replicas ready from {stretch[0].t_s:.1f} s; served from {start_s:.1f} s to "
        f"{end_s:.1f} s: {served}, shares {shares}; {len(asked)} asks ({asked}); "
        f"test {time.monotonic() - started:.0f} s"
    )
    assert time.monotonic() - started < 145
