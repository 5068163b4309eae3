"""gRPC clients through a drain: what each kept-alive client's RPCs end with at a SIGTERM.

    .venv/bin/python bench/grpc_drain.py [--clients 16] [--signals 3] [--load-s 2] [--age-s 0]
                                         [--json OUT]

A replica removed by a scale-down or a rollout gets SIGTERM while gRPC clients still hold
connections to it: a channel's one HTTP/2 connection stays on its pod until the server closes
it, whatever the Service's endpoints say. This starts `batchpilot runtime serve` on the MLP with
a simulated accelerator (t(b) = 5 + 1·b ms, batch 8) and a gRPC port, has `--clients` threads
send ModelInfer back to back, each on a channel of its own, for `--load-s`, then sends SIGTERM;
each client stops at its first error, as one that goes to another replica would. Per signal: the
answers, the errors before the signal, and the first error of each client after it, by status
code. OK and UNAVAILABLE
are what a drain should give (UNAVAILABLE: not run, send it elsewhere); CANCELLED is gRPC core
ending an RPC that had reached the server but was not yet taken up by its loop when the server
stopped (grpc/grpc#41785): the runtime never saw it. With `--age-s A` the connections go by age
during the load (GOAWAY with the server running): errors before the signal says what that costs.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import runtime_process  # noqa: E402

SERVER = (
    "--engine", "simulated",
    "--simulated-latency", "alpha_ms=5,beta_ms=1",
    "--max-batch-size", "8",
    "--drain-grace-s", "10",
)  # fmt: skip


def request() -> Any:
    rows = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    message = pb.ModelInferRequest(model_name="mlp")
    message.inputs.add(name="x", datatype="FP32", shape=rows.shape)
    message.raw_input_contents.append(rows.tobytes())
    return message


def one_signal(
    model: Path, folder: Path, *, clients: int, load_s: float, age_s: float
) -> dict[str, Any]:
    before: collections.Counter[str] = collections.Counter()
    after: collections.Counter[str] = collections.Counter()
    answers = 0
    lock = threading.Lock()
    signalled = threading.Event()
    with runtime_process(
        model, *SERVER, "--max-connection-age-s", f"{age_s:g}", grpc=True, log_dir=folder
    ) as server:
        message = request()

        def client() -> None:
            nonlocal answers
            channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                for _ in range(100_000):  # bounded: the signal ends every client long before
                    try:
                        stub.ModelInfer(message, timeout=10)
                    except grpc.RpcError as exc:
                        with lock:
                            (after if signalled.is_set() else before)[exc.code().name] += 1
                        return
                    with lock:
                        answers += 1
            finally:
                channel.close()

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        time.sleep(load_s)  # the load's length, not a wait for a condition
        signalled.set()
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=30)
        exit_code = server.process.wait(timeout=20)
    return {
        "answers": answers,
        "errors_before_signal": dict(before),
        "first_errors_after_signal": dict(after),
        "exit_code": exit_code,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--signals", type=int, default=3)
    parser.add_argument("--load-s", type=float, default=2.0, help="load before the signal")
    parser.add_argument("--age-s", type=float, default=0.0, help="connection age (0: never)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = mlp(folder / "mlp.onnx")
        runs = []
        for n in range(args.signals):
            run = one_signal(
                model, folder, clients=args.clients, load_s=args.load_s, age_s=args.age_s
            )
            runs.append(run)
            print(
                f"signal {n + 1}: {run['answers']} answers; errors before the signal "
                f"{run['errors_before_signal']}, after it {run['first_errors_after_signal']}; "
                f"exit {run['exit_code']}"
            )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"clients": args.clients, "age_s": args.age_s, "runs": runs}, indent=2)
        )


if __name__ == "__main__":
    main()
