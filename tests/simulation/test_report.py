"""The summary's SRE numbers: error budget used, flaps, worst streak over the SLA."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from batchpilot.simulation import cli
from batchpilot.simulation.report import (
    IntervalRecord,
    SimulationResult,
    Summary,
    summarize,
    table,
)

SLA = 0.1
OK, LATE = 0.05, 0.2


def record(t: float, *, p99_s: float = OK, replicas: int = 1) -> IntervalRecord:
    return IntervalRecord(
        t=t,
        offered_rps=100.0,
        served_rps=100.0,
        shed_rps=0.0,
        in_sla_rps=100.0,
        p99_s=p99_s,
        observed_p99_s=None,
        replicas=replicas,
        ready=replicas,
        billed=float(replicas),
        batch_size=8,
        max_queue_delay_s=0.005,
        mean_batch=None,
        utilization=None,
        reason="",
    )


def every_15_s(
    *, p99s: Sequence[float] | None = None, replicas: Sequence[int] | None = None
) -> list[IntervalRecord]:
    n = len(p99s if p99s is not None else replicas or ())
    return [
        record(
            15.0 * k,
            p99_s=p99s[k] if p99s is not None else OK,
            replicas=replicas[k] if replicas is not None else 1,
        )
        for k in range(n)
    ]


def summary_of(records: Sequence[IntervalRecord], **kwargs: float) -> Summary:
    return summarize(
        records,
        sla_s=SLA,
        within_sla=90,
        requests=100,
        shed=0,
        gpu_seconds=100.0,
        busy_seconds=50.0,
        **kwargs,
    )


class TestErrorBudget:
    @pytest.mark.parametrize(
        ("inside", "objective", "used"),
        [
            (200, 0.99, 0.0),  # 200 of 200 intervals within: nothing spent
            (199, 0.99, 0.5),  # (1 - 0.995) / (1 - 0.99) = 0.5
            (198, 0.99, 1.0),  # 1 % missed against a 99 % objective: all of it
            (196, 0.99, 2.0),  # twice over
            (199, 0.995, 1.0),  # (1 - 0.995) / (1 - 0.995)
            (180, 0.9, 1.0),  # (1 - 0.9) / (1 - 0.9)
        ],
    )
    def test_budget_used_is_missed_intervals_over_the_allowed(
        self, inside: int, objective: float, used: float
    ) -> None:
        records = every_15_s(p99s=[OK] * inside + [LATE] * (200 - inside))
        summary = summary_of(records)
        assert summary.budget_used(objective) == pytest.approx(used)

    def test_the_default_objective_is_99_percent(self) -> None:
        summary = summary_of(every_15_s(p99s=[OK] * 199 + [LATE]))
        assert summary.budget_used() == pytest.approx(0.5)

    @pytest.mark.parametrize("objective", [0.0, 1.0, 99.0, -0.5])
    def test_an_objective_outside_0_1_is_refused(self, objective: float) -> None:
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            summary_of(every_15_s(p99s=[OK])).budget_used(objective)


class TestFlaps:
    @pytest.mark.parametrize(
        ("replicas", "flaps"),
        [
            ([1, 1, 1, 1], 0),  # no change
            ([1, 2, 3, 4], 0),  # only up
            ([1, 2, 1, 1], 1),  # up at 15 s, down at 30 s
            ([1, 2, 3, 2], 1),  # up, up, then down 15 s after the last up
            ([2, 1, 2, 1], 2),  # down, up, down: two reversals
            ([1, 2, 2, 4, 3], 1),  # up at 15, up at 45, down at 60
        ],
    )
    def test_reversals_close_together(self, replicas: list[int], flaps: int) -> None:
        assert summary_of(every_15_s(replicas=replicas)).flaps == flaps

    def test_a_reversal_5_minutes_or_more_later_is_not_a_flap(self) -> None:
        # Up at t = 15 s; down at 15 + 20 · 15 = 315 s: exactly 300 s later, not a flap.
        held = [1] + [2] * 20 + [1]
        assert summary_of(every_15_s(replicas=held)).flaps == 0
        # Down at 300 s: 285 s after the up, a flap.
        sooner = [1] + [2] * 19 + [1]
        assert summary_of(every_15_s(replicas=sooner)).flaps == 1


class TestWorstStreak:
    @pytest.mark.parametrize(
        ("p99s", "seconds"),
        [
            ([OK, OK, OK], 0.0),
            ([OK, LATE, LATE, OK, LATE], 30.0),  # two intervals of 15 s in a row
            ([LATE, OK, LATE, LATE, LATE], 45.0),  # the last ends one interval after its start
            ([OK, math.inf, math.inf, OK], 30.0),  # over 1 % shed: infinitely slow
            ([LATE, math.nan, LATE], 15.0),  # no traffic is within the SLA, breaks the run
        ],
    )
    def test_longest_run_of_intervals_over_the_sla(self, p99s: list[float], seconds: float) -> None:
        assert summary_of(every_15_s(p99s=p99s)).worst_streak_s == seconds

    def test_the_trace_end_bounds_the_last_interval(self) -> None:
        records = every_15_s(p99s=[OK, LATE, LATE])  # the last starts at 30 s
        assert summary_of(records, end_s=40.0).worst_streak_s == 25.0  # 15 + (40 - 30)

    def test_a_lone_interval_lasts_until_the_end_if_known(self) -> None:
        assert summary_of([record(0.0, p99_s=LATE)]).worst_streak_s == 0.0
        assert summary_of([record(0.0, p99_s=LATE)], end_s=15.0).worst_streak_s == 15.0


def result_of(records: Sequence[IntervalRecord], policy: str = "autopilot") -> SimulationResult:
    return SimulationResult(
        policy=policy,
        trace="onoff",
        duration_s=15.0 * len(records),
        sla_s=SLA,
        service="t",
        summary=summary_of(records),
        intervals=records,
        wall_s=0.1,
    )


class TestShown:
    def test_to_dict_has_the_budget_flaps_and_streak(self) -> None:
        records = every_15_s(p99s=[OK] * 197 + [LATE] * 3)
        doc = result_of(records).to_dict(intervals=False, objective=0.99)["summary"]
        assert doc["objective"] == 0.99
        assert doc["errorBudgetUsed"] == pytest.approx(1.5)  # 1.5 % missed of 1 % allowed
        assert doc["worstStreakS"] == 45.0
        assert doc["flaps"] == 0

    def test_table_shows_them_against_the_objective(self) -> None:
        records = every_15_s(p99s=[OK] * 197 + [LATE] * 3)
        records[1:3] = [record(15.0, replicas=2), record(30.0, replicas=1)]
        header, _, row = table([result_of(records)], objective=0.98).splitlines()

        def cell(name: str) -> str:  # columns are right-aligned under their names
            return row[: header.index(name) + len(name)].split()[-1]

        assert cell("budget") == "0.75"  # 1.5 % missed of 2 % allowed
        assert cell("worst s") == "45"
        assert cell("flaps") == "1"


class TestSimulateObjective:
    @staticmethod
    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        return parser.parse_args(argv)

    def test_the_budget_is_reported_against_the_objective_given(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        trace, out = tmp_path / "flat.csv", tmp_path / "out.json"
        trace.write_text("t_seconds,rate_rps\n0,150\n120,150\n")
        args = self.parse("--trace", str(trace), "--objective-percent", "99.5", "--json", str(out))
        assert cli.main(args) == 0
        assert "in 99.5 % of intervals" in capsys.readouterr().out
        summary = json.loads(out.read_text())["results"][0]["summary"]
        assert summary["objective"] == 0.995
        assert {"errorBudgetUsed", "flaps", "worstStreakS"} <= set(summary)

    @pytest.mark.parametrize("percent", ["0", "100", "101"])
    def test_an_objective_outside_0_100_is_refused(self, percent: str) -> None:
        with pytest.raises(SystemExit):
            self.parse("--trace", "x.csv", "--objective-percent", percent)
