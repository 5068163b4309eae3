"""Helpers for the sandbox API's tests: the test CRD, a Widget, waiting, kubectl."""

from __future__ import annotations

import copy
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).parent
WIDGET_CRD_PATH = HERE / "widgets-crd.yaml"
WIDGETS = "/apis/sandbox.batchpilot.io/v1alpha1"


def widget_crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WIDGET_CRD_PATH.read_text())
    return loaded


def widget_schema() -> dict[str, Any]:
    schema: dict[str, Any] = widget_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def widget(name: str = "demo", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": {"uri": "file:///models/demo.onnx"}}
    body.update(copy.deepcopy(spec))
    return {
        "apiVersion": "sandbox.batchpilot.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": body,
    }


def wait_for(predicate: Callable[[], Any], *, timeout: float = 10.0, what: str = "") -> Any:
    """Poll until `predicate()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


@dataclass
class Kubectl:
    """kubectl against the sandbox, with its own kubeconfig, cache and HOME."""

    kubeconfig: Path
    home: Path

    def command(self, *args: str) -> list[str]:
        return [
            "kubectl",
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.home / 'cache'}",
            "--request-timeout=10s",
            *args,
        ]

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self.command(*args),
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=False,
        )
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result
