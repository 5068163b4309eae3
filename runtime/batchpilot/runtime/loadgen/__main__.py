"""`python -m batchpilot.runtime.loadgen`: the same command without the `batchpilot` dispatcher."""

import sys

from batchpilot.runtime.loadgen.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli())
