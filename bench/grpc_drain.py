"""gRPC clients through a replica's drain: what their RPCs end with when it gets SIGTERM.

    .venv/bin/python bench/grpc_drain.py [--clients 16] [--signals 10] [--load-s 2]
                                         [--age-s 30] [--json OUT]

A replica removed by a scale-down or a rollout leaves the Service's endpoints, then gets
SIGTERM, while gRPC clients still hold connections to it: a channel's one HTTP/2 connection
stays on its pod until the server closes it, whatever the endpoints say. This starts two
`batchpilot runtime serve` processes on the MLP with a simulated accelerator (t(b) = 5 + 1·b ms,
batch 8, `--drain-grace-s 10`, `--max-connection-age-s` as given) behind `ConnectionBalancer`
(kube-proxy's part: each connection to one endpoint), has `--clients` threads send ModelInfer
back to back, each on a channel of its own, for `--load-s`; then the balancer drops the first
replica and it gets SIGTERM, and the load goes on until it has exited and a second more. A
client that meets an error goes on sending, as one that retries would. Per signal: the answers
and the errors by status code, before and after the signal, how long the replica took to exit,
and its own tally. CANCELLED is gRPC core ending an RPC that had reached the server but that its
loop had not yet taken up when the server stopped (grpc/grpc#41785): the runtime never sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from batchpilot.sandbox.kubeproxy import ConnectionBalancer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import RuntimeProcess, runtime_process  # noqa: E402
from tests.test_grpc import mlp_rows, raw_request  # noqa: E402

SERVER = (
    "--engine", "simulated",
    "--simulated-latency", "alpha_ms=5,beta_ms=1",
    "--max-batch-size", "8",
    "--drain-grace-s", "10",
)  # fmt: skip


class Load:
    """`clients` threads sending ModelInfer back to back through `port`, until `stop`."""

    def __init__(self, port: int, clients: int) -> None:
        self.message = raw_request("mlp", {"x": mlp_rows(1)}, {"x": "FP32"})
        self.port = port
        self.lock = threading.Lock()
        self.signalled = False
        self.answers = collections.Counter[str]()
        self.errors = collections.Counter[str]()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _client(self) -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            for _ in range(1_000_000):  # bounded: `stop` ends it long before
                if self.stopped.is_set():
                    return
                try:
                    stub.ModelInfer(self.message, timeout=10)
                    code = ""
                except grpc.RpcError as exc:
                    code = exc.code().name
                with self.lock:
                    when = "after" if self.signalled else "before"
                    if code:
                        self.errors[f"{code} {when}"] += 1
                    else:
                        self.answers[when] += 1
        finally:
            channel.close()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=15)


def tally(server: RuntimeProcess) -> dict[str, int]:
    found = re.search(r"stopped; requests by outcome: (.*)", server.log())
    return {} if found is None else {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[1])}


async def one_signal(
    model: Path, folder: Path, *, clients: int, load_s: float, age_s: float
) -> dict[str, Any]:
    flags = (*SERVER, "--max-connection-age-s", f"{age_s:g}")
    with (
        runtime_process(model, *flags, grpc=True, log_dir=folder) as a,
        runtime_process(model, *flags, grpc=True, log_dir=folder) as b,
    ):
        assert a.grpc_port is not None
        assert b.grpc_port is not None
        async with ConnectionBalancer(
            [("127.0.0.1", a.grpc_port), ("127.0.0.1", b.grpc_port)]
        ) as balancer:
            load = Load(balancer.port, clients)
            try:
                await asyncio.sleep(load_s)  # the load's length, not a wait for a condition
                balancer.set_endpoints([("127.0.0.1", b.grpc_port)])
                with load.lock:
                    load.signalled = True
                signalled = time.monotonic()
                a.process.send_signal(signal.SIGTERM)
                exit_code = await asyncio.to_thread(a.process.wait, 20)
                exited_s = time.monotonic() - signalled
                await asyncio.sleep(1.0)  # a second of load on the replica left
            finally:
                await asyncio.to_thread(load.stop)
        return {
            "answers": dict(load.answers),
            "errors": dict(load.errors),
            "exited_s": round(exited_s, 2),
            "exit_code": exit_code,
            "signalled_replica_tally": tally(a),
        }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = mlp(folder / "mlp.onnx")
        for n in range(args.signals):
            result = await one_signal(
                model, folder, clients=args.clients, load_s=args.load_s, age_s=args.age_s
            )
            runs.append(result)
            print(
                f"signal {n + 1}: answers {result['answers']}; "
                f"errors {result['errors'] or 'none'}; "
                f"exited after {result['exited_s']} s (exit {result['exit_code']}); "
                f"its tally {result['signalled_replica_tally']}"
            )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--signals", type=int, default=10)
    parser.add_argument("--load-s", type=float, default=2.0, help="load before the signal")
    parser.add_argument("--age-s", type=float, default=30.0, help="connection age (0: never)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = asyncio.run(run(args))
    errors = collections.Counter[str]()
    for result in runs:
        errors.update(result["errors"])
    print(f"{args.signals} signals, {args.clients} clients: errors {dict(errors) or 'none'}")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"clients": args.clients, "age_s": args.age_s, "runs": runs}, indent=2)
        )


if __name__ == "__main__":
    main()
