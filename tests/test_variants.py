"""The runtime serving a variant made by `batchpilot optimize`, and the TensorRT provider choice.

Each variant is served by a real `batchpilot runtime serve` process on 127.0.0.1 and answers
what onnxruntime answers for that variant's file; a missing variant stops the server before it
listens. TensorRT needs a GPU, which these machines lack: its provider choice is a pure function,
tested as a table, and on this machine asking for it must degrade to the CPU with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from batchpilot.runtime.cli import main as cli
from batchpilot.runtime.device import (
    TENSORRT,
    DeviceUnavailable,
    ProviderChoice,
    choose_accelerated_providers,
)
from batchpilot.runtime.optimize.variants import Variant, variant_path
from batchpilot.runtime.settings import RuntimeSettings
from tests import onnx_models
from tests.runtime_process import RuntimeProcess, refused_start, runtime_process, send

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


@pytest.fixture(scope="module")
def optimized_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp.onnx with mlp.fp16.onnx and mlp.int8.onnx beside it."""
    model = onnx_models.mlp(tmp_path_factory.mktemp("variants") / "mlp.onnx")
    assert cli(["optimize", str(model), "--measure-s", "0"]) == 0
    return model


def infer_json(server: RuntimeProcess, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "data": x.ravel().tolist(),
                }
            ]
        }
    )
    reply = send(server, "POST", "/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
    assert reply.status == 200, reply.body
    [output] = reply.json()["outputs"]
    assert output["name"] == "logits"
    assert output["datatype"] == "FP32"
    return np.array(output["data"], np.float32).reshape(output["shape"])


# --- Serving a variant ------------------------------------------------------------------------


class TestServesTheVariant:
    @pytest.mark.parametrize("variant", ["original", "fp16", "int8"])
    def test_answers_like_the_variant_file_with_the_original_signature(
        self, variant: Variant, optimized_mlp: Path, tmp_path: Path
    ) -> None:
        x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
        direct = ort.InferenceSession(
            str(variant_path(optimized_mlp, variant)), providers=[CPU]
        ).run(None, {"x": x})[0]
        with runtime_process(
            optimized_mlp, "--variant", variant, "--device", "cpu", log_dir=tmp_path
        ) as server:
            metadata = send(server, "GET", "/v2/models/mlp").json()
            got = infer_json(server, x)
            metrics = send(server, "GET", "/metrics").body.decode()
        assert metadata["name"] == "mlp"  # the variant keeps the model's name...
        assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
        assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 16]}]
        assert metadata["parameters"]["variant"] == variant  # ...and says which file it runs
        assert f'variant="{variant}"' in metrics
        np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-5)

    def test_the_variant_comes_from_the_environment(
        self, optimized_mlp: Path, tmp_path: Path
    ) -> None:
        with runtime_process(
            optimized_mlp,
            "--device",
            "cpu",
            log_dir=tmp_path,
            env={"BATCHPILOT_MODEL_VARIANT": "fp16"},
        ) as server:
            assert send(server, "GET", "/v2/models/mlp").json()["parameters"]["variant"] == "fp16"

    def test_a_missing_variant_exits_1_naming_the_file_and_the_command(
        self, tmp_path: Path
    ) -> None:
        model = onnx_models.mlp(tmp_path / "mlp.onnx")
        text = refused_start(
            "--model", str(model), "--variant", "int8", log_path=tmp_path / "runtime.log"
        )
        errors = [line for line in text.splitlines() if " ERROR " in line]
        assert len(errors) == 1, text
        assert f"looked for {tmp_path / 'mlp.int8.onnx'}" in errors[0]
        assert f"`batchpilot optimize {model} --int8 dynamic`" in errors[0]

    def test_tensorrt_without_a_gpu_warns_and_serves_on_the_cpu(
        self, optimized_mlp: Path, tmp_path: Path
    ) -> None:
        x = np.ones((1, 64), np.float32)
        with runtime_process(
            optimized_mlp,
            "--variant",
            "fp16",
            "--accelerator",
            "tensorrt",
            "--tensorrt-cache-dir",
            str(tmp_path / "trt"),
            log_dir=tmp_path,
        ) as server:
            metadata = send(server, "GET", "/v2/models/mlp").json()
            assert infer_json(server, x).shape == (1, 16)
            log = server.log()
        assert metadata["parameters"]["device"] == "cpu"
        assert metadata["parameters"]["providers"] == [CPU]
        warnings = [line for line in log.splitlines() if "accelerator tensorrt" in line]
        assert len(warnings) == 1, log
        assert " WARNING " in warnings[0]
        assert "running on cpu with CPUExecutionProvider" in warnings[0]


class TestSettings:
    def test_defaults_and_environment(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        plain = RuntimeSettings(model_path=tmp_path / "m.onnx")
        assert (plain.model_variant, plain.accelerator, plain.tensorrt_cache_dir) == (
            "original",
            "default",
            None,
        )
        monkeypatch.setenv("BATCHPILOT_MODEL_VARIANT", "int8")
        monkeypatch.setenv("BATCHPILOT_ACCELERATOR", "tensorrt")
        monkeypatch.setenv("BATCHPILOT_TENSORRT_CACHE_DIR", str(tmp_path / "cache"))
        env = RuntimeSettings(model_path=tmp_path / "m.onnx")
        assert (env.model_variant, env.accelerator, env.tensorrt_cache_dir) == (
            "int8",
            "tensorrt",
            tmp_path / "cache",
        )
        assert env.model_name == "m"  # the name stays the model's, whatever the variant
        monkeypatch.setenv("BATCHPILOT_MODEL_VARIANT", "int4")
        with pytest.raises(ValueError, match="model_variant"):
            RuntimeSettings(model_path=tmp_path / "m.onnx")


# --- TensorRT provider choice -----------------------------------------------------------------


def trt(fp16: bool) -> tuple[str, dict[str, str]]:
    return (
        TENSORRT,
        {
            "trt_fp16_enable": "True" if fp16 else "False",
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": "/cache",
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": "/cache",
        },
    )


ALL = [TENSORRT, CUDA, CPU]


class TestTensorrtProviderChoice:
    @pytest.mark.parametrize(
        ("device", "gpu", "available", "fp16", "expected", "why"),
        [
            # TensorRT first, then CUDA for what it leaves, then the CPU.
            ("auto", True, ALL, False, ("gpu", [trt(False), CUDA, CPU]), None),
            ("gpu", True, ALL, False, ("gpu", [trt(False), CUDA, CPU]), None),
            # FP16 kernels only for the FP16 variant.
            ("auto", True, ALL, True, ("gpu", [trt(True), CUDA, CPU]), None),
            # Degrade, with the reason.
            ("auto", True, [CUDA, CPU], False, ("gpu", [CUDA, CPU]), "no TensorrtExecutionProv"),
            ("auto", False, ALL, False, ("cpu", [CPU]), "NVML sees no NVIDIA GPU"),
            ("cpu", True, ALL, True, ("cpu", [CPU]), "device cpu was chosen"),
            ("auto", True, [TENSORRT, CPU], False, ("cpu", [CPU]), "no CUDAExecutionProvider"),
            ("auto", False, [CPU], False, ("cpu", [CPU]), "NVML sees no NVIDIA GPU"),
        ],
    )
    def test_tensorrt(
        self,
        device: Any,
        gpu: bool,
        available: list[str],
        fp16: bool,
        expected: tuple[str, list[Any]],
        why: str | None,
    ) -> None:
        choice = choose_accelerated_providers(
            device,
            gpu_present=gpu,
            available=available,
            accelerator="tensorrt",
            fp16=fp16,
            tensorrt_cache_dir="/cache",
        )
        assert (choice.device, choice.providers) == expected
        if why is None:
            assert choice.warning is None
        else:
            assert choice.warning is not None
            assert choice.warning.startswith("accelerator tensorrt was requested but ")
            assert why in choice.warning
            assert f"running on {expected[0]}" in choice.warning

    @pytest.mark.parametrize("gpu", [True, False])
    def test_default_accelerator_is_the_plain_choice(self, gpu: bool) -> None:
        choice = choose_accelerated_providers(
            "auto",
            gpu_present=gpu,
            available=ALL,
            accelerator="default",
            fp16=True,
            tensorrt_cache_dir="/cache",
        )
        assert choice == (
            ProviderChoice("gpu", [CUDA, CPU]) if gpu else ProviderChoice("cpu", [CPU])
        )

    def test_device_gpu_still_insists_on_a_gpu(self) -> None:
        with pytest.raises(DeviceUnavailable, match="NVML sees no NVIDIA GPU"):
            choose_accelerated_providers(
                "gpu",
                gpu_present=False,
                available=ALL,
                accelerator="tensorrt",
                fp16=False,
                tensorrt_cache_dir="/cache",
            )
