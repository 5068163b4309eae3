"""`batchpilot profile NAME [-n NAMESPACE]` (also `kubectl batchpilot profile NAME`): the
textbook performance portrait of one InferenceService, read from Prometheus, with the next
tuning step.

The SLA and utilization band come from the InferenceService itself (through the Kubernetes API,
kubeconfig or in-cluster); `--sla-ms` stands in where the API cannot be read.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from batchpilot.operator.autopilot.portrait import Signals, render
from batchpilot.operator.autopilot.prometheus import (
    PrometheusObserver,
    PrometheusUnavailable,
    QueryFn,
    Scope,
    http_query,
)
from batchpilot.operator.settings import OperatorSettings


def extra_queries(scope: Scope, *, window_s: int) -> dict[str, str]:
    sel, w = scope.selector, f"{window_s}s"
    # process_* series carry no InferenceService labels: join them to the service's instances.
    mine = f"(0 * batchpilot_cpu_cores{{{sel}}} + 1)"
    return {
        "gpu_memory": (
            f"sum(batchpilot_gpu_memory_used_bytes{{{sel}}}) / "
            f"sum(batchpilot_gpu_memory_total_bytes{{{sel}}})"
        ),
        "cpu": (
            f"sum(rate(process_cpu_seconds_total[{w}]) * on(instance, job) group_left() {mine})"
            f" / sum(batchpilot_cpu_cores{{{sel}}})"
        ),
        "batch_limit": f"max(batchpilot_batching_max_batch_size{{{sel}}})",
        "burst_size": f"max(batchpilot_batching_burst_batch_size{{{sel}}})",
    }


def _value(result: list[dict[str, Any]]) -> float | None:
    try:
        value = float(result[0]["value"][1])
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def signals(
    query: QueryFn,
    scope: Scope,
    *,
    sla_s: float,
    band: tuple[float, float],
    window_s: int,
) -> Signals:
    observation = PrometheusObserver(query, window_s=window_s, clock=time.time).observe(
        scope, ready_replicas=None
    )
    if observation is None:
        raise PrometheusUnavailable("Prometheus did not answer")
    extra = {
        name: _value(query(text)) for name, text in extra_queries(scope, window_s=window_s).items()
    }
    return Signals(
        qps=observation.qps,
        p99_s=observation.p99_s,
        sla_s=sla_s,
        gpu_util=observation.utilization,
        gpu_band=band,
        gpu_memory=extra["gpu_memory"],
        memory_bandwidth=None,
        cpu_util=extra["cpu"],
        batch_size=observation.mean_batch,
        rows_per_request=observation.rows_per_request,
        outside_s=observation.outside_s,
        batch_limit=extra["batch_limit"],
        burst_size=extra["burst_size"],
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the InferenceService")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--prometheus", help="Prometheus URL (default: the operator's setting)")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG or in-cluster)")
    parser.add_argument("--window", type=int, default=60, help="seconds of metrics (default 60)")
    parser.add_argument(
        "--sla-ms", type=float, help="the P99 SLA, when the InferenceService cannot be read"
    )


def main(args: argparse.Namespace) -> int:
    settings = OperatorSettings()
    sla_s, band = None, (0.70, 0.95)
    if args.sla_ms is None:
        from batchpilot.operator.kinds import INFERENCESERVICE
        from batchpilot.operator.kube import KubeClient, KubeError
        from batchpilot.operator.spec import InferenceServiceSpec

        try:
            body = KubeClient.from_environment(kubeconfig=args.kubeconfig).get(
                INFERENCESERVICE, args.namespace, args.name
            )
        except (KubeError, OSError, ValueError, RuntimeError) as exc:  # no config, no API
            print(f"batchpilot profile: cannot read the InferenceService: {exc}", file=sys.stderr)
            return 2
        if body is None:
            print(
                f"batchpilot profile: no InferenceService {args.namespace}/{args.name}",
                file=sys.stderr,
            )
            return 2
        spec = InferenceServiceSpec.model_validate(body["spec"])
        sla_s = spec.sla.latency_p99_ms / 1e3
        band = (spec.sla.gpu_utilization.min / 100, spec.sla.gpu_utilization.max / 100)
    else:
        sla_s = args.sla_ms / 1e3
    url = args.prometheus or settings.prometheus_url
    try:
        portrait = signals(
            http_query(url),
            Scope(args.namespace, args.name),
            sla_s=sla_s,
            band=band,
            window_s=args.window,
        )
    except PrometheusUnavailable as exc:
        print(f"batchpilot profile: {exc} ({url})", file=sys.stderr)
        return 2
    print(render(f"{args.namespace}/{args.name}", portrait))
    return 0
