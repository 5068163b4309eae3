"""`stop_processes`: a process that exits on SIGTERM is reaped with its status, one that ignores
it is killed once the shared grace period is over, and one already gone is left alone."""

from __future__ import annotations

import signal
import subprocess
import sys

from batchpilot.sandbox.processes import stop_processes
from tests.waiting import wait_until

READY = "import signal, sys, time\n{handler}\nprint('ready', flush=True)\ntime.sleep(60)\n"


def child(handler: str = "") -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-c", READY.format(handler=handler)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"  # its handler is in place
    return process


def test_stops_each_the_way_it_can_be_stopped() -> None:
    polite = child()
    stubborn = child("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: gone.poll() is not None, what="the short-lived child exited")
    stop_processes([polite, stubborn, gone], grace_s=0.5)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert gone.returncode == 0


def test_another_signal_may_be_sent() -> None:
    # Python's own SIGINT handler, whatever was inherited: a shell starts background jobs
    # with SIGINT ignored, and a child that inherits that never sees it.
    process = child("signal.signal(signal.SIGINT, signal.default_int_handler)")
    stop_processes([process], grace_s=5, signum=signal.SIGINT)
    assert process.returncode == -signal.SIGINT  # Python re-raises an uncaught SIGINT
