"""gRPC clients through a replica's drain: every RPC answered, none failed.

A replica that a scale-down or a rollout removes leaves the Service's endpoints, then gets
SIGTERM; its gRPC clients' connections stay on it all the same (a channel's one HTTP/2
connection stays where it was placed until the server closes it). Stopping the gRPC server at
the signal sends GOAWAY, but gRPC's core ends as CANCELLED every RPC that had reached the server
and was not yet taken up by its loop (grpc/grpc#41785): under kept-alive load, one signal in a
few (bench/grpc_drain.py). So a draining replica keeps serving the RPCs of the connections it
has until their age retires them — GOAWAY with the server running, which costs no RPC — and
stops its gRPC server once none has come for a moment. Real server processes on loopback, the
simulated accelerator, gRPC clients each on a channel of its own, and `ConnectionBalancer`
playing kube-proxy in front of the two replicas.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from batchpilot.runtime.assembly import grpc_connection_age_s
from batchpilot.runtime.settings import RuntimeSettings
from batchpilot.sandbox.kubeproxy import ConnectionBalancer
from tests.runtime_process import RuntimeProcess, runtime_process
from tests.test_connection_age import serve_pair
from tests.test_grpc import mlp_rows, raw_request
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

AGE_S = 1.0
CLIENTS = 8
REPETITIONS = 3


def tally(server: RuntimeProcess) -> dict[str, int]:
    found = re.search(r"stopped; requests by outcome: (.*)", server.log())
    assert found is not None, server.log()
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", found[1])}


class Clients:
    """`CLIENTS` threads, each sending ModelInfer back to back on a channel of its own to
    `port`, until `stop` or its first error."""

    def __init__(self, port: int) -> None:
        self.request = raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
        self.port = port
        self.errors: collections.Counter[str] = collections.Counter()
        self.answers = [0] * CLIENTS
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)
        ]
        for thread in self.threads:
            thread.start()

    def _client(self, index: int) -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            for _ in range(100_000):  # bounded: `stop` ends it long before
                if self.stopped.is_set():
                    return
                try:
                    stub.ModelInfer(self.request, timeout=10)
                except grpc.RpcError as exc:
                    self.errors[f"{exc.code().name}: {exc.details()}"] += 1
                    return
                self.answers[index] += 1
        finally:
            channel.close()

    def each_answered(self, count: int) -> bool:
        """Whether every client has had `count` more answers than when asked first (`mark`)."""
        return all(now - then >= count for now, then in zip(self.answers, self.marked, strict=True))

    def mark(self) -> None:
        self.marked = list(self.answers)

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=15)


def drain_one(a: RuntimeProcess, b: RuntimeProcess, balancer: ConnectionBalancer) -> float:
    """Load through the balancer on both; then, as on a cluster, the endpoints drop `a` and the
    kubelet signals it. Returns how long `a` took to exit; the load goes on until every client
    has been answered by `b` too."""
    assert b.grpc_port is not None
    clients = Clients(balancer.port)
    try:
        clients.mark()
        wait_until(lambda: clients.each_answered(10) or bool(clients.errors), what="warm")
        balancer.set_endpoints([("127.0.0.1", b.grpc_port)])
        signalled = time.monotonic()
        a.process.send_signal(signal.SIGTERM)
        exit_code = a.process.wait(timeout=20)
        drained_s = time.monotonic() - signalled
        clients.mark()
        wait_until(lambda: clients.each_answered(10) or bool(clients.errors), what="after")
    finally:
        clients.stop()
    assert not clients.errors, (dict(clients.errors), a.log())
    assert exit_code == 0, a.log()
    return drained_s


async def test_a_draining_replicas_grpc_clients_lose_no_rpc(
    mlp_model: Path, tmp_path: Path
) -> None:
    for n in range(REPETITIONS):
        folder = tmp_path / str(n)
        folder.mkdir()
        with serve_pair(mlp_model, folder, AGE_S, "--drain-grace-s", "10") as (a, b):
            assert a.grpc_port is not None
            assert b.grpc_port is not None
            both = [("127.0.0.1", a.grpc_port), ("127.0.0.1", b.grpc_port)]
            async with ConnectionBalancer(both) as balancer:  # relays in this loop
                drained_s = await asyncio.to_thread(drain_one, a, b, balancer)
            counts = tally(a)
            assert counts["cancelled"] == counts["error"] == counts["timeout"] == 0, counts
            assert counts["rejected"] == 0, counts  # its clients' RPCs were all taken
            assert counts["success"] > 0, counts
            # Its connections went by age, then it stopped once quiet.
            assert drained_s < AGE_S * 1.1 + 5, (drained_s, a.log())
            assert "drain: gRPC connections served for" in a.log()


@pytest.mark.parametrize(
    ("age_s", "grace_s", "expected"),
    [(30.0, 25.0, 12.5), (5.0, 25.0, 5.0), (30.0, 4.0, 2.0), (0.0, 25.0, None)],
)
def test_grpc_connections_live_at_most_half_the_drains_grace(
    age_s: float, grace_s: float, expected: float | None
) -> None:
    settings = RuntimeSettings(
        model_path=Path("m.onnx"),
        max_connection_age_s=age_s,
        drain_grace_s=grace_s,
        grpc_port=8081,
    )
    assert grpc_connection_age_s(settings) == expected


def test_a_stream_kept_busy_through_the_drain_ends_within_the_grace(
    mlp_model: Path, tmp_path: Path
) -> None:
    """A client that keeps sending on one stream keeps the drain serving until half the grace,
    and the gRPC server's stop then had the whole grace again: 16 s for a 12 s grace, past the
    pod's termination period (its SIGKILL). Its stop now has what is left of the grace."""
    grace_s = 6.0
    with runtime_process(
        mlp_model, "--engine", "simulated", "--drain-grace-s", str(grace_s),
        grpc=True, log_dir=tmp_path,
    ) as server:  # fmt: skip
        sending = threading.Event()
        sending.set()

        def requests() -> Iterator[Any]:
            while sending.is_set():
                yield raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
                time.sleep(0.025)  # 40 a second

        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stream = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
            answers = iter(stream)
            next(answers)  # the stream is up and served
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(grpc.RpcError):
                for _ in answers:
                    pass
            sending.clear()
            assert server.process.wait(timeout=30) == 0
        # the drain's own steps after gRPC stops take a moment beyond the grace
        assert time.monotonic() - signalled < grace_s + 1.5
