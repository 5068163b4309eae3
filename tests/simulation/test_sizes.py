"""Requests of varied sizes on one replica: the runtime batcher's rules, in rows."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from batchpilot.api.request_rows import RowMix
from batchpilot.simulation.replica import Replica
from batchpilot.simulation.sizes import draw, latencies, serve


class TestRowMix:
    def test_a_mix_and_a_plain_number(self) -> None:
        mix = RowMix.parse("1:9, 16:1")
        assert mix.rows == (1, 16)
        assert mix.mean == pytest.approx(2.5)
        # E[r²] = 0.9 + 25.6 = 26.5; cv² = 26.5 / 6.25 - 1
        assert mix.cv == pytest.approx(math.sqrt(26.5 / 6.25 - 1))
        one = RowMix.parse("4")
        assert (one.mean, one.cv) == (4.0, 0.0)

    @pytest.mark.parametrize("text", ["", "0", "1:0", "a:1", "1:9,", "-1:2", "2:nan"])
    def test_nonsense_is_refused(self, text: str) -> None:
        with pytest.raises(ValueError, match=r"expected ROWS:WEIGHT|at least one row|positive"):
            RowMix.parse(text)

    def test_a_client_picks_by_the_weights(self) -> None:
        mix = RowMix.parse("1:3,8:1")
        rng = random.Random(4)
        picks = [mix.pick(rng) for _ in range(20_000)]
        assert sum(picks) / len(picks) == pytest.approx(0.25, abs=0.01)  # index 1: 8 rows
        assert mix.describe() == "rows a request: 1 (75%), 8 (25%); mean 2.75, cv 1.10"
        assert RowMix.parse("4").describe() == "4 rows a request"

    def test_draws_follow_the_weights(self) -> None:
        drawn = draw(RowMix.parse("1:3,8:1"), 40_000, np.random.default_rng(1))
        assert set(drawn.tolist()) == {1, 8}
        assert float((drawn == 8).mean()) == pytest.approx(0.25, abs=0.01)


class TestBatches:
    def test_one_size_is_the_simulators_replica(self) -> None:
        # Requests of 4 rows each under a limit of 16 rows: the replica that counts in requests
        # (β·4 a request, 4 a batch) serves the same arrivals at the same moments.
        arrivals = np.cumsum(np.random.default_rng(2).exponential(1 / 150, 5_000))
        served = serve(
            arrivals.tolist(), [4] * len(arrivals), alpha_s=0.002, beta_s=0.001, max_batch=16,
            delay_s=0.005,
        )  # fmt: skip
        replica = Replica(alpha_s=0.002, beta_s=0.004, max_batch=4, delay_s=0.005)
        batches = replica.serve(arrivals.tolist(), since=0.0, until=math.inf)
        ends = np.repeat(batches.dispatched_at + batches.seconds, batches.sizes)
        assert np.allclose(served, ends - batches.arrivals)

    def test_a_request_over_the_limit_runs_alone_and_one_that_does_not_fit_waits(
        self,
    ) -> None:
        # At 0: 20 rows, over the limit of 8: at once, alone (2 + 20 ms). At 1 and 2 ms: 3 and
        # 6 rows; the device is free at 22 ms, 9 rows wait, the first (3) runs alone: the 6 do
        # not fit beside it. Then the 6, at 27 ms, for 8 ms.
        served = serve(
            [0.0, 0.001, 0.002], [20, 3, 6], alpha_s=0.002, beta_s=0.001, max_batch=8,
            delay_s=0.010,
        )  # fmt: skip
        assert served.tolist() == pytest.approx([0.022, 0.026, 0.033])

    def test_the_room_a_request_that_does_not_fit_leaves_is_filled_from_behind(self) -> None:
        # As the runtime's batcher forms them (tests/test_batching.py): all at 0, limit 8, 21
        # rows waiting: 3 + 4 + 1 (the 6 does not fit) from 0 to 10 ms; the 6 and the 2 from
        # 10 to 20; the 5 alone, from 20 to 27.
        served = serve(
            [0.0] * 6, [3, 6, 4, 1, 2, 5], alpha_s=0.002, beta_s=0.001, max_batch=8,
            delay_s=0.01,
        )  # fmt: skip
        assert served.tolist() == pytest.approx([0.010, 0.020, 0.010, 0.010, 0.020, 0.027])
        # without the fill: 3 alone (to 5 ms), 6 alone (to 13), 4 + 1 + 2 (to 22), the 5
        closing = serve(
            [0.0] * 6, [3, 6, 4, 1, 2, 5], alpha_s=0.002, beta_s=0.001, max_batch=8,
            delay_s=0.01, fill_scan=0,
        )  # fmt: skip
        assert closing.tolist() == pytest.approx([0.005, 0.013, 0.022, 0.022, 0.022, 0.029])

    def test_a_batch_waits_the_delay_for_company_then_goes(self) -> None:
        served = serve([0.0, 0.004], [1, 2], alpha_s=0.002, beta_s=0.001, max_batch=8, delay_s=0.01)
        assert served.tolist() == pytest.approx([0.015, 0.011])

    def test_nonsense_is_refused(self) -> None:
        mix = RowMix.parse("1")
        with pytest.raises(ValueError, match="positive rate"):
            latencies(0, mix, alpha_s=0.001, beta_s=0.001, max_batch=8, delay_s=0, requests=10)
        with pytest.raises(ValueError, match="one size for each arrival"):
            serve([0.0], [1, 2], alpha_s=0.001, beta_s=0.001, max_batch=8, delay_s=0)
        with pytest.raises(ValueError, match="batch limit"):
            serve([0.0], [1], alpha_s=0.001, beta_s=0.001, max_batch=0, delay_s=0)
