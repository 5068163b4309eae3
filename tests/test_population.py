"""How many requests the queue has held at once (`batching.population`), with explicit times."""

from __future__ import annotations

from batchpilot.runtime.batching.population import Population


def cycle(population: Population, clients: int, now: float) -> None:
    """A closed loop's clients coming back one after another."""
    for count in range(1, clients + 1):
        population.reached(count, now)


def test_a_count_seen_once_is_no_pattern() -> None:
    population = Population(horizon_s=5.0)
    assert not population.everyone_here(1, 0.0)  # nothing seen
    population.reached(1, 0.0)
    assert not population.everyone_here(1, 0.0)  # the first request
    population.reached(1, 0.1)
    assert population.everyone_here(1, 0.1)


def test_a_closed_loop_is_everyone_only_when_all_are_back() -> None:
    population = Population(horizon_s=5.0)
    cycle(population, 4, 0.0)
    cycle(population, 4, 0.01)
    assert population.everyone_here(4, 0.01)
    assert not population.everyone_here(3, 0.01)


def test_a_new_high_waits_until_seen_again() -> None:
    population = Population(horizon_s=5.0)
    for now in (0.0, 0.01):
        cycle(population, 2, now)
    population.reached(3, 0.02)  # a rising load: three at once for the first time
    assert not population.everyone_here(3, 0.02)
    assert not population.everyone_here(2, 0.02)  # and two is no longer everyone
    cycle(population, 3, 0.03)
    assert population.everyone_here(3, 0.03)


def test_a_population_that_shrinks_is_forgotten_within_the_horizon() -> None:
    population = Population(horizon_s=5.0)
    for now in (0.0, 0.01):
        cycle(population, 4, now)
    # Two clients leave: the other two keep coming back, and the four are remembered until
    # five seconds after they were last all here.
    for now in (1.0, 2.0, 4.9):
        cycle(population, 2, now)
        assert not population.everyone_here(2, now)
    cycle(population, 2, 5.02)
    assert population.everyone_here(2, 5.02)


def test_a_closed_loop_right_after_a_burst_is_everyone_within_a_few_rounds() -> None:
    population = Population(horizon_s=5.0, settled_reaches=8)
    for now in (0.0, 0.01):
        cycle(population, 30, now)  # a burst: thirty at once, twice
    # One client now, in a loop: its count comes back round after round, thirty never again.
    rounds = [0.1 + 0.005 * n for n in range(8)]
    for now in rounds[:-1]:
        cycle(population, 1, now)
        assert not population.everyone_here(1, now)
    cycle(population, 1, rounds[-1])
    assert population.everyone_here(1, rounds[-1])  # 40 ms after the burst, not 5 s
    assert not population.everyone_here(0, rounds[-1])


def test_a_larger_count_in_between_keeps_the_peak() -> None:
    population = Population(horizon_s=5.0, settled_reaches=8)
    for now in (0.0, 0.01):
        cycle(population, 30, now)
    for n in range(20):
        # Two at once most rounds, three every fifth: two never comes back eight times in a
        # row with nothing above it, nor does three.
        cycle(population, 3 if n % 5 == 4 else 2, 0.1 + 0.005 * n)
        assert not population.everyone_here(3, 0.1 + 0.005 * n)
