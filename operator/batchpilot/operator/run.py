"""`batchpilot operator run`: the operator process (kubeconfig or in-cluster credentials).

With leader election (the default in a pod) it is one of several replicas: it waits as a standby
until it holds the Lease, and runs kopf only while it does (leading.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchpilot.operator.settings import OperatorSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; default: BATCHPILOT_OPERATOR_NAMESPACES or all)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz (a standby answers "
        "it too)",
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reconcile only while holding the Lease (BATCHPILOT_OPERATOR_LEASE_*), so that "
        "several replicas run with one active (default: BATCHPILOT_OPERATOR_LEADER_ELECTION, "
        "else on with in-cluster credentials, off with a kubeconfig)",
    )
    parser.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        help="address the operator's metrics are served on, at BATCHPILOT_OPERATOR_METRICS_PORT "
        "(default 0.0.0.0)",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def in_cluster(kubeconfig: str | None) -> bool:
    """Whether the Kubernetes client will use the pod's service account, as kube.py decides."""
    return not kubeconfig and "KUBERNETES_SERVICE_HOST" in os.environ


def main(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    import kopf

    from batchpilot.operator import handlers, outage_log
    from batchpilot.operator.settings import OperatorSettings

    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # An API-server outage is one WARNING, a reminder a minute and an INFO when it is over,
    # not an ERROR for every failed try of every watch.
    outage_log.install(
        *logging.getLogger().handlers,
        retrying=f"retrying {handlers.API_RETRIES}",
        asked_again="asked again by the next pass that needs it",
        level=level,
    )
    settings = OperatorSettings()
    if settings.metrics_port:
        from batchpilot.operator import telemetry

        served = telemetry.serve(settings.metrics_port, address=args.metrics_address)
        logging.getLogger(__name__).info(
            "serving the operator's metrics on %s:%d/metrics",
            args.metrics_address,
            served.server_port,
        )
    namespaces = args.namespace or settings.namespaces
    handlers.watching(namespaces)  # imported for its handler registrations, and told this
    leader_elect = args.leader_elect
    if leader_elect is None:
        leader_elect = settings.leader_election
    if leader_elect is None:
        leader_elect = in_cluster(os.environ.get("KUBECONFIG"))

    operator = KopfOnItsLoop(
        lambda: kopf.operator(
            standalone=True,
            namespaces=namespaces,
            clusterwide=not namespaces,
            liveness_endpoint=args.liveness,
        )
    )
    if not leader_elect:
        operator.run()
        return 0
    return _run_elected(settings, operator, liveness=args.liveness)


class KopfOnItsLoop:
    """kopf on an event loop of our own: `run()` blocks until kopf stops (its own signal handlers
    stop it on SIGTERM/SIGINT); `stop()`, from any thread or a signal handler, cancels it — kopf's
    own way to be stopped from outside. (A stop flag would do too, but kopf leaves the flag's
    waiter pending on a signal and waits 5 s for it before exiting: 5 s more before a hand-over.)
    """

    def __init__(self, operator: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._operator = operator
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[None]] | None = None
        self._stopped = False

    def run(self) -> None:
        from batchpilot.operator import telemetry

        telemetry.ACTIVE.set(1)
        try:
            self._run()
        finally:
            telemetry.ACTIVE.set(0)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(self._operator())
        # No lock: stop() may run in a signal handler on this very thread. Either stop() sees
        # the task, or this sees the flag.
        self._running = loop, task
        if self._stopped:
            task.cancel()
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        finally:
            close(loop)

    def stop(self) -> None:
        self._stopped = True
        if self._running is not None:
            loop, task = self._running
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)


def close(loop: asyncio.AbstractEventLoop) -> None:
    """As asyncio.run() ends: what kopf left running is cancelled and awaited, its async
    generators closed, the loop closed. kopf's watch streams may refuse to close ("generator
    didn't stop after athrow()", now and then, as a stream is cut at SIGTERM): the operator is
    stopping and nothing is lost, so that is logged at debug, not as an error with a traceback."""
    left = asyncio.all_tasks(loop)
    for straggler in left:
        straggler.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.set_exception_handler(_closing_generators)
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def _closing_generators(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if "asyncgen" in context and isinstance(context.get("exception"), RuntimeError):
        logging.getLogger(__name__).debug(
            "stopping: %s: %s", context.get("message"), context.get("exception")
        )
        return
    loop.default_exception_handler(context)


def _run_elected(
    settings: OperatorSettings, operator: KopfOnItsLoop, *, liveness: str | None
) -> int:
    from batchpilot.operator.election import LeaderElector, default_identity
    from batchpilot.operator.kube import KubeClient
    from batchpilot.operator.leadership import Candidate
    from batchpilot.operator.leading import run_while_leading

    # A round (a read and a write) fits in the renew deadline.
    kube = KubeClient.from_environment(timeout_s=settings.renew_deadline_seconds / 2)
    candidate = Candidate(
        identity=default_identity(),
        name=settings.lease_name,
        namespace=settings.lease_namespace,
        duration_s=settings.lease_duration_seconds,
    )
    elector = LeaderElector(
        kube,
        candidate,
        renew_deadline_s=settings.renew_deadline_seconds,
        retry_period_s=settings.retry_period_seconds,
    )
    return run_while_leading(
        elector,
        run_operator=operator.run,
        stop_operator=operator.stop,
        liveness=liveness,
        # Half the time between the renew deadline and the earliest take-over.
        stop_grace_s=(settings.lease_duration_seconds - settings.renew_deadline_seconds) / 2,
    )
