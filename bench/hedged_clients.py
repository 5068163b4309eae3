"""Clients that hedge: is a service whose every request is answered in time read as one?

    .venv/bin/python bench/hedged_clients.py [--physics slow|fast] [--seconds 20]
        [--levels 0.3,0.6] [--json OUT]

A client that hedges sends a request again when no answer came within a delay — about its P90
or P95 — takes the first answer and cancels the other send (gRPC's hedging policy, Envoy's
`hedge_on_per_try_timeout`, the "tail at scale" technique). Every hedge is a send cancelled at
the server, unless both are answered at once. This starts `batchpilot runtime serve` on the MLP
with a simulated accelerator — `slow`: t(b) = 150 + 2·b ms at batch limit 4 (25 rps), a 1 s
SLA, hedges after 300 and 250 ms; `fast`: `overload.py`'s 20 + 1·b ms at batch 8 (286 rps), a
100 ms SLA, hedges after 40 and 25 ms — the SLA and a deadline 5 % under it in its batching
document (as the operator writes them), and offers it open-loop Poisson load at each level
(times its capacity) from `batchpilot loadgen`, the same arrival times for every kind of client:
clients that never hedge, and clients that hedge (the copy numbered in `x-envoy-attempt-count`,
as Envoy's hedging does). One replica: a copy that arrives while its twin's batch runs waits for
the next, and is cancelled when the twin is answered. (A server hears of a client gone at its
next write — it probes at once and 2, 10 and 50 ms after the client's half-close — so a send
cancelled closer than that to its answer is answered all the same, and counted so; through
`ConnectionBalancer`'s relay, which passes a client's close on as a half-close, one write later
still.)
Per run: the clients' P50/P99 from the scheduled send, the hedges, the runtime's own counts
(arrivals, answered, cancelled, withdrawn), and the share of requests unserved the autopilot
reads from the pod's metrics (`PodScraper`, the operator's own reading) — with the sends
withdrawn before the SLA left out, and counted as misses as they were before
`batchpilot_withdrawn_total`: above 1 % the window is judged outside the SLA.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ holds the model builder and the server process helper

from tests.onnx_models import mlp  # noqa: E402
from tests.runtime_process import Scrape, runtime_process  # noqa: E402

from batchpilot.operator.autopilot.explain import SHED_TOLERANCE  # noqa: E402
from batchpilot.operator.autopilot.pod_metrics import PodScraper  # noqa: E402
from batchpilot.operator.children.common import Owner  # noqa: E402
from batchpilot.operator.spec import InferenceServiceSpec  # noqa: E402
from loadgen_run import open_loop  # noqa: E402


@dataclass(frozen=True)
class Physics:
    alpha_ms: float
    beta_ms: float
    max_batch: int
    sla_ms: float
    hedges_ms: tuple[int, int]
    """The clients' hedging delays: about the P99 and the P75 without hedging."""

    @property
    def capacity_rps(self) -> float:
        return self.max_batch / (self.alpha_ms + self.beta_ms * self.max_batch) * 1e3

    @property
    def batching(self) -> dict[str, float]:
        """The batching document, the deadline 5 % under the SLA as the operator sets it."""
        return {
            "maxBatchSize": self.max_batch,
            "maxQueueDelayMs": 2,
            "deadlineMs": 0.95 * self.sla_ms,
            "slaMs": self.sla_ms,
        }

    def clients(self) -> list[tuple[str, list[str]]]:
        return [("never hedge", [])] + [
            (f"hedge after {ms} ms", ["--hedge-ms", str(ms), "--mark-retries"])
            for ms in self.hedges_ms
        ]

    def owner(self) -> Owner:
        spec = {"model": {"uri": "pvc://models/mlp.onnx"}, "sla": {"latencyP99Ms": self.sla_ms}}
        return Owner(
            name="mlp",
            namespace="bench",
            uid="u",
            spec=InferenceServiceSpec.model_validate(spec),
        )


PHYSICS = {
    # slow batches: a send cancelled while it waits is found gone before it runs
    "slow": Physics(150.0, 2.0, 4, 1000.0, (300, 250)),
    # overload.py's accelerator: batches done within tens of milliseconds
    "fast": Physics(20.0, 1.0, 8, 100.0, (40, 25)),
}


class Pods:
    """The replicas' admin endpoints, as the operator finds a service's ready pods."""

    def __init__(self, *endpoints: str) -> None:
        self.endpoints = list(endpoints)

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return list(self.endpoints)


def counts(scrapes: list[Scrape]) -> dict[str, float]:
    """The replicas' counts together."""
    return {
        key: sum(scrape.value(name, **labels) for scrape in scrapes)
        for key, name, labels in (
            ("arrivals", "batchpilot_arrivals_total", {"attempt": "first"}),
            ("hedges", "batchpilot_arrivals_total", {"attempt": "retry"}),
            ("answered", "batchpilot_requests_total", {"outcome": "success"}),
            ("cancelled", "batchpilot_requests_total", {"outcome": "cancelled"}),
            ("withdrawn", "batchpilot_withdrawn_total", {}),
        )
    }


def one_run(
    model: Path,
    folder: Path,
    *,
    physics: Physics,
    config: Path,
    rate: float,
    seconds: float,
    flags: list[str],
) -> tuple[dict[str, Any], dict[str, float], float, float]:
    """A fresh replica, one run: the load generator's report, the replica's counts, and the
    share unserved the autopilot reads from its metrics, now and with cancellations as misses."""
    server = (
        "--engine", "simulated", "--batching-config", str(config),
        "--simulated-latency", f"alpha_ms={physics.alpha_ms:g},beta_ms={physics.beta_ms:g}",
    )  # fmt: skip
    owner = physics.owner()
    with runtime_process(model, *server, log_dir=folder) as replica:
        scraper = PodScraper(Pods(f"127.0.0.1:{replica.admin_port}"), clock=time.monotonic)
        scraper(owner, ready_replicas=1, at=time.time())
        doc = open_loop(
            replica.port, folder, rate=rate, seconds=seconds, sla_ms=physics.sla_ms, flags=flags
        )
        for _ in range(200):  # the sends cancelled last may still be on their way out
            if not Scrape(replica).value("batchpilot_inflight_requests"):
                break
            time.sleep(0.05)
        observation = scraper(owner, ready_replicas=1, at=time.time())
        counted = counts([Scrape(replica)])
    assert observation is not None
    before = replace(observation, withdrawn_qps=None).unserved_share
    return doc, counted, before, observation.unserved_share


def verdict(share: float) -> str:
    return f"{share:.1%} ({'outside' if share > SHED_TOLERANCE else 'inside'})"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    levels = [float(x) for x in args.levels.split(",")]
    results: list[dict[str, Any]] = []
    physics = PHYSICS[args.physics]
    print(
        f"one replica, t(b) = {physics.alpha_ms:g} + {physics.beta_ms:g}·b ms at batch "
        f"{physics.max_batch}: {physics.capacity_rps:.0f} rps, SLA {physics.sla_ms:g} ms; "
        f"{args.seconds:g} s per run"
    )
    print(
        "| offered | clients | P50/P99 | hedged | arrivals / hedges / answered / cancelled / "
        "withdrawn | unserved, cancellations as misses | unserved now |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="hedged-clients-") as tmp:
        folder = Path(tmp)
        model = mlp(folder / "mlp.onnx")
        config = folder / "batching.json"
        config.write_text(json.dumps(physics.batching))
        for level in levels:
            for name, flags in physics.clients():
                doc, counted, before, now = one_run(
                    model,
                    folder,
                    physics=physics,
                    config=config,
                    rate=level * physics.capacity_rps,
                    seconds=args.seconds,
                    flags=flags,
                )
                results.append(
                    {
                        "level": level,
                        "clients": name,
                        "report": doc,
                        "replicas": counted,
                        "unservedCancellationsAsMisses": before,
                        "unserved": now,
                    }
                )
                latency = doc["latency_ms"] or {}
                print(
                    f"| {level:g}× | {name} | {latency.get('p50_ms', float('nan')):.0f}/"
                    f"{latency.get('p99_ms', float('nan')):.0f} ms | "
                    f"{doc['hedges'] / max(1, doc['sent']):.0%} | "
                    + " / ".join(f"{v:,.0f}" for v in counted.values())
                    + f" | {verdict(before)} | {verdict(now)} |",
                    flush=True,
                )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--physics", choices=sorted(PHYSICS), default="slow")
    parser.add_argument("--seconds", type=float, default=20.0, help="each run's duration")
    parser.add_argument(
        "--levels", default="0.3,0.6", help="offered load, times the replica's capacity"
    )
    parser.add_argument("--json", type=Path, default=None, help="every run's numbers")
    args = parser.parse_args()
    results = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
