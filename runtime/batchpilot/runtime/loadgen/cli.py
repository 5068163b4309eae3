"""The `batchpilot loadgen` process: event loop, open-file limit, exit status and output.

`add_arguments` and `main` are what the `batchpilot` dispatcher calls; `run_cli` parses its own
argv (the tests and `python -m batchpilot.runtime.loadgen` use it). An invalid open-loop run
still prints and writes its report, but exits with its own status, so that a script cannot
mistake a client that fell behind for a measurement (the statuses: `args.EPILOG`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import orjson

from batchpilot.runtime.loadgen.args import add_arguments, config_from_args
from batchpilot.runtime.loadgen.config import SearchConfig
from batchpilot.runtime.loadgen.errors import (
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    TargetError,
)
from batchpilot.runtime.loadgen.report import format_report, format_search
from batchpilot.runtime.loadgen.run import run_load
from batchpilot.runtime.loadgen.search import find_max_rate

_T = TypeVar("_T")

DESCRIPTION: Final = (
    "Load generator for any Open Inference Protocol v2 endpoint: `batchpilot loadgen`."
)
"""`run_cli`'s help text: the first line of the package's docstring."""


def _run_async(factory: Callable[[], Awaitable[_T]]) -> _T:
    """Run on uvloop where it is installed: a cheaper loop leaves more CPU to the server."""

    async def call() -> _T:
        return await factory()

    try:
        import uvloop
    except ImportError:
        return asyncio.run(call())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(call())


def _allow_open_files(count: int) -> None:
    """An open loop may hold one connection per outstanding request; raise the soft limit on
    open files towards the hard one so that a default `ulimit -n` of 1024 is not what fails."""
    try:
        import resource
    except ImportError:  # not on this platform: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 64  # the pool, plus what the process already holds
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def main(args: argparse.Namespace) -> int:
    """`batchpilot loadgen`: 0 after a completed run (server errors are in the report), 3 after
    a completed but invalid one (open loop behind its schedule; a search stopped by such a
    probe), 2 on bad arguments or an unusable target."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"batchpilot loadgen: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc: dict[str, Any]
    valid: bool
    _allow_open_files(
        config.max_outstanding if isinstance(config, SearchConfig) else config.pool_size
    )
    try:
        if isinstance(config, SearchConfig):
            search_config = config
            result = _run_async(lambda: find_max_rate(search_config))
            table, doc = format_search(result), result.to_dict()
            valid = result.stopped_because != "invalid_probe"
        else:
            load_config = config
            report = _run_async(lambda: run_load(load_config))
            table, doc = format_report(report), report.to_dict()
            valid = report.valid
    except TargetError as exc:
        print(f"batchpilot loadgen: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("batchpilot loadgen: interrupted; no report", file=sys.stderr)
        return EXIT_INTERRUPTED
    # With the JSON on stdout, the table goes to stderr so the JSON stays parseable.
    print(table, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json is not None:
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        if args.json == "-":
            sys.stdout.write(data.decode() + "\n")
        else:
            Path(args.json).write_bytes(data + b"\n")
    return EXIT_OK if valid else EXIT_INVALID


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run; argparse's own usage errors come back as exit status 2."""
    parser = argparse.ArgumentParser(prog="batchpilot loadgen", description=DESCRIPTION)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return main(args)
