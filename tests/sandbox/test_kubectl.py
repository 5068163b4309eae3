"""kubectl against the sandbox: apply, get (printer columns), get -w, describe, scale, delete,
and an invalid resource refused with the API server's message."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from batchpilot.sandbox import LocalKubernetesAPI
from tests.sandbox.helpers import Kubectl, wait_for, widget

APPLY = ("apply", "--validate=false", "-f")


def write(tmp_path: Path, name: str, *documents: dict[str, object]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def rows(output: str) -> list[dict[str, str]]:
    """kubectl's table output as dicts, cut at the header's column positions (cells may be
    empty: kubectl prints a missing value as nothing)."""
    header, *lines = output.splitlines()
    starts = [found.start() for found in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    names = header.split()
    return [
        {
            name: line[start:end].strip()
            for name, start, end in zip(names, starts, ends, strict=True)
        }
        for line in lines
    ]


def patch_status(sandbox: LocalKubernetesAPI, name: str, status: dict[str, object]) -> None:
    def write_status() -> None:
        rt = sandbox.store.registry.get("sandbox.batchpilot.io", "v1alpha1", "widgets")
        assert rt is not None
        sandbox.store.patch(
            rt,
            "default",
            name,
            "application/merge-patch+json",
            {"status": status},
            subresource="status",
        )

    sandbox.call(write_status)


class TestApplyAndGet:
    def test_apply_get_and_reapply(self, kubectl: Kubectl, tmp_path: Path) -> None:
        manifest = write(tmp_path, "w.yaml", widget("demo", replicas=2))
        assert kubectl(*APPLY, manifest).stdout == "widget.sandbox.batchpilot.io/demo created\n"
        assert kubectl(*APPLY, manifest).stdout == "widget.sandbox.batchpilot.io/demo unchanged\n"
        changed = write(tmp_path, "w2.yaml", widget("demo", replicas=3))
        assert kubectl(*APPLY, changed).stdout == "widget.sandbox.batchpilot.io/demo configured\n"
        (row,) = rows(kubectl("get", "widgets").stdout)
        assert list(row) == ["NAME", "READY", "REPLICAS", "MAX", "AGE"]
        assert row | {"AGE": ""} == {
            "NAME": "demo",
            "READY": "",
            "REPLICAS": "3",
            "MAX": "8",
            "AGE": "",
        }
        (wide,) = rows(kubectl("get", "wdg", "-o", "wide").stdout)
        assert list(wide) == ["NAME", "READY", "REPLICAS", "MAX", "MODE", "AGE"]
        assert wide["MODE"] == "auto"
        assert "demo" in kubectl("get", "sandboxtest").stdout  # the category

    def test_printer_columns_follow_status(
        self, kubectl: Kubectl, sandbox: LocalKubernetesAPI, tmp_path: Path
    ) -> None:
        kubectl(*APPLY, write(tmp_path, "w.yaml", widget("demo")))
        patch_status(sandbox, "demo", {"conditions": [{"type": "Ready", "status": "True"}]})
        (row,) = rows(kubectl("get", "widget", "demo").stdout)
        assert (row["NAME"], row["READY"]) == ("demo", "True")

    def test_built_in_kinds_with_strategic_merge(self, kubectl: Kubectl, tmp_path: Path) -> None:
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1"}]},
                },
            },
        }
        kubectl(*APPLY, write(tmp_path, "d.yaml", deployment))
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:2"  # type: ignore[index]
        assert "configured" in kubectl(*APPLY, write(tmp_path, "d.yaml", deployment)).stdout
        (row,) = rows(kubectl("get", "deploy", "-o", "wide").stdout)
        assert list(row)[:5] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
        assert (row["NAME"], row["READY"], row["IMAGES"], row["SELECTOR"]) == (
            "web",
            "0/2",
            "nginx:2",
            "app=web",
        )
        assert "web" in kubectl("get", "all").stdout


class TestRefusals:
    def test_an_invalid_resource_is_refused_with_a_readable_message(
        self, kubectl: Kubectl, tmp_path: Path
    ) -> None:
        manifest = write(tmp_path, "bad.yaml", widget("bad", scaling={"maxReplicas": 0}))
        result = kubectl(*APPLY, manifest, check=False)
        assert result.returncode != 0
        assert 'The Widget "bad" is invalid:' in result.stderr
        assert (
            "spec.scaling.maxReplicas: Invalid value: 0: spec.scaling.maxReplicas in body should"
            " be greater than or equal to 1"
        ) in result.stderr
        assert (
            'spec.scaling: Invalid value: "object": minReplicas (1) must not exceed maxReplicas (0)'
            in result.stderr
        )
        assert "No resources found" in kubectl("get", "widgets").stderr


class TestDescribe:
    def test_describe_shows_conditions_and_events(
        self, kubectl: Kubectl, sandbox: LocalKubernetesAPI, tmp_path: Path
    ) -> None:
        kubectl(*APPLY, write(tmp_path, "w.yaml", widget("demo")))
        patch_status(
            sandbox,
            "demo",
            {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "AllReplicasReady",
                        "message": "1/1 replicas are ready",
                        "lastTransitionTime": "2024-05-01T12:00:00Z",
                    }
                ]
            },
        )
        uid = kubectl("get", "widget", "demo", "-o", "jsonpath={.metadata.uid}").stdout
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "demo.scaled"},
            "involvedObject": {
                "apiVersion": "sandbox.batchpilot.io/v1alpha1",
                "kind": "Widget",
                "name": "demo",
                "namespace": "default",
                "uid": uid,
            },
            "type": "Normal",
            "reason": "ScaledUp",
            "message": "replicas 1 -> 2: P99 above the SLA",
            "source": {"component": "batchpilot"},
            "count": 1,
        }
        kubectl("create", "--validate=false", "-f", write(tmp_path, "e.yaml", event))
        described = kubectl("describe", "widget", "demo").stdout
        assert "Conditions:" in described
        assert "AllReplicasReady" in described
        assert "1/1 replicas are ready" in described
        events = described.split("Events:", 1)[1]
        assert "ScaledUp" in events
        assert "replicas 1 -> 2: P99 above the SLA" in events
        assert "batchpilot" in events


class TestScaleAndDelete:
    def test_scale_then_delete(self, kubectl: Kubectl, tmp_path: Path) -> None:
        kubectl(*APPLY, write(tmp_path, "w.yaml", widget("demo")))
        assert kubectl("scale", "widget/demo", "--replicas=4").stdout.strip() == (
            "widget.sandbox.batchpilot.io/demo scaled"
        )
        replicas = kubectl("get", "widget", "demo", "-o", "jsonpath={.spec.replicas}").stdout
        assert replicas == "4"
        deleted = kubectl("delete", "widget", "demo").stdout.strip()
        assert deleted == 'widget.sandbox.batchpilot.io "demo" deleted'
        assert kubectl("get", "widget", "demo", check=False).returncode != 0


class TestWatch:
    def test_get_w_shows_a_change(
        self, kubectl: Kubectl, sandbox: LocalKubernetesAPI, tmp_path: Path
    ) -> None:
        kubectl(*APPLY, write(tmp_path, "w.yaml", widget("demo")))
        command = kubectl.command("get", "widgets", "-w")
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=kubectl.env
        ) as process:
            lines: queue.Queue[str] = queue.Queue()

            def pump() -> None:
                assert process.stdout is not None
                for line in process.stdout:
                    lines.put(line)

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                header = lines.get(timeout=10)
                (first,) = rows(header + lines.get(timeout=10))
                assert (first["NAME"], first["READY"], first["REPLICAS"]) == ("demo", "", "1")
                patch_status(sandbox, "demo", {"conditions": [{"type": "Ready", "status": "True"}]})
                (second,) = rows(header + lines.get(timeout=10))
                assert (second["NAME"], second["READY"], second["REPLICAS"]) == (
                    "demo",
                    "True",
                    "1",
                )
            except queue.Empty:
                pytest.fail("kubectl get -w printed nothing in time")
            finally:
                process.terminate()
                process.wait(timeout=10)
                reader.join(timeout=10)
        wait_for(lambda: sandbox.emulator.hub.subscriber_count() == 0, what="the watch to close")
