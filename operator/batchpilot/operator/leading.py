"""Run the operator only while this process leads: a standby first, then kopf, then the hand-over.

The sequence is controller-runtime's, crash-only:

1. standby — wait for the Lease (election.py); the liveness endpoint answers meanwhile, from a
   small server of our own on kopf's port, because the kubelet would otherwise restart a standby
   that is waiting exactly as it should (kopf's endpoint only exists once kopf runs);
2. leading — kopf runs while a background thread renews the Lease; if a renewal does not go
   through within the renew deadline, or someone else holds the Lease, kopf is told to stop and
   the process exits non-zero (1), to come back as a standby — forcibly if kopf has not stopped
   while the Lease still cannot have been taken over;
3. hand-over — when kopf stops for any other reason (SIGTERM in a rolling upgrade or a drain),
   the Lease is released, so that a standby takes it at once instead of a lease duration later.
   Only after kopf has stopped: never two active operators.

The InferenceServices' autopilot memory is in their status, so the next leader carries on.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import signal
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, ClassVar

from batchpilot.operator.election import LeaderElector
from batchpilot.operator.kube import WRITES

logger = logging.getLogger(__name__)

LOST = 1
"""The exit status after losing the Lease: the kubelet restarts the container, as a standby."""


def _exit_now() -> None:
    os._exit(LOST)


def run_while_leading(
    elector: LeaderElector,
    *,
    run_operator: Callable[[], None],
    stop_operator: Callable[[], None],
    liveness: str | None = None,
    stop_grace_s: float,
    exit_after_loss: Callable[[], None] = _exit_now,
    fence: Callable[[], None] = WRITES.close,
) -> int:
    """Run `run_operator()` (blocking) only while holding the Lease; the exit status.

    `stop_operator()` is called from another thread when the Lease is lost, after `fence()`
    (every write of the process refused from then on); if `run_operator()` has not returned
    `stop_grace_s` later, `exit_after_loss()` ends the process.
    """
    on_signal = [elector.stop]
    with _signals_call(on_signal):
        with _standby_liveness(liveness, elector):
            if not elector.acquire():
                logger.info("stopped while a standby")
                return 0
        # Until kopf installs its own handlers: stop it (it returns as soon as it starts), and
        # keep renewing until it has.
        on_signal[0] = stop_operator
        return _lead(
            elector,
            run_operator=run_operator,
            stop_operator=stop_operator,
            stop_grace_s=stop_grace_s,
            exit_after_loss=exit_after_loss,
            fence=fence,
        )


def _lead(
    elector: LeaderElector,
    *,
    run_operator: Callable[[], None],
    stop_operator: Callable[[], None],
    stop_grace_s: float,
    exit_after_loss: Callable[[], None],
    fence: Callable[[], None],
) -> int:
    logger.info("leading as %s", elector.identity)
    operator_done = threading.Event()

    def renew() -> None:
        if elector.keep():
            return
        logger.error("lost the lease (%s): stopping the operator", elector.lost_because)
        fence()  # before anything else: a standby may hold the Lease by now
        stop_operator()
        if not operator_done.wait(stop_grace_s):
            logger.error("the operator did not stop within %g s: exiting now", stop_grace_s)
            exit_after_loss()

    renewer = threading.Thread(target=renew, name="lease-keeper", daemon=True)
    renewer.start()
    try:
        run_operator()
    finally:
        operator_done.set()
        elector.stop()
        renewer.join()
        if not elector.lost_because:
            elector.release()
    return LOST if elector.lost_because else 0


@contextlib.contextmanager
def _signals_call(target: list[Callable[[], None]]) -> Iterator[None]:
    """SIGTERM and SIGINT call `target[0]` (which may change) while no one else handles them:
    kopf installs its own handlers while it runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        logger.info("%s received", signal.Signals(signum).name)
        target[0]()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Liveness(http.server.BaseHTTPRequestHandler):
    path_served: ClassVar[str] = "/healthz"
    answer: ClassVar[bytes] = b"{}"

    def do_GET(self) -> None:
        found = urllib.parse.urlsplit(self.path).path == self.path_served
        body = self.answer if found else b'{"error": "not found"}'
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the kubelet probes every few seconds: not worth a line each


@contextlib.contextmanager
def _standby_liveness(url: str | None, elector: LeaderElector) -> Iterator[None]:
    """Answer the liveness probe at `url` (kopf's liveness endpoint, e.g.
    http://0.0.0.0:8081/healthz) while a standby; closed before kopf binds the same port."""
    if not url:
        yield
        return
    parts = urllib.parse.urlsplit(url)
    handler = type(
        "StandbyLiveness",
        (_Liveness,),
        {
            "path_served": parts.path or "/",
            "answer": json.dumps({"standby": True, "identity": elector.identity}).encode(),
        },
    )
    server = http.server.ThreadingHTTPServer(
        (parts.hostname or "127.0.0.1", parts.port or 80), handler
    )
    # shutdown() waits for the server to notice, up to a poll interval: a take-over waits on it.
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="standby-liveness", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
