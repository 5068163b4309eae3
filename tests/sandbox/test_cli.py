"""`batchpilot sandbox api` as a process: it serves, writes a kubeconfig, stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from tests.sandbox.helpers import WIDGET_CRD_PATH, wait_for

MODULE = ["-m", "batchpilot.sandbox", "api"]


def test_serves_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [
            sys.executable,
            *MODULE,
            "--kubeconfig",
            str(kubeconfig),
            "--crds",
            str(WIDGET_CRD_PATH),
            "--namespace",
            "team-a",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(kubeconfig.exists, what="the kubeconfig")
        config = yaml.safe_load(kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
        assert server.startswith("http://127.0.0.1:")
        assert oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
        with urllib.request.urlopen(f"{server}/api/v1/namespaces/team-a", timeout=5) as response:
            assert json.load(response)["metadata"]["name"] == "team-a"
        with urllib.request.urlopen(
            f"{server}/apis/sandbox.batchpilot.io/v1alpha1", timeout=5
        ) as r:
            assert json.load(r)["resources"][0]["name"] == "widgets"
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert "widgets.sandbox.batchpilot.io" in stdout
    assert f"kubeconfig: {kubeconfig}" in stdout


def test_a_missing_crd_directory_is_an_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, *MODULE, "--crds", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "no such file or directory" in result.stderr


def test_a_refused_crd_is_an_error(tmp_path: Path) -> None:
    crd = yaml.safe_load(WIDGET_CRD_PATH.read_text())
    crd["metadata"]["name"] = "wrong.example.com"
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump(crd))
    result = subprocess.run(
        [sys.executable, *MODULE, "--crds", str(tmp_path / "crd.yaml"), "--kubeconfig", "k"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert 'must be spec.names.plural+"."+spec.group' in result.stderr
