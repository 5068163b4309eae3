"""The rows a request brings, as a distribution: what a client sends (`batchpilot loadgen --rows
1:9,16:1`) and what the simulator's reference of varied sizes draws (`simulation.sizes`).

Clients that batch on their side rarely send one size: a ranking call carries however many
candidates the page had, an upload however many images. The autopilot measures the spread of
rows a request (`batchpilot_arrival_rows_squared_total`) because requests of varied sizes queue
as rows arriving in clumps; the tools that make such traffic spell it here.

Pure: no numpy (the api stands alone); `pick` draws with the caller's `random.Random`.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RowMix:
    """Rows a request brings, drawn from `rows` with `weights` (in proportion)."""

    rows: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.weights):
            raise ValueError("a row mix needs one weight for each size, and at least one size")
        if any(r < 1 for r in self.rows):
            raise ValueError("a request brings at least one row")
        if any(not (w > 0 and math.isfinite(w)) for w in self.weights):
            raise ValueError("each size's weight must be a positive number")

    @classmethod
    def parse(cls, text: str) -> RowMix:
        """`ROWS:WEIGHT,...` (`1:9,16:1`: nine requests of one row for each of sixteen), or a
        plain number of rows (every request the same)."""
        if re.fullmatch(r"\s*\d+\s*", text):
            return cls((int(text),), (1.0,))
        rows, weights = [], []
        for part in text.split(","):
            match = re.fullmatch(r"\s*(\d+)\s*:\s*([0-9]*\.?[0-9]+)\s*", part)
            if match is None:
                raise ValueError(
                    f"expected ROWS:WEIGHT[,ROWS:WEIGHT...] (1:9,16:1) or ROWS; got {text!r}"
                )
            rows.append(int(match[1]))
            weights.append(float(match[2]))
        return cls(tuple(rows), tuple(weights))

    @property
    def shares(self) -> tuple[float, ...]:
        """Each size's share of the requests."""
        total = math.fsum(self.weights)
        return tuple(w / total for w in self.weights)

    @property
    def mean(self) -> float:
        return math.fsum(p * r for p, r in zip(self.shares, self.rows, strict=True))

    @property
    def cv(self) -> float:
        """The coefficient of variation of a request's rows (0: every request the same)."""
        squares = math.fsum(p * r * r for p, r in zip(self.shares, self.rows, strict=True))
        mean = self.mean
        return math.sqrt(max(0.0, squares / (mean * mean) - 1.0))

    @property
    def single(self) -> bool:
        """Whether every request brings the same rows."""
        return len(set(self.rows)) == 1

    def pick(self, rng: random.Random) -> int:
        """The index (into `rows`) of one request's size, drawn with `rng`."""
        cumulative = list(itertools.accumulate(self.weights))
        at = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
        return min(len(self.rows) - 1, at)

    def describe(self) -> str:
        if self.single:
            return f"{self.rows[0]} rows a request"
        parts = ", ".join(f"{r} ({p:.0%})" for r, p in zip(self.rows, self.shares, strict=True))
        return f"rows a request: {parts}; mean {self.mean:.3g}, cv {self.cv:.2f}"
