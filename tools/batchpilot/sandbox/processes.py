"""Stopping the sandbox's child processes: signal them all, give them one grace period together
to drain and exit, then kill whatever is still running. Every part that starts processes (the
pod runner, the pod host, Prometheus, `sandbox up`) stops them this way."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterable


def stop_processes(
    processes: Iterable[subprocess.Popen[bytes]],
    *,
    grace_s: float,
    signum: signal.Signals = signal.SIGTERM,
) -> None:
    """Send `signum` to every process still running, wait up to `grace_s` in all for them to
    exit, and kill (and reap) the ones that have not."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
