"""What a perfect server could do on the simulated accelerator within the SLA.

The theoretical capacity max over b of b / (α + β·b) is a throughput at 100 % busy, where queues
grow without bound; no server meets a P99 SLA there. To tell the runtime's own losses from
queueing that no server avoids, this simulates the runtime's batching policy with zero overhead
(no HTTP, no event loop, no copies) on the same Poisson arrivals and finds the highest rate whose
P99 stays within the SLA. The policy is the runtime's: when the engine is free, the oldest
request starts a batch, which takes every request that has arrived, up to max batch size, and
waits for more until max batch size is reached or the oldest request has waited max queue delay.
Pure numpy and arithmetic; deterministic for a seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def latencies(
    rate_rps: float,
    *,
    alpha_s: float,
    beta_s: float,
    max_batch: int,
    max_delay_s: float,
    duration_s: float,
    seed: int,
) -> np.ndarray[Any, Any]:
    """Per-request latency (completion - arrival) of the ideal batching server."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, duration_s, rng.poisson(rate_rps * duration_s)))
    n = len(arrivals)
    result = np.empty(n)
    free_at = 0.0
    i = 0
    while i < n:
        oldest = float(arrivals[i])
        start = max(free_at, oldest)
        full_at = float(arrivals[i + max_batch - 1]) if i + max_batch - 1 < n else math.inf
        formed = max(start, min(oldest + max_delay_s, full_at))
        j = min(int(np.searchsorted(arrivals, formed, side="right")), i + max_batch)
        done = formed + alpha_s + beta_s * (j - i)
        result[i:j] = done - arrivals[i:j]
        free_at = done
        i = j
    return result


def p99_ms(values_s: np.ndarray[Any, Any]) -> float:
    ordered = np.sort(values_s)
    rank = max(1, math.ceil(len(ordered) * 0.99 - 1e-9))
    return float(ordered[rank - 1]) * 1e3


def max_rate_within_sla(
    *,
    alpha_s: float,
    beta_s: float,
    max_batch: int,
    max_delay_s: float,
    sla_ms: float,
    duration_s: float = 120.0,
    seeds: tuple[int, ...] = (1, 2, 3),
    precision: float = 0.002,
) -> float:
    """The highest rate at which every seed's P99 is within the SLA (bisection)."""
    capacity = max_batch / (alpha_s + beta_s * max_batch)

    def passes(rate: float) -> bool:
        return all(
            p99_ms(
                latencies(
                    rate,
                    alpha_s=alpha_s,
                    beta_s=beta_s,
                    max_batch=max_batch,
                    max_delay_s=max_delay_s,
                    duration_s=duration_s,
                    seed=seed,
                )
            )
            <= sla_ms
            for seed in seeds
        )

    low, high = 0.0, capacity
    while high - low > precision * capacity:
        mid = (low + high) / 2
        if passes(mid):
            low = mid
        else:
            high = mid
    return low
