"""True capacity at the SLA: the highest rate a replica serves inside it, per batch limit.

The oracle and the static baseline need to know what a replica can really carry — not what the
autopilot's model predicts, but what the simulated service does. Two measures, both by bisection
on the rate with the same random arrivals scaled to every probed rate (common random numbers,
so latency grows with the rate and the bisection converges instead of chasing noise):

- `capacity_at_sla`: long-run P99 over every request within the SLA — what
  `batchpilot loadgen --find-max` measures on the real thing;
- `interval_capacity`: at least 99 % of control intervals with their own P99 within the SLA —
  the aim the autopilot is judged by. P99 over 15 s of traffic is noisy, so this is 5-8 % below
  the long-run figure. It is measured on a pool of `POOL` replicas behind random balancing
  (a pool's P99 is less noisy than one replica's: for the textbook case this capacity is about
  2 % lower for one replica and 2 % higher for four).

With random balancing each of n replicas sees Poisson traffic at rate/n, so a fleet's capacity
follows from one replica's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from batchpilot.simulation.observe import exact_quantile
from batchpilot.simulation.service import ServiceTruth

PROBE_REQUESTS = 30_000
"""Requests per probe: 300 samples above the P99, enough for a stable estimate."""
BISECTION_STEPS = 10
"""Rate precision: the replica's saturation rate / 2^10, about 0.1 %."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """Highest per-replica rate with long-run P99 inside the SLA, for one batch limit."""

    max_batch: int
    rate: float

    def replicas_for(self, rate: float) -> float:
        """Replicas needed for `rate` (fractional; infinite if this limit cannot meet the SLA)."""
        if rate <= 0:
            return 0.0
        return rate / self.rate if self.rate > 0 else math.inf


def p99_at(
    truth: ServiceTruth, *, rate: float, max_batch: int, delay_s: float, unit: np.ndarray
) -> float:
    """Exact P99 latency of one replica under Poisson `rate` (unit-rate arrivals scaled)."""
    arrivals = unit / rate
    replica = truth.replica(max_batch=max_batch, delay_s=delay_s, capacity=len(unit))
    served = replica.serve(arrivals.tolist(), since=0.0, until=math.inf)
    ended = served.dispatched_at + served.seconds
    latency = np.repeat(ended, served.sizes) - served.arrivals + truth.overhead_s
    return exact_quantile(0.99, latency)


@lru_cache(maxsize=64)
def capacity_at_sla(
    truth: ServiceTruth, *, sla_s: float, max_batch: int, delay_s: float, seed: int = 0
) -> Capacity:
    """Bisection on the rate, between nothing and the replica's saturation B / t(B)."""
    unit = np.cumsum(np.random.default_rng(seed).exponential(size=PROBE_REQUESTS))
    low, high = 0.0, truth.capacity(max_batch)
    if p99_at(truth, rate=high * 1e-3, max_batch=max_batch, delay_s=delay_s, unit=unit) > sla_s:
        return Capacity(max_batch, 0.0)
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        p99 = p99_at(truth, rate=middle, max_batch=max_batch, delay_s=delay_s, unit=unit)
        if p99 <= sla_s:
            low = middle
        else:
            high = middle
    return Capacity(max_batch, low)


POOL = 2
INTERVAL_PROBES = 100
"""Control intervals per probe of `interval_capacity`."""
INTERVAL_STEPS = 6
"""Bisection steps between 80 % and 100 % of the long-run capacity: 0.3 % precision."""


def interval_attainment(
    truth: ServiceTruth,
    *,
    rate: float,
    max_batch: int,
    delay_s: float,
    sla_s: float,
    interval_s: float,
    streams: list[np.ndarray],
) -> float:
    """Share of intervals whose P99 is within the SLA, for a pool of replicas each at `rate`."""
    duration = INTERVAL_PROBES * interval_s
    latencies, slots = [], []
    for seed, unit in enumerate(streams):
        arrivals = unit[unit < duration * rate] / rate
        replica = truth.replica(max_batch=max_batch, delay_s=delay_s, seed=seed)
        served = replica.serve(arrivals.tolist(), since=0.0, until=math.inf)
        ended = served.dispatched_at + served.seconds
        ended = np.repeat(ended, served.sizes)
        latencies.append(ended - served.arrivals + truth.overhead_s)
        slots.append(np.floor(ended / interval_s).astype(np.int64))
    latency, slot = np.concatenate(latencies), np.concatenate(slots)
    order = np.argsort(slot, kind="stable")
    latency, slot = latency[order], slot[order]
    edges = np.searchsorted(slot, np.arange(INTERVAL_PROBES + 1))
    # The first interval is a cold start, the last may be partial: judge the ones between.
    inside = [
        exact_quantile(0.99, latency[edges[k] : edges[k + 1]]) <= sla_s
        for k in range(1, INTERVAL_PROBES - 1)
    ]
    return sum(inside) / len(inside)


@lru_cache(maxsize=64)
def interval_capacity(
    truth: ServiceTruth,
    *,
    sla_s: float,
    max_batch: int,
    delay_s: float,
    interval_s: float,
    attainment: float = 0.99,
    seed: int = 0,
) -> Capacity:
    """The highest per-replica rate at which a pool meets the SLA in `attainment` of intervals."""
    long_run = capacity_at_sla(truth, sla_s=sla_s, max_batch=max_batch, delay_s=delay_s)
    if long_run.rate <= 0:
        return long_run
    rng = np.random.default_rng(seed)
    needed = int(long_run.rate * INTERVAL_PROBES * interval_s * 1.1) + 100
    streams = [np.cumsum(rng.exponential(size=needed)) for _ in range(POOL)]
    low, high = 0.8 * long_run.rate, long_run.rate

    def attained(rate: float) -> float:
        return interval_attainment(
            truth,
            rate=rate,
            max_batch=max_batch,
            delay_s=delay_s,
            sla_s=sla_s,
            interval_s=interval_s,
            streams=streams,
        )

    if attained(low) < attainment:
        return Capacity(max_batch, low)  # noisier than this is beyond what a probe resolves
    for _ in range(INTERVAL_STEPS):
        middle = (low + high) / 2
        if attained(middle) >= attainment:
            low = middle
        else:
            high = middle
    return Capacity(max_batch, low)


def capacity_table(
    truth: ServiceTruth, *, sla_s: float, batches: list[int], delay_s: float
) -> list[Capacity]:
    return [capacity_at_sla(truth, sla_s=sla_s, max_batch=b, delay_s=delay_s) for b in batches]


def best_batch(table: list[Capacity]) -> Capacity:
    """The batch limit with the most capacity inside the SLA (the smallest on a tie)."""
    return max(table, key=lambda c: (c.rate, -c.max_batch))
