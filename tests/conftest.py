"""Shared fixtures: test models built once per session; the operator's settings for tests; how
the suite is shared out between workers.

kopf reads timer intervals when `batchpilot.operator.handlers` is imported, and test modules in
several folders import it (tests/deploy reads its handler registry, tests/operator runs it), so
the settings are set here, in the first conftest loaded, before any of them is collected: a fast
periodic reconcile (2 s) to exercise idle passes, and an autopilot that stays out of the way (its
own tests drive it directly).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests import onnx_models

os.environ.setdefault("BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS", "2")
os.environ.setdefault("BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS", "3600")
os.environ.setdefault("BATCHPILOT_OPERATOR_PROMETHEUS_URL", "http://127.0.0.1:9")

TAKING_TURNS = (
    "tests/sandbox_e2e/",
    "tests/test_overload.py",
    "tests/test_drain.py",
    "tests/test_grpc_drain.py",
    "tests/test_connection_age.py",
    "tests/test_perf_analyzer.py",
)
"""The runs held to wall-clock timelines under load they generate: the sandbox's end-to-end runs
(a whole system on loopback: API emulator, Prometheus, operator, runtime processes, a load
generator; a node's notice within a second, a toleration within a second and a half), and the
runtime's own under overload, through drains and connection moves."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `pytest -n 2` (`make test`) test files go out one at a time to whichever worker is
    free, each whole and in its order (a module's fixtures are built once, and a class such as
    tests/operator/test_operator_live.py's lifecycle runs its steps in turn), except
    `TAKING_TURNS`: one unit of work, run one after another on one worker. Two of them at once
    would share the machine's cores with two loads, while either runs well beside the rest of
    the suite, which mostly waits on processes and sockets. (`--dist loadgroup` would do this
    with marks, but xdist 3.8 cannot rename a test's node id on pytest 9.2, so its groups are
    silently ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    class LoadRunsTakeTurns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "taking turns" if nodeid.startswith(TAKING_TURNS) else nodeid.split("::")[0]

    return LoadRunsTakeTurns(config, log)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def mlp_model(model_dir: Path) -> Path:
    return onnx_models.mlp(model_dir / "mlp.onnx")


@pytest.fixture(scope="session")
def multi_io_model(model_dir: Path) -> Path:
    return onnx_models.multi_io(model_dir / "multi_io.onnx")


@pytest.fixture(scope="session")
def variable_length_model(model_dir: Path) -> Path:
    return onnx_models.variable_length(model_dir / "variable_length.onnx")


@pytest.fixture(scope="session")
def image_model(model_dir: Path) -> Path:
    return onnx_models.image_signature(model_dir / "image.onnx")


@pytest.fixture(scope="session")
def fixed_batch_model(model_dir: Path) -> Path:
    return onnx_models.fixed_batch(model_dir / "fixed_batch.onnx")
