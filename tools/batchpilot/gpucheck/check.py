"""The textbook case, on whatever accelerator is here: one model, served by the real runtime with
max batch 1 and with dynamic batching, measured with the real load generator.

1. The model: torchvision's ResNet-50 (random weights) on a GPU; on a machine without CUDA a
   small residual network of the same signature, on the CPU — and the report says so in words.
2. t(b) timed directly at batch 1…64 (`timing`), no server.
3. For each configuration — max batch 1, and dynamic batching (max batch 64, 5 ms queue delay) —
   the same server, given the configuration's batch settings as a pod gets a new ConfigMap,
   `batchpilot loadgen --find-max --sla-ms 100` (the highest rate whose P99 is
   within 100 ms), then a steady run at that rate, during which GPU utilization is read two ways:
   NVML's (the runtime's `batchpilot_gpu_utilization_ratio`, sampled) and the runtime's busy
   counter (`batchpilot_device_busy_seconds_total`'s increase over the run's length).
4. t(b) fitted from the runtime's own per-bucket counters (`batchpilot_batch_compute_seconds`,
   `_rows`, `_batches`) over the dynamic batching configuration, beside the direct timing's line.
5. The autopilot's `decide()` on the steady run of the batching server, observed as its pilot
   would observe it (rates, server-side P99, utilization, compute points), for a 100 ms SLA.

Everything lands in `results.json` and `gpu-check.png` in the output folder.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from batchpilot.gpucheck import models
from batchpilot.gpucheck.serving import GaugeSampler, Scrape, Server, histogram_quantile, loadgen
from batchpilot.gpucheck.serving import serve as serving
from batchpilot.gpucheck.timing import least_squares, time_directly
from batchpilot.operator.autopilot.decide import decide
from batchpilot.operator.autopilot.observation import ComputePoint, Observation
from batchpilot.operator.autopilot.policy import InForce, Policy
from batchpilot.operator.autopilot.service_model import fit
from batchpilot.operator.autopilot.state import State
from batchpilot.runtime.device import Nvml
from batchpilot.runtime.torch_engine import TorchEngine

SLA_MS = 100.0
MAX_BATCH = 64
QUEUE_DELAY_MS = 5.0
MODEL_NAME = "model"
CLIENT_TIMEOUT_S = 1.0
"""Ten times the SLA: an answer later than that is a miss however late, and a short timeout keeps
each find-max probe's worst case (and so the search's time budget) short."""


@dataclass(frozen=True, slots=True)
class Plan:
    """How long each step may take: `full` for a GPU (under 8 minutes in all), `quick` for the
    CPU run that `make test` does (under 20 seconds: two batch-size points more than a line
    needs, two probes per search, a second of steady load — enough for every number to exist,
    not to mean much)."""

    batches: tuple[int, ...]
    seconds_per_batch: float
    probe_s: float
    max_probes: int
    search_budget_s: float
    steady_s: float
    warmup_s: float
    settle_s: float
    """The pause between the search's probes, for the queue to drain."""
    start_rps: float

    @classmethod
    def full(cls) -> Plan:
        return cls(
            batches=(1, 2, 4, 8, 16, 32, 64),
            seconds_per_batch=1.0,
            probe_s=4.0,
            max_probes=10,
            search_budget_s=100.0,
            steady_s=15.0,
            warmup_s=1.0,
            settle_s=0.5,
            start_rps=50.0,
        )

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            batches=(1, 4, 8),
            seconds_per_batch=0.1,
            probe_s=0.5,
            max_probes=2,
            search_budget_s=8.0,
            steady_s=1.0,
            warmup_s=0.2,
            settle_s=0.2,
            start_rps=10.0,
        )


def environment() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    nvml = Nvml.probe()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "nvml_gpus": nvml.names() if nvml is not None else [],
        "torchvision": models.torchvision_available(),
    }


CONFIGURATIONS = (("batch1", 1, 0.0), ("dynamic", MAX_BATCH, QUEUE_DELAY_MS))
"""(label, max batch size, max queue delay in ms): without batching, and with dynamic batching."""


def _configuration(
    server: Server,
    *,
    label: str,
    max_batch: int,
    delay_ms: float,
    plan: Plan,
    out: Path,
) -> dict[str, Any]:
    """One configuration: its batch settings in force, find-max within the SLA, then a steady
    run at the rate found."""
    server.configure(max_batch=max_batch, delay_ms=delay_ms)
    start = server.scrape()
    search = loadgen(
        server.url, MODEL_NAME, "--find-max", "--sla-ms", str(SLA_MS),
        "--start-rps", str(plan.start_rps), "--probe-duration-s", str(plan.probe_s),
        "--warmup-s", str(plan.warmup_s), "--max-probes", str(plan.max_probes),
        "--max-total-s", str(plan.search_budget_s), "--settle-s", str(plan.settle_s),
        "--precision", "0.1", "--timeout-s", str(CLIENT_TIMEOUT_S),
        out=out / f"search-{label}.json",
    )  # fmt: skip
    best = float(search.get("best_rps") or 0.0)
    steady = _steady_run(server, best or plan.start_rps, plan=plan, label=label, out=out)
    end = server.scrape()
    return {
        "max_batch_size": max_batch,
        "max_queue_delay_ms": delay_ms,
        "max_qps_within_sla": best,
        "search_stopped_because": search.get("stopped_because"),
        "search_invalid_reason": search.get("invalid_reason"),
        "probes": [
            {
                "rate_rps": p["rate_rps"],
                "passed": p["passed"],
                "p99_ms": (p["report"].get("latency_ms") or {}).get("p99_ms"),
                "valid": p["report"].get("valid"),
            }
            for p in search.get("probes", [])
        ],
        "steady": steady,
        "runtime_compute": _compute_points(end, since=start),
    }


def _compute_points(scrape: Scrape, *, since: Scrape) -> list[dict[str, float]]:
    """Per batch-size bucket, the batches run between the two scrapes: how many, their mean
    size and mean compute time."""

    def increase(name: str) -> dict[str, float]:
        before = since.by_label(name, "batch_bucket")
        return {b: v - before.get(b, 0.0) for b, v in scrape.by_label(name, "batch_bucket").items()}

    seconds = increase("batchpilot_batch_compute_seconds_total")
    rows = increase("batchpilot_batch_rows_total")
    batches = increase("batchpilot_batches_total")
    points = [
        {
            "bucket": int(bucket),
            "batches": batches[bucket],
            "mean_batch": rows[bucket] / batches[bucket],
            "mean_seconds": seconds[bucket] / batches[bucket],
        }
        for bucket in seconds
        if batches.get(bucket, 0.0) > 0
    ]
    return sorted(points, key=lambda p: p["bucket"])


def _steady_run(
    server: Server, rate: float, *, plan: Plan, label: str, out: Path
) -> dict[str, Any]:
    """A constant rate for `steady_s`: the client's view, and the server's as its counters and
    gauges tell it (the autopilot's view)."""
    before = server.scrape()
    with GaugeSampler(server) as nvml:
        report = loadgen(
            server.url, MODEL_NAME, "--rate", f"{rate:.3f}", "--duration", str(plan.steady_s),
            "--sla-ms", str(SLA_MS), "--timeout-s", str(CLIENT_TIMEOUT_S),
            out=out / f"steady-{label}.json",
        )  # fmt: skip
    after = server.scrape()
    # The counters' increase is the run's (nothing else loads the server), spread over the run's
    # length rather than the scrapes' span, which includes the load generator's start.
    window = float(report.get("elapsed_s") or plan.steady_s)

    def rate_of(name: str, **labels: str) -> float:
        return (after.total(name, **labels) - before.total(name, **labels)) / window

    batches = after.total("batchpilot_batches_total") - before.total("batchpilot_batches_total")
    rows = after.total("batchpilot_batch_rows_total") - before.total("batchpilot_batch_rows_total")
    timed = rate_of("batchpilot_request_duration_seconds_count")
    in_batcher = rate_of("batchpilot_batcher_seconds_total")
    startup = after.by_label("batchpilot_startup_batch_seconds", "rows")
    latency = report.get("latency_ms") or {}
    return {
        "rate_rps": rate,
        "window_s": window,
        "client": {
            "valid": report.get("valid"),
            "invalid_reason": report.get("invalid_reason"),
            "achieved_qps": report.get("achieved_qps"),
            "p50_ms": latency.get("p50_ms"),
            "p99_ms": latency.get("p99_ms"),
            "shed": report.get("shed"),
            "failed": report.get("failed"),
        },
        "server": {
            "arrival_qps": rate_of("batchpilot_arrivals_total"),
            "qps": rate_of("batchpilot_requests_total", outcome="success"),
            "rejected_qps": rate_of("batchpilot_shed_total"),
            "p99_s": histogram_quantile(0.99, before, after, "batchpilot_request_duration_seconds"),
            "p95_s": histogram_quantile(0.95, before, after, "batchpilot_request_duration_seconds"),
            "queue_p99_s": histogram_quantile(0.99, before, after, "batchpilot_queue_wait_seconds"),
            "mean_batch": rows / batches if batches else None,
            "compute": _compute_points(after, since=before),
            # the mean time a request spent outside the batcher (decode, encode, HTTP)
            "outside_s": (
                (rate_of("batchpilot_request_duration_seconds_sum") - in_batcher) / timed
                if timed
                else None
            ),
            # t(b) as the runtime timed it at start-up, beside the direct timing
            "startup": [{"rows": int(r), "seconds": startup[r]} for r in sorted(startup, key=int)],
        },
        "utilization": {
            "busy_counter": rate_of("batchpilot_device_busy_seconds_total"),
            "nvml": nvml.mean,
            "nvml_samples": len(nvml.values),
        },
    }


def autopilot_decision(
    steady: dict[str, Any], *, max_batch: int, delay_ms: float
) -> dict[str, Any]:
    """`decide()` on the steady run as the pilot would observe it, for a 100 ms SLA."""
    server = steady["server"]
    observation = Observation(
        at=0.0,
        window_s=steady["window_s"],
        p99_s=server["p99_s"],
        p95_s=server["p95_s"],
        qps=server["qps"],
        rejected_qps=server["rejected_qps"],
        queue_p99_s=server["queue_p99_s"],
        utilization=steady["utilization"]["busy_counter"],
        mean_batch=server["mean_batch"],
        compute=tuple(
            ComputePoint(p["mean_batch"], p["mean_seconds"], p["batches"])
            for p in server["compute"]
        ),
        ready_replicas=1,
        arrival_qps=server["arrival_qps"],
        outside_s=server["outside_s"],
        startup=tuple(ComputePoint(p["rows"], p["seconds"], 0.0) for p in server["startup"]),
    )
    policy = Policy(
        sla_p99_s=SLA_MS / 1e3,
        min_utilization=0.7,
        min_replicas=1,
        max_replicas=8,
        max_batch_size=MAX_BATCH,
        scale_down_delay_s=300,
        max_queue_delay_s=QUEUE_DELAY_MS / 1e3,
    )
    current = InForce(replicas=1, batch_size=max_batch, max_queue_delay_s=delay_ms / 1e3)
    decision, state = decide(observation, policy, current, State(), now=0.0)
    return {
        "observation": dataclasses.asdict(observation),
        "decision": dataclasses.asdict(decision),
        "fit": dataclasses.asdict(state.fit) if state.fit is not None else None,
    }


def _line(points: list[tuple[float, float, float]]) -> dict[str, float] | None:
    line = least_squares(points)
    return line.as_dict() if line is not None else None


def run_check(
    out: Path,
    *,
    plan: Plan,
    model_kind: Literal["auto", "resnet50", "tiny"] = "auto",
    device: Literal["auto", "cpu", "gpu"] = "auto",
    intra_op_threads: int = 0,
) -> dict[str, Any]:
    """The whole check; writes results.json (and returns it) in `out`."""
    began = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    on_gpu = device != "cpu" and env["cuda"]
    if model_kind == "auto":
        model_kind = "resnet50" if on_gpu and env["torchvision"] else "tiny"
    notes = []
    if not on_gpu:
        notes.append(
            "NO GPU: PyTorch sees no CUDA device here, so this ran on the CPU with a "
            f"{'tiny stand-in model' if model_kind == 'tiny' else model_kind}; the numbers prove "
            "the check runs end to end, and say nothing about a GPU"
        )
    elif model_kind != "resnet50":
        notes.append(f"the model is {model_kind}, not ResNet-50 (torchvision is not installed)")
    print(f"gpu-check: {env}; model {model_kind}", flush=True)
    for note in notes:
        print(f"gpu-check: {note}", flush=True)
    model = models.save(models.build(model_kind), out / "model.pt")
    device_args = ["--device", "gpu" if on_gpu else "cpu"]
    if intra_op_threads:
        device_args += ["--intra-op-threads", str(intra_op_threads)]

    engine = TorchEngine.load(
        model, name=MODEL_NAME, device="gpu" if on_gpu else "cpu", intra_op_threads=intra_op_threads
    )
    direct = time_directly(engine, plan.batches, seconds_per_batch=plan.seconds_per_batch)
    del engine
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    print(
        "gpu-check: direct t(b), ms: "
        + ", ".join(f"{d['batch']}: {d['median_s'] * 1e3:.2f}" for d in direct),
        flush=True,
    )

    configurations = {}
    _, first_batch, first_delay_ms = CONFIGURATIONS[0]
    args = [
        "--max-batch-size", str(first_batch), "--max-queue-delay-ms", str(first_delay_ms),
        "--deadline-ms", str(SLA_MS), "--queue-capacity", "4096", *device_args,
        # timed at start-up up to the largest limit the check sets, as the operator has it
        "--calibration-rows", str(max(batch for _, batch, _ in CONFIGURATIONS)),
    ]  # fmt: skip
    log_path = out / "runtime.log"
    with serving(model, *args, name=MODEL_NAME, log_path=log_path, ready_timeout_s=300) as server:
        for label, max_batch, delay_ms in CONFIGURATIONS:
            configurations[label] = _configuration(
                server, label=label, max_batch=max_batch, delay_ms=delay_ms, plan=plan, out=out
            )
            c = configurations[label]
            print(
                f"gpu-check: {label}: max QPS at P99 <= {SLA_MS:g} ms: "
                f"{c['max_qps_within_sla']:.1f} ({c['search_stopped_because']}); utilization "
                f"busy {c['steady']['utilization']['busy_counter']:.2f}, NVML "
                f"{c['steady']['utilization']['nvml']}",
                flush=True,
            )
    dynamic = configurations["dynamic"]
    runtime_points = [
        (p["mean_batch"], p["mean_seconds"], p["batches"]) for p in dynamic["runtime_compute"]
    ]
    autopilot_fit = fit([ComputePoint(b, t, n) for b, t, n in runtime_points], prior=None)
    results: dict[str, Any] = {
        "on_gpu": on_gpu,
        "notes": notes,
        "environment": env,
        "model": model_kind,
        "sla_ms": SLA_MS,
        "plan": dataclasses.asdict(plan),
        "direct_timing": direct,
        "t_of_b": {
            "direct": _line([(d["batch"], d["median_s"], 1.0) for d in direct]),
            "runtime_metrics": _line(runtime_points),
            "autopilot_fit": dataclasses.asdict(autopilot_fit) if autopilot_fit else None,
            # what the runtime timed before serving, and the autopilot's first fit from it
            "startup": _line(
                [(p["rows"], p["seconds"], 1.0) for p in dynamic["steady"]["server"]["startup"]]
            ),
        },
        "configurations": configurations,
        "autopilot": autopilot_decision(
            dynamic["steady"], max_batch=MAX_BATCH, delay_ms=QUEUE_DELAY_MS
        ),
        "elapsed_s": time.monotonic() - began,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    from batchpilot.gpucheck.plot import plot

    plot(results, out / "gpu-check.png")
    decision = results["autopilot"]["decision"]
    print(
        f"gpu-check: autopilot for a {SLA_MS:g} ms SLA: {decision['action']} -> "
        f"{decision['replicas']} replicas, batch {decision['batch_size']}: {decision['reason']}",
        flush=True,
    )
    print(f"gpu-check: results in {out} ({results['elapsed_s']:.0f} s)", flush=True)
    return results
