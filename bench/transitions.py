"""Zero errors and the P99 while replicas go away: a scale-down and a rolling update under load.

The Deployment is the operator's own (`build_deployment`: maxSurge 1, maxUnavailable 0, the
readiness probe, a preStop sleep of `preStopSleepSeconds`, the grace period), of simulated
runtimes (the MLP model's signature, t(b) = α + β·b per batch, so the capacity is known and the
CPU is left to the HTTP path), run by the sandbox's kubelet (the pod runner: start, readiness,
the endpoint dropped at deletion, SIGTERM after the preStop sleep) behind the sandbox's Service
proxy, which is where the client sends. An open loop at a constant rate (default 170 rps, half
of what three replicas serve at batch 8: 8 / (50 + 2.5·8) ms = 114 rps each) goes on
throughout; then

1. `scale-down`: the Deployment's replicas go from 3 to 2 (as the autopilot would set them);
   the window lasts until the removed pod's process has exited;
2. `rollout`: an env var of the InferenceService's runtime changes, so the pods roll; the
   window lasts until every pod is new and every old process has exited.

Each request is counted in the window in which it was sent: non-200 answers by status,
connection errors by kind, and P50/P99 of the answers that were 200 (from the scheduled send
time). `--pre-stop-s 0` shows what the preStop sleep is for. Everything is bounded: the load
stops after the rollout or at `--budget-s`, whichever is first; at most `--max-in-flight`
requests are outstanding (any more are counted as `client-overflow`); each request times out
after 10 s; every process started is stopped on the way out. 127.0.0.1 only.

    .venv/bin/python bench/transitions.py [--rate 170] [--pre-stop-s 5] [--pod-host]
        [--engine simulated|onnx] [--balance request|connection] [--json OUT]

`--balance connection` puts the sandbox's Service in kube-proxy's mode: each client connection
stays on its pod, also once the pod has left the endpoints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ holds the model builders

from tests import onnx_models  # noqa: E402

from batchpilot.operator.children.common import Owner  # noqa: E402
from batchpilot.operator.children.configmap import build_configmap  # noqa: E402
from batchpilot.operator.children.deployment import build_deployment  # noqa: E402
from batchpilot.operator.children.secret import build_secret  # noqa: E402
from batchpilot.operator.settings import OperatorSettings  # noqa: E402
from batchpilot.operator.spec import InferenceServiceSpec  # noqa: E402
from batchpilot.sandbox import LocalKubernetesAPI  # noqa: E402
from batchpilot.sandbox.hosting import pod_host_process  # noqa: E402
from batchpilot.sandbox.podrunner import API, Endpoints, PodRunner  # noqa: E402
from batchpilot.sandbox.processes import stop_processes  # noqa: E402
from batchpilot.sandbox.prometheus import free_port  # noqa: E402
from loaddriver import prepare  # noqa: E402

NS = "default"
NAME = "m"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
PODS = f"/api/v1/namespaces/{NS}/pods"


def owner(args: argparse.Namespace, *, revision: str) -> Owner:
    """The InferenceService; `revision` is an env var of its pods, so a new one rolls them."""
    runtime: dict[str, Any] = {
        "engine": args.engine,
        "env": [{"name": "REVISION", "value": revision}],
    }
    if args.engine == "onnx":
        runtime["device"] = "cpu"
    else:
        runtime["simulatedLatency"] = {"alphaMs": args.alpha_ms, "betaMs": args.beta_ms}
    spec = InferenceServiceSpec.model_validate({
        "model": {"uri": "pvc://models/mlp.onnx"},
        "sla": {"latencyP99Ms": args.sla_ms},
        "scaling": {"maxBatchSize": args.max_batch},
        "runtime": runtime,
    })  # fmt: skip
    return Owner(name=NAME, namespace=NS, uid="uid-1", spec=spec)


def orphaned(child: dict[str, Any]) -> dict[str, Any]:
    """Without its owner reference: there is no InferenceService here for it to belong to (the
    API's garbage collector would delete it)."""
    child["metadata"].pop("ownerReferences", None)
    return child


def deployment(args: argparse.Namespace, *, replicas: int, revision: str) -> dict[str, Any]:
    """The Deployment exactly as the operator renders it: strategy, probes, preStop, grace."""
    settings = OperatorSettings(pre_stop_sleep_seconds=args.pre_stop_s)
    rendered = build_deployment(owner(args, revision=revision), settings, replicas=replicas)
    rendered["spec"]["template"]["spec"]["containers"][0]["args"] += ["--log-level", "warning"]
    return orphaned(rendered)


def seed(rest: API, args: argparse.Namespace) -> None:
    """What the Deployment mounts: the batching ConfigMap and the admin token's Secret."""
    of = owner(args, revision="1")
    configmap = build_configmap(
        of, batch_size=args.max_batch, max_queue_delay_ms=5.0, deadline_ms=10 * args.sla_ms
    )
    rest.call(f"/api/v1/namespaces/{NS}/configmaps", "POST", orphaned(configmap))
    secret = orphaned(build_secret(of, token="bench-token"))
    rest.call(f"/api/v1/namespaces/{NS}/secrets", "POST", secret)


# -- the load ----------------------------------------------------------------------------------
@dataclass
class Sent:
    at: float
    """Seconds since the load started, when it was scheduled."""
    latency_s: float
    outcome: str
    """"200", another status, or the connection error's class name."""


@dataclass
class Load:
    url: str
    body: bytes
    headers: dict[str, str]
    rate_rps: float
    max_in_flight: int
    sent: list[Sent] = field(default_factory=list)
    why: Counter[str] = field(default_factory=Counter)
    """Non-200 answers by status and the start of the body: who refused, and why."""
    in_flight: int = 0
    started: float = 0.0

    async def one(self, session: aiohttp.ClientSession, scheduled: float) -> None:
        self.in_flight += 1
        outcome = ""
        try:
            async with session.post(self.url, data=self.body, headers=self.headers) as answer:
                body = await answer.read()
                outcome = str(answer.status)
                if answer.status != 200:
                    self.why[f"{outcome} {body[:80].decode(errors='replace')}"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome = type(exc).__name__
        finally:
            self.in_flight -= 1
        now = asyncio.get_running_loop().time()
        self.sent.append(Sent(scheduled - self.started, now - scheduled, outcome))

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=10)
        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self.started = loop.time()
            n = 0
            while not stop.is_set():
                scheduled = self.started + n / self.rate_rps
                n += 1
                if (delay := scheduled - loop.time()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                if self.in_flight >= self.max_in_flight:
                    self.sent.append(Sent(scheduled - self.started, 0.0, "client-overflow"))
                    continue
                task = asyncio.create_task(self.one(session, scheduled))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)


# -- the transitions ---------------------------------------------------------------------------
def status(rest: API) -> dict[str, Any]:
    return dict((rest.call(DEPLOYMENT) or {}).get("status", {}))


def pod_names(rest: API) -> list[str]:
    return [p["metadata"]["name"] for p in (rest.call(PODS) or {}).get("items", [])]


async def until(condition: Any, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class Window:
    name: str
    start: float
    end: float


async def drive(rest: API, runner: PodRunner, load: Load, args: argparse.Namespace) -> list[Window]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    driver = asyncio.create_task(load.run(stop))
    try:
        await asyncio.sleep(args.steady_s)
        at = loop.time() - load.started
        windows = [Window("steady", 0.0, at)]

        await asyncio.to_thread(
            rest.call, DEPLOYMENT, "PATCH", {"spec": {"replicas": 2}}, patch=True
        )
        await until(
            lambda: len(pod_names(rest)) == 2 and not (runner.terminating or runner.leaving_host),
            timeout_s=60,
            what="the scale-down",
        )
        end = loop.time() - load.started
        windows.append(Window("scale-down", at, end))
        await asyncio.sleep(args.settle_s)
        at = loop.time() - load.started
        windows.append(Window("steady at 2", end + 1.0, at))

        old = set(await asyncio.to_thread(pod_names, rest))
        changed = deployment(args, replicas=2, revision="2")
        await asyncio.to_thread(rest.call, DEPLOYMENT, "PUT", changed)

        def rolled() -> bool:
            names = pod_names(rest)
            return bool(
                len(names) == 2
                and not old & set(names)
                and status(rest).get("readyReplicas") == 2
                and not runner.terminating
                and not runner.leaving_host
            )

        await until(rolled, timeout_s=90, what="the rollout")
        end = loop.time() - load.started
        windows.append(Window("rollout", at, end))
        await asyncio.sleep(args.settle_s)
        windows.append(Window("steady after", end + 1.0, loop.time() - load.started))
        return windows
    finally:
        stop.set()
        await driver


# -- the table ---------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(load: Load, windows: Sequence[Window]) -> list[dict[str, Any]]:
    rows = []
    for w in windows:
        inside = [s for s in load.sent if w.start <= s.at < w.end]
        ok = [s.latency_s * 1e3 for s in inside if s.outcome == "200"]
        errors = Counter(s.outcome for s in inside if s.outcome != "200")
        p50, p99 = percentile(ok, 0.50), percentile(ok, 0.99)
        rows.append({
            "window": w.name,
            "seconds": round(w.end - w.start, 1),
            "sent": len(inside),
            "ok": len(ok),
            "errors": dict(errors),
            "p50_ms": None if p50 is None else round(p50, 1),
            "p99_ms": None if p99 is None else round(p99, 1),
        })  # fmt: skip
    return rows


def timeline(load: Load) -> list[dict[str, Any]]:
    """Second by second: what was sent, the errors, the P99 of the 200s."""
    seconds: dict[int, list[Sent]] = {}
    for sent in load.sent:
        seconds.setdefault(int(sent.at), []).append(sent)
    out = []
    for second, inside in sorted(seconds.items()):
        ok = [s.latency_s * 1e3 for s in inside if s.outcome == "200"]
        p99 = percentile(ok, 0.99)
        out.append({
            "second": second,
            "sent": len(inside),
            "errors": dict(Counter(s.outcome for s in inside if s.outcome != "200")),
            "p99_ms": None if p99 is None else round(p99, 1),
        })  # fmt: skip
    return out


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'window':<13} {'s':>5} {'sent':>6} {'200':>6} {'P50 ms':>7} {'P99 ms':>7}  errors"]
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "0"
        lines.append(
            f"{r['window']:<13} {r['seconds']:>5} {r['sent']:>6} {r['ok']:>6} "
            f"{r['p50_ms'] if r['p50_ms'] is not None else '-':>7} "
            f"{r['p99_ms'] if r['p99_ms'] is not None else '-':>7}  {errors}"
        )
    return "\n".join(lines)


def proxied(port: int) -> int:
    """How many endpoints the Service proxy sends to now (it re-reads them every 0.25 s)."""
    try:
        url = f"http://127.0.0.1:{port}/sandbox/stats"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return len(json.loads(answer.read())["endpoints"])
    except OSError:
        return 0


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    models = workdir / "models"
    models.mkdir(parents=True, exist_ok=True)
    onnx_models.mlp(models / "mlp.onnx")
    endpoints_file = workdir / "endpoints.json"
    endpoints_file.write_text("[]")

    def publish(endpoints: Endpoints) -> None:
        tmp = endpoints_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(endpoints.ready.get((NS, NAME), []))))
        tmp.replace(endpoints_file)

    proxy_port = free_port()
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded())
        rest = API(api.url)
        seed(rest, args)
        first = deployment(args, replicas=3, revision="1")
        rest.call(f"/apis/apps/v1/namespaces/{NS}/deployments", "POST", first)
        proxy = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.sandbox.service",
             "--port", str(proxy_port), "--endpoints", str(endpoints_file),
             "--balance", args.balance],
        )  # fmt: skip
        stack.callback(stop_processes, [proxy], grace_s=10)
        host = stack.enter_context(pod_host_process(workdir / "podhost")) if args.pod_host else None
        runner = PodRunner(
            api.url,
            workdir=workdir,
            models_dir=models,
            start_delay_s=args.start_delay_s,
            on_endpoints=publish,
            pod_host=None if host is None else host.client,
        )
        runner.run_in_thread()
        stack.callback(runner.stop)
        deadline = time.monotonic() + 60
        while not (status(rest).get("readyReplicas") == 3 and proxied(proxy_port) == 3):
            if time.monotonic() > deadline:
                raise TimeoutError(f"3 ready replicas; see {workdir}/pods/*/runtime.log")
            time.sleep(0.2)
        request = prepare(
            f"http://127.0.0.1:{proxy_port}",
            NAME,
            {"x": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)},
        )
        load = Load(request.url, request.body, dict(request.headers), args.rate, args.max_in_flight)

        async def bounded() -> list[Window]:
            return await asyncio.wait_for(drive(rest, runner, load, args), args.budget_s)

        windows = asyncio.run(bounded())
        marks = [{"window": w.name, "start": round(w.start, 1), "end": round(w.end, 1)}
                 for w in windows]  # fmt: skip
        return {
            "windows": summarize(load, windows),
            "marks": marks,
            "timeline": timeline(load),
            "why": dict(load.why),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=170.0, help="requests per second")
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=6.0)
    parser.add_argument("--engine", choices=["simulated", "onnx"], default="simulated")
    parser.add_argument("--alpha-ms", type=float, default=50.0)
    parser.add_argument("--beta-ms", type=float, default=2.5)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--sla-ms", type=float, default=500.0)
    parser.add_argument("--start-delay-s", type=float, default=1.0)
    parser.add_argument(
        "--pre-stop-s", type=int, default=5, help="the operator's preStopSleepSeconds"
    )
    parser.add_argument(
        "--balance",
        choices=["request", "connection"],
        default="request",
        help="the Service's balancing: per request (a mesh) or per connection (kube-proxy)",
    )
    parser.add_argument("--max-in-flight", type=int, default=400)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--pod-host", action="store_true", help="simulated pods in one host")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.workdir is not None:
        result = measure(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="transitions-") as tmp:
            result = measure(args, Path(tmp))
    print(table(result["windows"]))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
