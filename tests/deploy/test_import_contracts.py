"""The import contracts bite: `lint-imports` (run by `make lint`) fails on a planted import.

A copy of the source roots with three forbidden imports planted — the pure core's seasonal
forecast importing kopf, the runtime's batch queue importing the operator's spec, the model
server importing torch — must break exactly the contracts that forbid them, and name the
offending modules; the unplanted copy keeps them all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("api", "runtime", "operator", "tools")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.slow


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        # The copy's portions of the `batchpilot` namespace come first on the path.
        "PYTHONPATH": os.pathsep.join(str(tree / name) for name in ROOTS),
    }
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("src")
    for name in ROOTS:
        shutil.copytree(
            ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def plant(path: Path, line: str) -> None:
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    assert sep, path
    path.write_text(f"{head}{sep}\n{line}\n{rest}")


def test_the_contracts_hold_on_the_tree_as_it_is(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_planted_forbidden_import_fails_lint(tree: Path) -> None:
    plant(tree / "operator/batchpilot/operator/autopilot/season.py", "import kopf  # noqa")
    plant(
        tree / "runtime/batchpilot/runtime/batching/batch_queue.py",
        "import batchpilot.operator.spec  # noqa",
    )
    plant(tree / "runtime/batchpilot/runtime/server.py", "import torch  # noqa")
    result = lint(tree)
    assert result.returncode != 0
    out = result.stdout
    assert "BROKEN" in out, out
    assert "Pure core" in out, out
    assert "batchpilot.operator.autopilot.season -> kopf" in out, out
    assert "Runtime and operator independent" in out, out
    assert "batchpilot.runtime.batching.batch_queue -> batchpilot.operator.spec" in out, out
    assert "PyTorch stays in its engine" in out, out
    assert "batchpilot.runtime.server -> torch" in out, out
