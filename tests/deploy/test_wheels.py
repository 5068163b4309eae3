"""The product and its tools are two distributions: the `batchpilot` wheel, the one every image
installs (whatever its extra), holds the runtime, the operator and the documents they share (the
api) and nothing of the sandbox, the simulator or the GPU check; the `batchpilot-tools` wheel
(tools/) holds exactly those three. Both are built here offline, as the images build theirs
(`pip wheel --no-deps --no-build-isolation`), and their file lists read. Without the tools, the
`batchpilot` command's tool subcommands say so in one line."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.deploy.dockerfile import parse

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted((ROOT / "images").glob("*.Dockerfile"))
TOOL_PACKAGES = ("batchpilot/sandbox/", "batchpilot/simulation/", "batchpilot/gpucheck/")
PRODUCT_PACKAGES = ("batchpilot/api/", "batchpilot/operator/", "batchpilot/runtime/")


PIP_WHEEL = ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]


def build_wheel(source: Path, out: Path) -> zipfile.ZipFile:
    done = subprocess.run(
        [sys.executable, *PIP_WHEEL, "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return build_wheel(ROOT, tmp_path_factory.mktemp("product"))


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return build_wheel(ROOT / "tools", tmp_path_factory.mktemp("tools"))


def code(wheel: zipfile.ZipFile) -> list[str]:
    """The wheel's files outside its .dist-info folder."""
    return [n for n in wheel.namelist() if not n.split("/", 1)[0].endswith(".dist-info")]


def metadata(wheel: zipfile.ZipFile) -> dict[str, list[str]]:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    message = Parser().parsestr(wheel.read(name).decode())
    return {key: message.get_all(key) or [] for key in ("Name", "Requires-Dist", "Provides-Extra")}


class TestTheProductWheel:
    def test_it_holds_the_runtime_the_operator_and_the_api(self, product: zipfile.ZipFile) -> None:
        files = code(product)
        assert "batchpilot/runtime/cli.py" in files
        assert "batchpilot/operator/run.py" in files
        # The documents both sides read: without them neither image could start.
        assert "batchpilot/api/pipeline.py" in files
        assert "batchpilot/api/batching.py" in files
        assert all(f.startswith(PRODUCT_PACKAGES) for f in files), files

    def test_it_holds_nothing_of_the_tools(self, product: zipfile.ZipFile) -> None:
        assert [f for f in product.namelist() if f.startswith(TOOL_PACKAGES)] == []

    def test_it_needs_none_of_the_tools_dependencies(self, product: zipfile.ZipFile) -> None:
        meta = metadata(product)
        assert meta["Name"] == ["batchpilot"]
        assert "sandbox" not in meta["Provides-Extra"]
        assert not [r for r in meta["Requires-Dist"] if r.startswith(("kmock", "cel-python"))]


class TestTheToolsWheel:
    def test_it_holds_exactly_the_sandbox_the_simulator_and_the_gpu_check(
        self, tools: zipfile.ZipFile
    ) -> None:
        files = code(tools)
        assert "batchpilot/sandbox/apiserver.py" in files
        assert "batchpilot/simulation/cli.py" in files
        assert "batchpilot/gpucheck/models.py" in files
        assert all(f.startswith(TOOL_PACKAGES) for f in files), files

    def test_it_goes_with_this_version_of_the_product(self, tools: zipfile.ZipFile) -> None:
        meta = metadata(tools)
        assert meta["Name"] == ["batchpilot-tools"]
        requires = meta["Requires-Dist"]
        assert "batchpilot[operator,runtime]==0.1.0" in requires
        assert any(r.startswith("kmock") for r in requires)


def test_neither_wheel_owns_the_namespace_package(
    product: zipfile.ZipFile, tools: zipfile.ZipFile
) -> None:
    # PEP 420: `batchpilot` spans both wheels only while neither has a batchpilot/__init__.py.
    assert "batchpilot/__init__.py" not in product.namelist()
    assert "batchpilot/__init__.py" not in tools.namelist()


@pytest.mark.parametrize("image", IMAGES, ids=lambda p: p.stem)
def test_no_image_copies_the_tools(image: Path) -> None:
    for stage in parse(image).stages:
        for copy in stage.all("COPY"):
            sources = copy.value.split()[:-1]
            assert not [s for s in sources if s.rstrip("/") == "tools"], f"{image.name}: {copy}"
        for run in stage.all("RUN"):
            # `pip wheel … .` builds the product; `./tools` would build the tools.
            assert not re.search(r"(^|\s|\./)tools/?(\s|$)", run.value), f"{image.name}: {run}"


PROBE = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("batchpilot.sandbox", "batchpilot.simulation"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Refuse())
from batchpilot.runtime.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [["sandbox", "up"], ["sandbox", "api"], ["simulate"]])
def test_without_the_tools_their_commands_say_so_in_one_line(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"batchpilot {' '.join(command)} needs the development tools: "
        "pip install batchpilot-tools, or run it from a source checkout with make install\n"
    )
