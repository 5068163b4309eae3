"""The objective's books: attainment, error budget, burn rates and the multi-window alert."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchpilot.operator.autopilot.slo import BUCKETS, Objective, SloLedger

TICK = 15.0
HOUR = Objective(target=0.99, window_s=3600)


def ledger_of(verdicts: list[bool | None], objective: Objective = HOUR) -> SloLedger:
    ledger = SloLedger(objective)
    for k, verdict in enumerate(verdicts):
        ledger = ledger.record(k * TICK, verdict, covers_s=60)
    return ledger


class TestObjective:
    def test_the_workbook_pairs_for_a_30_day_window(self) -> None:
        fast, slow = Objective(0.999, 30 * 86400).alerts()
        assert (fast.long_s, fast.short_s, fast.threshold) == (3600, 300, pytest.approx(14.4))
        assert (slow.long_s, slow.short_s, slow.threshold) == (21600, 1800, pytest.approx(6))

    def test_a_short_window_has_floors_and_never_alerts_below_a_sustainable_burn(self) -> None:
        fast, slow = HOUR.alerts()
        assert (fast.long_s, fast.short_s) == (300, 60)
        assert (slow.long_s, slow.short_s) == (1800, 150)
        assert fast.threshold == slow.threshold == 1.0

    @pytest.mark.parametrize("target", [0.0, 1.0, 1.5])
    def test_a_target_outside_the_open_interval_is_refused(self, target: float) -> None:
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            Objective(target, 3600)


class TestLedger:
    def test_nothing_judged_is_no_attainment_not_a_perfect_one(self) -> None:
        report = SloLedger(HOUR).report(0)
        assert report.attainment is None
        assert report.budget_remaining is None
        assert report.burn_rates == {}
        assert report.at_risk is None

    def test_all_good_keeps_the_budget(self) -> None:
        report = ledger_of([True] * 100).report(100 * TICK)
        assert report.attainment == 1.0
        assert report.budget_remaining == 1.0
        assert report.burn_rates == {"fast": 0.0, "slow": 0.0}

    def test_one_bad_interval_in_a_hundred_spends_the_whole_budget(self) -> None:
        verdicts: list[bool | None] = [True] * 100
        verdicts[50] = False
        report = ledger_of(verdicts).report(100 * TICK)
        # 99 good ticks after the first (which only starts the clock), one of them bad
        assert report.attainment == pytest.approx(1 - 1 / 99)
        assert report.budget_remaining == pytest.approx(1 - 100 / 99, abs=1e-9)

    def test_time_without_a_verdict_counts_neither_way(self) -> None:
        blind = ledger_of([True] * 10 + [None] * 50 + [True] * 10)
        report = blind.report(70 * TICK)
        assert report.attainment == 1.0
        fine = blind.fine
        assert fine is not None
        # every tick after the first but the blind ones: the first verdict after the blind run
        # stands for the 15 s since the last blind tick, not for the blind minutes
        assert sum(fine.judged) == pytest.approx(19 * TICK)

    def test_a_burst_of_bad_windows_fires_the_fast_alert_and_it_clears_after(self) -> None:
        verdicts: list[bool | None] = [True] * 40 + [False] * 4
        burning = ledger_of(verdicts)
        report = burning.report(43 * TICK)
        assert report.at_risk is not None
        assert "burns" in report.at_risk
        assert "over 5 min" in report.at_risk
        # the short lookbacks (1 and 2.5 min) clear first: the alert stops with the burning
        recovered = burning
        for k in range(44, 60):
            recovered = recovered.record(k * TICK, True, covers_s=60)
        assert recovered.report(59 * TICK).at_risk is None
        assert recovered.report(59 * TICK).burn_rates["fast"] > 1

    def test_old_verdicts_leave_the_window(self) -> None:
        verdicts: list[bool | None] = [False] * 4 + [True] * 400  # 101 minutes
        report = ledger_of(verdicts).report(403 * TICK)
        assert report.attainment == 1.0

    def test_a_gap_longer_than_a_window_counts_only_the_window(self) -> None:
        ledger = SloLedger(HOUR).record(0, True, covers_s=60).record(600, False, covers_s=60)
        assert ledger.coarse is not None
        assert sum(ledger.coarse.bad) == 60

    def test_a_changed_window_starts_the_books_afresh_a_changed_target_keeps_them(self) -> None:
        ledger = ledger_of([True, False, True])
        same_buckets = ledger.for_objective(Objective(0.95, 3600))
        assert same_buckets.fine == ledger.fine
        assert same_buckets.report(2 * TICK).budget_remaining == pytest.approx(1 - 0.5 / 0.05)
        regrouped = ledger.for_objective(Objective(0.99, 7 * 86400))
        assert regrouped.fine is None
        assert regrouped.last_at == ledger.last_at

    def test_the_ledger_stays_the_same_size_whatever_the_window(self) -> None:
        for window in (300, 3600, 86400, 28 * 86400):
            ledger = ledger_of([True, False] * 2000, Objective(0.99, window))
            assert ledger.fine is not None
            assert ledger.coarse is not None
            assert len(ledger.fine.judged) <= BUCKETS
            assert len(ledger.coarse.judged) <= BUCKETS

    def test_unreadable_persisted_books_start_afresh(self) -> None:
        assert SloLedger.from_dict({"target": "x"}) == SloLedger()
        assert SloLedger.from_dict(None) == SloLedger()
        broken = ledger_of([True, False]).to_dict()
        broken["fine"]["badS"] = [1.0] * (BUCKETS + 1)
        assert SloLedger.from_dict(broken) == SloLedger()


@given(
    st.lists(st.one_of(st.none(), st.booleans()), max_size=300),
    st.sampled_from([300.0, 3600.0, 86400.0]),
)
def test_the_books_survive_the_status_and_stay_within_bounds(
    verdicts: list[bool | None], window: float
) -> None:
    ledger = ledger_of(verdicts, Objective(0.99, window))
    restored = SloLedger.from_dict(ledger.to_dict())
    now = len(verdicts) * TICK
    assert restored.report(now) == pytest.approx(ledger.report(now)) or (
        restored.report(now) == ledger.report(now)
    )
    report = ledger.report(now)
    if report.attainment is not None:
        assert 0.0 <= report.attainment <= 1.0
        assert report.budget_remaining is not None
        assert report.budget_remaining <= 1.0
