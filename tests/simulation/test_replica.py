"""The batch loop against queueing theory and against the runtime batcher's rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchpilot.simulation.replica import Replica, Served


def run(replica: Replica, arrivals: np.ndarray, *, chunk_s: float = 15.0) -> list[Served]:
    """Feed the arrivals a control interval at a time, then drain."""
    end = float(arrivals[-1]) + chunk_s
    served, start = [], 0.0
    while start < end:
        stop = start + chunk_s
        mine = arrivals[(arrivals >= start) & (arrivals < stop)].tolist()
        served.append(replica.serve(mine, since=start, until=stop))
        start = stop
    served.append(replica.serve([], since=start, until=math.inf))
    return served


def waits(served: list[Served]) -> np.ndarray:
    return np.concatenate([np.repeat(s.dispatched_at, s.sizes) - s.arrivals for s in served])


class TestClosedForms:
    @pytest.mark.parametrize("rho", [0.5, 0.8])
    def test_batch_1_is_an_md1_queue(self, rho: float) -> None:
        # M/D/1: mean wait ρ·t / (2(1 - ρ)). t = 4 ms; ρ = 0.5 → 2 ms, ρ = 0.8 → 8 ms.
        service = 0.004
        rate = rho / service
        arrivals = np.cumsum(np.random.default_rng(1).exponential(1 / rate, size=200_000))
        replica = Replica(alpha_s=service, beta_s=0.0, max_batch=1, delay_s=0.005)
        mean_wait = float(waits(run(replica, arrivals)).mean())
        assert mean_wait == pytest.approx(rho * service / (2 * (1 - rho)), rel=0.05)

    def test_a_fixed_batch_limit_caps_throughput_at_b_over_t_b(self) -> None:
        # t(8) = 2 + 1·8 = 10 ms → at most 8 / 10 ms = 800 rps, whatever is offered (1500 rps).
        arrivals = np.cumsum(np.random.default_rng(2).exponential(1 / 1500, size=30_000))
        replica = Replica(alpha_s=0.002, beta_s=0.001, max_batch=8, delay_s=0.0, capacity=10**6)
        served = run(replica, arrivals)
        dispatched = np.concatenate([s.dispatched_at for s in served])
        sizes = np.concatenate([s.sizes for s in served])
        busy_until = dispatched[-1] + 0.002 + 0.001 * sizes[-1]
        assert sizes.sum() / busy_until == pytest.approx(800, rel=0.01)
        assert (sizes == 8).mean() > 0.99  # a backlog always fills the batch

    def test_a_full_queue_sheds_what_exceeds_capacity(self) -> None:
        # 1000 rps for 10 s against 100 rps of capacity and 50 places: about 9000 - 50 shed.
        arrivals = np.arange(0, 10, 0.001)
        replica = Replica(alpha_s=0.01, beta_s=0.0, max_batch=1, delay_s=0.0, capacity=50)
        served = run(replica, arrivals, chunk_s=10)
        done = sum(s.batches for s in served)
        shed = sum(s.shed for s in served)
        assert done + shed == len(arrivals)
        assert done == pytest.approx(10 / 0.01 + 50, abs=2)


class TestBatcherRules:
    def make(self, **settings: float) -> Replica:
        values = {"alpha_s": 0.010, "beta_s": 0.0, "max_batch": 4, "delay_s": 0.005}
        values.update(settings)
        return Replica(
            alpha_s=values["alpha_s"],
            beta_s=values["beta_s"],
            max_batch=int(values["max_batch"]),
            delay_s=values["delay_s"],
        )

    def test_a_lone_request_waits_the_queue_delay(self) -> None:
        served = self.make().serve([1.0], since=0.0, until=2.0)
        assert served.dispatched_at.tolist() == [pytest.approx(1.005)]  # 1.0 + 5 ms
        assert served.sizes.tolist() == [1]

    def test_a_full_batch_leaves_at_once(self) -> None:
        served = self.make().serve([1.0, 1.001, 1.002, 1.003], since=0.0, until=2.0)
        assert served.dispatched_at.tolist() == [pytest.approx(1.003)]  # the 4th arrival
        assert served.sizes.tolist() == [4]

    def test_a_busy_device_makes_the_next_batch_wait_and_grow(self) -> None:
        # Batch 1 leaves at 1.005 and runs 10 ms; 1.006, 1.007 and 1.008 wait until 1.015.
        served = self.make().serve([1.0, 1.006, 1.007, 1.008], since=0.0, until=2.0)
        assert served.dispatched_at.tolist() == [pytest.approx(1.005), pytest.approx(1.015)]
        assert served.sizes.tolist() == [1, 3]

    def test_settings_change_between_calls(self) -> None:
        replica = self.make(delay_s=1.0)
        first = replica.serve([0.5, 0.6], since=0.0, until=1.0)
        assert first.batches == 0  # still waiting for company (until 1.5)
        replica.max_batch = 2
        second = replica.serve([], since=1.0, until=2.0)
        assert second.dispatched_at.tolist() == [1.0]  # full under the new limit, from now
        assert second.sizes.tolist() == [2]

    def test_every_request_is_answered_once_in_arrival_order(self) -> None:
        arrivals = np.sort(np.random.default_rng(3).uniform(0, 60, 20_000))
        served = run(self.make(alpha_s=0.001, beta_s=0.0005, max_batch=16), arrivals)
        answered = np.concatenate([s.arrivals for s in served])
        assert np.array_equal(answered, arrivals)


class TestDeadlineAdmission:
    """The runtime's admission: refuse at arrival what is predicted to finish past the deadline."""

    def make(self, deadline_s: float | None) -> Replica:
        # t(b) = 2 + 1·b ms: full batches of 8 take 10 ms, one replica carries 800 rps at most.
        return Replica(
            alpha_s=0.002, beta_s=0.001, max_batch=8, delay_s=0.005, deadline_s=deadline_s
        )

    def overload(self, deadline_s: float | None) -> tuple[np.ndarray, list[Served]]:
        arrivals = np.cumsum(np.random.default_rng(4).exponential(1 / 1600, size=96_000))
        return arrivals, run(self.make(deadline_s), arrivals)

    def test_at_twice_the_capacity_the_excess_is_refused_at_arrival(self) -> None:
        arrivals, served = self.overload(deadline_s=0.050)
        done = sum(int(s.sizes.sum()) for s in served)
        refused = sum(s.refused for s in served)
        assert sum(s.shed for s in served) == 0  # the queue never fills: nobody waits that long
        assert done + refused == len(arrivals)  # every request answered or refused, once
        # 1600 rps offered for 60 s, 800 served: half refused.
        assert done / 60 == pytest.approx(800, rel=0.02)
        assert refused / len(arrivals) == pytest.approx(0.5, rel=0.04)

    def test_what_it_admits_finishes_within_the_deadline(self) -> None:
        _, served = self.overload(deadline_s=0.050)
        ends = np.concatenate(
            [np.repeat(s.dispatched_at + 0.002 + 0.001 * s.sizes, s.sizes) for s in served]
        )
        latency = ends - np.concatenate([s.arrivals for s in served])
        assert latency.max() <= 0.050 + 1e-9
        assert np.percentile(latency, 50) > 0.030  # the queue stays near the deadline's depth

    def test_without_a_deadline_the_queue_grows_until_it_sheds(self) -> None:
        arrivals, served = self.overload(deadline_s=None)
        refused = sum(s.refused for s in served)
        shed = sum(s.shed for s in served)
        assert refused == 0
        assert shed > 0.45 * len(arrivals)  # the 1024 places fill within 2 s
        latency = waits(served)
        assert np.percentile(latency, 99) > 1.0  # 1024 requests ahead: 128 batches, 1.28 s

    def test_under_the_capacity_nothing_is_refused(self) -> None:
        arrivals = np.cumsum(np.random.default_rng(5).exponential(1 / 400, size=24_000))
        served = run(self.make(0.050), arrivals)
        assert sum(s.refused for s in served) == 0

    def test_a_request_predicted_late_is_refused_and_a_later_one_admitted(self) -> None:
        # t(b) = 10 ms, batches of 1, a 25 ms deadline. The first runs from 1.000 to 1.010; the
        # second waits. A third at 1.001 would finish at 1.010 + 10 + 10 ms = 1.030, 29 ms after
        # arriving: refused. A fourth at 1.006 would finish then too, 24 ms after: admitted.
        replica = Replica(alpha_s=0.010, beta_s=0.0, max_batch=1, delay_s=0.0, deadline_s=0.025)
        served = replica.serve([1.0, 1.0005, 1.001, 1.006], since=0.0, until=2.0)
        assert served.refused_at.tolist() == [1.001]
        assert served.arrivals.tolist() == [1.0, 1.0005, 1.006]
        assert served.dispatched_at.tolist() == [1.0, 1.010, 1.020]


class TestBurstBatches:
    """The runtime's burst size (`tests/test_admission.py::TestBurstBatches`, the same cases):
    a backlog of more than the limit runs in one batch, up to the burst size; t(b) = 20 + 1·b
    ms, a batch limit of 4 (24 ms a batch), a 100 ms deadline."""

    def make(self, burst: int | None = 32) -> Replica:
        return Replica(
            alpha_s=0.020, beta_s=0.001, max_batch=4, delay_s=0.0, deadline_s=0.100, burst=burst
        )

    def test_a_backlog_runs_in_one_batch(self) -> None:
        # six batches of 4 take 144 ms; one of 24 takes 44 ms
        served = self.make().serve([1.0] * 24, since=0.0, until=2.0)
        assert served.sizes.tolist() == [24]
        assert served.refused == 0

    def test_without_a_burst_size_the_same_backlog_is_refused_in_part(self) -> None:
        served = self.make(burst=None).serve([1.0] * 24, since=0.0, until=2.0)
        assert 0 < served.refused < 24
        assert max(served.sizes) == 4

    def test_what_comes_while_a_batch_runs_is_the_next_backlog(self) -> None:
        served = self.make().serve([1.0] + [1.010] * 6, since=0.0, until=2.0)
        assert served.sizes.tolist() == [1, 6]
        assert served.dispatched_at.tolist() == [1.0, pytest.approx(1.021)]

    def test_the_oldest_request_bounds_the_larger_batch(self) -> None:
        # The oldest arrived 70 ms before the others: 30 ms of its deadline are left when they
        # come, enough for a batch of 10; the 6 left run as one. Batches of 4 serve 16 in time;
        # more would join the backlog's batch only if the oldest could wait for it: refused.
        replica = self.make()
        replica.free_at = 1.070  # the device is busy until the others arrive
        served = replica.serve([1.0] + [1.070] * 20, since=0.0, until=2.0)
        assert served.sizes.tolist() == [10, 6]
        assert served.refused == 5

    def test_the_burst_size_is_the_most_a_batch_takes(self) -> None:
        served = self.make(burst=8).serve([1.0] * 24, since=0.0, until=2.0)
        assert served.sizes.tolist() == [8, 8, 8]

    def test_where_rows_cost_most_a_backlog_served_in_time_keeps_the_limit(self) -> None:
        replica = Replica(
            alpha_s=0.002, beta_s=0.010, max_batch=4, delay_s=0.0, deadline_s=1.0, burst=32
        )
        assert replica.serve([1.0] * 8, since=0.0, until=2.0).sizes.tolist() == [4, 4]

    def test_where_rows_cost_most_a_backlog_the_limit_makes_late_runs_together(self) -> None:
        replica = Replica(
            alpha_s=0.002, beta_s=0.010, max_batch=4, delay_s=0.0, deadline_s=0.120, burst=32
        )
        served = replica.serve([1.0] * 12, since=0.0, until=2.0)
        assert (served.sizes.tolist(), served.refused) == ([11], 1)

    def test_without_a_deadline_a_batch_never_grows(self) -> None:
        replica = self.make()
        replica.deadline_s = None
        served = replica.serve([1.0] * 12, since=0.0, until=2.0)
        assert served.sizes.tolist() == [4, 4, 4]

    def test_past_the_limits_capacity_larger_batches_serve_it_within_the_deadline(self) -> None:
        # The limit of 4 carries 4 / 24 ms = 167 rps; batches of up to 32, 615 rps. 400 rps
        # offered: without a burst size 60 % is refused, with one nearly all is served.
        arrivals = np.cumsum(np.random.default_rng(4).exponential(1 / 400, size=24_000))
        served = {burst: run(self.make(burst), arrivals) for burst in (None, 32)}
        rates = {burst: sum(int(s.sizes.sum()) for s in out) / 60 for burst, out in served.items()}
        assert rates[None] == pytest.approx(167, rel=0.03)
        assert rates[32] > 0.97 * 400
        latency = np.concatenate(
            [
                np.repeat(s.dispatched_at + 0.020 + 0.001 * s.sizes, s.sizes) - s.arrivals
                for s in served[32]
            ]
        )
        assert np.percentile(latency, 99) <= 0.100
