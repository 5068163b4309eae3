"""What the leader-election tests share: the operator's client on the local Kubernetes API, short
lease timings, and candidates running as leading.py runs them."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, config

from batchpilot.operator.election import LeaderElector
from batchpilot.operator.kinds import LEASE
from batchpilot.operator.kube import Kube, KubeClient, own_retries
from batchpilot.operator.leadership import Candidate, parse_micro_time
from batchpilot.sandbox import LocalKubernetesAPI

NAMESPACE = "batchpilot-system"
DURATION_S = 2
RENEW_DEADLINE_S = 1.5
RETRY_S = 0.2
SLACK_S = 0.5
"""Scheduling and request time on a busy test machine, on top of what the rules allow."""


def client_for(api: LocalKubernetesAPI, path: Path) -> KubeClient:
    """The operator's client, configured from a kubeconfig without touching the global one."""
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(api.write_kubeconfig(path)), client_configuration=configuration
    )
    return KubeClient(client.ApiClient(own_retries(configuration)), timeout_s=RENEW_DEADLINE_S / 2)


def elector(kube: Kube, lease_name: str, identity: str) -> LeaderElector:
    return LeaderElector(
        kube,
        Candidate(identity, lease_name, NAMESPACE, DURATION_S),
        renew_deadline_s=RENEW_DEADLINE_S,
        retry_period_s=RETRY_S,
    )


def read(kube: KubeClient, lease_name: str) -> dict[str, Any]:
    lease = kube.get(LEASE, NAMESPACE, lease_name)
    assert lease is not None
    return lease


def renewed_for(kube: KubeClient, lease_name: str) -> float:
    """Seconds between the holder's acquireTime and its last renewTime, as written."""
    spec = read(kube, lease_name)["spec"]
    acquired, renewed = parse_micro_time(spec["acquireTime"]), parse_micro_time(spec["renewTime"])
    assert acquired is not None
    assert renewed is not None
    return (renewed - acquired).total_seconds()


class Candidacy:
    """An elector running acquire() then keep() in a thread, as leading.py runs it."""

    def __init__(self, elector: LeaderElector) -> None:
        self.elector = elector
        self.leading = threading.Event()
        self.led_since = 0.0
        self.kept: bool | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.elector.acquire():
                self.led_since = time.monotonic()
                self.leading.set()
                self.kept = self.elector.keep()
        finally:
            self.done.set()

    def crash(self) -> None:
        """Stop renewing and writing at all, without a release: a killed process."""
        self.elector.stop()
        assert self.done.wait(5)

    def hand_over(self) -> None:
        """A graceful stop: stop renewing, release."""
        self.elector.stop()
        assert self.done.wait(5)
        assert self.elector.release()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(url: str) -> tuple[int, Any] | None:
    """The status and JSON body at `url`; None while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return None
