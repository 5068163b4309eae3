"""How long one autopilot decision takes for one service: `python bench/decide_speed.py`.

Runs 300 ticks of a service whose load wanders between 500 and 620 rps (so the headroom and the
capacity search are exercised), once with the capacity answers remembered between ticks (steady
state) and once forgetting them every tick (the worst case: every capacity searched afresh).
"""

from __future__ import annotations

import time

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.service_model import LatencyFit, _sla_capacity
from batchpilot.operator.autopilot.state import State

TICKS = 300
POLICY = Policy(
    sla_p99_s=0.1,
    min_utilization=0.70,
    min_replicas=1,
    max_replicas=8,
    max_batch_size=64,
    scale_down_delay_s=300,
    max_queue_delay_s=0.005,
)
MODEL = LatencyFit(alpha_s=0.0015, beta_s=0.00225, confident=True)


def run(*, forget: bool) -> float:
    _sla_capacity.cache_clear()
    state, current = State(fit=MODEL), InForce(2, 8, 0.005)
    began = time.perf_counter()
    for k in range(TICKS):
        rate = 500.0 + (k % 7) * 20
        observation = Observation(
            at=k * 15.0,
            window_s=60,
            p99_s=0.07,
            p95_s=0.06,
            qps=rate,
            rejected_qps=0.0,
            queue_p99_s=0.01,
            utilization=0.6,
            mean_batch=6,
            compute=(ComputePoint(6, MODEL.batch_seconds(6), 1000),),
            ready_replicas=current.replicas,
            arrival_qps=rate,
            recent_qps=rate,
            recent_window_s=30,
        )
        decision, state = decide(observation, POLICY, current, state, k * 15.0)
        current = InForce(decision.replicas, decision.batch_size, decision.max_queue_delay_s)
        if forget:
            _sla_capacity.cache_clear()
    return (time.perf_counter() - began) / TICKS


if __name__ == "__main__":
    print(f"steady state: {run(forget=False) * 1e3:.2f} ms per decision")
    print(f"worst case:   {run(forget=True) * 1e3:.2f} ms per decision")
