"""Engines: device choice, the engines that run a model (onnxruntime and PyTorch, one table for
both), the simulated accelerator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from batchpilot.runtime.device import DeviceUnavailable, Nvml, choose_providers
from batchpilot.runtime.engine import Engine, TimedEngine, example_inputs
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


@dataclass(frozen=True)
class EngineCase:
    """One engine of the table and the test models it serves: the same models in its format."""

    kind: str
    load: Callable[..., Engine]
    mlp: Path
    """`onnx_models.mlp`'s function: x FP32 [N, 64] → logits FP32 [N, 16]."""
    fixed_batch: Path
    """The same, but with a batch of exactly 1."""
    multi_io: Path
    """`onnx_models.multi_io`'s six datatypes in, six out."""
    classifier: Path
    """An image classifier, FP32 [N, 3, 224, 224] in."""
    suffix: str
    """The file name ending of this engine's models."""


def _onnx_case(model_dir: Path) -> EngineCase:
    return EngineCase(
        kind="onnxruntime",
        load=lambda path, **kw: OnnxEngine.load(path, name="m", device="cpu", **kw),
        mlp=model_dir / "mlp.onnx",
        fixed_batch=model_dir / "fixed_batch.onnx",
        multi_io=model_dir / "multi_io.onnx",
        classifier=onnx_models.pretrained_classifier(),
        suffix=".onnx",
    )


def _torch_case(model_dir: Path) -> EngineCase:
    pytest.importorskip("torch", reason="the torch extra is not installed")
    from batchpilot.gpucheck import models as gpucheck_models
    from batchpilot.runtime.torch_engine import TorchEngine
    from tests import torch_models

    folder = model_dir / "torch"
    if not folder.exists():
        folder.mkdir()
        torch_models.mlp(folder / "mlp.pt")
        torch_models.fixed_batch(folder / "fixed_batch.pt")
        torch_models.multi_io(folder / "multi_io.pt")
        gpucheck_models.save(gpucheck_models.build("tiny"), folder / "classifier.pt")
    return EngineCase(
        kind="torch",
        load=lambda path, **kw: TorchEngine.load(
            path, name="m", device="cpu", intra_op_threads=1, **kw
        ),
        mlp=folder / "mlp.pt",
        fixed_batch=folder / "fixed_batch.pt",
        multi_io=folder / "multi_io.pt",
        classifier=folder / "classifier.pt",
        suffix=".pt",
    )


@pytest.fixture(params=["onnx", "torch"])
def case(
    request: pytest.FixtureRequest,
    model_dir: Path,
    mlp_model: Path,
    fixed_batch_model: Path,
    multi_io_model: Path,
) -> EngineCase:
    return _onnx_case(model_dir) if request.param == "onnx" else _torch_case(model_dir)


class TestEngines:
    """What every engine that runs a model does, the same table for each (`case`)."""

    async def test_runs_batches_like_a_plain_session(
        self, case: EngineCase, mlp_model: Path
    ) -> None:
        engine = case.load(case.mlp)
        x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
        out = await engine.run({"x": x})
        (expected,) = ort.InferenceSession(str(mlp_model)).run(None, {"x": x})
        np.testing.assert_allclose(out["logits"], expected, rtol=1e-5, atol=1e-6)
        assert engine.info.kind == case.kind
        assert engine.info.device == "cpu"
        assert not engine.info.simulated
        assert [s.shape for s in engine.signature.inputs] == [(-1, 64)]
        assert [(s.name, s.datatype, s.shape) for s in engine.signature.outputs] == [
            ("logits", "FP32", (-1, 16))
        ]
        await engine.close()

    async def test_every_datatype_goes_through_unchanged(self, case: EngineCase) -> None:
        engine = case.load(case.multi_io)
        inputs = onnx_models.random_multi_io(3)
        out = await engine.run(inputs)
        for name, expected in onnx_models.multi_io_expected(inputs).items():
            assert out[name].dtype == expected.dtype, name
            np.testing.assert_array_equal(out[name], expected, err_msg=name)
        await engine.close()

    async def test_concurrent_batches_each_get_their_own_rows(self, case: EngineCase) -> None:
        engine = case.load(case.mlp, instances=2)
        rng = np.random.default_rng(1)
        batches = [rng.standard_normal((rows, 64)).astype(np.float32) for rows in (1, 3, 7, 2)]
        outs = await asyncio.gather(*(engine.run({"x": x}) for x in batches))
        alone = [await engine.run({"x": x}) for x in batches]
        for out, single, x in zip(outs, alone, batches, strict=True):
            assert out["logits"].shape == (x.shape[0], 16)
            np.testing.assert_allclose(out["logits"], single["logits"], rtol=1e-5, atol=1e-6)
        assert engine.info.instances == 2
        await engine.close()

    async def test_a_batch_is_timed_on_its_thread_not_by_the_event_loop(
        self, case: EngineCase
    ) -> None:
        """The loop, busy elsewhere (reading a burst of requests), takes the outputs back late;
        the batch's compute time is still its own."""
        engine = case.load(case.mlp)
        assert isinstance(engine, TimedEngine)
        x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
        loop_started = time.perf_counter()
        task = asyncio.create_task(engine.run_timed({"x": x}))
        await asyncio.sleep(0)  # the batch is on its instance's thread now
        time.sleep(0.3)  # noqa: ASYNC251 - a stalled event loop
        ran = await task
        assert time.perf_counter() - loop_started >= 0.3
        assert 0 < ran.seconds < 0.3
        alone = await engine.run({"x": x})
        np.testing.assert_allclose(ran.outputs["logits"], alone["logits"], rtol=1e-5, atol=1e-6)
        await engine.close()

    def test_a_model_without_a_dynamic_batch_axis_is_refused(self, case: EngineCase) -> None:
        with pytest.raises(ModelLoadError, match="dimension 0 must be a dynamic batch axis"):
            case.load(case.fixed_batch)

    def test_a_missing_or_corrupt_file_is_refused(self, case: EngineCase, tmp_path: Path) -> None:
        with pytest.raises(ModelLoadError, match="does not exist"):
            case.load(tmp_path / f"nope{case.suffix}")
        corrupt = tmp_path / f"corrupt{case.suffix}"
        corrupt.write_bytes(b"\x08\x07garbage" * 10)
        with pytest.raises(ModelLoadError, match="cannot load"):
            case.load(corrupt)

    def test_an_image_classifier_loads(self, case: EngineCase) -> None:
        engine = case.load(case.classifier)
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

    async def test_its_compute_time_is_the_models_however_late_the_loop_wakes(
        self, image_model: Path
    ) -> None:
        engine = SimulatedEngine.load(
            image_model, name="resnet", latency=LatencyModel(alpha_s=0.008, beta_s=0.0015)
        )
        task = asyncio.create_task(engine.run_timed(example_inputs(engine.signature, rows=8)))
        await asyncio.sleep(0)
        time.sleep(0.1)  # noqa: ASYNC251 - a stalled loop wakes the device 80 ms late
        ran = await task
        assert ran.seconds == pytest.approx(0.008 + 8 * 0.0015)
        assert ran.outputs["probabilities"].shape == (8, 1000)


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
