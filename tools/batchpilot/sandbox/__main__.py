"""`python -m batchpilot.sandbox api ...`: the sandbox API without the main CLI."""

from __future__ import annotations

import argparse
import sys

from batchpilot.sandbox import apiserver


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchpilot.sandbox")
    commands = parser.add_subparsers(dest="command", required=True)
    api = commands.add_parser("api", help="serve a local Kubernetes API on 127.0.0.1")
    apiserver.add_arguments(api)
    args = parser.parse_args(argv)
    return apiserver.main(args)


if __name__ == "__main__":
    sys.exit(run())
