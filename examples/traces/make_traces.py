"""Writes traffic traces: the shipped ones, or any kind with any seed (seeded, so reproducible).

    python examples/traces/make_traces.py                     # rewrite the shipped files
    python examples/traces/make_traces.py onoff --seed 7 --out /tmp/onoff-7.csv
    python examples/traces/make_traces.py flash --seed 3 --duration-s 3600 --amplitude 6
    python examples/traces/make_traces.py --list

The generators are `batchpilot.simulation.generate`; this script only names the shipped
files and writes CSVs. Each file is `t_seconds,rate_rps`, one row per change of rate; the last
row ends the trace. A generated file's `#` comment says what it is and the command that made it.
The point of seeds: judge the autopilot on traces it was never tuned on.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

from batchpilot.simulation import generate

HERE = Path(__file__).parent
SCRIPT = "python examples/traces/make_traces.py"


def _bursty_comment() -> str:
    spikes = generate.bursty_spikes(generate.KINDS["bursty"].seed)
    return f"""Bursty: 2 hours; after a 5-minute ramp, a base drifting between 300 and 600 rps whose
rate jumps every 10-60 s (lognormal, 5 %), and {spikes} spikes of 1.2-1.5x lasting 10-45 s
(about eight an hour), shorter than a replica takes to start. Made by make_traces.py (seeded)."""


# The first four files' comments are kept word for word, so the files do not change.
FIXED_COMMENTS: dict[str, Callable[[], str]] = {
    "textbook": lambda: (
        """\
The textbook case: ResNet-50 on one A10, SLA P99 < 100 ms, 300 rps for an hour.
Start it at batch 1 on one replica (which overloads: 266 rps at most at batch 1);
the autopilot must find batch ~8 on one replica (410 rps at most) by itself."""
    ),
    "diurnal": lambda: (
        """\
Diurnal: a day's traffic compressed into 4 hours (ramps 6x steeper than a real day's),
one row a minute from 03:00: night trough ~100 rps, morning ramp, lunch dip, evening peak
~1350 rps, back down. 3 % noise. Made by make_traces.py (seeded)."""
    ),
    "step": lambda: (
        """\
Step: 3 hours of flat levels joined by sudden steps every 20 minutes, up by 1.3x at a
time to 800 rps, then down: 200 → 260 → 350 → 450 → 600 → 800 → 600 → 450 → 300 rps.
Each step arrives faster than a replica can start (30 s)."""
    ),
    "bursty": _bursty_comment,
}
SHIPPED = ("textbook", "diurnal", "step", "bursty", "onoff", "flash", "ramp")
"""The files in examples/traces, each with its kind's default seed and parameters."""

PARAMETERS = {"duration_s": "--duration-s", "base_rps": "--base-rps", "amplitude": "--amplitude"}


def command(kind: str, seed: int, parameters: dict[str, float], out: str | None) -> str:
    """The command line that makes this trace again."""
    words = [kind, "--seed", str(seed)]
    for name, value in parameters.items():
        words += [PARAMETERS[name], f"{value:g}"]
    if out is not None:
        words += ["--out", out]
    return f"{SCRIPT} {shlex.join(words)}"


def comment(
    kind: str, seed: int, parameters: dict[str, float], rows: generate.Rows, made_by: str
) -> str:
    described = textwrap.fill(generate.describe(kind, seed, rows, parameters), width=95)
    return f"{described}\nMade by: {made_by}"


def write_shipped(directory: Path) -> list[Path]:
    written = []
    for kind in SHIPPED:
        rows = generate.generate(kind)
        path = directory / f"{kind}.csv"
        if kind in FIXED_COMMENTS:
            text = FIXED_COMMENTS[kind]()
        else:
            seed = generate.KINDS[kind].seed
            made_by = command(kind, seed, {}, f"examples/traces/{path.name}")
            text = comment(kind, seed, {}, rows, made_by)
        generate.write_csv(path, rows, text)
        written.append(path)
    return written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make_traces.py",
        description="Write a traffic trace CSV; with no kind, rewrite the shipped traces.",
    )
    p.add_argument("kind", nargs="?", choices=list(generate.KINDS), help="the kind of traffic")
    p.add_argument("--seed", type=int, default=None, help="default: the shipped file's seed")
    p.add_argument("--out", default=None, help="the CSV to write (default: standard output)")
    p.add_argument("--duration-s", type=float, default=None)
    p.add_argument("--base-rps", type=float, default=None)
    p.add_argument("--amplitude", type=float, default=None, help="the peak, times the base")
    p.add_argument(
        "--out-dir", type=Path, default=HERE, help="where the shipped traces go (no kind)"
    )
    p.add_argument("--list", action="store_true", help="list the kinds and their parameters")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        for name, kind in generate.KINDS.items():
            flags = " ".join(PARAMETERS[p] for p in kind.parameters if p in PARAMETERS)
            print(f"{name:<10} seed {kind.seed:<9} {flags:<37} {kind.summary}")
        return 0
    if args.kind is None:
        for path in write_shipped(args.out_dir):
            print(path)
        return 0
    parameters = {
        name: getattr(args, name) for name in PARAMETERS if getattr(args, name) is not None
    }
    kind = generate.KINDS[args.kind]
    refused = [PARAMETERS[name] for name in parameters if name not in kind.parameters]
    if refused:
        print(f"make_traces.py: {args.kind} takes no {', '.join(refused)}", file=sys.stderr)
        return 2
    seed = kind.seed if args.seed is None else args.seed
    try:
        rows = generate.generate(args.kind, seed, **parameters)
    except ValueError as exc:
        print(f"make_traces.py: {exc}", file=sys.stderr)
        return 2
    made_by = command(args.kind, seed, parameters, args.out)
    text = generate.csv_text(rows, comment(args.kind, seed, parameters, rows, made_by))
    if args.out is None:
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
