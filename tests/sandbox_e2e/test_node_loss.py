"""The sandbox end to end: a node dies under a service's replicas, and the autopilot stands in.

A service of the simulated engine is scaled by the autopilot to the three replicas its load
needs; then the node of one of them dies (`--lose-node`). Its pod answers nothing, is marked not
Ready after the node controller's notice (5 s here, 40 s on a default cluster), and is evicted,
and so replaced, only when its toleration of the unreachable taint runs out: 75 s here, long
enough that the replacement must come from the autopilot, not from the eviction. The autopilot
must ask for a fourth replica in its place — at once where the replicas left miss the SLA (what
was sent to the lost pod until it went not Ready failed: here about 1 % of the window, at the
tolerance), or once it has been away longer than a restart takes (`lost.grace_s`: a minute, the
cold start being learned short) — naming the stand-in in its reason; the stand-in must become
ready before the eviction, by either path; after the eviction every replica must be ready again.
Then nothing the sandbox started may still run, the frozen process included.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from batchpilot.sandbox.nodes import NodeLoss
from batchpilot.sandbox.up import SandboxResult
from tests.sandbox_e2e.mlp_sandbox import mlp_service, run_mlp_sandbox, timeline
from tests.sandbox_e2e.test_demo import processes_mentioning

pytestmark = pytest.mark.slow

LOST_AT_S = 40.0
"""Into the load: the autopilot has scaled to three replicas by then."""
NOTICE_S = 5.0
TOLERATION_S = 75
STAND_IN = "more in place of 1 replica ready before and not for"


def service() -> dict[str, Any]:
    # t(b) = 100 + 10·b ms: at batch ≤ 4 a replica serves at most 4 / 140 ms = 28 rps, 21 rps
    # inside 400 ms (the SLA's headroom), so 45 rps need three of them, with the load's headroom
    # too (not four: the plan must not have a replica to spare, or the stand-in would be in
    # force already). Requests of the small MLP's rows keep the machine's load low.
    unreachable = {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION_S}
    return mlp_service(
        "lost-node",
        scaling={"minReplicas": 1, "maxReplicas": 5, "maxBatchSize": 4},
        # The eviction comes from the pods' own toleration, as on a cluster.
        tolerations=[
            {"key": "node.kubernetes.io/unreachable", **unreachable},
            {"key": "node.kubernetes.io/not-ready", **unreachable},
        ],
    )


def event_at(result: SandboxResult, text: str) -> float:
    (found,) = [t for t, what in result.node_events if text in what]
    return found


@pytest.mark.timeout(210)
def test_the_autopilot_stands_in_for_a_replica_on_a_lost_node(
    tmp_path: Path, mlp_model: Path
) -> None:
    started = time.monotonic()
    result, lines = run_mlp_sandbox(
        tmp_path,
        mlp_model,
        service(),
        scenario="0:45",
        # Evenly spaced: a Poisson second of 60 rps reads as a rise and plans a fourth replica
        # (a spare, for the scale-down delay) that the loss would then not need to be stood in.
        arrivals="uniform",
        duration_s=LOST_AT_S + NOTICE_S + TOLERATION_S + 15,
        lose_node=NodeLoss(LOST_AT_S, 1, notice_s=NOTICE_S),
    )
    log = "\n".join(lines) + f"\n\n{timeline(result)}\n{result.status.get('autopilot')}"
    assert result.load, log

    lost_at = event_at(result, "its node stops answering")
    not_ready_at = event_at(result, "not Ready (NodeNotReady)")
    evicted_at = event_at(result, "evicted and deleted")
    # Kubernetes' timeline: the notice, then the pod's toleration.
    assert NOTICE_S - 1 <= not_ready_at - lost_at <= NOTICE_S + 1.5, log
    assert TOLERATION_S - 1 <= evicted_at - not_ready_at <= TOLERATION_S + 1.5, log

    # Settled at three, all ready, when the node went.
    before = [s for s in result.samples if lost_at - 5 <= s.t_s < lost_at]
    assert before, log
    assert all((s.desired, s.ready) == (3, 3) for s in before), log
    # Then one replica short, and nothing replaced it: the Deployment still counts it.
    assert any(s.ready == 2 for s in result.samples if s.t_s > not_ready_at), log

    # The stand-in: asked for by the autopilot, in those words, well before the eviction.
    stand_ins = [d for d in result.decisions if STAND_IN in d.get("reason", "")]
    assert stand_ins, log
    first = stand_ins[0]
    asked_at = float(first["t_s"])
    assert (first["from"]["replicas"], first["to"]["replicas"]) == (3, 4), log
    assert not_ready_at < asked_at < evicted_at, log
    # ... and ready before the eviction: four in force, three of them serving.
    ready_at = next(
        (s.t_s for s in result.samples if asked_at <= s.t_s and (s.desired, s.ready) == (4, 3)),
        None,
    )
    assert ready_at is not None, log
    assert ready_at < evicted_at, log

    # After the eviction the lost pod is replaced, and every replica is ready again.
    after = [s for s in result.samples if s.t_s > evicted_at]
    assert any(s.ready == s.desired >= 3 for s in after), log
    status = result.status
    assert status.get("readyReplicas") == status.get("replicas"), (status, log)

    # Nothing left behind, the frozen process included.
    assert result.started_pids
    assert processes_mentioning(str(tmp_path)) == []
    print(
        f"loss {lost_at:.1f} s, not Ready {not_ready_at:.1f} s, stand-in asked {asked_at:.1f} s "
        f"({first['reason']}), ready {ready_at:.1f} s, evicted {evicted_at:.1f} s; "
        f"test {time.monotonic() - started:.0f} s"
    )
    assert time.monotonic() - started < 195
