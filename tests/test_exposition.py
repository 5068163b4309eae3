"""`GET /metrics`'s fast text writer gives, byte for byte, what prometheus_client's
`generate_latest` gives — for the runtime's own metrics after traffic, and for every kind of
metric and awkward label value — and keeps giving it as values and label sets change."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchpilot.runtime import exposition
from batchpilot.runtime.engine import EngineInfo
from batchpilot.runtime.exposition import Exposition
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.outcomes import RequestOutcome


def without_process(text: bytes) -> list[str]:
    """The lines, less the process collector's (CPU time moves between two reads)."""
    return [line for line in text.decode().splitlines() if "process_" not in line]


class Stamped(Collector):
    """A custom collector whose samples carry timestamps."""

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("custom_stamped", "a gauge with a timestamp", labels=["k"])
        family.add_metric(["a"], 1.5, timestamp=1_700_000_000.123)
        family.add_metric(["b"], float("nan"))
        yield family


def every_kind() -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("c", 'help with "quotes", a \\ backslash\nand a newline', ["a", "b"],
                      registry=registry)  # fmt: skip
    counter.labels("plain", 'quote " back \\ new\nline').inc(3)
    counter.labels("ünïcødé ✓", "").inc(0.1)
    Gauge("g", "gauge", registry=registry).set(float("inf"))
    Gauge("g_neg", "gauge", registry=registry).set(float("-inf"))
    Gauge("g_big", "gauge", registry=registry).set(123456789012.0)
    histogram = Histogram("h", "histogram", ["x"], buckets=(0.001, 0.5, 10), registry=registry)
    for value in (0.0005, 0.2, 3.0, 50.0):
        histogram.labels("y").observe(value)
    Summary("s", "summary", registry=registry).observe(2.5)
    Info("i", "info", registry=registry).info({"version": "1.2", "z": "last"})
    Enum("e", "enum", states=["up", "down"], registry=registry).state("down")
    registry.register(Stamped())
    return registry


def test_every_kind_of_metric_is_written_as_generate_latest_writes_it() -> None:
    registry = every_kind()
    assert Exposition(registry).render() == generate_latest(registry)


def test_the_runtimes_metrics_after_traffic_are_written_the_same() -> None:
    metrics = RuntimeMetrics(
        model="mlp",
        service="svc",
        namespace="team-a",
        engine=EngineInfo(kind="simulated", device="gpu", simulated=True, detail="t(b)"),
        nvml=None,
    )
    fast = Exposition(metrics.registry)
    assert without_process(fast.render()) == without_process(generate_latest(metrics.registry))
    for index, outcome in enumerate(RequestOutcome):  # label sets appear with traffic
        metrics.request_finished(outcome, 0.012 * (index + 1))
    metrics.shed("draining")
    assert without_process(fast.render()) == without_process(generate_latest(metrics.registry))


def test_values_and_new_label_sets_show_on_the_next_render() -> None:
    registry = CollectorRegistry()
    counter = Counter("calls", "calls", ["key_id"], registry=registry)
    fast = Exposition(registry)
    counter.labels("alice").inc()
    assert fast.render() == generate_latest(registry)
    counter.labels("alice").inc(2)
    counter.labels("bob").inc()
    assert fast.render() == generate_latest(registry)
    counter.remove("alice")
    assert fast.render() == generate_latest(registry)


def test_the_remembered_label_sets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exposition, "MAX_REMEMBERED", 3)
    registry = CollectorRegistry()
    counter = Counter("calls", "calls", ["key_id"], registry=registry)
    fast = Exposition(registry)
    for index in range(10):
        counter.labels(f"k{index}").inc()
        assert fast.render() == generate_latest(registry)
        assert len(fast._prefixes) <= 3
