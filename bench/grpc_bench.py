"""gRPC vs REST on one server: the same MLP, the same closed-loop concurrency, side by side.

One `batchpilot runtime serve --grpc-port` process serves both protocols from one batcher. The
load alternates between them in rounds (REST, gRPC, REST, gRPC, ...) so drift on the machine hits
both alike; each round runs `concurrency` clients that each send one one-row request, wait for
the answer, and send the next, for a fixed time. REST sends binary tensors
(Inference-Header-Content-Length) over keep-alive connections (aiohttp); gRPC sends
raw_input_contents over one HTTP/2 channel (grpc.aio). Both clients run in this process on uvloop.
Reported per protocol: requests per second, P50 and P99 latency; and gRPC/REST as a ratio.

    .venv/bin/python bench/grpc_bench.py [--concurrency 8] [--seconds 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builders and the server process helper

import aiohttp  # noqa: E402
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import orjson  # noqa: E402
from tests import onnx_models  # noqa: E402
from tests.runtime_process import runtime_process  # noqa: E402

from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2 as pb  # noqa: E402
from batchpilot.runtime.grpc_api import grpc_predict_v2_pb2_grpc as pb_grpc  # noqa: E402
from batchpilot.runtime.protocol import Tensor, encode_request  # noqa: E402

MAX_REQUESTS_PER_CLIENT = 200_000
"""Bounds every client loop, whatever the duration."""

Send = Callable[[], Awaitable[None]]


async def _closed_loop(send: Send, *, concurrency: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def one_client() -> None:
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            started = time.perf_counter()
            if started >= end:
                return
            await send()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "qps": len(ordered) / elapsed,
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
    }


async def _measure(
    http_port: int, grpc_port: int, *, concurrency: int, seconds: float, rounds: int
) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    body, header_length = encode_request([Tensor("x", "FP32", x)])
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(header_length),
    }
    url = f"http://127.0.0.1:{http_port}/v2/models/mlp/infer"
    message = pb.ModelInferRequest(model_name="mlp")
    message.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(x.tobytes())

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def rest() -> None:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"REST answered {response.status}")

        async def grpc_call() -> None:
            reply = await stub.ModelInfer(message)
            if len(reply.raw_output_contents) != 1:
                raise RuntimeError("gRPC answer without its output")

        sides: dict[str, Send] = {"rest": rest, "grpc": grpc_call}
        for send in sides.values():  # warm up connections and the server's code paths
            await _closed_loop(send, concurrency=concurrency, seconds=min(1.0, seconds))
        per_round: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, send in sides.items():
                per_round[name].append(
                    await _closed_loop(send, concurrency=concurrency, seconds=seconds)
                )
    result: dict[str, Any] = {}
    for name, runs in per_round.items():
        result[name] = {
            "qps": statistics.mean(r["qps"] for r in runs),
            "p50_ms": statistics.mean(r["p50_ms"] for r in runs),
            "p99_ms": statistics.mean(r["p99_ms"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
        }
    result["grpc_over_rest_qps"] = result["grpc"]["qps"] / result["rest"]["qps"]
    result["settings"] = {"concurrency": concurrency, "seconds": seconds, "rounds": rounds}
    return result


def measure(
    mlp: Path, *, log_dir: Path, concurrency: int = 8, seconds: float = 5.0, rounds: int = 2
) -> dict[str, Any]:
    """Start one server with both protocols and measure them side by side."""
    with runtime_process(
        mlp,
        "--device",
        "cpu",
        "--intra-op-threads",
        "1",
        "--max-batch-size",
        "8",
        "--max-queue-delay-ms",
        "2",
        grpc=True,
        log_dir=log_dir,
    ) as server:
        assert server.grpc_port is not None
        coroutine = _measure(
            server.port, server.grpc_port, concurrency=concurrency, seconds=seconds, rounds=rounds
        )
        try:
            import uvloop
        except ImportError:
            return asyncio.run(coroutine)
        return uvloop.run(coroutine)


def table(result: dict[str, Any]) -> str:
    settings = result["settings"]
    lines = [
        f"gRPC vs REST, MLP, closed loop, {settings['concurrency']} clients, one row per request",
        f"{'':6} {'req/s':>9} {'P50 ms':>8} {'P99 ms':>8}",
    ]
    for name in ("rest", "grpc"):
        side = result[name]
        lines.append(
            f"{name.upper():6} {side['qps']:9.0f} {side['p50_ms']:8.2f} {side['p99_ms']:8.2f}"
        )
    lines.append(f"gRPC / REST throughput: {result['grpc_over_rest_qps']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="per round and protocol")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpc-bench-") as work:
        mlp = onnx_models.mlp(Path(work) / "mlp.onnx")
        result = measure(
            mlp,
            log_dir=Path(work),
            concurrency=args.concurrency,
            seconds=args.seconds,
            rounds=args.rounds,
        )
    print(table(result))
    if args.json:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
