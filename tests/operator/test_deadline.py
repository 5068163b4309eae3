"""The pods' default deadline, derived from the SLA and the latency learned outside the batcher."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchpilot.operator.children.configmap import batching_document, batching_in
from batchpilot.operator.children.deadline import default_deadline_ms


class TestDefaultDeadline:
    def test_nothing_learned_is_the_sla_itself(self) -> None:
        assert default_deadline_ms(sla_ms=100, outside_s=None) == 100

    def test_the_latency_outside_the_batcher_comes_off(self) -> None:
        # 100 - 12.3 = 87.7 ms, down to the 2 ms step: 86
        assert default_deadline_ms(sla_ms=100, outside_s=0.0123) == 86

    def test_an_overhead_gone_wild_leaves_half_the_sla(self) -> None:
        assert default_deadline_ms(sla_ms=100, outside_s=5.0) == 50

    def test_a_wobble_within_a_step_keeps_the_deadline_in_force(self) -> None:
        # in force 86; wanted 100 - 13.1 = 86.9, within a 2 ms step: no change
        assert default_deadline_ms(sla_ms=100, outside_s=0.0131, in_force_ms=86) == 86
        # wanted 100 - 9 = 91, more than a step away: it moves
        assert default_deadline_ms(sla_ms=100, outside_s=0.009, in_force_ms=86) == 90

    def test_an_sla_change_moves_it_at_once(self) -> None:
        assert default_deadline_ms(sla_ms=250, outside_s=None, in_force_ms=100) == 250

    def test_whole_milliseconds_for_small_slas(self) -> None:
        assert default_deadline_ms(sla_ms=10, outside_s=0.0021) == 7  # step 1 ms: floor(7.9)

    @given(
        sla_ms=st.integers(min_value=1, max_value=600_000),
        outside_s=st.one_of(st.none(), st.floats(min_value=0, max_value=1000)),
        in_force=st.one_of(st.none(), st.floats(min_value=1, max_value=600_000)),
    )
    def test_written_and_read_back_it_is_a_no_op(
        self, sla_ms: int, outside_s: float | None, in_force: float | None
    ) -> None:
        deadline = default_deadline_ms(sla_ms=sla_ms, outside_s=outside_s, in_force_ms=in_force)
        document = batching_document(batch_size=4, max_queue_delay_ms=5.0, deadline_ms=deadline)
        recorded = batching_in({"data": {"batching.json": document}})
        assert recorded is not None
        # the next tick with the same knowledge changes nothing
        again = default_deadline_ms(
            sla_ms=sla_ms, outside_s=outside_s, in_force_ms=recorded.deadline_ms
        )
        assert again == recorded.deadline_ms == deadline
        assert 0 < deadline <= max(sla_ms, in_force or 0)


def test_a_document_from_an_older_operator_has_no_deadline() -> None:
    old = json.dumps({"maxBatchSize": 4, "maxQueueDelayMs": 5.0})
    recorded = batching_in({"data": {"batching.json": old}})
    assert recorded is not None
    assert recorded.deadline_ms is None


@pytest.mark.parametrize("doc", ['{"maxBatchSize": "x"}', "[]", "nope"])
def test_an_unreadable_document_is_none(doc: str) -> None:
    assert batching_in({"data": {"batching.json": doc}}) is None
