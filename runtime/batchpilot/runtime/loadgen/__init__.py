"""Load generator for any Open Inference Protocol v2 endpoint: `batchpilot loadgen`.

Sizing a service the textbook way needs a client that does not lie. Three things make load
generators lie, and this one is built around avoiding them:

- **Coordinated omission.** A closed loop (fixed concurrency) slows down when the server does,
  so it never offers the load that would hurt. The open loop here schedules every arrival in
  advance (Poisson or evenly spaced, from a rate or a piecewise-constant rate schedule) and sends
  each at its scheduled time whatever is outstanding; latency is measured from the *scheduled*
  send time (the service latency from the actual send time is kept too).
- **A client that is the bottleneck.** It shares a small machine with the server under test, so
  the request body is encoded once and reused, responses are read but not decoded (unless
  `--verify`), and each request costs one `session.post`. And it checks that it kept up: the
  send lag of every request (actual minus scheduled send time) is reported, and an open-loop
  run whose lag P99 exceeds `--max-send-lag-ms` or whose client dropped arrivals is reported
  as INVALID (exit status 3), not as a result — it offered less load than it names.
- **Averages.** The report gives exact nearest-rank percentiles from every recorded sample,
  errors by kind (load shed with 503/429 counted apart from real failures), how fast the shed
  requests were refused, goodput within `--sla-ms`, and per-window time series for plotting.

`--find-max --sla-ms 100` searches the highest constant rate whose P99 stays within the SLA with
no errors but refusals, which count as misses of the SLA: exponential ramp, then bisection, each
probe stopping early once it can no longer pass; an invalid probe stops the search. Schedules,
arrival times, statistics and the search steps are pure functions, so the tests check them
without a server; the HTTP part is a thin layer around them.

The modules, lowest layer first (each imports only those above it): `errors` (the error-kind
vocabulary, exit statuses), `schedule` (rates and arrival times), `stats` (percentiles,
summaries, windows, send lag and validity), `config` (target, run and search settings),
`request` (the request built from the metadata), `client` (HTTP), `loops` (open and closed
loop), `run` (one load test), `search` (find-max), `report` (tables), `args` and `cli` (the
command). This package re-exports their public names.
"""

from __future__ import annotations

from batchpilot.runtime.loadgen.args import add_arguments, config_from_args
from batchpilot.runtime.loadgen.cli import main, run_cli
from batchpilot.runtime.loadgen.client import fetch_metadata, send_once
from batchpilot.runtime.loadgen.config import (
    MAX_DURATION_S,
    LoadConfig,
    Retries,
    SearchConfig,
    Target,
)
from batchpilot.runtime.loadgen.errors import (
    CONNECTION,
    DROPPED_CLIENT,
    EXIT_INVALID,
    INVALID_RESPONSE,
    SHED_KINDS,
    TIMEOUT,
    UNFINISHED,
    TargetError,
)
from batchpilot.runtime.loadgen.loops import PRECISE_CLOCK, Clock
from batchpilot.runtime.loadgen.report import format_report, format_search
from batchpilot.runtime.loadgen.request import (
    ModelMetadata,
    PreparedRequest,
    TensorSpec,
    prepare_request,
    random_inputs,
    request_shape,
    response_is_valid,
)
from batchpilot.runtime.loadgen.run import LoadReport, run_load
from batchpilot.runtime.loadgen.schedule import (
    MAX_ARRIVALS,
    MAX_RATE_RPS,
    ArrivalProcess,
    RateSchedule,
    arrival_times,
)
from batchpilot.runtime.loadgen.search import (
    Probe,
    RateSearch,
    SearchResult,
    find_max_rate,
    probe_passes,
)
from batchpilot.runtime.loadgen.stats import (
    DEFAULT_MAX_SEND_LAG_MS,
    LatencyStats,
    Outcomes,
    Summary,
    WindowStats,
    goodput,
    invalid_reason,
    latency_stats,
    nearest_rank,
    send_lag,
    summarize,
)

__all__ = [
    "CONNECTION",
    "DEFAULT_MAX_SEND_LAG_MS",
    "DROPPED_CLIENT",
    "EXIT_INVALID",
    "INVALID_RESPONSE",
    "MAX_ARRIVALS",
    "MAX_DURATION_S",
    "MAX_RATE_RPS",
    "PRECISE_CLOCK",
    "SHED_KINDS",
    "TIMEOUT",
    "UNFINISHED",
    "ArrivalProcess",
    "Clock",
    "LatencyStats",
    "LoadConfig",
    "LoadReport",
    "ModelMetadata",
    "Outcomes",
    "PreparedRequest",
    "Probe",
    "RateSchedule",
    "RateSearch",
    "Retries",
    "SearchConfig",
    "SearchResult",
    "Summary",
    "Target",
    "TargetError",
    "TensorSpec",
    "WindowStats",
    "add_arguments",
    "arrival_times",
    "config_from_args",
    "fetch_metadata",
    "find_max_rate",
    "format_report",
    "format_search",
    "goodput",
    "invalid_reason",
    "latency_stats",
    "main",
    "nearest_rank",
    "prepare_request",
    "probe_passes",
    "random_inputs",
    "request_shape",
    "response_is_valid",
    "run_cli",
    "run_load",
    "send_lag",
    "send_once",
    "summarize",
]
