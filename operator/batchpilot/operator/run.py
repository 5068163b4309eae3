"""`batchpilot operator run`: the operator process (kubeconfig or in-cluster credentials)."""

from __future__ import annotations

import argparse
import logging
import os
import sys


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
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def main(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    import kopf

    from batchpilot.operator import handlers
    from batchpilot.operator.settings import OperatorSettings

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    namespaces = args.namespace or OperatorSettings().namespaces
    del handlers  # imported for its handler registrations
    kopf.run(
        standalone=True,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0
