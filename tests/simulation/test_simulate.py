"""Whole simulations: reproducible, the textbook case found from scratch, baselines, the CLI."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from batchpilot.operator.simulation import TEXTBOOK, ClusterConfig, Scenario, Trace, cli, simulate
from batchpilot.operator.simulation.report import SimulationResult
from batchpilot.operator.simulation.scenario import oracle_gpu_seconds

TRACES = Path(__file__).parents[2] / "examples" / "traces"


def short(rate: float = 300.0, duration_s: float = 600.0, **spec: object) -> Scenario:
    return Scenario(
        trace=Trace.constant(rate, duration_s),
        service=TEXTBOOK,
        sla_s=0.1,
        **spec,  # type: ignore[arg-type]
    )


class TestReproducible:
    def test_the_same_seed_gives_the_same_run(self) -> None:
        first, second = simulate(short(), "autopilot"), simulate(short(), "autopilot")
        assert first.summary == second.summary
        assert first.intervals == second.intervals

    def test_another_seed_gives_another_run(self) -> None:
        other = short(cluster=ClusterConfig(seed=1))
        assert simulate(other, "autopilot").summary != simulate(short(), "autopilot").summary


@pytest.fixture(scope="module")
def textbook_run() -> SimulationResult:
    scenario = Scenario(trace=Trace.from_csv(TRACES / "textbook.csv"), service=TEXTBOOK, sla_s=0.1)
    return simulate(scenario, "autopilot")


class TestTheTextbookCase:
    """ResNet-50 on one A10, SLA P99 < 100 ms, 300 rps, starting at batch 1 on one replica."""

    def test_it_finds_batch_8_on_one_replica_by_itself(
        self, textbook_run: SimulationResult
    ) -> None:
        run = textbook_run
        ticks = run.intervals
        # t=0: the spec's batch 1 overloads the replica (266 rps at most < 300 offered).
        assert (ticks[0].batch_size, ticks[0].replicas) == (1, 1)
        assert ticks[0].p99_s > 1.0
        # t=15: one step raises the batch limit (the model says one replica will do).
        assert ticks[1].batch_size > 1
        assert ticks[1].replicas == 1
        # t=90: the latency outside the device is learned (40 ms): batch ≤ 8, since two full
        # batches of 8 (2 · 19.5 ms) plus 40 ms fit the 88 ms target and 12 would not.
        settled = ticks[6:]
        assert {t.batch_size for t in settled} <= {6, 8}
        assert run.summary.final_batch_size == 8
        assert run.summary.max_replicas == 1
        # The operating point: ≈ 300 rps on one replica inside the SLA, the device ~80 % busy.
        inside = [t for t in settled if t.p99_s <= 0.1]
        assert len(inside) / len(settled) >= 0.99
        served = sum(t.served_rps for t in settled) / len(settled)
        assert served == pytest.approx(300, rel=0.01)
        assert 0.7 < run.summary.mean_utilization < 0.9


class TestBaselines:
    def test_static_provisions_the_peak_and_never_moves(self) -> None:
        result = simulate(short(rate=500, duration_s=300), "static")
        # Batch 1 carries about 207 rps a replica inside the SLA in 99 % of intervals:
        # 500 / 207 = 2.4 → 3 replicas, the whole time.
        assert {t.replicas for t in result.intervals} == {3}
        assert result.summary.scaling_actions == 0
        assert result.summary.gpu_seconds == pytest.approx(3 * 300)

    def test_hpa_scales_an_overloaded_service_on_utilization(self) -> None:
        result = simulate(short(rate=500, duration_s=600), "hpa")
        # One replica at batch 1 is 100 % busy: ceil(1 · 1.0 / 0.7) = 2, then 2 at 94 % → 3.
        assert result.intervals[-1].replicas >= 3
        assert {t.batch_size for t in result.intervals} == {1}

    def test_the_oracle_bill_is_its_replicas_times_the_intervals(self) -> None:
        scenario = short(rate=500, duration_s=300)
        result = simulate(scenario, "oracle")
        assert result.summary.interval_attainment == 1.0
        assert result.summary.gpu_seconds == pytest.approx(oracle_gpu_seconds(scenario), rel=1e-3)


def test_the_cli_prints_a_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "flat.csv"
    trace.write_text("t_seconds,rate_rps\n0,150\n300,150\n")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "out.json"
    args = parser.parse_args(
        ["--trace", str(trace), "--policy", "autopilot,static", "--json", str(out)]
    )
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "autopilot" in printed
    assert "static" in printed
    document = json.loads(out.read_text())
    assert [r["policy"] for r in document["results"]] == ["autopilot", "static"]
    assert len(document["results"][0]["intervals"]) == 20  # 300 s / 15 s
    assert set(document["results"][0]["summary"]) >= {
        "intervalAttainment",
        "requestAttainment",
        "gpuSeconds",
        "scalingActions",
        "meanUtilization",
    }


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_the_cli_plots(tmp_path: Path) -> None:
    trace = tmp_path / "flat.csv"
    trace.write_text("t_seconds,rate_rps\n0,150\n120,150\n")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    png = tmp_path / "out.png"
    assert cli.main(parser.parse_args(["--trace", str(trace), "--plot", str(png)])) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_trace_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.main(parser.parse_args(["--trace", str(tmp_path / "nope.csv")])) == 2
    assert "nope.csv" in capsys.readouterr().err
