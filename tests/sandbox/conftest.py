"""Fixtures for the sandbox API's tests: servers, a kubeconfig, kubectl."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from batchpilot.sandbox import LocalKubernetesAPI
from tests.sandbox.helpers import WIDGET_CRD_PATH, Kubectl


@pytest.fixture
async def api() -> AsyncIterator[LocalKubernetesAPI]:
    """A sandbox API on this test's event loop, with the test CRD."""
    async with LocalKubernetesAPI(crds=[WIDGET_CRD_PATH], seed=7) as server:
        yield server


@pytest.fixture
def sandbox() -> Iterator[LocalKubernetesAPI]:
    """A sandbox API in a background thread, for synchronous clients and subprocesses."""
    with LocalKubernetesAPI(crds=[WIDGET_CRD_PATH], seed=7).threaded() as server:
        yield server


@pytest.fixture
def kubeconfig(sandbox: LocalKubernetesAPI, tmp_path: Path) -> Path:
    return sandbox.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kubectl(kubeconfig: Path, tmp_path: Path) -> Kubectl:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    home = tmp_path / "home"
    home.mkdir()
    return Kubectl(kubeconfig, home)
