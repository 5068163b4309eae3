"""A replica added under load, behind a Service that balances connections as kube-proxy does.

Two simulated runtimes (the MLP's signature, t(b) = 10 ms + 2 ms·b, max batch 8: 308 rps each,
deadline 100 ms) behind `ConnectionBalancer` (kube-proxy's per-connection balancing), and one
client that keeps a pool of `--pool` kept-alive connections (aiohttp's connector, as a service
calling another does) sending an open loop, Poisson at `--rate` (default 420 rps: more than one
replica serves, two thirds of what two serve). For `--lead-s` only the first replica is in the
Service, so it is overloaded and refuses (503); then the second joins, as a replica the
autopilot added would, and the load goes on for `--after-s`. Per run (`--runs`: the runtime's
`--max-connection-age-s`, 0 for connections that live for ever — kube-proxy's behaviour alone —
and `+retire` where the operator's `POST /admin/connections/retire` reaches the first replica as
the second joins, as `ConnectionRebalancer` sends it): the
second replica's share of answers per second after it joined (from each runtime's own counters),
how long until it serves a third of them, and, over the time after it joined, the answers
within the deadline per second offered ("goodput"), the 503s, and the P99 of the 200s from the
scheduled send. Everything is bounded: the schedule is fixed in count and time, each request
times out after 10 s; 127.0.0.1 only.

    .venv/bin/python bench/rebalance.py [--runs 0,30,5,30+retire] [--rate 420] [--pool 32]
        [--lead-s 5] [--after-s 40] [--seed 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builders and the server process helper

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tests import onnx_models  # noqa: E402
from tests.runtime_process import RuntimeProcess, runtime_process  # noqa: E402
from tests.test_server_process import mlp_rows, v2_request  # noqa: E402

from batchpilot.operator.autopilot.push import retire_connections  # noqa: E402
from batchpilot.sandbox.kubeproxy import ConnectionBalancer  # noqa: E402

SIMULATED = ("--engine", "simulated", "--simulated-latency", "alpha_ms=10,beta_ms=2")
DEADLINE_MS = 100
TOKEN = "bench-admin-token"
INFER = "/v2/models/mlp/infer"


@dataclass
class Outcome:
    age_s: float
    retire: bool
    share_by_second: list[float]
    """The second replica's share of successes, per second after it joined."""
    seconds_to_a_third: float | None
    goodput: float
    """Answers within the deadline, per request offered, after the join."""
    refused: int
    p99_ms: float | None
    errors: int


def successes(server: RuntimeProcess) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "batchpilot_requests_total" and sample.labels["outcome"] == "success":
                return float(sample.value)
    return 0.0


async def one_run(
    model: Path, age_s: float, retire: bool, args: argparse.Namespace, log_dir: Path
) -> Outcome:
    body, headers = v2_request(mlp_rows(1, seed=0), binary_inputs={"x"})
    rng = np.random.default_rng(args.seed)
    total_s = args.lead_s + args.after_s
    sends = np.cumsum(rng.exponential(1 / args.rate, size=int(args.rate * total_s * 1.2)))
    sends = sends[sends < total_s]
    with ExitStack() as stack:
        a, b = (
            stack.enter_context(
                runtime_process(
                    model,
                    *SIMULATED,
                    "--max-batch-size",
                    "8",
                    "--deadline-ms",
                    str(DEADLINE_MS),
                    "--max-connection-age-s",
                    str(age_s),
                    "--admin-token-file",
                    str(log_dir / "token"),
                    log_dir=log_dir / name,
                )
            )
            for name in ("a", "b")
        )
        async with ConnectionBalancer([("127.0.0.1", a.port)]) as balancer:
            url = f"http://127.0.0.1:{balancer.port}{INFER}"
            results: list[tuple[float, int, float]] = []  # (scheduled, status, latency)
            errors = 0
            connector = aiohttp.TCPConnector(limit=args.pool)
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                began = time.monotonic()

                async def request(at: float) -> None:
                    nonlocal errors
                    await asyncio.sleep(max(0.0, began + at - time.monotonic()))
                    try:
                        async with session.post(url, data=body, headers=headers) as response:
                            await response.read()
                            status = response.status
                    except (aiohttp.ClientError, TimeoutError):
                        errors += 1
                        return
                    results.append((at, status, time.monotonic() - began - at))

                async def join_and_watch() -> list[tuple[float, float, float]]:
                    await asyncio.sleep(args.lead_s)
                    balancer.set_endpoints([*balancer.endpoints, ("127.0.0.1", b.port)])
                    joined = time.monotonic()
                    if retire:
                        endpoint = f"127.0.0.1:{a.admin_port}"
                        await asyncio.to_thread(
                            retire_connections, endpoint, token=TOKEN, document=""
                        )
                    counts = []
                    while time.monotonic() - joined < args.after_s:
                        pair = await asyncio.to_thread(lambda: (successes(a), successes(b)))
                        counts.append((time.monotonic() - joined, *pair))
                        await asyncio.sleep(1.0)
                    return counts

                watch = asyncio.create_task(join_and_watch())
                await asyncio.gather(*(request(float(t)) for t in sends))
                counts = await watch
    shares = []
    for (_, a0, b0), (_, a1, b1) in itertools.pairwise(counts):
        done = (a1 - a0) + (b1 - b0)
        shares.append((b1 - b0) / done if done else 0.0)
    third = next((i + 1.0 for i, share in enumerate(shares) if share >= 1 / 3), None)
    after = [(status, latency) for at, status, latency in results if at >= args.lead_s]
    offered = int((sends >= args.lead_s).sum())
    ok = [latency for status, latency in after if status == 200]
    good = sum(1 for latency in ok if latency <= DEADLINE_MS / 1000)
    return Outcome(
        age_s=age_s,
        retire=retire,
        share_by_second=[round(s, 3) for s in shares],
        seconds_to_a_third=third,
        goodput=good / offered if offered else 0.0,
        refused=sum(1 for status, _ in after if status == 503),
        p99_ms=float(np.percentile(ok, 99)) * 1000 if ok else None,
        errors=errors,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", default="0,30,5,30+retire", help="--max-connection-age-s values, +retire"
    )
    parser.add_argument("--rate", type=float, default=420.0)
    parser.add_argument("--pool", type=int, default=32)
    parser.add_argument("--lead-s", type=float, default=5.0)
    parser.add_argument("--after-s", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        model = onnx_models.mlp(Path(tmp) / "mlp.onnx")
        for run in args.runs.split(","):
            age, retire = float(run.removesuffix("+retire")), run.endswith("+retire")
            log_dir = Path(tmp) / run
            for name in ("a", "b"):
                (log_dir / name).mkdir(parents=True)
            (log_dir / "token").write_text(TOKEN)
            outcome = asyncio.run(one_run(model, age, retire, args, log_dir))
            outcomes.append(outcome)
            half = len(outcome.share_by_second) // 2
            label = f"age {'off' if age == 0 else f'{age:g} s'}{', retire' if retire else ''}"
            print(
                f"{label:>16}: second replica's share "
                f"{np.mean(outcome.share_by_second[:5]):.0%} in the first 5 s, "
                f"{np.mean(outcome.share_by_second[half:]):.0%} in the second half; "
                f"a third from {outcome.seconds_to_a_third or '-'} s; "
                f"goodput {outcome.goodput:.1%} of offered, {outcome.refused} x 503, "
                f"P99 {outcome.p99_ms or float('nan'):.0f} ms, {outcome.errors} errors",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
