"""The kind path (make kind-up / kind-e2e) cannot run here — no Docker — so its parts are checked
for what can go wrong without a cluster: the manifests are valid, the InferenceServices pass the
CRD and the operator, the names the scripts use match the files they refer to."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from batchpilot.operator.children.common import Owner
from batchpilot.operator.children.deployment import build_deployment
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from tests.deploy.chart import CHART, KUBE_VERSIONS, ROOT, load
from tests.deploy.dockerfile import parse

KIND = ROOT / "hack" / "kind"
SCRIPTS = sorted((ROOT / "hack").glob("*.sh"))


def docs_of(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def inference_services() -> list[dict[str, Any]]:
    return [d for d in docs_of(KIND / "inferenceservices.yaml") if d["kind"] == "InferenceService"]


def set_flags(script: Path) -> dict[str, str]:
    """`--set KEY=VALUE` flags of the helm command in a script (line continuations joined)."""
    text = script.read_text().replace("\\\n", " ")
    words = shlex.split(text, comments=True)
    return dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "--set")


def test_the_kind_config_names_the_cluster_the_scripts_use() -> None:
    config = load(ROOT / "kind-config.yaml")
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert {node["role"] for node in config["nodes"]} == {"control-plane", "worker"}
    for script in ("kind-up.sh", "kind-e2e.sh"):
        assert (
            "cluster=${KIND_CLUSTER:-" + config["name"] + "}"
            in (ROOT / "hack" / script).read_text()
        )
    assert f"kind delete cluster --name {config['name']}" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_the_scripts_parse(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script.read_text()


def test_the_makefile_has_the_targets_the_docs_name() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("images", "kind-up", "kind-e2e", "kind-down", "chart-lint", "image-constraints"):
        assert re.search(rf"^{target}:", makefile, re.M), target


class TestKindUp:
    def test_every_value_it_sets_exists_in_the_chart(self) -> None:
        values = load(CHART / "values.yaml")
        flags = set_flags(ROOT / "hack" / "kind-up.sh")
        assert flags
        for key in flags:
            node: Any = values
            for part in key.split("."):
                assert isinstance(node, dict), f"--set {key}: no such value"
                assert part in node, f"--set {key}: no such value"
                node = node[part]

    def test_it_points_the_operator_at_the_kind_prometheus(self) -> None:
        docs = docs_of(KIND / "prometheus.yaml")
        (service,) = [d for d in docs if d["kind"] == "Service"]
        (port,) = service["spec"]["ports"]
        url = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}"
        assert set_flags(ROOT / "hack" / "kind-up.sh")["prometheus.url"] == url

    @pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
    def test_the_kind_prometheus_is_valid(self, kube_version: str) -> None:
        for doc in docs_of(KIND / "prometheus.yaml"):
            kubernetes_validate.validate(doc, kube_version, strict=True)

    def test_prometheus_scrapes_what_the_runtime_pods_announce(self) -> None:
        config = docs_of(KIND / "prometheus.yaml")
        (configmap,) = [d for d in config if d["kind"] == "ConfigMap"]
        scrape = yaml.safe_load(configmap["data"]["prometheus.yml"])
        (job,) = scrape["scrape_configs"]
        keep = job["relabel_configs"][0]
        assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
        for doc in inference_services():
            annotations = runtime_deployment(doc)["spec"]["template"]["metadata"]["annotations"]
            assert re.fullmatch(keep["regex"], annotations["prometheus.io/scrape"])


def runtime_deployment(doc: dict[str, Any]) -> dict[str, Any]:
    owner = Owner(
        name=doc["metadata"]["name"],
        namespace=doc["metadata"]["namespace"],
        uid="uid-1",
        spec=InferenceServiceSpec.model_validate(doc["spec"]),
    )
    return build_deployment(owner, OperatorSettings(), replicas=1)


class TestKindInferenceServices:
    def test_they_pass_the_crds_schema(self) -> None:
        crd = load(ROOT / "crds" / "inferenceservice.yaml")
        (version,) = crd["spec"]["versions"]
        for doc in inference_services():
            jsonschema.validate(doc, version["schema"]["openAPIV3Schema"])

    def test_they_serve_the_model_the_demo_image_bakes_in(self) -> None:
        demo = parse(KIND / "demo-runtime.Dockerfile")
        (copy,) = demo.final.all("COPY")
        destination = copy.value.split()[-1]
        for doc in inference_services():
            assert doc["spec"]["model"]["uri"] == f"file://{destination}"
            (container,) = runtime_deployment(doc)["spec"]["template"]["spec"]["containers"]
            assert container["args"][container["args"].index("--model") + 1] == destination

    def test_they_fit_a_laptop(self) -> None:
        for doc in inference_services():
            assert doc["spec"]["runtime"]["device"] == "cpu"
            requests = doc["spec"]["runtime"]["resources"]["requests"]
            assert requests["cpu"].endswith("m")
            assert int(requests["cpu"][:-1]) <= 500

    def test_the_e2e_drives_the_model_they_name(self) -> None:
        script = (ROOT / "hack" / "kind-e2e.sh").read_text()
        names = {doc["spec"]["model"]["name"] for doc in inference_services()}
        assert names == {"orientation"}
        assert "--model orientation" in script
        for doc in inference_services():
            assert f"inferenceservice/{doc['metadata']['name']}" in script
