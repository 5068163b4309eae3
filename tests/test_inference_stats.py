"""Triton's statistics extension, in process: what `InferenceStatistics` counts from requests and
batches, and that its document is the one Triton's own gRPC messages carry."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as triton_pb

from batchpilot.runtime.engine import EngineInfo, ModelSignature
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2 as ours
from batchpilot.runtime.inference_stats import InferenceStatistics
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.outcomes import BatchDone, RequestOutcome


def stats_of(statistics: InferenceStatistics, version: str = "1") -> dict[str, Any]:
    return statistics.snapshot(name="m", version=version)


class TestCounts:
    def test_every_request_of_a_batch_is_charged_the_batch_whole_times(self) -> None:
        statistics = InferenceStatistics(wall_clock=lambda: 1_700_000_000.25)
        # One batch of three requests of 1, 2 and 5 rows, which waited 1, 2 and 3 ms.
        statistics.batch_done(
            BatchDone(
                rows=8,
                compute_s=0.020,
                queue_waits_s=(1e-3, 2e-3, 3e-3),
                input_s=0.0005,
                output_s=0.0001,
            )
        )
        for duration in (0.030, 0.031, 0.032):
            statistics.request_ended(success=True, duration_s=duration)
        got = stats_of(statistics)
        assert got["inference_count"] == 8  # rows, not requests
        assert got["execution_count"] == 1
        assert got["last_inference"] == 1_700_000_000_250
        inference = got["inference_stats"]
        assert inference["success"] == {"count": 3, "ns": 93_000_000}
        assert inference["fail"] == {"count": 0, "ns": 0}
        assert inference["queue"] == {"count": 3, "ns": 6_000_000}
        assert inference["compute_input"] == {"count": 3, "ns": 1_500_000}
        assert inference["compute_infer"] == {"count": 3, "ns": 60_000_000}
        assert inference["compute_output"] == {"count": 3, "ns": 300_000}
        assert got["batch_stats"] == [
            {
                "batch_size": 8,
                "compute_input": {"count": 1, "ns": 500_000},
                "compute_infer": {"count": 1, "ns": 20_000_000},
                "compute_output": {"count": 1, "ns": 100_000},
            }
        ]

    def test_batches_by_size_in_order(self) -> None:
        statistics = InferenceStatistics()
        for rows, infer_s in ((4, 0.004), (1, 0.001), (4, 0.006)):
            statistics.batch_done(
                BatchDone(
                    rows=rows, compute_s=infer_s, queue_waits_s=(0.0,), input_s=0.0, output_s=0.0
                )
            )
        sizes = [
            (entry["batch_size"], entry["compute_infer"])
            for entry in stats_of(statistics)["batch_stats"]
        ]
        assert sizes == [(1, {"count": 1, "ns": 1_000_000}), (4, {"count": 2, "ns": 10_000_000})]
        assert stats_of(statistics)["execution_count"] == 3
        assert stats_of(statistics)["inference_count"] == 9

    def test_a_failure_counts_with_its_time_or_none(self) -> None:
        statistics = InferenceStatistics()
        statistics.request_ended(success=False, duration_s=0.002)
        statistics.request_ended(success=False, duration_s=None)  # its client went away
        got = stats_of(statistics)["inference_stats"]
        assert got["fail"] == {"count": 2, "ns": 2_000_000}
        assert got["success"] == {"count": 0, "ns": 0}

    @pytest.mark.parametrize(("version", "served"), [(None, "1"), ("", "1"), ("3", "3")])
    def test_a_model_without_versions_is_version_1(self, version: str | None, served: str) -> None:
        # perf_analyzer reads the statistics' version as a number to find the latest.
        signature = ModelSignature(name="m", platform="p", inputs=(), outputs=(), version=version)
        assert signature.served_version == served


def test_the_runtime_metrics_feed_it() -> None:
    """Every request outcome and every batch the metrics adapter hears of reaches the
    statistics: success alone is a success; refusals, timeouts and the rest are failures."""
    engine = EngineInfo(kind="simulated", device="gpu", simulated=True)
    metrics = RuntimeMetrics(model="m", service="", namespace="", engine=engine, nvml=None)
    metrics.batch_done(
        BatchDone(rows=2, compute_s=0.01, queue_waits_s=(0.001, 0.002), input_s=0.0, output_s=0.0)
    )
    for outcome in RequestOutcome:
        metrics.request_finished(outcome, 0.001)
    got = metrics.statistics.snapshot(name="m", version="1")
    assert got["inference_stats"]["success"]["count"] == 1
    assert got["inference_stats"]["fail"]["count"] == len(RequestOutcome) - 1
    assert got["inference_stats"]["queue"] == {"count": 2, "ns": 3_000_000}
    assert got["execution_count"] == 1


def test_the_document_is_tritons_grpc_message_on_the_wire() -> None:
    """The snapshot parses into our ModelStatisticsResponse, and its bytes parse into Triton's
    own message (tritonclient's) with the same content: field names and numbers agree."""
    statistics = InferenceStatistics(wall_clock=lambda: 1_700_000_000.0)
    statistics.batch_done(
        BatchDone(
            rows=3, compute_s=0.002, queue_waits_s=(0.004, 0.005), input_s=0.001, output_s=0.003
        )
    )
    statistics.request_ended(success=True, duration_s=0.01)
    document = {"model_stats": [stats_of(statistics)]}
    message = json_format.ParseDict(document, ours.ModelStatisticsResponse())
    theirs = triton_pb.ModelStatisticsResponse.FromString(message.SerializeToString())
    as_dict = json_format.MessageToDict(
        theirs, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    entry = as_dict["model_stats"][0]
    assert entry.pop("memory_usage") == []  # Triton's fields the runtime does not serve
    assert entry.pop("response_stats") == {}

    def numbers(value: Any) -> Any:  # JSON from protobuf writes uint64 as strings
        if isinstance(value, dict):
            return {
                key: item if key in ("name", "version") else numbers(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [numbers(item) for item in value]
        return int(value) if isinstance(value, str) and value.isdigit() else value

    assert numbers(as_dict) == document
