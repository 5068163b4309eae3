"""The sandbox end to end: one replica turns slow, and the autopilot replaces it.

A service of the simulated engine runs three replicas (its minimum) under an even load the
three carry with room to spare. Then the device of one of them throttles (`--throttle-pod`: its
runtime gets SIGUSR1), as a GPU at its power or thermal limit does: its batches take twice as
long as its peers'. Prometheus scrapes each pod under its own name; the autopilot must find
that pod slower than its peers and delete it through the API, and remember it replaced it; the
pod runner, as its kubelet, stops it, and the ReplicaSet makes another; every replica of the
service is ready again, none of them the throttled one. Then nothing the sandbox started may
still run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.sandbox_e2e.mlp_sandbox import mlp_service, run_mlp_sandbox, timeline
from tests.sandbox_e2e.test_demo import processes_mentioning

pytestmark = pytest.mark.slow

THROTTLE_AT_S = 25.0
"""Into the load: the autopilot has learned t(b) and settled by then."""


def event_at(events: list[tuple[float, str]], text: str) -> tuple[float, str]:
    (found,) = [(t, what) for t, what in events if text in what]
    return found


@pytest.mark.timeout(180)
def test_the_autopilot_replaces_a_throttled_replica(tmp_path: Path, mlp_model: Path) -> None:
    started = time.monotonic()
    result, lines = run_mlp_sandbox(
        tmp_path,
        mlp_model,
        mlp_service("slow-one", scaling={"minReplicas": 3, "maxReplicas": 5, "maxBatchSize": 4}),
        scenario="0:30",
        arrivals="uniform",
        duration_s=THROTTLE_AT_S + 45,
        throttle_at_s=THROTTLE_AT_S,
    )
    log = "\n".join(lines) + f"\n\n{timeline(result)}\n{result.status.get('autopilot')}"
    assert result.load, log

    throttled_at, said = event_at(result.node_events, "its device throttles")
    pod = said.split(":")[0].removeprefix("pod ")
    deleted = [t for t, what in result.node_events if what == f"pod {pod}: deleted through the API"]
    assert len(deleted) == 1, log
    deleted_at = deleted[0]
    # Found slow and replaced within a window or two (10 s here) and a decision or two, the
    # autopilot's own record saying so. (Its reasons name the pod at every decision, but the
    # run records only the decisions that changed something: tests/autopilot/test_pilot.py
    # reads the words.)
    assert 0 < deleted_at - throttled_at < 35, log
    replaced = result.status.get("autopilot", {}).get("stragglers", {}).get("replaced", [])
    assert [p for p, _ in replaced] == [pod], log

    # Every replica ready again (three, or four where the feedback added one while the slow
    # replica's requests were late), the throttled pod not among them.
    after = [s for s in result.samples if s.t_s > deleted_at]
    assert any(s.ready == s.desired >= 3 for s in after), log
    status = result.status
    assert status.get("readyReplicas") == status.get("replicas"), log

    assert result.started_pids
    assert processes_mentioning(str(tmp_path)) == []
    print(
        f"throttled {pod} at {throttled_at:.1f} s, deleted {deleted_at:.1f} s; "
        f"test {time.monotonic() - started:.0f} s"
    )
