"""Operator settings and shared fixtures for the tests in this folder.

kopf reads timer intervals when the handlers module is imported, so they are set here, before
any test imports it: a fast periodic reconcile (2 s) to exercise idle passes, and an autopilot
that stays out of the way (its own tests drive it directly). The leader-election tests share a
local Kubernetes API per module, with a Lease of their own per test.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from batchpilot.operator.kube import KubeClient
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import NAMESPACE, client_for

os.environ.setdefault("BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS", "2")
os.environ.setdefault("BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS", "3600")
os.environ.setdefault("BATCHPILOT_OPERATOR_PROMETHEUS_URL", "http://127.0.0.1:9")

_lease_names = itertools.count()


@pytest.fixture(scope="module")
def lease_api() -> Iterator[LocalKubernetesAPI]:
    with LocalKubernetesAPI(namespaces=[NAMESPACE]).threaded() as server:
        yield server


@pytest.fixture(scope="module")
def lease_kube(
    lease_api: LocalKubernetesAPI, tmp_path_factory: pytest.TempPathFactory
) -> KubeClient:
    return client_for(lease_api, tmp_path_factory.mktemp("leases") / "kubeconfig")


@pytest.fixture
def lease_name() -> str:
    return f"lease-{next(_lease_names)}"
