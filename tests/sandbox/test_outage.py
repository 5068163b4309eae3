"""`sandbox up --prometheus-outage AT_S:FOR_S`: what it accepts, and a Prometheus started
again on its port and data."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from batchpilot.sandbox.prometheus import prometheus_process
from batchpilot.sandbox.up import PrometheusOutage, parse_outage


def test_an_outage_is_a_start_and_a_length() -> None:
    assert parse_outage("20:30") == PrometheusOutage(20.0, 30.0)
    assert parse_outage("0:0.5") == PrometheusOutage(0.0, 0.5)


@pytest.mark.parametrize("text", ["20", "20:", ":30", "x:30", "-1:30", "20:0"])
def test_anything_else_is_refused_with_the_shape(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected AT_S:FOR_S \(e.g. 20:30\)"):
        parse_outage(text)


@pytest.mark.slow
def test_prometheus_started_again_answers_on_the_same_port(tmp_path: Path) -> None:
    with prometheus_process(tmp_path) as prometheus:
        url = prometheus.url
        prometheus.stop()
        assert not prometheus.running
        with pytest.raises(urllib.error.URLError, match="refused"):
            urllib.request.urlopen(f"{url}/-/ready", timeout=1)
        prometheus.restart()
        assert prometheus.url == url
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            assert answer.status == 200
