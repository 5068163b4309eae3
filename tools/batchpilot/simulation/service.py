"""The simulated service: per-batch device time t(b) = α + β·b plus a fixed non-device latency.

The simulator needs a ground truth to serve batches with; this is it. It is deliberately the same
shape as the autopilot's service model (and as the runtime's simulated engine), so the question a
simulation answers is "does the control loop find and hold the operating point?", not "is the
linear model right?". Two things the autopilot's model does not know are part of the truth here:
the non-device latency every request pays (decoding, pre- and post-processing, serialisation —
`overhead_s`), and the queueing of real Poisson traffic.

The textbook case (ResNet-50 on one A10, `reference/` and DESIGN.md) is fitted in `TEXTBOOK`:

- GPU utilization is the device's busy fraction, so busy seconds per request are
  utilization / QPS. At batch 1: t(1) = 0.32 / 85 = 3.76 ms. At batch 8 (full batches, which is
  what 78 % at 320 QPS needs: 40 batches/s × 19.5 ms = 78 %): t(8) = 0.78 × 8 / 320 = 19.5 ms.
  So β = (19.5 − 3.76) / 7 = 2.25 ms and α = 3.76 − 2.25 = 1.52 ms.
- Latency is not device time: at batch 1 the device takes 3.8 ms of a 45 ms P99. The rest is
  work outside the device (the case reports 55 % CPU). A fixed 40 ms overhead reproduces both
  points: batch 1, P99 ≈ 40 + 3.8 + one request ahead (3.8) ≈ 47 ms (45 reported); batch 8 with
  full batches formed over 25 ms, P99 ≈ 40 + 25 + 19.5 ≈ 85 ms (85 reported).
- Consequences: one replica serves at most 1 / 3.76 ms = 266 rps at batch 1 (so 300 rps at
  batch 1 overloads it) and 8 / 19.5 ms = 410 rps at batch 8; the device's share of the 100 ms
  SLA is 60 ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from batchpilot.api.request_rows import RowMix
from batchpilot.simulation.replica import Replica
from batchpilot.simulation.sized import SizedReplica

MAX_CV = 2.0
"""Beyond this a batch's time is not t(b) with noise but something else."""


@dataclass(frozen=True, slots=True)
class ServiceTruth:
    """What one replica really does: t(b) = α + β·b on the device for a batch of b rows, plus
    `overhead_s` per request outside it (in parallel, never queued: the CPU side is not the
    bottleneck here); and what its callers send: `rows_per_request` rows in every request (a
    client that batches on its side). The batch limit counts rows, as the runtime's does: a
    batch holds as many whole requests as fit in it, and at least one. `cv`: how much a batch's
    time varies around t(b) (its coefficient of variation; 0: every batch takes exactly t(b))."""

    alpha_s: float
    beta_s: float
    overhead_s: float = 0.0
    rows_per_request: int = 1
    cv: float = 0.0
    row_mix: RowMix | None = None
    """Requests of varied rows, drawn from this mix (`rows_per_request` then 1): its replicas
    count in rows (`sized.SizedReplica`). None: every request brings `rows_per_request`."""

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or self.beta_s < 0 or self.overhead_s < 0:
            raise ValueError("alpha, beta and overhead must not be negative")
        if self.alpha_s + self.beta_s <= 0:
            raise ValueError("a batch must take some time: alpha + beta must be positive")
        if self.rows_per_request < 1:
            raise ValueError("a request carries at least one row")
        if not 0 <= self.cv <= MAX_CV:
            raise ValueError(f"cv is the batch time's spread around t(b), 0 to {MAX_CV}")
        if self.row_mix is not None and self.rows_per_request != 1:
            raise ValueError("rows a request: one size (rows_per_request) or a mix, not both")

    def batch_seconds(self, rows: float) -> float:
        return self.alpha_s + self.beta_s * rows

    @property
    def mean_rows(self) -> float:
        """The mean rows a request brings."""
        return self.row_mix.mean if self.row_mix is not None else float(self.rows_per_request)

    def replica_limit(self, max_batch: int) -> int:
        """What a replica's batch limit counts for a limit of `max_batch` rows: rows where they
        vary (`SizedReplica`), else the whole requests they hold."""
        return max_batch if self.row_mix is not None else self.requests_per_batch(max_batch)

    def requests_per_batch(self, max_batch: int) -> int:
        """Whole requests a batch limit of `max_batch` rows holds (a larger request runs alone)."""
        return max(1, max_batch // self.rows_per_request)

    @property
    def request_beta_s(self) -> float:
        """Device time one more request adds to a batch: β for each of its rows."""
        return self.beta_s * self.rows_per_request

    @property
    def replica_beta_s(self) -> float:
        """β as a replica of this service counts it: per row where the rows vary, else per
        request."""
        return self.beta_s if self.row_mix is not None else self.request_beta_s

    def replica(self, *, max_batch: int, delay_s: float, **options: Any) -> Replica | SizedReplica:
        """A replica of this service, counting in requests: its batch limit is the requests
        `max_batch` rows hold (`requests_per_batch`, as the cluster sets it again when the limit
        changes), a request costs `request_beta_s`. Where the rows vary, counting in rows
        (`SizedReplica`; a `burst` option in rows too). `seed`: its batch times' draws, where
        they vary, and its requests' rows."""
        if self.row_mix is not None:
            return SizedReplica(
                alpha_s=self.alpha_s,
                beta_s=self.beta_s,
                mix=self.row_mix,
                max_batch=max_batch,
                delay_s=delay_s,
                cv=self.cv,
                **options,
            )
        return Replica(
            alpha_s=self.alpha_s,
            beta_s=self.request_beta_s,
            max_batch=self.requests_per_batch(max_batch),
            delay_s=delay_s,
            cv=self.cv,
            **options,
        )

    def capacity(self, max_batch: int) -> float:
        """Requests per second one replica serves with full batches of `max_batch` rows (where
        the rows vary, batches the batcher fills to the limit)."""
        if self.row_mix is not None:
            return max_batch / self.row_mix.mean / (self.alpha_s + self.beta_s * max_batch)
        n = self.requests_per_batch(max_batch)
        return n / (self.alpha_s + self.request_beta_s * n)

    def describe(self) -> str:
        text = f"t(b) = {self.alpha_s * 1e3:.3g} + {self.beta_s * 1e3:.3g}·b ms"
        if self.overhead_s:
            text += f", +{self.overhead_s * 1e3:.3g} ms outside the device"
        if self.rows_per_request > 1:
            text += f", {self.rows_per_request} rows a request"
        if self.row_mix is not None:
            text += f", {self.row_mix.describe()}"
        if self.cv:
            text += f", batch times ±{self.cv:.0%} (cv)"
        return text

    @classmethod
    def parse(cls, text: str, *, overhead_ms: float | None = None) -> ServiceTruth:
        """`alpha_ms=A,beta_ms=B[,overhead_ms=C][,rows=K][,cv=V]`, or a preset name
        (`textbook`), optionally followed by `,rows=K` and `,cv=V` (`textbook,rows=4,cv=0.2`)."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        preset = PRESETS.get(parts[0].lower()) if parts else None
        values: dict[str, float] = {}
        for part in parts[1:] if preset is not None else parts:
            match = re.fullmatch(r"(alpha_ms|beta_ms|overhead_ms|rows|cv)=([0-9]*\.?[0-9]+)", part)
            if match is None or (preset is not None and match[1] not in ("rows", "cv")):
                raise ValueError(
                    f"expected alpha_ms=A,beta_ms=B[,overhead_ms=C][,rows=K][,cv=V] or one of "
                    f"{', '.join(PRESETS)}[,rows=K][,cv=V]; got {text!r}"
                )
            values[match[1]] = float(match[2])
        rows = values.get("rows", 1.0)
        if rows != int(rows) or rows < 1:
            raise ValueError(f"rows is a whole number of rows a request, at least 1; got {text!r}")
        if preset is not None:
            overhead_s = preset.overhead_s if overhead_ms is None else overhead_ms / 1e3
            return cls(preset.alpha_s, preset.beta_s, overhead_s, int(rows), values.get("cv", 0.0))
        if not {"alpha_ms", "beta_ms"} <= set(values):
            raise ValueError(f"expected both alpha_ms and beta_ms, got {text!r}")
        if overhead_ms is not None:
            values["overhead_ms"] = overhead_ms
        return cls(
            alpha_s=values["alpha_ms"] / 1e3,
            beta_s=values["beta_ms"] / 1e3,
            overhead_s=values.get("overhead_ms", 0.0) / 1e3,
            rows_per_request=int(rows),
            cv=values.get("cv", 0.0),
        )


def fit_two_points(
    *, qps_1: float, util_1: float, batch_2: int, qps_2: float, util_2: float
) -> tuple[float, float]:
    """α and β (seconds) from two measured operating points with full batches: each gives
    t(b) = utilization × b / QPS (busy seconds per batch)."""
    t1 = util_1 * 1 / qps_1
    t2 = util_2 * batch_2 / qps_2
    beta = (t2 - t1) / (batch_2 - 1)
    return t1 - beta, beta


_ALPHA, _BETA = fit_two_points(qps_1=85, util_1=0.32, batch_2=8, qps_2=320, util_2=0.78)
TEXTBOOK = ServiceTruth(alpha_s=round(_ALPHA, 6), beta_s=round(_BETA, 6), overhead_s=0.040)
"""ResNet-50 on one A10 as the textbook reports it: α = 1.52 ms, β = 2.25 ms, 40 ms overhead."""

PRESETS = {"textbook": TEXTBOOK, "resnet50-a10": TEXTBOOK}
