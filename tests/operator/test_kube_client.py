"""The operator's API client against a local Kubernetes API: as many connections kept as threads
call it at once."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from batchpilot.operator.kinds import LEASE
from batchpilot.operator.kube import KubeClient
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import NAMESPACE

CALLERS = 24


def calls_at_once(kube: KubeClient) -> None:
    """`CALLERS` threads, each a few reads, all started together."""
    start = threading.Barrier(CALLERS)

    def caller() -> None:
        start.wait()
        for _ in range(5):
            kube.get(LEASE, NAMESPACE, "nobody")

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("connections", [CALLERS, 2])
def test_threads_calling_at_once_keep_their_connections(
    lease_api: LocalKubernetesAPI,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    connections: int,
) -> None:
    kubeconfig = str(lease_api.write_kubeconfig(tmp_path / "kubeconfig"))
    kube = KubeClient.from_environment(kubeconfig=kubeconfig, connections=connections)
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        calls_at_once(kube)
    discarded = [r for r in caplog.records if "Connection pool is full" in r.getMessage()]
    if connections == CALLERS:
        assert discarded == []
    else:  # the pool this guards against: fewer kept than callers
        assert discarded
