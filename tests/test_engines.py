"""Engines: device choice, the onnxruntime engine, the simulated accelerator."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from batchpilot.runtime.device import DeviceUnavailable, Nvml, choose_providers
from batchpilot.runtime.engine import example_inputs
from batchpilot.runtime.metrics import batch_bucket
from batchpilot.runtime.onnx_engine import ModelLoadError, OnnxEngine
from batchpilot.runtime.simulated import LatencyModel, SimulatedEngine
from tests import onnx_models

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


class TestDeviceChoice:
    def test_auto_takes_the_gpu_only_when_nvml_sees_one_and_cuda_is_installed(self) -> None:
        assert choose_providers("auto", gpu_present=True, available=[CUDA, CPU]) == (
            "gpu",
            [CUDA, CPU],
        )
        assert choose_providers("auto", gpu_present=False, available=[CUDA, CPU]) == ("cpu", [CPU])
        assert choose_providers("auto", gpu_present=True, available=[CPU]) == ("cpu", [CPU])

    def test_cpu_is_always_possible(self) -> None:
        assert choose_providers("cpu", gpu_present=True, available=[CUDA, CPU]) == ("cpu", [CPU])

    def test_gpu_without_a_gpu_or_without_cuda_is_refused_with_the_reason(self) -> None:
        with pytest.raises(DeviceUnavailable, match="NVML sees no NVIDIA GPU"):
            choose_providers("gpu", gpu_present=False, available=[CUDA, CPU])
        with pytest.raises(DeviceUnavailable, match="no CUDAExecutionProvider"):
            choose_providers("gpu", gpu_present=True, available=[CPU])


class TestOnnxEngine:
    async def test_runs_batches_like_a_plain_session(self, mlp_model: Path) -> None:
        engine = OnnxEngine.load(mlp_model, name="mlp", device="cpu")
        x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
        out = await engine.run({"x": x})
        (expected,) = ort.InferenceSession(str(mlp_model)).run(None, {"x": x})
        np.testing.assert_allclose(out["logits"], expected, rtol=1e-5)
        assert engine.info.device == "cpu"
        assert not engine.info.simulated
        assert [s.shape for s in engine.signature.inputs] == [(-1, 64)]
        await engine.close()

    def test_a_model_without_a_dynamic_batch_axis_is_refused(self, fixed_batch_model: Path) -> None:
        with pytest.raises(ModelLoadError, match="dimension 0 must be a dynamic batch axis"):
            OnnxEngine.load(fixed_batch_model, name="fixed", device="cpu")

    def test_a_missing_or_corrupt_file_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ModelLoadError, match="does not exist"):
            OnnxEngine.load(tmp_path / "nope.onnx", name="x", device="cpu")
        corrupt = tmp_path / "corrupt.onnx"
        corrupt.write_bytes(b"\x08\x07garbage" * 10)
        with pytest.raises(ModelLoadError, match="cannot load"):
            OnnxEngine.load(corrupt, name="x", device="cpu")

    def test_the_pretrained_classifier_loads(self) -> None:
        engine = OnnxEngine.load(onnx_models.pretrained_classifier(), name="orient", device="cpu")
        (spec,) = engine.signature.inputs
        assert spec.datatype == "FP32"
        assert spec.shape[1:] == (3, 224, 224)


class TestSimulatedEngine:
    def test_latency_model_parses_the_cli_form(self) -> None:
        model = LatencyModel.parse("alpha_ms=8,beta_ms=1.5")
        assert model.seconds(4) == pytest.approx(0.008 + 4 * 0.0015)
        for bad in ("alpha_ms=8", "alpha=1,beta=2", "alpha_ms=-1,beta_ms=1", ""):
            with pytest.raises(ValueError, match="expected"):
                LatencyModel.parse(bad)

    @pytest.mark.looptime
    async def test_a_batch_takes_alpha_plus_beta_b_of_loop_time(self, image_model: Path) -> None:
        engine = SimulatedEngine.load(
            image_model, name="resnet", latency=LatencyModel(alpha_s=0.008, beta_s=0.0015)
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = await engine.run(example_inputs(engine.signature, rows=8))
        assert loop.time() - start == pytest.approx(0.008 + 8 * 0.0015)  # 20 ms
        assert out["probabilities"].shape == (8, 1000)
        assert engine.info.simulated
        assert engine.signature.platform == "simulated"


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [
        "1", "2", "4", "4", "8", "8", "16", "64", "128",
    ]  # fmt: skip


@pytest.mark.gpu
def test_the_gpu_is_used_when_there_is_one(mlp_model: Path) -> None:
    nvml = Nvml.probe()
    if nvml is None or CUDA not in ort.get_available_providers():
        pytest.skip("no NVIDIA GPU with onnxruntime-gpu here")
    engine = OnnxEngine.load(mlp_model, name="mlp", device="gpu", gpu_present=True)
    assert engine.info.device == "gpu"
    assert engine.info.providers[0] == CUDA
    assert nvml.sample(), "NVML reads the GPU"
