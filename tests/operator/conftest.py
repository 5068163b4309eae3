"""Shared fixtures for the tests in this folder (the operator's settings for tests are set in
tests/conftest.py, before any test module imports the handlers). The leader-election tests share
a local Kubernetes API per module, with a Lease of their own per test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from batchpilot.operator.kube import KubeClient
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import NAMESPACE, client_for

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
