"""Batching settings changed while serving: the document, the mounted file watcher, and the
service level (SLA, objective) the document carries to the metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client import generate_latest

from batchpilot.runtime.batching import BatchSettings
from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.live_settings import ConfigFileWatcher, batching_doc, parse_batching
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.outcomes import RequestOutcome
from batchpilot.runtime.server import ModelServer
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models

CURRENT = BatchSettings(max_batch_size=8, max_queue_delay_s=0.005)


class TestDocument:
    def test_both_keys(self) -> None:
        settings = parse_batching(b'{"maxBatchSize": 16, "maxQueueDelayMs": 2.5}', current=CURRENT)
        assert settings == BatchSettings(max_batch_size=16, max_queue_delay_s=0.0025)
        assert batching_doc(settings) == {
            "maxBatchSize": 16,
            "maxQueueDelayMs": 2.5,
            "deadlineMs": 0.0,
        }

    def test_the_deadline_is_live_too_and_zero_means_none(self) -> None:
        settings = parse_batching(b'{"deadlineMs": 80}', current=CURRENT)
        assert settings == BatchSettings(max_batch_size=8, max_queue_delay_s=0.005, deadline_s=0.08)
        assert batching_doc(settings)["deadlineMs"] == 80.0
        assert parse_batching(b'{"deadlineMs": 0}', current=settings).deadline_s is None
        # absent: the deadline in force stays
        assert parse_batching(b'{"maxBatchSize": 2}', current=settings).deadline_s == 0.08

    def test_absent_keys_keep_their_value(self) -> None:
        settings = parse_batching(b'{"maxBatchSize": 2}', current=CURRENT)
        assert settings == BatchSettings(max_batch_size=2, max_queue_delay_s=0.005)

    def test_the_sla_and_objective_travel_with_the_batch_settings(self) -> None:
        body = b'{"maxBatchSize": 4, "deadlineMs": 90, "slaMs": 100, "objectivePercent": 99.9}'
        settings = parse_batching(body, current=CURRENT)
        assert (settings.sla_s, settings.objective) == (0.1, 0.999)
        assert batching_doc(settings) == {
            "maxBatchSize": 4,
            "maxQueueDelayMs": 5.0,
            "deadlineMs": 90.0,
            "slaMs": 100.0,
            "objectivePercent": 99.9,
        }
        # absent: they stay, exactly (no round trip through other units)
        again = parse_batching(b'{"maxBatchSize": 8}', current=settings)
        assert (again.sla_s, again.objective) == (0.1, 0.999)
        # a document without them (an older operator): none, and none shown
        assert parse_batching(b'{"maxBatchSize": 8}', current=CURRENT).sla_s is None
        assert "slaMs" not in batching_doc(CURRENT)
        assert "objectivePercent" not in batching_doc(CURRENT)

    def test_the_burst_size_is_live_and_zero_means_none(self) -> None:
        settings = parse_batching(b'{"maxBatchSize": 4, "burstBatchSize": 32}', current=CURRENT)
        assert (settings.burst_batch_size, settings.ceiling) == (32, 32)
        assert batching_doc(settings)["burstBatchSize"] == 32
        # absent: it stays; 0: none, and none shown
        assert parse_batching(b'{"maxBatchSize": 8}', current=settings).burst_batch_size == 32
        cleared = parse_batching(b'{"burstBatchSize": 0}', current=settings)
        assert (cleared.burst_batch_size, cleared.ceiling) == (None, 4)
        assert "burstBatchSize" not in batching_doc(cleared)
        # below the limit it changes nothing: the limit is the most a batch takes
        assert parse_batching(b'{"burstBatchSize": 2}', current=CURRENT).ceiling == 8

    def test_the_rows_timed_at_start_up_are_kept_and_shown(self) -> None:
        settings = parse_batching(b'{"calibrationRows": 32}', current=CURRENT)
        assert settings.calibration_rows == 32
        assert batching_doc(settings)["calibrationRows"] == 32
        assert parse_batching(b'{"maxBatchSize": 4}', current=settings).calibration_rows == 32
        cleared = parse_batching(b'{"calibrationRows": 0}', current=settings)
        assert cleared.calibration_rows is None
        assert "calibrationRows" not in batching_doc(cleared)

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (b"nope", "not valid JSON"),
            (b'{"calibrationRows": 2.5}', "calibrationRows must be an integer"),
            (b'{"calibrationRows": -3}', "calibrationRows must be 0 .none. or more"),
            (b'{"burstBatchSize": 8.5}', "burstBatchSize must be an integer"),
            (b'{"burstBatchSize": -1}', "burstBatchSize must be 0 .none. or more"),
            (b"[1]", "must be a JSON object"),
            (b'{"batchSize": 4}', "unknown batching setting batchSize"),
            (b'{"maxBatchSize": "4"}', "maxBatchSize must be an integer"),
            (b'{"maxBatchSize": true}', "maxBatchSize must be an integer"),
            (b'{"maxBatchSize": 0}', "max_batch_size must be at least 1"),
            (b'{"maxQueueDelayMs": "5"}', "maxQueueDelayMs must be a number"),
            (b'{"maxQueueDelayMs": -1}', "max_queue_delay must be between"),
            (b'{"deadlineMs": "100"}', "deadlineMs must be a number"),
            (b'{"deadlineMs": -5}', "deadlineMs must be 0 .no deadline. or more"),
            (b'{"deadlineMs": 7200000}', "the deadline must be more than 0 and at most 3600 s"),
            (b'{"slaMs": "100"}', "slaMs must be a number"),
            (b'{"slaMs": 0}', "slaMs must be more than 0"),
            (b'{"slaMs": 900000}', "the SLA must be more than 0 and at most 600 s"),
            (b'{"objectivePercent": true}', "objectivePercent must be a number"),
            (b'{"objectivePercent": 100}', "objectivePercent must be more than 0 and below 100"),
            (b'{"objectivePercent": 0}', "objectivePercent must be more than 0 and below 100"),
        ],
    )
    def test_refusals(self, body: bytes, message: str) -> None:
        with pytest.raises(InvalidRequest, match=message):
            parse_batching(body, current=CURRENT)


class TestConfigFileWatcher:
    def make(self, path: Path) -> tuple[ConfigFileWatcher, list[BatchSettings]]:
        applied: list[BatchSettings] = []
        watcher = ConfigFileWatcher(
            path, current=lambda: applied[-1] if applied else CURRENT, apply=applied.append
        )
        return watcher, applied

    def test_applies_the_file_once_and_again_only_when_it_changes(self, tmp_path: Path) -> None:
        path = tmp_path / "batching.json"
        path.write_text('{"maxBatchSize": 4}')
        watcher, applied = self.make(path)
        assert watcher.check()
        assert not watcher.check()
        assert applied == [BatchSettings(max_batch_size=4, max_queue_delay_s=0.005)]

    def test_follows_an_atomic_swap_like_a_configmap_update(self, tmp_path: Path) -> None:
        # The kubelet writes a new directory and swaps a symlink to it.
        (tmp_path / "v1").mkdir()
        (tmp_path / "v1" / "batching.json").write_text('{"maxBatchSize": 4}')
        os.symlink("v1", tmp_path / "..data")
        os.symlink("..data/batching.json", tmp_path / "batching.json")
        watcher, applied = self.make(tmp_path / "batching.json")
        assert watcher.check()
        (tmp_path / "v2").mkdir()
        (tmp_path / "v2" / "batching.json").write_text('{"maxBatchSize": 32}')
        os.symlink("v2", tmp_path / "..data_tmp")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        assert watcher.check()
        assert [s.max_batch_size for s in applied] == [4, 32]

    def test_a_broken_file_is_ignored_and_the_settings_stay(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        path = tmp_path / "batching.json"
        path.write_text('{"maxBatchSize": 4}')
        watcher, applied = self.make(path)
        watcher.check()
        path.write_text('{"maxBatchSize": -3, "padding": 1}')
        assert not watcher.check()
        assert "batching config" in caplog.text
        assert "ignored" in caplog.text
        assert len(applied) == 1

    def test_a_missing_file_changes_nothing(self, tmp_path: Path) -> None:
        watcher, applied = self.make(tmp_path / "absent.json")
        assert not watcher.check()
        assert applied == []


class TestServiceLevelGauges:
    """`batchpilot_sla_seconds` and `batchpilot_slo_objective_ratio` follow the document the
    server is given (mounted file or admin endpoint), with the labels of every other series."""

    LABELS: ClassVar[dict[str, str]] = {
        "model": "mlp",
        "isvc": "resnet50",
        "namespace": "vision",
    }

    def server(self, tmp_path: Path) -> ModelServer:
        model = onnx_models.mlp(tmp_path / "mlp.onnx", features=4, hidden=8, classes=3)
        engine = SimulatedEngine.load(model, name="mlp", latency=LatencyModel(0.0, 0.0))
        metrics = RuntimeMetrics(
            model="mlp", service="resnet50", namespace="vision", engine=engine.info, nvml=None
        )
        return ModelServer(engine, batching=CURRENT, queue_capacity=4, metrics=metrics)

    def gauges(self, server: ModelServer) -> tuple[float | None, float | None]:
        registry = server.metrics.registry
        return (
            registry.get_sample_value("batchpilot_sla_seconds", self.LABELS),
            registry.get_sample_value("batchpilot_slo_objective_ratio", self.LABELS),
        )

    def test_absent_until_the_document_gives_them(self, tmp_path: Path) -> None:
        server = self.server(tmp_path)
        assert self.gauges(server) == (None, None)
        exposed = generate_latest(server.metrics.registry).decode()
        assert "batchpilot_sla_seconds{" not in exposed
        assert "batchpilot_slo_objective_ratio{" not in exposed

    def test_requests_over_the_sla_are_counted_once_it_is_given(self, tmp_path: Path) -> None:
        """`batchpilot_requests_over_sla_total`: the requests timed slower than the SLA in force,
        absent until an SLA is given (a 0 would read as every request inside it)."""
        metrics = self.server(tmp_path).metrics
        metrics.request_finished(RequestOutcome.SUCCESS, 0.5)
        assert (
            "batchpilot_requests_over_sla_total{" not in generate_latest(metrics.registry).decode()
        )
        metrics.settings_changed(max_batch_size=4, max_queue_delay_s=0.005, sla_s=0.1)
        for outcome, seconds in (
            (RequestOutcome.SUCCESS, 0.099),
            (RequestOutcome.SUCCESS, 0.1),  # at the SLA is inside it
            (RequestOutcome.SUCCESS, 0.101),
            (RequestOutcome.TIMEOUT, 0.2),
            (RequestOutcome.REJECTED, 0.3),  # refused: not timed, not counted here
        ):
            metrics.request_finished(outcome, seconds)
        over = metrics.registry.get_sample_value("batchpilot_requests_over_sla_total", self.LABELS)
        assert over == 2
        timed = metrics.registry.get_sample_value(
            "batchpilot_request_duration_seconds_count", self.LABELS
        )
        assert timed == 5  # the one before the SLA, and four since

    def test_the_mounted_document_sets_them(self, tmp_path: Path) -> None:
        server = self.server(tmp_path)
        path = tmp_path / "batching.json"
        path.write_text(
            '{"maxBatchSize": 4, "maxQueueDelayMs": 5.0, "deadlineMs": 88.0,'
            ' "slaMs": 100, "objectivePercent": 99.5}'
        )
        watcher = ConfigFileWatcher(
            path,
            current=lambda: server.batching,
            apply=lambda s: server.set_batching(s, source=str(path)),
        )
        assert watcher.check()
        assert self.gauges(server) == (0.1, 0.995)
        # a new SLA and objective: the gauges follow
        path.write_text('{"slaMs": 250, "objectivePercent": 99.9}')
        assert watcher.check()
        assert self.gauges(server) == (0.25, 0.999)
        assert server.batching.max_batch_size == 4  # kept

    def test_settings_without_them_remove_the_series(self, tmp_path: Path) -> None:
        server = self.server(tmp_path)
        server.set_batching(
            BatchSettings(max_batch_size=2, max_queue_delay_s=0.0, sla_s=0.1, objective=0.99),
            source="test",
        )
        assert self.gauges(server) == (0.1, 0.99)
        server.set_batching(BatchSettings(max_batch_size=2, max_queue_delay_s=0.0), source="test")
        assert self.gauges(server) == (None, None)


class TestBatchBucketsFromZero:
    """Every batch-size bucket a batch may fall in is exported at zero from the limit that
    reaches it, before its first batch: Prometheus counts that batch, and rate() has the
    bucket's series from the scrape after the limit changed."""

    def buckets(self, server: ModelServer) -> dict[str, float]:
        registry = server.metrics.registry
        return {
            bucket: value
            for bucket in ("1", "2", "4", "8", "16", "32", "64")
            if (
                value := registry.get_sample_value(
                    "batchpilot_batches_total",
                    {**TestServiceLevelGauges.LABELS, "batch_bucket": bucket},
                )
            )
            is not None
        }

    def test_a_raised_limit_exports_its_buckets(self, tmp_path: Path) -> None:
        server = TestServiceLevelGauges().server(tmp_path)  # started at limit 8
        assert self.buckets(server) == {"1": 0, "2": 0, "4": 0, "8": 0}
        server.set_batching(BatchSettings(max_batch_size=20, max_queue_delay_s=0.0), source="test")
        assert self.buckets(server) == {"1": 0, "2": 0, "4": 0, "8": 0, "16": 0, "32": 0}
        # a lowered limit keeps them: their counts are history Prometheus still reads
        server.set_batching(BatchSettings(max_batch_size=1, max_queue_delay_s=0.0), source="test")
        assert set(self.buckets(server)) == {"1", "2", "4", "8", "16", "32"}

    def test_a_burst_size_exports_the_buckets_it_reaches(self, tmp_path: Path) -> None:
        server = TestServiceLevelGauges().server(tmp_path)
        server.set_batching(
            BatchSettings(max_batch_size=4, max_queue_delay_s=0.0, burst_batch_size=64),
            source="test",
        )
        assert set(self.buckets(server)) == {"1", "2", "4", "8", "16", "32", "64"}
        registry = server.metrics.registry
        labels = TestServiceLevelGauges.LABELS
        assert registry.get_sample_value("batchpilot_batching_burst_batch_size", labels) == 64
        server.set_batching(BatchSettings(max_batch_size=4, max_queue_delay_s=0.0), source="test")
        assert registry.get_sample_value("batchpilot_batching_burst_batch_size", labels) == 4
