"""Requests their clients withdrew: neither served nor missed.

A client that hedges — sends a request again when no answer came within a delay, takes the first
and cancels the other (gRPC's hedging policy, Envoy's `hedge_on_per_try_timeout`) — cancels one
send of every pair it makes. The runtime counts an arrival cancelled before the SLA as withdrawn
(`batchpilot_withdrawn_total`), and the autopilot leaves those out of the share of requests left
unserved: counted as misses, a service that answers every request in time would read as over its
SLA, and be scaled up for it, window after window.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.explain import judge
from batchpilot.operator.autopilot.pod_metrics import PodScraper
from batchpilot.operator.autopilot.policy import InForce
from batchpilot.operator.autopilot.reporting import metrics_status
from batchpilot.operator.autopilot.state import State
from batchpilot.runtime.loadgen import LoadConfig, Retries, Target, run_load
from tests.autopilot.test_decide import POLICY, seen
from tests.autopilot.test_pod_metrics import Pods, owner
from tests.runtime_process import Scrape, runtime_process
from tests.waiting import wait_until


class TestTheShareUnserved:
    def test_withdrawn_requests_are_left_out_of_both_sides(self) -> None:
        # 100 arrivals a second, 90 answered, 10 cancelled by their clients before the SLA
        window = replace(seen(at=0, qps=90, p99_ms=60, ready=1), arrival_qps=100)
        assert window.unserved_share == pytest.approx(0.1)
        hedged = replace(window, withdrawn_qps=10)
        assert hedged.unserved_share == 0.0
        assert judge(hedged, POLICY) is True
        assert judge(window, POLICY) is False
        # the load is every arrival all the same: they were queued
        assert hedged.offered_qps == 100

    def test_what_is_refused_besides_is_still_unserved(self) -> None:
        window = replace(
            seen(at=0, qps=80, rejected=10, p99_ms=60, ready=1),
            arrival_qps=100,
            withdrawn_qps=10,
        )
        assert window.unserved_share == pytest.approx(1 - 80 / 90)

    def test_every_arrival_withdrawn_leaves_nothing_unserved(self) -> None:
        window = replace(seen(at=0, qps=0, p99_ms=None, ready=1), arrival_qps=5, withdrawn_qps=5)
        assert window.unserved_share == 0.0

    def test_the_reason_says_so(self) -> None:
        window = replace(
            seen(at=0, qps=90, p99_ms=60, ready=1, batch=4), arrival_qps=100, withdrawn_qps=10
        )
        decision, _ = decide(window, POLICY, InForce(1, 4, 0.005), State(), 0)
        assert "10 rps of them withdrawn by their clients before the SLA" in decision.reason
        assert decision.sla_met is True
        now = datetime.now(UTC)
        assert metrics_status(window, now=now)["withdrawnQps"] == 10.0
        assert "withdrawnQps" not in metrics_status(replace(window, withdrawn_qps=None), now=now)


def test_a_client_that_hedges_against_a_runtime_is_read_as_served(
    mlp_model: Path, tmp_path: Path
) -> None:
    """Real parts: a runtime process (t(b) = 30 ms at batch 1, SLA 200 ms), two clients at a
    time that hedge after 40 ms, and the operator's reading of the pod's own metrics."""
    config = tmp_path / "batching.json"
    config.write_text('{"maxBatchSize": 1, "maxQueueDelayMs": 1, "slaMs": 200}')
    with runtime_process(
        mlp_model,
        "--engine", "simulated", "--simulated-latency", "alpha_ms=30,beta_ms=0",
        "--batching-config", str(config),
        log_dir=tmp_path,
    ) as runtime:  # fmt: skip
        scraper = PodScraper(Pods(f"127.0.0.1:{runtime.admin_port}"), clock=time.time)
        assert scraper(owner(), ready_replicas=1, at=time.time()) is None  # the first read
        load = LoadConfig(
            target=Target(url=runtime.url, model="mlp", timeout_s=5),
            duration_s=20,
            concurrency=2,
            max_requests=40,
            hedge_s=0.04,
            retries=Retries(0, marked=True),  # the copy numbered 2, as Envoy numbers it
        )
        report = asyncio.run(run_load(load))
        # the last sends the clients cancelled may still be on their way out of the server
        wait_until(
            lambda: Scrape(runtime).value("batchpilot_inflight_requests") == 0,
            timeout=10,
            what="every send answered or cancelled",
        )
        observation = scraper(owner(), ready_replicas=1, at=time.time())
        scrape = Scrape(runtime)
    assert report.succeeded == 40
    assert report.hedges >= 10
    # every hedge is a second arrival, one send of each pair withdrawn (the loser cancelled
    # while queued or computing: within its 5 s deadline and the 200 ms SLA)
    assert scrape.value("batchpilot_arrivals_total", attempt="retry") == report.hedges
    withdrawn = scrape.value("batchpilot_withdrawn_total")
    cancelled = scrape.value("batchpilot_requests_total", outcome="cancelled")
    assert withdrawn == cancelled
    assert withdrawn >= 0.8 * report.hedges
    assert observation is not None
    assert observation.withdrawn_qps is not None
    assert observation.withdrawn_qps > 0
    assert observation.unserved_share < 0.01
    # Counted as misses, they would have put the window over the SLA's 1 % unserved.
    assert replace(observation, withdrawn_qps=None).unserved_share > 0.1
