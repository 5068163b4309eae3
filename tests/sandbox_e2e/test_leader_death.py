"""The sandbox end to end: the operator that leads dies, and its load rises while nobody leads.

Two operators run with leader election, as the chart runs them (`--kill-leader`). A service of
the simulated engine carries a light load on one replica; then the leader is killed with
SIGKILL (an OOM kill, its node lost), so it neither releases the Lease nor finishes what it was
doing, and a few seconds later the load more than quadruples. Nobody decides until the Lease
expires: the runtime carries what it can and refuses the rest. The standby must then take the
Lease, within the lease duration and a retry period, and its autopilot must decide at once —
within a few of its intervals, not a round later — carry on from the memory in
`status.autopilot` and add the replicas the load needs; the killed operator's replacement pod
must wait as the standby and never decide. At the end the service is back
inside its SLA, and nothing the sandbox started still runs.

The same death while Prometheus is away: the new leader has no answer from it and no read of the
pods from before; its first round reads the pods, waits its first window, and adds the replicas
from them — and removes none until Prometheus is back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from batchpilot.sandbox.up import PrometheusOutage
from tests.sandbox_e2e.mlp_sandbox import mlp_service, run_mlp_sandbox, timeline
from tests.sandbox_e2e.test_demo import processes_mentioning
from tests.sandbox_e2e.test_slow_replica import event_at

pytestmark = pytest.mark.slow

KILL_AT_S = 12.0
"""Into the load: the autopilot has a window of metrics and the one replica by then."""
STEP_AT_S = KILL_AT_S + 4
LEASE_S = 15.0
"""The Lease's duration (the operator's default, the chart's): how long the standby waits."""
RETRY_S = 2.0
AUTOPILOT_INTERVAL_S = 2.0
"""The sandbox's."""
FROM_PODS = "Prometheus did not answer; from the pods' own metrics"
BLIND_INTERVAL_S = 8.0
"""The autopilot's interval where the leader dies while Prometheus is away: long enough that a
first round which only read the pods would put the rise a whole interval after it."""


@pytest.mark.timeout(180)
def test_the_standby_takes_over_and_scales_for_the_rise(tmp_path: Path, mlp_model: Path) -> None:
    started = time.monotonic()
    # t(b) = 100 + 10·b ms at batch ≤ 4: a replica carries ~21 rps inside the SLA's headroom,
    # so 10 rps need one and 45 rps three.
    result, lines = run_mlp_sandbox(
        tmp_path,
        mlp_model,
        mlp_service("leaderless", scaling={"minReplicas": 1, "maxReplicas": 5, "maxBatchSize": 4}),
        scenario=f"0:10,{STEP_AT_S:g}:45",
        duration_s=KILL_AT_S + 60,
        kill_leader_at_s=KILL_AT_S,
    )
    events = "\n".join(f"{t:6.1f}s !! {what}" for t, what in result.operator_events)
    log = "\n".join(lines) + f"\n\n{events}\n{timeline(result)}"
    assert result.load, log

    killed_at, said = event_at(result.operator_events, "killed (SIGKILL)")
    killed = said.split()[2]
    led_at, said = event_at(result.operator_events, "holds the Lease")
    leader = said.split()[0]
    assert leader != killed, log
    # The Lease expires a lease duration after the last renewal the killed leader made (at most
    # a retry period before its death), and the standby tries once a retry period (+ the
    # sandbox's one-second look).
    assert LEASE_S - RETRY_S <= led_at - killed_at <= LEASE_S + RETRY_S + 2, log
    replaced_at, said = event_at(result.operator_events, f"started in place of {killed}")
    replacement = said.split()[0]
    assert replaced_at < led_at, log  # a new pod, a new identity: it does not take the Lease

    # Nobody decides while nobody leads (a decision the sandbox saw a second late aside) ...
    decided = [float(d["t_s"]) for d in result.decisions]
    assert not [t for t in decided if killed_at + 1.5 < t < led_at], log
    # ... and the new leader at once: its first round within a few intervals of taking the
    # Lease (kopf's start, the fleet's initial lists, one round), not an interval later. (The
    # sandbox notes the take-over and the decision in the same look: the same second.)
    rises = [
        d
        for d in result.decisions
        if float(d["t_s"]) >= led_at and d["to"]["replicas"] > d["from"]["replicas"]
    ]
    assert rises, log
    assert float(rises[0]["t_s"]) - led_at <= 3 * AUTOPILOT_INTERVAL_S + 2, log
    assert max(d["to"]["replicas"] for d in rises) >= 3, log

    # Back inside the SLA with every replica ready; the restarted operator waits, never leads.
    assert result.final_p99_ms is not None, log
    assert result.final_p99_ms <= 500, log
    status = result.status
    assert status.get("readyReplicas") == status.get("replicas") >= 3, log
    standby_log = (tmp_path / f"{replacement}.log").read_text(errors="replace")
    assert f"lease batchpilot-operator: {replacement} is a candidate" in standby_log, standby_log
    assert "leading as" not in standby_log, standby_log

    assert result.started_pids
    assert processes_mentioning(str(tmp_path)) == []
    print(
        f"killed {killed} at {killed_at:.1f} s, {leader} led at {led_at:.1f} s, "
        f"first rise decided at {rises[0]['t_s']} s; test {time.monotonic() - started:.0f} s"
    )


@pytest.mark.timeout(180)
def test_a_standby_that_takes_over_while_prometheus_is_away_scales_from_the_pods(
    tmp_path: Path, mlp_model: Path
) -> None:
    down_at_s, down_for_s = KILL_AT_S - 4, 50.0  # away from before the death to after the take-over
    result, lines = run_mlp_sandbox(
        tmp_path,
        mlp_model,
        mlp_service("blindlead", scaling={"minReplicas": 1, "maxReplicas": 5, "maxBatchSize": 4}),
        scenario=f"0:10,{STEP_AT_S:g}:45",
        arrivals="uniform",
        duration_s=KILL_AT_S + 60,
        kill_leader_at_s=KILL_AT_S,
        prometheus_outage=PrometheusOutage(down_at_s, down_for_s),
        autopilot_interval_s=BLIND_INTERVAL_S,
    )
    events = "\n".join(f"{t:6.1f}s !! {what}" for t, what in result.operator_events)
    log = "\n".join(lines) + f"\n\n{events}\n{timeline(result)}"
    assert result.load, log
    assert result.prometheus_down is not None, log
    down, up = result.prometheus_down
    assert up is not None, log
    killed_at, _ = event_at(result.operator_events, "killed (SIGKILL)")
    led_at, _ = event_at(result.operator_events, "holds the Lease")
    assert down < killed_at < led_at < up, log

    # The new leader's first rise, from the pods, within an interval of taking the Lease: its
    # first round (kopf's start and lists, a second here) reads the pods, waits a first window
    # (a third of the interval) and decides; it does not wait an interval for a second read.
    rises = [
        d
        for d in result.decisions
        if float(d["t_s"]) >= led_at and d["to"]["replicas"] > d["from"]["replicas"]
    ]
    assert rises, log
    assert rises[0]["reason"].startswith(FROM_PODS), log
    assert float(rises[0]["t_s"]) - led_at < BLIND_INTERVAL_S, log
    # Nothing removed while Prometheus is away, and the rise's replicas ready before it is back.
    during = [d for d in result.decisions if down < float(d["t_s"]) <= up]
    assert all(d["to"]["replicas"] >= d["from"]["replicas"] for d in during), log
    assert max(d["to"]["replicas"] for d in during) >= 3, log
    last = [s for s in result.samples if up - 5 <= s.t_s <= up]
    assert last, log
    assert all(s.ready >= 3 for s in last), log
    assert result.final_p99_ms is not None, log
    assert result.final_p99_ms <= 500, log
    assert processes_mentioning(str(tmp_path)) == []
    print(
        f"Prometheus down {down:.1f}–{up:.1f} s, leader killed at {killed_at:.1f} s, the standby "
        f"led at {led_at:.1f} s and added replicas from the pods at {rises[0]['t_s']} s"
    )
