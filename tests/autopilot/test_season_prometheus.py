"""The seasonal queries against a real Prometheus holding two days of history.

The history is backfilled (`promtool tsdb create-blocks-from openmetrics`, as an operator would
import old data): a service at 10 rps whose load stepped to 60 rps two minutes after this time
on each of the last two days. The observer must read today's level, each day's level and each
day's look-ahead peak; and a period Prometheus holds no history for means no forecast at all.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from batchpilot.operator.autopilot.prometheus import (
    PrometheusObserver,
    Scope,
    Seasonality,
    http_query,
)
from batchpilot.operator.autopilot.season import seasonal_forecast
from batchpilot.sandbox.prometheus import prometheus_process

pytestmark = pytest.mark.slow

SCOPE = Scope(namespace="vision", isvc="resnet50")
DAY = 86_400
SCRAPE_S = 15
BASE, STEP = 10.0, 60.0


def history(now: int) -> str:
    """OpenMetrics text: the arrivals counter every 15 s from two days and two hours ago."""
    steps = [(now - n * DAY + 120, now - n * DAY + 720) for n in (1, 2)]
    lines = ["# TYPE batchpilot_arrivals counter"]
    labels = f'namespace="{SCOPE.namespace}",isvc="{SCOPE.isvc}",pod="{SCOPE.isvc}-0"'
    total = 0.0
    for t in range(now - 2 * DAY - 7200, now - SCRAPE_S, SCRAPE_S):
        rate = STEP if any(lo <= t < hi for lo, hi in steps) else BASE
        total += rate * SCRAPE_S
        lines.append(f"batchpilot_arrivals_total{{{labels}}} {total:.0f} {t}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def test_two_days_of_history_forecast_the_daily_step(tmp_path: Path) -> None:
    now = int(time.time()) // SCRAPE_S * SCRAPE_S
    source = tmp_path / "history.om"
    source.write_text(history(now))
    data = tmp_path / "prometheus" / "data"
    data.mkdir(parents=True)
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with prometheus_process(tmp_path / "prometheus", retention="4d") as prometheus:
        query = http_query(prometheus.url)
        daily = PrometheusObserver(
            query, window_s=60, seasonality=Seasonality(period_s=DAY), clock=time.time
        )
        observation = daily.observe(SCOPE, ready_replicas=1, at=now)
        assert observation is not None
        assert observation.level_qps == pytest.approx(BASE, rel=0.05)
        assert len(observation.past) == 2
        for period in observation.past:
            assert period.level_qps == pytest.approx(BASE, rel=0.05)
            assert period.ahead_qps == pytest.approx(STEP, rel=0.05)
        forecast = seasonal_forecast(observation.level_qps, observation.past)
        assert forecast is not None
        assert forecast.rate == pytest.approx(STEP, rel=0.1)

        # Three days back there is no history: the pattern is unknown, not smaller.
        weekly = PrometheusObserver(
            query,
            window_s=60,
            seasonality=Seasonality(period_s=DAY, periods=3),
            clock=time.time,
        )
        observation = weekly.observe(SCOPE, ready_replicas=1, at=now)
        assert observation is not None
        assert observation.past == ()
        assert observation.level_qps == pytest.approx(BASE, rel=0.05)
