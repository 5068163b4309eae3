"""Trace generators: reproducible per seed, within their documented bounds, and the shipped files
are exactly what `make_traces.py` writes."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
from pathlib import Path
from types import ModuleType

import pytest

from batchpilot.simulation import cli, generate
from batchpilot.simulation.generate import KINDS, Rows
from batchpilot.simulation.trace import Trace

TRACES = Path(__file__).parents[2] / "examples" / "traces"
SEEDS = range(6)
RANDOM_KINDS = [name for name in KINDS if name not in ("textbook", "step")]


@pytest.fixture(scope="module")
def make_traces() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_traces", TRACES / "make_traces.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(rows: Rows, high: float) -> list[tuple[bool, float, float]]:
    """(above `high`, start, end) of each maximal run of rows on one side of `high`."""
    out: list[tuple[bool, float, float]] = []
    for (t, rate), (t_next, _) in itertools.pairwise(rows):
        above = rate > high
        if out and out[-1][0] == above:
            out[-1] = (above, out[-1][1], t_next)
        else:
            out.append((above, t, t_next))
    return out


class TestEveryKind:
    @pytest.mark.parametrize("name", list(KINDS))
    def test_the_same_seed_gives_the_same_trace(self, name: str) -> None:
        assert generate.generate(name, 7) == generate.generate(name, 7)

    @pytest.mark.parametrize("name", RANDOM_KINDS)
    def test_another_seed_gives_another_trace(self, name: str) -> None:
        assert generate.generate(name, 7) != generate.generate(name, 8)

    @pytest.mark.parametrize(("name", "seed"), list(itertools.product(KINDS, SEEDS)))
    def test_rows_are_a_valid_trace(self, name: str, seed: int) -> None:
        rows = generate.generate(name, seed)
        times = [t for t, _ in rows]
        assert times[0] == 0
        assert all(b > a for a, b in itertools.pairwise(times))
        assert all(math.isfinite(r) and r >= 0 for _, r in rows)
        assert len(rows) < 3000  # small files: one row per change
        Trace.from_points(rows, duration_s=None)  # raises if not

    @pytest.mark.parametrize("name", list(KINDS))
    def test_the_duration_is_honoured(self, name: str) -> None:
        assert generate.generate(name, 3, duration_s=4800)[-1][0] == 4800

    @pytest.mark.parametrize(
        "name",
        [
            "onoff",
            "flash",
            "ramp",
            "realistic",
            "steps6",
            "pulses",
            "square",
            "regimes",
            "walk",
            "sawtooth",
            "spikes",
        ],
    )
    def test_rates_scale_with_the_base(self, name: str) -> None:
        # Same seed, same draws: half the base gives half the rates (to the 0.1 rps rounding).
        full = generate.generate(name, 3, base_rps=200)
        half = generate.generate(name, 3, base_rps=100)
        assert [t for t, _ in full] == [t for t, _ in half]
        assert all(abs(f / 2 - h) <= 0.1 for (_, f), (_, h) in zip(full, half, strict=True))

    def test_an_unknown_kind_or_parameter_is_refused(self) -> None:
        with pytest.raises(ValueError, match="unknown trace kind"):
            generate.generate("zigzag")
        with pytest.raises(ValueError, match="textbook takes no amplitude"):
            generate.generate("textbook", amplitude=2)

    def test_without_a_seed_the_shipped_seed(self) -> None:
        assert generate.generate("onoff") == generate.generate("onoff", KINDS["onoff"].seed)


class TestOnOff:
    BASE, AMPLITUDE = 100.0, 10.0

    @pytest.mark.parametrize("seed", SEEDS)
    def test_quiet_stretches_and_bursts(self, seed: int) -> None:
        rows = generate.onoff(seed)
        assert rows[-1][0] == 5400
        assert rows[0][1] <= 1.1 * self.BASE  # starts quiet
        assert max(r for _, r in rows) <= 1.1 * self.AMPLITUDE * self.BASE
        stretches = runs(rows, high=1.1 * self.BASE)
        for above, start, end in stretches[:-1]:  # the last one is cut by the trace's end
            if above:  # a burst: 1-6 minutes
                assert 60 <= end - start <= 360, (start, end)
            else:  # quiet: 2-15 minutes
                assert 120 <= end - start <= 900, (start, end)
        assert sum(1 for above, _, _ in stretches if above) >= 4

    @pytest.mark.parametrize("seed", SEEDS)
    def test_bursts_rise_within_seconds_to_5_to_10x(self, seed: int) -> None:
        rows = generate.onoff(seed)
        for above, start, end in runs(rows, high=1.1 * self.BASE):
            if not above or end == rows[-1][0]:
                continue
            inside = [(t, r) for t, r in rows if start <= t < end]
            # Every burst reaches at least 0.9 · 5 · base (its level, less 10 % noise) ...
            reached = [t for t, r in inside if r >= 0.9 * self.AMPLITUDE / 2 * self.BASE]
            assert reached, start
            # ... within 8 s of its start.
            assert reached[0] - start <= 8, start

    def test_some_quiet_stretches_are_silent(self) -> None:
        silent = [seed for seed in SEEDS if any(r == 0 for _, r in generate.onoff(seed)[:-1])]
        assert silent


class TestFlash:
    BASE, AMPLITUDE = 200.0, 8.0

    @pytest.mark.parametrize("seed", range(10))
    def test_a_crowd_rises_in_seconds_holds_for_minutes_and_decays(self, seed: int) -> None:
        rows = generate.flash(seed)
        assert min(r for _, r in rows) >= 0.97 * self.BASE
        assert max(r for _, r in rows) <= 1.1 * self.AMPLITUDE * self.BASE
        crowds = [(s, e) for above, s, e in runs(rows, high=1.03 * self.BASE) if above]
        peak = [t for t, r in rows if r >= 0.9 * 5 / 8 * self.AMPLITUDE * self.BASE]
        assert 1 <= len(crowds) <= 2
        for start, end in crowds:
            # Rise 10-30 s + hold 5-20 min + decay 2-5 min (the last decay rows may be ≤ 3 %).
            assert 10 + 300 + 120 - 30 <= end - start <= 30 + 1200 + 300, (start, end)
            first = min(t for t in peak if start <= t < end)
            assert first - start <= 30

    def test_some_traces_have_two_crowds(self) -> None:
        counts = {
            sum(1 for above, _, _ in runs(generate.flash(seed), 1.03 * self.BASE) if above)
            for seed in range(10)
        }
        assert counts == {1, 2}

    def test_a_trace_too_short_for_a_crowd_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 2200 s"):
            generate.flash(0, duration_s=1800)


class TestRamp:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_a_linear_ramp_up_and_back(self, seed: int) -> None:
        trace = Trace.from_points(generate.ramp(seed), duration_s=None)
        assert trace.duration_s == 5400
        base, top = 200.0, 1200.0  # 6x
        # Flat 600 s, up over 1800 s (120 steps of 15 s), flat 600 s, down, flat 600 s.
        for t in range(0, 600, 60):
            assert trace.rate_at(t) == pytest.approx(base, rel=0.021)
        for k in range(120):
            up = base + (top - base) * (k + 1) / 120
            assert trace.rate_at(600 + 15 * k) == pytest.approx(up, rel=0.021), k
            down = top + (base - top) * (k + 1) / 120
            assert trace.rate_at(3000 + 15 * k) == pytest.approx(down, rel=0.021), k
        for t in range(2400, 3000, 60):
            assert trace.rate_at(t) == pytest.approx(top, rel=0.021)

    def test_a_trace_shorter_than_two_ramps_is_refused(self) -> None:
        with pytest.raises(ValueError, match="twice the ramp"):
            generate.ramp(0, duration_s=3000)


class TestRealistic:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_a_smooth_day(self, seed: int) -> None:
        rows = generate.realistic(seed)
        rates = [r for _, r in rows]
        assert rows[-1][0] == 7200
        assert all(b - a == 30 for (a, _), (b, _) in itertools.pairwise(rows[:-1]))
        # Nothing on/off: consecutive rows differ by well under 25 % (AR(1) steps of ~3 %).
        assert all(abs(math.log(b / a)) < 0.25 for a, b in itertools.pairwise(rates))
        # Trough near the base at the start (03:00-04:00), peak near 6x in the evening.
        assert min(rates) >= 0.6 * 150
        assert max(rates) <= 1.6 * 6 * 150
        assert 3 <= max(rates) / min(rates) <= 12


class TestSteps6:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_one_step_up_and_one_down(self, seed: int) -> None:
        rows = generate.steps6(seed)
        ratios = [b / a for (_, a), (_, b) in itertools.pairwise(rows)]
        ups = [k for k, x in enumerate(ratios) if x > 5]
        downs = [k for k, x in enumerate(ratios) if x < 1 / 5]
        assert len(ups) == 1
        assert len(downs) == 1
        t_up, t_down = rows[ups[0] + 1][0], rows[downs[0] + 1][0]
        assert 0.20 * 3600 <= t_up <= 0.35 * 3600
        assert 0.30 * 3600 <= t_down - t_up <= 0.40 * 3600
        assert all(0.98 * 150 <= r <= 1.02 * 6 * 150 for _, r in rows)


class TestPulses:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_a_second_long_pulse_every_15_s(self, seed: int) -> None:
        rows = generate.pulses(seed)
        starts = [t for (_, a), (t, b) in itertools.pairwise(rows) if b > 2 * a]
        assert starts[0] < 15
        assert all(b - a == 15 for a, b in itertools.pairwise(starts))
        assert len(starts) == 120  # one in every 15 s of the half hour
        highs = [r for _, r in rows if r > 1000]
        lows = [r for _, r in rows if r <= 1000]
        assert all(0.98 * 1650 <= r <= 1.02 * 1650 for r in highs)
        assert all(0.98 * 550 <= r <= 1.02 * 550 for r in lows)
        widths = {t1 - t0 for (t0, r0), (t1, _) in itertools.pairwise(rows) if r0 > 1000}
        assert widths == {1.0}


class TestSquare:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_ten_times_for_half_of_every_20_s(self, seed: int) -> None:
        rows = generate.square(seed)
        starts = [t for (_, a), (t, b) in itertools.pairwise(rows) if b > 2 * a]
        assert starts[0] < 20
        assert all(b - a == 20 for a, b in itertools.pairwise(starts))
        assert len(starts) == 90
        assert all(0.98 * 2200 <= r <= 1.02 * 2200 for _, r in rows if r > 1000)
        assert all(0.98 * 220 <= r <= 1.02 * 220 for _, r in rows if r <= 1000)
        widths = {t1 - t0 for (t0, r0), (t1, _) in itertools.pairwise(rows[:-1]) if r0 > 1000}
        assert widths == {10.0}

    def test_the_busy_part_fits_the_period(self) -> None:
        with pytest.raises(ValueError, match="shorter than the period"):
            generate.square(1, width_s=20.0)


class TestRegimes:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_levels_anywhere_in_the_range_held_minutes_at_no_rhythm(self, seed: int) -> None:
        rows = generate.regimes(seed)
        rates = [r for _, r in rows[:-1]]
        assert all(400 / 3 - 0.1 <= r <= 400 * 3 + 0.1 for r in rates)
        holds = [b[0] - a[0] for a, b in itertools.pairwise(rows)]
        assert min(holds[:-1]) >= 20  # (the last is cut by the trace's end)
        assert len(rows) >= 6  # regimes of ~4 minutes in an hour
        assert len(set(holds)) > len(holds) // 2  # no period to learn

    def test_steps_both_ways_of_several_times(self) -> None:
        ratios = [b / a for (_, a), (_, b) in itertools.pairwise(generate.regimes(1)[:-1])]
        assert max(ratios) > 2
        assert min(ratios) < 0.5


class TestWalk:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_small_steps_every_10_s_within_the_bounds(self, seed: int) -> None:
        rows = generate.walk(seed)
        assert [t for t, _ in rows[:-1]] == [float(t) for t in range(0, 3600, 10)]
        assert all(80 - 0.1 <= r <= 2000 + 0.1 for _, r in rows)
        steps = [math.log(b / a) for (_, a), (_, b) in itertools.pairwise(rows[:-1])]
        assert max(abs(x) for x in steps) < 5 * 0.05 + 0.01
        assert 0.03 < float(sum(x * x for x in steps) / len(steps)) ** 0.5 < 0.07

    def test_it_drifts_with_no_level_to_return_to(self) -> None:
        means = [sum(r for _, r in generate.walk(seed)[:-1]) / 360 for seed in SEEDS]
        assert max(means) / min(means) > 1.5


class TestSawtooth:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_a_linear_rise_every_period_then_a_drop(self, seed: int) -> None:
        rows = generate.sawtooth(seed)
        rates = [r for _, r in rows[:-1]]
        assert all(200 - 0.1 <= r <= 1000 + 0.1 for r in rates)
        drops = [t for (_, a), (t, b) in itertools.pairwise(rows[:-1]) if b < a]
        assert all(b - a == 300 for a, b in itertools.pairwise(drops))
        assert len(drops) in (11, 12)
        rises = [b - a for (_, a), (_, b) in itertools.pairwise(rows[:-1]) if b > a]
        assert all(abs(x - 800 * 5 / 300) <= 0.2 for x in rises)

    def test_a_period_under_30_s_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 30 s"):
            generate.sawtooth(1, period_s=20)


class TestSpikes:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_short_spikes_of_heavy_tailed_height_on_a_flat_base(self, seed: int) -> None:
        rows = generate.spikes(seed)
        spans = [(a[0], b[0] - a[0], a[1]) for a, b in itertools.pairwise(rows)]
        spikes = [(t, width, r) for t, width, r in spans if r > 300]
        assert all(r == 300 for _, _, r in spans if r <= 300)
        assert all(5 <= width <= 60 for t, width, _ in spikes if t + width < 3600)
        assert all(300 < r <= 6 * 300 for _, _, r in spikes)
        assert spans[0][:2] == (0.0, 60.0)
        assert 8 <= len(spikes) <= 40

    def test_most_spikes_small_a_few_near_the_top(self) -> None:
        heights = [r / 300 for seed in SEEDS for _, r in generate.spikes(seed) if r > 300]
        small = sum(h < 2 for h in heights)
        assert small > len(heights) / 2
        assert max(heights) >= 4


class TestDaily:
    @staticmethod
    def job_starts(rows: generate.Rows) -> list[float]:
        """When the rate jumps by more than 3x the base at once: the job (or a flash crowd)."""
        return [t for (_, a), (t, b) in itertools.pairwise(rows) if b - a > 3 * 150]

    @pytest.mark.parametrize("seed", SEEDS)
    def test_the_job_comes_at_the_same_time_every_day(self, seed: int) -> None:
        rows = generate.daily(seed)
        assert rows[-1][0] == 4 * 7200
        for day in range(4):
            phase = 0.30 * 7200 + day * 7200
            assert any(abs(t - phase) <= 120 for t in self.job_starts(rows)), day
        peak = max(r for _, r in rows)
        assert 5 * 150 <= peak <= 12 * 150

    def test_unscheduled_the_job_comes_at_another_time_each_day(self) -> None:
        phases = [t % 7200 for t in self.job_starts(generate.daily(7, scheduled=0))]
        assert max(phases) - min(phases) > 1800

    def test_a_period_shorter_than_half_an_hour_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 30 minutes"):
            generate.daily(1, period_s=600)


class TestMakeTraces:
    def test_the_shipped_files_are_what_it_writes(
        self, make_traces: ModuleType, tmp_path: Path
    ) -> None:
        assert make_traces.main(["--out-dir", str(tmp_path)]) == 0
        for name in make_traces.SHIPPED:
            assert (tmp_path / f"{name}.csv").read_bytes() == (
                TRACES / f"{name}.csv"
            ).read_bytes(), name

    def test_a_shipped_generated_file_is_its_rows(self) -> None:
        shipped = Trace.from_csv(TRACES / "onoff.csv")
        rows = generate.generate("onoff")
        assert shipped == Trace.from_points(rows, name="onoff", duration_s=None)

    def test_any_kind_any_seed_any_path(self, make_traces: ModuleType, tmp_path: Path) -> None:
        out = tmp_path / "onoff-7.csv"
        argv = ["onoff", "--seed", "7", "--duration-s", "1800", "--out", str(out)]
        assert make_traces.main(argv) == 0
        text = out.read_text()
        assert (
            "# Made by: python examples/traces/make_traces.py onoff --seed 7 --duration-s 1800 "
            f"--out {out}"
        ) in text
        rows = generate.generate("onoff", 7, duration_s=1800)
        assert Trace.from_csv(out) == Trace.from_points(rows, name="onoff-7", duration_s=None)

    def test_a_parameter_the_kind_does_not_take_is_refused(
        self, make_traces: ModuleType, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert make_traces.main(["textbook", "--amplitude", "3"]) == 2
        assert "textbook takes no --amplitude" in capsys.readouterr().err


class TestSimulateTraceGen:
    @staticmethod
    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        return parser.parse_args(argv)

    def test_a_kind_without_a_seed_is_the_shipped_file(self) -> None:
        generated = cli.trace_of(self.parse("--trace-gen", "onoff"))
        assert generated == Trace.from_csv(TRACES / "onoff.csv")

    def test_a_seed_names_the_trace(self) -> None:
        trace = cli.trace_of(self.parse("--trace-gen", "flash:9", "--duration-s", "3000"))
        assert trace.name == "flash-9"
        assert trace.duration_s == 3000

    @pytest.mark.parametrize(
        "argv",
        [
            ["--trace-gen", "zigzag"],
            ["--trace-gen", "onoff:x"],
            ["--trace-gen", "onoff", "--trace", "x.csv"],
            [],
        ],
    )
    def test_bad_or_conflicting_sources_are_refused(self, argv: list[str]) -> None:
        with pytest.raises(SystemExit):
            self.parse(*argv)

    def test_simulate_runs_a_generated_trace(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert cli.main(self.parse("--trace-gen", "steps6:3", "--duration-s", "120")) == 0
        assert "steps6-3" in capsys.readouterr().out
