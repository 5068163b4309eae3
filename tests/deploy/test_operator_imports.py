"""The operator image installs only the `operator` extra: its code must import without the
runtime's dependencies (onnxruntime, numpy, Pillow, tokenizers, grpc, FastAPI), even where it
reads the documents it shares with the runtime (`batchpilot.api`: the pipeline and batching
documents)."""

from __future__ import annotations

import subprocess
import sys

RUNTIME_ONLY = ("onnxruntime", "numpy", "PIL", "tokenizers", "grpc", "fastapi", "uvicorn")
OPERATOR_MODULES = (
    "batchpilot.operator.handlers",
    "batchpilot.operator.reconciler",
    "batchpilot.operator.autopilot.pilot",
    "batchpilot.operator.children.deployment",
    "batchpilot.operator.spec",
)

PROBE = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {RUNTIME_ONLY!r}:
            raise ImportError(f"{{name}} is not in the operator image")
sys.meta_path.insert(0, Refuse())
for module in {OPERATOR_MODULES!r}:
    __import__(module)
print("ok")
"""


def test_the_operator_imports_without_the_runtimes_dependencies() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
