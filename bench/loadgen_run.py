"""`batchpilot loadgen` as the benchmarks run it: one open-loop run, in a process of its own (the
client's CPU apart from the bench's), against a local server; its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def open_loop(
    port: int,
    folder: Path,
    *,
    rate: float,
    seconds: float,
    sla_ms: float,
    flags: Sequence[str] = (),
    model: str = "mlp",
) -> dict[str, Any]:
    """Poisson arrivals at `rate` for `seconds` (seed 1: the same arrival times for every run
    of a rate), a 5 s client timeout, goodput counted against `sla_ms`; `flags` besides."""
    report = folder / "report.json"
    command = [
        sys.executable, "-m", "batchpilot.runtime.cli", "loadgen",
        "--url", f"http://127.0.0.1:{port}", "--model", model,
        "--rate", f"{rate:.1f}", "--duration", f"{seconds:g}", "--sla-ms", f"{sla_ms:g}",
        "--timeout-s", "5", "--seed", "1", "--json", str(report), *flags,
    ]  # fmt: skip
    subprocess.run(command, capture_output=True, timeout=seconds + 180, check=False)
    doc: dict[str, Any] = json.loads(report.read_text())
    return doc
