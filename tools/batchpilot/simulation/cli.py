"""`batchpilot simulate`: run the autopilot (and the baselines) over a traffic trace, offline.

    batchpilot simulate --trace examples/traces/diurnal.csv --service textbook \\
        --policy autopilot,hpa,oracle --sla-ms 100 --json out.json --plot out.png

Prints a comparison table; `--json` writes every interval of every run; `--plot` draws rate,
P99 against the SLA, replicas and batch limit (needs matplotlib). `--trace-gen onoff:7`
simulates a freshly generated trace instead of a file (`generate`'s kinds; without a seed, the
shipped file's), so a policy can be judged on seeds it was never tuned on.

`--lose-node 1200:2` kills the node under the two oldest ready replicas 1200 s in (repeat it for
more nodes): they answer nothing from then on, stay ready in Kubernetes for `--node-notice-s`
(40, the node-monitor-grace-period; the requests the Service sends them fail), are NotReady
but still billed for `--eviction-s` more (300, the taints' tolerationSeconds), and are then
deleted and replaced by new replicas that pay the cold start.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast

from batchpilot.operator.autopilot.prometheus import Seasonality
from batchpilot.simulation import generate
from batchpilot.simulation.clients import Retries
from batchpilot.simulation.cluster import ClusterConfig, NodeLoss, Slowdown
from batchpilot.simulation.report import DEFAULT_OBJECTIVE, SimulationResult, table
from batchpilot.simulation.scenario import POLICIES, PolicyName, Scenario, simulate
from batchpilot.simulation.service import ServiceTruth
from batchpilot.simulation.trace import Trace


def _policies(text: str) -> list[PolicyName]:
    names = list(POLICIES) if text.strip() == "all" else [p.strip() for p in text.split(",")]
    unknown = [name for name in names if name not in POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)} or all"
        )
    return [cast(PolicyName, name) for name in names]


def _trace_gen(text: str) -> tuple[str, int | None]:
    """`NAME` or `NAME:SEED`."""
    name, _, seed = text.partition(":")
    if name not in generate.KINDS:
        raise argparse.ArgumentTypeError(
            f"unknown trace kind {name!r}; choose from {', '.join(generate.KINDS)}"
        )
    try:
        return name, int(seed) if seed else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"the seed in {text!r} is not an integer") from None


def _node_loss(text: str) -> tuple[float, int]:
    """`AT_S` or `AT_S:COUNT`."""
    at, _, count = text.partition(":")
    try:
        loss = float(at), int(count) if count else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not AT_S[:COUNT]") from None
    if loss[0] < 0 or loss[1] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need AT_S >= 0 and COUNT >= 1")
    return loss


def _slowdown(text: str) -> Slowdown:
    try:
        return Slowdown.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _retries(text: str) -> Retries:
    try:
        return Retries.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _clump(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clump must be a number, not {text!r}") from None
    if not (value >= 1 and value < float("inf")):
        raise argparse.ArgumentTypeError("--clump is a mean clump size: at least 1")
    return value


def clients_line(result: SimulationResult) -> str:
    """What the retrying clients did under one policy."""
    clients = result.clients or {}
    requests, retries = clients.get("requests", 0), clients.get("retries", 0)
    return (
        f"{result.trace:<12} {result.policy:<10} clients: {requests} requests, {retries} "
        f"retries ({retries / requests if requests else 0:.3f} per request), "
        f"{clients.get('gaveUp', 0)} given up"
    )


def _objective_percent(text: str) -> float:
    value = float(text)
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError("the objective is a percentage strictly inside 0-100")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="CSV: t_seconds,rate_rps")
    source.add_argument(
        "--trace-gen",
        type=_trace_gen,
        metavar="KIND[:SEED]",
        help=f"a generated trace instead: {', '.join(generate.KINDS)} (default seed: the "
        "shipped file's)",
    )
    parser.add_argument(
        "--service",
        default="textbook",
        help="alpha_ms=A,beta_ms=B[,overhead_ms=C], or 'textbook' (ResNet-50 on an A10: "
        "α 1.52 ms, β 2.25 ms, 40 ms outside the device); either followed by ',rows=K' for "
        "clients that send K rows a request and ',cv=V' for batch times that vary around t(b) "
        "by V; default: textbook",
    )
    parser.add_argument(
        "--overhead-ms",
        type=float,
        default=None,
        help="latency every request spends outside the device (decode, pre/post-processing)",
    )
    parser.add_argument(
        "--policy",
        type=_policies,
        default=["autopilot"],
        help="autopilot, oracle, reactive, hpa, static — one, a comma-separated list, or all",
    )
    parser.add_argument("--sla-ms", type=float, default=100.0, help="P99 latency SLA")
    parser.add_argument(
        "--objective-percent",
        type=_objective_percent,
        default=DEFAULT_OBJECTIVE * 100,
        help="sla.objectivePercent: the share of time within the SLA the autopilot keeps and "
        "the error budget is counted against (99)",
    )
    parser.add_argument(
        "--objective-window-s",
        type=float,
        default=3600.0,
        help="sla.window in seconds: the objective's rolling window (3600)",
    )
    spec = parser.add_argument_group("the InferenceService spec")
    spec.add_argument("--min-replicas", type=int, default=1)
    spec.add_argument("--max-replicas", type=int, default=8)
    spec.add_argument("--start-replicas", type=int, default=1)
    spec.add_argument("--max-batch-size", type=int, default=64)
    spec.add_argument("--batch-size", type=int, default=1, help="starting batch limit")
    spec.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    spec.add_argument("--scale-down-delay-s", type=float, default=300.0)
    baselines = parser.add_argument_group("baselines")
    baselines.add_argument(
        "--baseline-batch",
        type=int,
        default=None,
        help="fixed batch limit of the HPA and static baselines (default: --batch-size)",
    )
    baselines.add_argument("--hpa-target", type=float, default=70.0, help="GPU utilization %%")
    baselines.add_argument(
        "--reactive-margin",
        type=float,
        default=1.0,
        help="the reactive bound provisions this many times the present rate (default 1)",
    )
    cluster = parser.add_argument_group("the simulated cluster")
    cluster.add_argument("--cold-start-s", type=float, default=30.0)
    cluster.add_argument("--interval-s", type=float, default=15.0, help="control interval")
    cluster.add_argument("--window-s", type=float, default=60.0, help="metrics window")
    cluster.add_argument("--queue-capacity", type=int, default=1024)
    cluster.add_argument(
        "--admission",
        choices=["deadline", "queue"],
        default="deadline",
        help="replicas refuse at arrival what they predict late (the runtime's default), or "
        "shed only when the queue is full",
    )
    cluster.add_argument(
        "--no-burst",
        dest="burst",
        action="store_false",
        help="replicas never batch beyond the limit in force (the runtime without a burst size, "
        "as in modes recommend and off); default: a backlog of more than the limit runs in one "
        "batch of up to --max-batch-size",
    )
    cluster.add_argument(
        "--scrape-interval-s",
        type=float,
        default=15.0,
        help="Prometheus' scrape interval for every replica; 0: exact windows, no scraping",
    )
    cluster.add_argument(
        "--recent-window-s",
        type=float,
        default=30.0,
        help="the fast signal's range (autopilot.recentWindowSeconds); two scrapes must fit",
    )
    cluster.add_argument(
        "--seasonal-period-s",
        type=int,
        default=86_400,
        help="the traffic pattern's period (autopilot.seasonality.periodSeconds; the daily "
        "trace kind's days last 7200 s); 0: no seasonal forecast",
    )
    cluster.add_argument(
        "--seasonal-periods",
        type=int,
        default=2,
        help="past periods that must all show a rise (autopilot.seasonality.periods)",
    )
    cluster.add_argument(
        "--seasonal-lookahead-s",
        type=int,
        default=300,
        help="how far past this time a past rise counts (autopilot.seasonality.lookaheadSeconds)",
    )
    cluster.add_argument("--balancing", choices=["random", "round-robin"], default="random")
    cluster.add_argument(
        "--lose-node",
        type=_node_loss,
        action="append",
        default=[],
        metavar="AT_S[:COUNT]",
        help="a node dies AT_S seconds in under the COUNT (1) oldest ready replicas; repeat for "
        "more nodes",
    )
    cluster.add_argument(
        "--node-notice-s",
        type=float,
        default=40.0,
        help="how long a dead node's replicas stay ready and in the endpoints, failing what "
        "they are sent (the node-monitor-grace-period: 40)",
    )
    cluster.add_argument(
        "--eviction-s",
        type=float,
        default=300.0,
        help="how long they are then NotReady, billed and not replaced, until deleted and "
        "replaced: the pod template's tolerationSeconds of the node-loss taints, which the "
        "autopilot reads too (300, Kubernetes' default; the operator renders 30)",
    )
    cluster.add_argument(
        "--slowdown",
        type=_slowdown,
        action="append",
        default=[],
        metavar="AT_S:FACTOR[:DURATION_S[:COUNT]]",
        help="batches take FACTOR times as long from AT_S seconds in, for DURATION_S (to the "
        "end): on every replica, new ones too (a heavier input mix, a fleet-wide thermal limit), "
        "or on the COUNT oldest ready ones (a GPU that throttles; a replica that replaces one is "
        "normal). Repeat for more",
    )
    cluster.add_argument(
        "--keep-slow-replicas",
        action="store_true",
        help="the autopilot does not replace replicas slower than their peers "
        "(scaling.replaceSlowReplicas: false)",
    )
    cluster.add_argument(
        "--retries",
        type=_retries,
        default=None,
        metavar="attempts=3,delay_s=1,backoff=1,jitter=0.5,marked=0",
        help="clients send a refused request again, after delay_s (times backoff per attempt, "
        "± jitter), up to attempts tries in all; the runtimes count every try as an arrival. "
        "marked=1: each retry says it is one (x-envoy-attempt-count, gRPC's attempt count), "
        "and the arrival signals count the first tries alone. "
        "Default: a refused request is dropped",
    )
    cluster.add_argument(
        "--clump",
        type=_clump,
        default=1.0,
        metavar="MEAN",
        help="requests arrive in clumps of this mean size, a clump's at once (a client's "
        "fan-out, a gateway's bursts): geometric sizes, the trace's rate. Default 1: Poisson",
    )
    cluster.add_argument(
        "--basic-signals",
        action="store_true",
        help="the policies see only P99, P95, the served and refused rates, the queue's P99, the "
        "busy share, the mean batch and the ready replicas (a runtime without batchpilot's own "
        "series: batch times by size, arrivals, the recent rate, the start-up timing)",
    )
    cluster.add_argument(
        "--busy-signals",
        action="store_true",
        help="fewer still: the basic signals without the mean batch (an exporter of request "
        "counts, latency and the device's utilization, nothing of its batches)",
    )
    cluster.add_argument("--seed", type=int, default=0)
    cluster.add_argument(
        "--duration-s", type=float, default=None, help="override the trace's length"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every interval here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG here")


def trace_of(args: argparse.Namespace) -> Trace:
    """The `--trace` file, or the `--trace-gen` kind generated with its seed; `--duration-s`
    cuts or extends either the same way."""
    if args.trace_gen is None:
        return Trace.from_csv(args.trace, duration_s=args.duration_s)
    kind, seed = args.trace_gen
    return Trace.from_points(
        generate.generate(kind, seed),
        name=kind if seed is None else f"{kind}-{seed}",
        duration_s=args.duration_s,
    )


def scenario_of(args: argparse.Namespace) -> Scenario:
    return Scenario(
        trace=trace_of(args),
        service=ServiceTruth.parse(args.service, overhead_ms=args.overhead_ms),
        sla_s=args.sla_ms / 1e3,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        start_replicas=max(args.min_replicas, args.start_replicas),
        max_batch_size=args.max_batch_size,
        batch_size=args.batch_size,
        max_queue_delay_s=args.max_queue_delay_ms / 1e3,
        scale_down_delay_s=args.scale_down_delay_s,
        baseline_batch=args.baseline_batch,
        hpa_target=args.hpa_target / 100,
        reactive_margin=args.reactive_margin,
        objective=args.objective_percent / 100,
        objective_window_s=args.objective_window_s,
        replace_slow=not args.keep_slow_replicas,
        cluster=ClusterConfig(
            interval_s=args.interval_s,
            window_s=args.window_s,
            cold_start_s=args.cold_start_s,
            queue_capacity=args.queue_capacity,
            admission=args.admission,
            burst=args.burst,
            scrape_interval_s=args.scrape_interval_s,
            recent_window_s=args.recent_window_s,
            balancing=args.balancing,
            seasonality=(
                Seasonality(
                    period_s=args.seasonal_period_s,
                    periods=args.seasonal_periods,
                    lookahead_s=args.seasonal_lookahead_s,
                )
                if args.seasonal_period_s > 0
                else None
            ),
            seed=args.seed,
            retries=args.retries,
            clump=args.clump,
            basic_signals=args.basic_signals,
            busy_signals=args.busy_signals,
            node_losses=tuple(
                NodeLoss(at, count, notice_s=args.node_notice_s, eviction_s=args.eviction_s)
                for at, count in args.lose_node
            ),
            slowdowns=tuple(args.slowdown),
        ),
    )


def main(args: argparse.Namespace) -> int:
    try:
        scenario = scenario_of(args)
    except (OSError, ValueError) as exc:
        print(f"batchpilot simulate: {exc}", file=sys.stderr)
        return 2
    results: list[SimulationResult] = [simulate(scenario, name) for name in args.policy]
    objective = args.objective_percent / 100
    print(
        f"{scenario.trace.name}: {scenario.service.describe()}, SLA P99 < {args.sla_ms:g} ms "
        f"in {args.objective_percent:g} % of intervals"
    )
    print(table(results, objective=objective))
    for result in results:
        if result.clients is not None:
            print(clients_line(result))
    if args.json is not None:
        document = {"results": [result.to_dict(objective=objective) for result in results]}
        args.json.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    if args.plot is not None:
        from batchpilot.simulation.plot import plot

        try:
            plot(results, args.plot)
        except RuntimeError as exc:
            print(f"batchpilot simulate: {exc}", file=sys.stderr)
            return 1
    return 0
