"""The `batchpilot` command: one entry point, one module per subcommand, imported on use.

Subcommands are listed here by module path, not imported, so `batchpilot --help` is instant and
an image that lacks one side's dependencies (the operator image has no onnxruntime) can still run
the other side's commands. Each subcommand module provides `add_arguments(parser)` and
`main(args) -> int`.

The sandbox and the simulator are tools, not product: they live in the separate
`batchpilot-tools` distribution (tools/ in the source tree), which no image installs. Where it is
missing, their subcommands say so in one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("runtime", "serve"): (
        "batchpilot.runtime.serve",
        "serve an ONNX model over the Open Inference Protocol v2 with dynamic batching",
    ),
    ("runtime", "fetch"): (
        "batchpilot.runtime.fetch",
        "copy a model from an http(s):// or file:// URI (the pod's init container)",
    ),
    ("operator", "run"): (
        "batchpilot.operator.run",
        "run the operator: reconcile InferenceServices, run the SLA autopilot",
    ),
    ("sandbox", "api"): (
        "batchpilot.sandbox.apiserver",
        "a local Kubernetes API (emulator) with the CRDs installed, for tests and the sandbox",
    ),
    ("sandbox", "up"): (
        "batchpilot.sandbox.up",
        "the whole system locally under load: API, Prometheus, operator, pods, live view, plot",
    ),
    ("profile",): (
        "batchpilot.operator.profile",
        "the performance portrait of an InferenceService, with the next tuning step",
    ),
    ("simulate",): (
        "batchpilot.simulation.cli",
        "simulate the autopilot and its baselines over a traffic trace",
    ),
    ("loadgen",): (
        "batchpilot.runtime.loadgen",
        "open- or closed-loop load against a v2 endpoint; --find-max sizes a service",
    ),
    ("optimize",): (
        "batchpilot.runtime.optimize.command",
        "write FP16 and INT8 variants of an ONNX model and compare their speed and outputs",
    ),
}

TOOL_PACKAGES = ("batchpilot.sandbox", "batchpilot.simulation")
"""The packages of the `batchpilot-tools` distribution, which the product never installs."""
TOOLS_MISSING = (
    "needs the development tools: pip install batchpilot-tools, "
    "or run it from a source checkout with make install"
)


def _usage() -> str:
    lines = ["usage: batchpilot COMMAND [options]", "", "commands:"]
    for words, (_, summary) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<16}{summary}")
    lines += ["", "`batchpilot COMMAND --help` describes a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words, (module_name, summary) in COMMANDS.items():
        if tuple(argv[: len(words)]) == words:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                if not _is_missing_tool(module_name, error):
                    raise
                print(f"batchpilot {' '.join(words)} {TOOLS_MISSING}", file=sys.stderr)
                return 2
            parser = argparse.ArgumentParser(
                prog=f"batchpilot {' '.join(words)}", description=summary
            )
            module.add_arguments(parser)
            args = parser.parse_args(argv[len(words) :])
            code: int = module.main(args)
            return code
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    print(f"batchpilot: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return 2


def _is_missing_tool(module_name: str, error: ModuleNotFoundError) -> bool:
    """The command is a tool and its own module is absent (not something that module imports)."""
    missing = error.name or ""
    own = module_name == missing or module_name.startswith(f"{missing}.")
    return own and module_name.startswith(tuple(f"{package}." for package in TOOL_PACKAGES))


if __name__ == "__main__":
    sys.exit(main())
