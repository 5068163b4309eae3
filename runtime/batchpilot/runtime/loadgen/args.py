"""The options of `batchpilot loadgen`, and how they become a run or a search.

Turning arguments into a LoadConfig or a SearchConfig is pure and raises ValueError for a bad
combination, so `main` maps every usage mistake to exit status 2 in one place. The exit
statuses are described in the help's epilog, since scripts depend on them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Final

from batchpilot.api.request_rows import RowMix
from batchpilot.runtime.loadgen.config import LoadConfig, Retries, SearchConfig, Target
from batchpilot.runtime.loadgen.errors import (
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
)
from batchpilot.runtime.loadgen.schedule import RateSchedule
from batchpilot.runtime.loadgen.stats import DEFAULT_MAX_SEND_LAG_MS

EPILOG: Final = (
    f"exit status: {EXIT_OK} the run (or search) completed and is a result, server errors and "
    f"shed load included; {EXIT_INVALID} the run completed but is INVALID: the open loop's "
    "client dropped arrivals (--max-outstanding) or its send lag P99 exceeded "
    "--max-send-lag-ms, so it offered less load than asked (for --find-max: a probe was "
    f"invalid and stopped the search); {EXIT_USAGE} bad arguments or an unusable target; "
    f"{EXIT_INTERRUPTED} interrupted."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if parser.epilog is None:
        parser.epilog = EPILOG
    target = parser.add_argument_group("target")
    target.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    target.add_argument("--model", required=True, help="model name")
    target.add_argument(
        "--rows",
        type=_rows,
        default=RowMix((1,), (1.0,)),
        metavar="ROWS|ROWS:WEIGHT,...",
        help="batch rows per request (default 1), or a mix each request draws from: 1:9,16:1 "
        "sends nine requests of one row for each of sixteen",
    )
    target.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D,D,...",
        help="explicit shape of an input (repeatable); wins over the metadata and --rows",
    )
    target.add_argument("--seed", type=int, default=0, help="seeds the data and the arrivals")
    target.add_argument(
        "--json-tensors", action="store_true", help="send JSON tensor data instead of binary"
    )
    target.add_argument("--verify", action="store_true", help="decode and check every response")
    target.add_argument("--timeout-s", type=float, default=10.0, help="per request (default 10)")
    target.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME: VALUE",
        help="an HTTP header for every request (repeatable)",
    )
    target.add_argument(
        "--api-key",
        help="send 'Authorization: Bearer KEY' with every request (default: $BATCHPILOT_API_KEY, "
        "which keeps the key out of the process list)",
    )

    load = parser.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, help="open loop at this constant rate (rps)")
    mode.add_argument("--schedule", help='open loop, piecewise constant: "0:50,20:400,40:100"')
    mode.add_argument("--schedule-file", help="open loop from a t_seconds,rate_rps CSV")
    mode.add_argument("--concurrency", type=int, help="closed loop with this many workers")
    load.add_argument("--duration", type=float, help="measured seconds (required for a run)")
    load.add_argument(
        "--arrivals",
        choices=["poisson", "uniform"],
        default="poisson",
        help="open-loop arrival process (default poisson)",
    )
    load.add_argument(
        "--clump",
        type=float,
        default=1.0,
        metavar="MEAN",
        help="send Poisson arrivals in clumps of this mean size, each clump's at once, as a "
        "client that fans out does (default 1: one at a time)",
    )
    load.add_argument(
        "--max-outstanding",
        type=int,
        default=2000,
        help="open loop: arrivals beyond this many in flight count as dropped_client",
    )
    load.add_argument(
        "--max-send-lag-ms",
        type=float,
        default=DEFAULT_MAX_SEND_LAG_MS,
        help="open loop: a send lag P99 above this makes the run invalid, exit status "
        f"{EXIT_INVALID} (default {DEFAULT_MAX_SEND_LAG_MS:g})",
    )
    load.add_argument("--requests", type=int, help="cap on measured requests")
    load.add_argument(
        "--warmup-s", type=float, default=0.0, help="unmeasured lead-in seconds (default 0)"
    )
    load.add_argument(
        "--connections", type=int, help="connection pool size (default: concurrency or outstanding)"
    )
    load.add_argument(
        "--window-s", type=float, default=1.0, help="time-series window seconds (default 1)"
    )
    load.add_argument(
        "--retries",
        type=int,
        default=0,
        help="send a refused request (503/429) again up to this many times, as retrying "
        "clients do; its latency runs to its last answer (default 0)",
    )
    load.add_argument(
        "--retry-delay-s",
        type=float,
        default=None,
        help="wait this long before each retry (0: at once); default: the answer's Retry-After, "
        "1 s where it has none",
    )
    load.add_argument(
        "--mark-retries",
        action="store_true",
        help="number every try in x-envoy-attempt-count, as an Envoy proxy retrying for its "
        "client does: the server counts the repeats as retries, not as demand",
    )
    load.add_argument(
        "--hedge-ms",
        type=float,
        default=None,
        help="hedge: send a request again when no answer came within this many ms, take the "
        "first success and cancel the other send (gRPC's hedging policy, Envoy's "
        "hedge_on_per_try_timeout); with --mark-retries the copy is numbered 2",
    )

    search = parser.add_argument_group("find-max")
    search.add_argument(
        "--find-max", action="store_true", help="search the highest rate within --sla-ms"
    )
    search.add_argument(
        "--sla-ms",
        type=float,
        help="P99 latency SLA: what --find-max searches within; for a run, goodput counts "
        "the answers within it",
    )
    search.add_argument(
        "--start-rps", type=float, default=10.0, help="first probe's rate (default 10; or --rate)"
    )
    search.add_argument(
        "--probe-duration-s", type=float, default=5.0, help="seconds per probe (default 5)"
    )
    search.add_argument(
        "--precision", type=float, default=0.05, help="relative precision (default 0.05)"
    )
    search.add_argument("--max-probes", type=int, default=16, help="at most this many (16)")
    search.add_argument(
        "--max-total-s", type=float, default=600.0, help="time budget of the search (600)"
    )
    search.add_argument(
        "--settle-s", type=float, default=1.0, help="pause between probes (default 1)"
    )

    parser.add_argument("--json", metavar="OUT", help="write the report as JSON ('-': stdout)")


def _parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise ValueError(f"--shape {item!r} is not NAME=D,D,...") from None
    return shapes


def _parse_headers(items: Sequence[str], api_key: str | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or " " in name.strip():
            raise ValueError(f"--header {item.split(':')[0]!r}... is not 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    key = api_key if api_key is not None else os.environ.get("BATCHPILOT_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _rows(text: str) -> RowMix:
    try:
        return RowMix.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _target_from(args: argparse.Namespace) -> Target:
    mix: RowMix = args.rows
    return Target(
        url=args.url,
        model=args.model,
        rows=mix.rows[0],
        row_mix=None if mix.single else mix,
        shapes=_parse_shapes(args.shape),
        seed=args.seed,
        json_tensors=args.json_tensors,
        verify=args.verify,
        timeout_s=args.timeout_s,
        headers=_parse_headers(args.header, args.api_key),
    )


def _schedule_from(args: argparse.Namespace) -> RateSchedule | None:
    if args.rate is not None:
        return RateSchedule.constant(args.rate)
    if args.schedule is not None:
        return RateSchedule.parse(args.schedule)
    if args.schedule_file is not None:
        try:
            return RateSchedule.from_csv(args.schedule_file)
        except OSError as exc:
            raise ValueError(f"cannot read --schedule-file: {exc}") from None
    return None


def config_from_args(args: argparse.Namespace) -> LoadConfig | SearchConfig:
    """Turn parsed arguments into a run or a search; ValueError says what is wrong."""
    target = _target_from(args)
    if args.find_max:
        if args.retries or args.hedge_ms is not None:
            raise ValueError("--find-max sends each request once: drop --retries and --hedge-ms")
        if args.clump != 1:
            raise ValueError("--find-max probes Poisson arrivals: drop --clump")
        if args.sla_ms is None:
            raise ValueError("--find-max needs --sla-ms")
        if args.concurrency is not None or args.schedule or args.schedule_file:
            raise ValueError("--find-max probes constant rates; drop --concurrency/--schedule")
        return SearchConfig(
            target=target,
            sla_ms=args.sla_ms,
            start_rps=args.rate if args.rate is not None else args.start_rps,
            probe_duration_s=args.probe_duration_s,
            warmup_s=args.warmup_s,
            precision=args.precision,
            max_probes=args.max_probes,
            max_total_s=args.max_total_s,
            settle_s=args.settle_s,
            arrivals=args.arrivals,
            max_outstanding=args.max_outstanding,
            seed=args.seed,
            max_send_lag_ms=args.max_send_lag_ms,
        )
    if args.duration is None:
        raise ValueError("--duration is required (seconds)")
    schedule = _schedule_from(args)
    if schedule is None and args.concurrency is None:
        raise ValueError("give one of --rate, --schedule, --schedule-file or --concurrency")
    return LoadConfig(
        target=target,
        duration_s=args.duration,
        schedule=schedule,
        concurrency=args.concurrency,
        arrivals=args.arrivals,
        clump=args.clump,
        max_outstanding=args.max_outstanding,
        max_requests=args.requests,
        warmup_s=args.warmup_s,
        window_s=args.window_s,
        connections=args.connections,
        seed=args.seed,
        sla_ms=args.sla_ms,
        max_send_lag_ms=args.max_send_lag_ms,
        retries=Retries(args.retries, args.retry_delay_s, marked=args.mark_retries),
        hedge_s=None if args.hedge_ms is None else args.hedge_ms / 1e3,
    )
