"""Traces and the simulated service: the inputs a simulation starts from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from batchpilot.simulation.service import TEXTBOOK, ServiceTruth, fit_two_points
from batchpilot.simulation.trace import Trace

TRACES = Path(__file__).parents[2] / "examples" / "traces"


class TestTrace:
    def test_the_last_row_ends_the_trace(self, tmp_path: Path) -> None:
        path = tmp_path / "t.csv"
        path.write_text("# a comment\nt_seconds,rate_rps\n0,100\n60,300\n120,0\n")
        trace = Trace.from_csv(path)
        assert (trace.starts, trace.rates, trace.duration_s) == ((0.0, 60.0), (100.0, 300.0), 120)
        assert trace.mean(0, 120) == 200  # (60 · 100 + 60 · 300) / 120
        assert trace.peak(30, 90) == 300

    def test_a_duration_overrides_the_end(self, tmp_path: Path) -> None:
        path = tmp_path / "t.csv"
        path.write_text("t_seconds,rate_rps\n0,100\n")
        assert Trace.from_csv(path, duration_s=30).duration_s == 30
        with pytest.raises(ValueError, match="duration"):
            Trace.from_csv(path)

    def test_arrivals_are_poisson_at_the_trace_rate(self) -> None:
        trace = Trace.from_points([(0, 100.0), (50, 400.0), (100, 0.0)], duration_s=None)
        counts = [len(trace.arrivals(0, 100, np.random.default_rng(s))) for s in range(200)]
        # 50 · 100 + 50 · 400 = 25 000 expected; Poisson spread √25 000 ≈ 158.
        assert np.mean(counts) == pytest.approx(25_000, rel=0.005)
        assert np.std(counts) == pytest.approx(158, rel=0.15)

    @pytest.mark.parametrize("name", ["textbook", "diurnal", "step", "bursty"])
    def test_the_shipped_traces_read(self, name: str) -> None:
        trace = Trace.from_csv(TRACES / f"{name}.csv")
        assert trace.duration_s >= 3600
        assert 0 < trace.max_rate < 2000


class TestService:
    def test_the_textbook_numbers_fit_alpha_and_beta(self) -> None:
        # t(1) = 0.32 / 85 = 3.765 ms; t(8) = 0.78 · 8 / 320 = 19.5 ms;
        # β = (19.5 - 3.765) / 7 = 2.248 ms; α = 3.765 - 2.248 = 1.517 ms.
        alpha, beta = fit_two_points(qps_1=85, util_1=0.32, batch_2=8, qps_2=320, util_2=0.78)
        assert alpha == pytest.approx(0.001517, abs=1e-6)
        assert beta == pytest.approx(0.002248, abs=1e-6)
        assert TEXTBOOK.overhead_s == 0.040
        # Batch 1 overloads at 300 rps (266 at most); batch 8 carries 410.
        assert TEXTBOOK.capacity(1) == pytest.approx(265.6, abs=0.1)
        assert TEXTBOOK.capacity(8) == pytest.approx(410.3, abs=0.1)

    def test_parse(self) -> None:
        assert ServiceTruth.parse("alpha_ms=2,beta_ms=0.5") == ServiceTruth(0.002, 0.0005, 0.0)
        assert ServiceTruth.parse("alpha_ms=2,beta_ms=0.5,overhead_ms=10").overhead_s == 0.01
        assert ServiceTruth.parse("textbook", overhead_ms=0).overhead_s == 0
        with pytest.raises(ValueError, match="alpha_ms"):
            ServiceTruth.parse("alpha=2")

    def test_rows_a_request(self) -> None:
        assert ServiceTruth.parse("textbook,rows=4") == replace(TEXTBOOK, rows_per_request=4)
        assert ServiceTruth.parse("alpha_ms=2,beta_ms=0.5,rows=8").rows_per_request == 8
        for bad in ("textbook,rows=2.5", "textbook,rows=0", "textbook,alpha_ms=3"):
            with pytest.raises(ValueError, match="rows"):
                ServiceTruth.parse(bad)
        # 16 rows hold 4 requests of 4 rows; a limit below a request's rows runs it alone
        four = replace(TEXTBOOK, rows_per_request=4)
        assert four.capacity(16) == pytest.approx(4 / TEXTBOOK.batch_seconds(16))
        assert four.capacity(2) == pytest.approx(1 / TEXTBOOK.batch_seconds(4))
        assert "4 rows a request" in four.describe()
