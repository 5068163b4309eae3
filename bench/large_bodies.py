"""Large JSON bodies and the health checks beside them.

    .venv/bin/python bench/large_bodies.py [--mib 60] [--parallel 1,4] [--gzip]

Serves `tests/onnx_models.mlp` (x: FP32 [N, 4]) on the simulated accelerator and sends, from
`--parallel` clients at once, bodies of `--mib` MiB of JSON numbers (gzip'd with `--gzip`: a few
kilobytes on the wire), each far more rows than the deadline allows — the server decodes each
whole before it can say so. Meanwhile a prober asks `/v2/health/live` every 50 ms on a new
connection. Prints, per parallel count, the bodies' statuses and answer times, the prober's
longest wait and how many waits passed 1 s (the kubelet's probes here time out at 2 s), and the
server's peak resident memory. Run it at two commits (a `git worktree`, `PYTHONPATH` pointing at
its `api` and `runtime`) to compare them.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import RuntimeProcess, runtime_process  # noqa: E402


def body_of(mib: float) -> bytes:
    """`mib` MiB of a v2 JSON body whose data are "0.5" numbers, rows of 4."""
    unit = b"0.5,"
    values = int(mib * 2**20) // len(unit) // 4 * 4
    data = unit * (values - 1) + unit[:-1]
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,4],"data":[' % (values // 4)
    return head + data + b"]}]}"


def post(server: RuntimeProcess, body: bytes, headers: dict[str, str]) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request("POST", "/v2/models/mlp/infer", body, headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    return status, time.monotonic() - started


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(server: RuntimeProcess, body: bytes, headers: dict[str, str], parallel: int) -> None:
    waits: list[float] = []
    peak = [rss_mib(server.process.pid)]
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            try:
                conn.request("GET", "/v2/health/live")
                conn.getresponse().read()
            finally:
                conn.close()
            waits.append(time.monotonic() - started)
            done.wait(0.05)

    def sample() -> None:  # apart from the prober, which waits while the server stalls
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(server.process.pid))
            done.wait(0.01)

    helpers = [threading.Thread(target=probe), threading.Thread(target=sample)]
    for helper in helpers:
        helper.start()
    with ThreadPoolExecutor(parallel) as pool:
        answers = list(pool.map(lambda _: post(server, body, headers), range(parallel)))
    done.set()
    for helper in helpers:
        helper.join()
    said = ", ".join(f"{status} in {seconds:.2f} s" for status, seconds in answers)
    print(
        f"{parallel} at once: {said}; health/live longest {max(waits):.2f} s, "
        f"{sum(w > 1 for w in waits)} of {len(waits)} over 1 s; peak RSS {peak[0]:.0f} MiB",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=60)
    parser.add_argument("--parallel", default="1,4")
    parser.add_argument("--gzip", action="store_true")
    args = parser.parse_args()
    body = body_of(args.mib)
    headers = {"Content-Type": "application/json"}
    if args.gzip:
        body = gzip.compress(body, 6)
        headers["Content-Encoding"] = "gzip"
    print(f"bodies of {args.mib:g} MiB of JSON, {len(body) / 1e6:.2f} MB on the wire", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = mlp(Path(tmp) / "mlp.onnx", features=4)
        simulated = ("--engine", "simulated", "--simulated-latency", "alpha_ms=8,beta_ms=1.5")
        with runtime_process(model, *simulated, log_dir=Path(tmp)) as server:
            for parallel in (int(p) for p in args.parallel.split(",")):
                run(server, body, headers, parallel)


if __name__ == "__main__":
    main()
