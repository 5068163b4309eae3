"""Requests that say they are retries are counted apart: the headers, and a real runtime's series.

The demand the autopilot sizes for is the first attempts; a retry's arrival is still an
arrival (admitted or refused like any other), counted under `attempt="retry"`.
"""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from batchpilot.runtime.attempts import is_retry, is_retry_raw
from batchpilot.runtime.engine import EngineInfo
from batchpilot.runtime.metrics import RuntimeMetrics
from tests.runtime_process import Scrape, runtime_process, send
from tests.test_server_process import v2_request
from tests.waiting import wait_until

SIMULATED = ("--engine", "simulated", "--simulated-latency", "alpha_ms=1,beta_ms=0.1")
INFER = "/v2/models/mlp/infer"
RETRYING = [
    ("grpc.enable_retries", 1),
    (
        "grpc.service_config",
        json.dumps(
            {
                "methodConfig": [
                    {
                        "name": [{"service": "inference.GRPCInferenceService"}],
                        "retryPolicy": {
                            "maxAttempts": 3,
                            "initialBackoff": "0.01s",
                            "maxBackoff": "0.05s",
                            "backoffMultiplier": 2,
                            "retryableStatusCodes": ["UNAVAILABLE"],
                        },
                    }
                ]
            }
        ),
    ),
]
"""A gRPC client that tries what is refused (UNAVAILABLE) three times in all (gRFC A6)."""


@pytest.mark.parametrize(
    ("headers", "retry"),
    [
        ([], False),
        ([("x-envoy-attempt-count", "1")], False),
        ([("x-envoy-attempt-count", "2")], True),
        ([("x-envoy-attempt-count", " 7 ")], True),
        ([("grpc-previous-rpc-attempts", "0")], False),
        ([("grpc-previous-rpc-attempts", "1")], True),
        # Not a whole number: read for the metrics alone, so no retry and no error.
        ([("x-envoy-attempt-count", "two")], False),
        ([("x-envoy-attempt-count", "2.0")], False),
        ([("grpc-previous-rpc-attempts", "")], False),
        # Another header with a number is not read.
        ([("x-attempt", "3"), ("content-length", "9")], False),
        ([("x-envoy-attempt-count", "1"), ("grpc-previous-rpc-attempts", "2")], True),
    ],
)
def test_the_headers_that_mark_a_retry(headers: list[tuple[str, str]], retry: bool) -> None:
    assert is_retry(headers) is retry
    raw = [(name.encode(), value.encode()) for name, value in headers]
    assert is_retry_raw(raw) is retry


def test_the_last_seconds_rate_is_kept_by_attempt_too() -> None:
    metrics = RuntimeMetrics(
        model="mlp",
        service="mlp",
        namespace="default",
        engine=EngineInfo(kind="simulated", device="cpu", simulated=True),
        nvml=None,
    )
    metrics.arrived()
    metrics.arrived(retry=True)
    metrics.arrived(retry=True)
    rates = {
        sample.labels["attempt"]: sample.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        if family.name == "batchpilot_recent_arrivals_per_second"
        for sample in family.samples
    }
    assert rates["retry"] == pytest.approx(2 * rates["first"], rel=0.05)
    assert rates["first"] > 0


def mlp_request(seed: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="mlp")
    rows = np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)
    request.inputs.add(name="x", datatype="FP32", shape=rows.shape)
    request.raw_input_contents.append(rows.tobytes())
    return request


@pytest.mark.slow
def test_a_runtime_counts_the_retries_its_clients_mark_apart_on_every_path(
    mlp_model: Path, tmp_path: Path
) -> None:
    rows = {"x": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)}
    body, headers = v2_request(rows)
    with runtime_process(mlp_model, *SIMULATED, grpc=True, log_dir=tmp_path) as server:
        # HTTP: two first attempts (one says so), three retries (one of them async); a bad
        # request is no arrival.
        for attempt in ({}, {"x-envoy-attempt-count": "1"}):
            assert send(server, "POST", INFER, body, {**headers, **attempt}).status == 200
        for attempt in ("2", "3"):
            retried = {**headers, "x-envoy-attempt-count": attempt}
            assert send(server, "POST", INFER, body, retried).status == 200
        retried = {**headers, "x-envoy-attempt-count": "2"}
        assert send(server, "POST", INFER, b"{}", retried).status == 400
        accepted = send(server, "POST", f"{INFER}/async", body, retried)
        assert accepted.status == 202
        # gRPC: one first attempt, a retry by Envoy's header, one streamed; and a client whose
        # retry policy tries three times what is refused (gRPC itself numbers the attempts).
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(mlp_request(2), timeout=10)
            stub.ModelInfer(mlp_request(4), metadata=[("x-envoy-attempt-count", "4")], timeout=10)
            requests: queue.SimpleQueue[pb.ModelInferRequest | None] = queue.SimpleQueue()
            requests.put(mlp_request(5))
            requests.put(None)
            stream = stub.ModelStreamInfer(
                iter(requests.get, None), metadata=[("x-envoy-attempt-count", "2")], timeout=10
            )
            answers = list(stream)
            assert len(answers) == 1
            assert not answers[0].error_message
        job = accepted.json()["id"]
        assert send(server, "GET", f"{INFER}/async/{job}?wait_s=5").status == 200
        scrape = Scrape(server)
        assert scrape.value("batchpilot_arrivals_total", attempt="first") == 3
        assert scrape.value("batchpilot_arrivals_total", attempt="retry") == 5
        assert scrape.value("batchpilot_admitted_total") == 8


@pytest.mark.slow
def test_a_clients_own_retries_of_a_refusal_count_as_retries(
    mlp_model: Path, tmp_path: Path
) -> None:
    """A gRPC client whose retry policy tries again what is refused (gRPC itself numbers the
    attempts, and waits the server's pushback between them). The device has 4 s of 1 s batches
    queued, so a request with 1.5 s to go cannot finish in time now — though it could on an
    idle device, so it is refused for now (UNAVAILABLE, with the pushback of when it would be
    in time), and a retry is served: each attempt after the first counted as a retry."""
    slow = ("--engine", "simulated", "--simulated-latency", "alpha_ms=1000,beta_ms=0")
    holding = 4
    with runtime_process(
        mlp_model, *slow, "--max-batch-size", "1", grpc=True, log_dir=tmp_path
    ) as server:
        body, headers = v2_request(
            {"x": np.zeros((1, 64), np.float32)}, parameters={"timeout": 10_000_000}
        )
        with ThreadPoolExecutor(holding) as pool:
            held = [pool.submit(send, server, "POST", INFER, body, headers) for _ in range(holding)]
            wait_until(
                lambda: Scrape(server).value("batchpilot_inflight_requests") == holding,
                timeout=10,
                what="the batches that hold the device",
            )
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=RETRYING) as ch:
                stub = pb_grpc.GRPCInferenceServiceStub(ch)
                late = mlp_request(3)
                late.parameters["timeout"].int64_param = 1_500_000  # µs
                stub.ModelInfer(late, timeout=20)
            assert [reply.result().status for reply in held] == [200] * holding
        scrape = Scrape(server)
        retries = scrape.value("batchpilot_arrivals_total", attempt="retry")
        assert retries in (1, 2)  # the pushback's retry, or one more
        assert scrape.value("batchpilot_arrivals_total", attempt="first") == holding + 1
        # Every arrival is admitted or refused, whichever attempt it was.
        assert scrape.value("batchpilot_admitted_total") == holding + 1
        assert scrape.value("batchpilot_shed_total", reason="predicted_late") == retries
