"""A model of a batching inference service, to predict its operating point.

Per-batch compute time is close to linear in the batch size on accelerators: t(b) ≈ α + β·b
(α: launch and fixed overhead, β: per-row cost). The runtime exports compute time by batch-size
bucket; `fit` turns those points into α and β, with priors and sanity bounds, and `predict`
turns (α, β, load, replicas, batch limit, queue delay) into the batch size a replica will run,
its busy fraction and its P99 latency.

How a replica with the runtime's batcher behaves: after the first request of a batch arrives,
the batch dispatches when it is full, or when the queue delay has passed and the device is free.
So a cycle lasts c = max(D, t(b)), a batch holds the b = λ·c requests that arrived during the
cycle (at most B), and a request waits at most one cycle and then its own batch: P99 ≈ c + t(b₉₉)
with b₉₉ the 99th percentile of a Poisson batch. When b₉₉ reaches B the replica is near its
capacity B / t(B), and requests start waiting for several cycles: an M/D/1-like queueing term
t(B)·ρ/(1-ρ) is added, which grows without bound as ρ = λ·t(B)/B approaches 1.

The prediction is a model, not the truth: the decision function multiplies it by a calibration
factor learned from observed P99 and falls back to feedback when the fit is poor.

Pure: arithmetic only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from batchpilot.operator.autopilot.observation import ComputePoint

Z99 = 2.33
"""Normal 99th percentile: a Poisson batch of mean b exceeds b + 2.33·√b 1 % of the time."""
MIN_BATCHES = 20
"""Buckets with fewer batches in the window are too noisy to fit."""
SMOOTHING = 0.5
"""Weight of a new fit against the previous one."""


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """t(b) = α + β·b, in seconds. `confident`: fitted from at least two distinct batch sizes."""

    alpha_s: float
    beta_s: float
    confident: bool

    def batch_seconds(self, batch: float) -> float:
        return self.alpha_s + self.beta_s * batch

    def capacity(self, max_batch: int) -> float:
        """Requests per second one replica serves at full batches of `max_batch`."""
        return max_batch / self.batch_seconds(max_batch)


def fit(points: Sequence[ComputePoint], prior: LatencyFit | None) -> LatencyFit | None:
    """α and β from this window's compute points, smoothed with the previous fit.

    With points at two or more distinct batch sizes: weighted least squares (weights: batches).
    With one batch size only, α and β cannot be told apart: keep the prior's β if it was
    confident, otherwise split the time evenly (α = β·b), and say the fit is not confident.
    Fits that make no physical sense (β ≤ 0, α < 0) are clipped.
    """
    usable = [p for p in points if p.batches >= MIN_BATCHES and p.mean_seconds > 0]
    if not usable:
        return prior
    weight = sum(p.batches for p in usable)
    mean_b = sum(p.batches * p.mean_batch for p in usable) / weight
    mean_t = sum(p.batches * p.mean_seconds for p in usable) / weight
    spread = max(p.mean_batch for p in usable) / min(p.mean_batch for p in usable)
    if len(usable) >= 2 and spread >= 1.5:
        var = sum(p.batches * (p.mean_batch - mean_b) ** 2 for p in usable)
        cov = sum(p.batches * (p.mean_batch - mean_b) * (p.mean_seconds - mean_t) for p in usable)
        beta = cov / var
        alpha = mean_t - beta * mean_b
        if beta <= 0:  # bigger batches no slower: compute is negligible next to overhead
            beta, alpha = mean_t * 1e-3 / mean_b, mean_t * 0.999
        if alpha < 0:  # no fixed overhead visible: all per-row cost
            alpha, beta = 0.0, mean_t / mean_b
        new = LatencyFit(alpha_s=alpha, beta_s=beta, confident=True)
    elif prior is not None and prior.confident:
        beta = min(prior.beta_s, mean_t / mean_b)
        new = LatencyFit(alpha_s=mean_t - beta * mean_b, beta_s=beta, confident=True)
    else:
        new = LatencyFit(alpha_s=mean_t / 2, beta_s=mean_t / (2 * mean_b), confident=False)
    if prior is None:
        return new
    return LatencyFit(
        alpha_s=SMOOTHING * new.alpha_s + (1 - SMOOTHING) * prior.alpha_s,
        beta_s=SMOOTHING * new.beta_s + (1 - SMOOTHING) * prior.beta_s,
        confident=new.confident,
    )


@dataclass(frozen=True, slots=True)
class Prediction:
    batch: float
    """Mean rows per batch a replica will run."""
    utilization: float
    """Device busy fraction of a replica."""
    load: float
    """Arrival rate over capacity at full batches: above 1 the queue grows without bound."""
    p99_s: float
    """Predicted P99 latency (math.inf when overloaded)."""


def predict(
    model: LatencyFit, *, rate: float, replicas: int, max_batch: int, delay_s: float
) -> Prediction:
    """The steady state of `replicas` replicas sharing `rate` requests per second."""
    per_replica = rate / replicas
    full = model.batch_seconds(max_batch)
    load = per_replica * full / max_batch
    if per_replica <= 0:
        return Prediction(
            batch=1.0, utilization=0.0, load=0.0, p99_s=delay_s + model.batch_seconds(1)
        )
    if load >= 1:
        return Prediction(batch=max_batch, utilization=1.0, load=load, p99_s=math.inf)
    # Batch size where the cycle is the compute itself: b = λ·t(b) → b = λα / (1 - λβ).
    busy_batch = (
        per_replica * model.alpha_s / (1 - per_replica * model.beta_s)
        if per_replica * model.beta_s < 1
        else max_batch
    )
    batch = min(max_batch, max(1.0, per_replica * delay_s, busy_batch))
    cycle = max(delay_s, model.batch_seconds(batch)) if max_batch > 1 else model.batch_seconds(1)
    utilization = min(1.0, per_replica * model.batch_seconds(batch) / batch)
    tail_batch = batch + Z99 * math.sqrt(batch)
    p99 = cycle + model.batch_seconds(min(max_batch, tail_batch))
    if tail_batch >= max_batch:
        p99 += full * load / (1 - load)
    return Prediction(batch=batch, utilization=utilization, load=load, p99_s=p99)
