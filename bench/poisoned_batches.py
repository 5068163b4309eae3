"""One request the model cannot take, and the requests batched with it.

    .venv/bin/python bench/poisoned_batches.py [--rate 400] [--seconds 10] [--seed 1]

Serves an embedding table (`tests/onnx_models.embedding`: ids INT64 [N, 3] → rows of a table of
10,000 × 64, onnxruntime's `Gather`, which fails the whole run on an id past the table) with a
batch limit of 16 and a 5 ms queue delay, and sends Poisson arrivals at `--rate` for `--seconds`
from one aiohttp session, a share of them holding an id past the table (0, 1 % and 5 %, a fresh
server for each). For each share it prints what became of the good requests (answered, and
failed with them) and of the bad ones (their statuses), the good ones' P50 and P99 from their
scheduled send time, and the engine's failed runs (`batchpilot_engine_failed_batches_total`,
absent before the counter existed). Run it at two commits (a `git worktree`, `PYTHONPATH`
pointing at its `api`, `runtime` and `operator`) to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import embedding  # noqa: E402
from tests.runtime_process import runtime_process, send  # noqa: E402

VOCABULARY = 10_000
SERVER = (
    "--max-batch-size", "16",
    "--max-queue-delay-ms", "5",
    "--deadline-ms", "0",
)  # fmt: skip
SHARES = (0.0, 0.01, 0.05)


def body(ids: list[int]) -> bytes:
    tensor = {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": ids}
    return orjson.dumps({"inputs": [tensor]})


async def drive(
    url: str, rate: float, seconds: float, share: float, seed: int
) -> dict[str, object]:
    """Open-loop Poisson arrivals; each request's status and latency, by kind."""
    rng = np.random.default_rng(seed)
    count = int(rate * seconds)
    at = np.cumsum(rng.exponential(1 / rate, count))
    bad = rng.random(count) < share
    statuses: dict[bool, Counter[int]] = {False: Counter(), True: Counter()}
    good_ms: list[float] = []

    async def one(session: aiohttp.ClientSession, index: int, start: float) -> None:
        await asyncio.sleep(max(0.0, start + at[index] - time.perf_counter()))
        ids = (
            [1, VOCABULARY + 7, 3]
            if bad[index]
            else [int(v) for v in rng.integers(0, VOCABULARY, 3)]
        )
        scheduled = start + at[index]
        async with session.post(url, data=body(ids)) as reply:
            await reply.read()
            statuses[bool(bad[index])][reply.status] += 1
            if not bad[index] and reply.status == 200:
                good_ms.append((time.perf_counter() - scheduled) * 1e3)

    connector = aiohttp.TCPConnector(limit=256)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter() + 0.1
        await asyncio.gather(*(one(session, index, start) for index in range(count)))
    latency = np.sort(np.asarray(good_ms)) if good_ms else np.asarray([float("nan")])
    return {
        "good": statuses[False],
        "bad": statuses[True],
        "p50": float(np.percentile(latency, 50)),
        "p99": float(np.percentile(latency, 99)),
    }


def failed_runs(metrics: str) -> str:
    found = re.search(r"^batchpilot_engine_failed_batches_total\{[^}]*\} (\S+)$", metrics, re.M)
    return "n/a" if found is None else f"{float(found[1]):.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        "| bad requests | good: 200 | good: failed | bad: statuses | good P50 / P99 | failed runs |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="poisoned-") as tmp:
        folder = Path(tmp)
        model = embedding(folder / "embedding.onnx", vocabulary=VOCABULARY, width=64)
        for share in SHARES:
            with runtime_process(model, *SERVER, log_dir=folder) as server:
                url = f"{server.url}/v2/models/embedding/infer"
                result = asyncio.run(drive(url, args.rate, args.seconds, share, args.seed))
                metrics = send(server, "GET", "/metrics").body.decode()
            good, bad = result["good"], result["bad"]
            assert isinstance(good, Counter)
            assert isinstance(bad, Counter)
            total = sum(good.values())
            failed = total - good[200]
            print(
                f"| {share:.0%} | {good[200]:,} of {total:,} | {failed:,} "
                f"({failed / max(1, total):.1%}) | "
                + (", ".join(f"{n:,}× {s}" for s, n in sorted(bad.items())) or "none")
                + f" | {result['p50']:.2f} / {result['p99']:.2f} ms | "
                f"{failed_runs(metrics)} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
