"""The torch engine beyond the engine table (tests/test_engines.py): where its signature comes
from, the programs it refuses and why, FP16 under autocast, the server with `--engine torch`,
and, where there is a GPU, CUDA.

No onnx here, no shared conftest fixtures: `make gpu-check` runs this module's GPU tests on a
machine with PyTorch and without onnx (`pytest --noconftest -m gpu`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

from batchpilot.runtime.device import DeviceUnavailable, Nvml  # noqa: E402
from batchpilot.runtime.onnx_engine import ModelLoadError  # noqa: E402
from batchpilot.runtime.torch_engine import TorchEngine  # noqa: E402
from batchpilot.runtime.torch_program import choose_device  # noqa: E402
from batchpilot.runtime.torch_signature import sidecar_path  # noqa: E402
from tests import torch_models  # noqa: E402
from tests.runtime_process import Scrape, refused_start, runtime_process, send  # noqa: E402

X = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)


def expected_logits(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return torch_models.Mlp()(torch.from_numpy(x)).numpy()


def load(path: Path, **kwargs: object) -> TorchEngine:
    return TorchEngine.load(path, name="m", device="cpu", intra_op_threads=1, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("torch-models")


@pytest.fixture(scope="module")
def exported_mlp(models: Path) -> Path:
    """torch.export of the mlp returning {"logits": …} (an export takes seconds: made once)."""
    return torch_models.exported(torch_models.MlpByName(), models / "mlp_by_name.pt2")


@pytest.fixture(scope="module")
def exported_unnamed(models: Path) -> Path:
    """torch.export of the mlp returning a bare tensor."""
    return torch_models.exported(torch_models.Mlp(), models / "mlp.pt2")


class TestWhereTheSignatureComesFrom:
    async def test_a_sidecar_beside_a_torchscript_file(self, tmp_path: Path) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt")
        assert sidecar_path(path) == tmp_path / "mlp.signature.json"
        engine = load(path)
        np.testing.assert_allclose(
            (await engine.run({"x": X}))["logits"], expected_logits(X), rtol=1e-5, atol=1e-6
        )
        assert engine.signature.platform == "pytorch_libtorch"

    async def test_a_document_inside_the_torchscript_archive(self, tmp_path: Path) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt", declare="embedded")
        assert not sidecar_path(path).exists()
        engine = load(path)
        assert [s.name for s in engine.signature.outputs] == ["logits"]
        np.testing.assert_allclose(
            (await engine.run({"x": X}))["logits"], expected_logits(X), rtol=1e-5, atol=1e-6
        )

    async def test_an_exported_program_carries_its_inputs_and_names_its_outputs(
        self, exported_mlp: Path
    ) -> None:
        engine = load(exported_mlp)
        sig = engine.signature
        assert [(s.name, s.datatype, s.shape) for s in sig.inputs] == [("x", "FP32", (-1, 64))]
        assert [(s.name, s.datatype, s.shape) for s in sig.outputs] == [
            ("logits", "FP32", (-1, 16))
        ]
        assert sig.platform == "pytorch_export"
        np.testing.assert_allclose(
            (await engine.run({"x": X}))["logits"], expected_logits(X), rtol=1e-5, atol=1e-6
        )

    def test_unnamed_outputs_of_an_exported_program_are_numbered(
        self, exported_unnamed: Path
    ) -> None:
        assert [s.name for s in load(exported_unnamed).signature.outputs] == ["output_0"]

    def test_a_sidecar_names_an_exported_programs_outputs(
        self, exported_unnamed: Path, tmp_path: Path
    ) -> None:
        path = tmp_path / "named.pt2"
        path.write_bytes(exported_unnamed.read_bytes())
        sidecar_path(path).write_text(
            json.dumps({"outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 16]}]})
        )
        assert [s.name for s in load(path).signature.outputs] == ["scores"]

    def test_the_file_name_does_not_decide_the_format(
        self, exported_mlp: Path, tmp_path: Path
    ) -> None:
        path = tmp_path / "model.bin"
        path.write_bytes(exported_mlp.read_bytes())
        assert load(path).signature.platform == "pytorch_export"


class TestProgramsThatCannotBeServedSayWhy:
    def test_a_torch_save_pickle(self, tmp_path: Path) -> None:
        path = tmp_path / "weights.pt"
        torch.save(torch_models.Mlp().state_dict(), path)
        with pytest.raises(ModelLoadError, match=r"written by torch\.save.*torch\.jit\.script"):
            load(path)

    def test_torchscript_without_a_signature(self, tmp_path: Path) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt", declare="none")
        with pytest.raises(ModelLoadError, match=r"does not carry.*mlp\.signature\.json"):
            load(path)

    @pytest.mark.parametrize(
        ("document", "message"),
        [
            ("{not json", "is not a signature document"),
            ('{"inputs": [{"name": "x", "datatype": "FP8", "shape": [-1]}], "outputs": []}',
             "is not a signature document"),
            ('{"outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}]}',
             "declares no inputs"),
            ('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}],'
             ' "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}], "extra": 1}',
             "is not a signature document"),
        ],
    )  # fmt: skip
    def test_a_malformed_sidecar(self, tmp_path: Path, document: str, message: str) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt")
        sidecar_path(path).write_text(document)
        with pytest.raises(ModelLoadError, match=message):
            load(path)

    @pytest.mark.parametrize(
        ("inputs", "outputs", "message"),
        [
            ([-1, 32], [-1, 16], "warm-up inference failed"),
            ([-1, 64], [-1, 10], r"output 'logits' has shape \[1, 16\].*declares \[-1, 10\]"),
        ],
    )
    def test_a_sidecar_that_does_not_fit_the_program(
        self, tmp_path: Path, inputs: list[int], outputs: list[int], message: str
    ) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt")
        sidecar_path(path).write_text(
            json.dumps(
                {
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": inputs}],
                    "outputs": [{"name": "logits", "datatype": "FP32", "shape": outputs}],
                }
            )
        )
        with pytest.raises(ModelLoadError, match=message):
            load(path)

    def test_declared_datatypes_and_counts_must_be_what_the_program_returns(
        self, tmp_path: Path
    ) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt")
        x = {"name": "x", "datatype": "FP32", "shape": [-1, 64]}
        for outputs, message in [
            ([{"name": "logits", "datatype": "FP64", "shape": [-1, 16]}], "is FP32, the signa"),
            (
                [
                    {"name": "a", "datatype": "FP32", "shape": [-1, 16]},
                    {"name": "b", "datatype": "FP32", "shape": [-1, 16]},
                ],
                "returns 1 outputs, the signature declares 2",
            ),
        ]:
            sidecar_path(path).write_text(json.dumps({"inputs": [x], "outputs": outputs}))
            with pytest.raises(ModelLoadError, match=message):
                load(path)

    def test_an_exported_program_with_a_fixed_batch(self, tmp_path: Path) -> None:
        path = torch_models.exported(torch_models.Mlp(), tmp_path / "fixed.pt2", dynamic=False)
        with pytest.raises(ModelLoadError, match="dimension 0 must be a dynamic batch axis"):
            load(path)

    def test_a_sidecar_that_contradicts_an_exported_program(
        self, exported_mlp: Path, tmp_path: Path
    ) -> None:
        path = tmp_path / "m.pt2"
        path.write_bytes(exported_mlp.read_bytes())
        sidecar_path(path).write_text(
            json.dumps(
                {
                    "inputs": [{"name": "x", "datatype": "FP16", "shape": [-1, 64]}],
                    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 16]}],
                }
            )
        )
        with pytest.raises(ModelLoadError, match="declares input 'x' as FP16, the program takes"):
            load(path)

    def test_the_int8_variant_is_an_onnx_file(self, tmp_path: Path) -> None:
        with pytest.raises(ModelLoadError, match="variant int8 is an ONNX file"):
            load(torch_models.mlp(tmp_path / "mlp.pt"), variant="int8")

    def test_device_gpu_without_cuda_is_refused_with_the_reason(self) -> None:
        with pytest.raises(DeviceUnavailable, match="PyTorch sees no CUDA device"):
            choose_device("gpu", cuda=False)
        assert choose_device("auto", cuda=False) == "cpu"
        assert choose_device("auto", cuda=True) == "gpu"
        assert choose_device("cpu", cuda=True) == "cpu"


class TestFp16Variant:
    async def test_autocast_keeps_the_declared_datatypes_and_close_numbers(
        self, tmp_path: Path
    ) -> None:
        engine = load(torch_models.mlp(tmp_path / "mlp.pt"), variant="fp16")
        out = (await engine.run({"x": X}))["logits"]
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected_logits(X), rtol=0.05, atol=0.02)
        assert not np.array_equal(out, expected_logits(X))  # it did compute in float16
        assert engine.info.variant == "fp16"
        assert "autocast FP16" in engine.info.detail


class TestServedByTheRuntime:
    def test_serve_engine_torch_answers_v2_and_counts_its_batches(self, tmp_path: Path) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt")
        body = orjson.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [5, 64], "data": X.ravel()}]},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        args = (
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--intra-op-threads",
            "1",
            "--drain-linger-s",
            "0",
        )
        with runtime_process(path, *args, log_dir=tmp_path, ready_timeout_s=60) as server:
            meta = send(server, "GET", "/v2/models/mlp").json()
            assert meta["platform"] == "pytorch_libtorch"
            assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
            reply = send(server, "POST", "/v2/models/mlp/infer", body)
            assert reply.status == 200, reply.body
            (out,) = reply.json()["outputs"]
            np.testing.assert_allclose(
                np.array(out["data"], np.float32).reshape(out["shape"]),
                expected_logits(X),
                rtol=1e-5,
                atol=1e-6,
            )
            scrape = Scrape(server)
            assert scrape.value("batchpilot_engine_info", engine="torch", device="cpu") == 1
            assert scrape.value("batchpilot_batch_compute_seconds_total") > 0
            assert scrape.value("batchpilot_batch_rows_total") == 5
            assert scrape.value("batchpilot_device_busy_seconds_total") > 0
        assert "PyTorch" in server.log()

    def test_a_program_that_cannot_load_is_one_log_line_and_status_1(self, tmp_path: Path) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt", declare="none")
        log = refused_start(
            "--model", str(path), "--engine", "torch", log_path=tmp_path / "refused.log",
            timeout_s=60,
        )  # fmt: skip
        assert "cannot be served" in log
        assert "does not carry its inputs" in log

    def test_without_pytorch_the_server_says_which_extra_it_needs(self, tmp_path: Path) -> None:
        probe = (
            "import importlib.abc, sys\n"
            "class Refuse(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            raise ModuleNotFoundError(\"No module named 'torch'\", name=name)\n"
            "sys.meta_path.insert(0, Refuse())\n"
            "from batchpilot.runtime.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe, "runtime", "serve", "--engine", "torch",
             "--model", str(tmp_path / "m.pt"), "--port", "0", "--admin-port", "0"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "batchpilot[runtime,torch]" in done.stderr


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device visible to PyTorch here"
)


@pytest.mark.gpu
@needs_cuda
class TestOnTheGpu:
    async def test_the_program_runs_on_cuda_and_agrees_with_the_cpu(self, tmp_path: Path) -> None:
        path = torch_models.mlp(tmp_path / "mlp.pt")
        engine = TorchEngine.load(path, name="m", device="gpu", instances=2)
        assert engine.info.device == "gpu"
        assert engine.info.providers[0].startswith("cuda")
        out = (await engine.run({"x": X}))["logits"]
        np.testing.assert_allclose(out, expected_logits(X), rtol=1e-3, atol=1e-3)
        half = TorchEngine.load(path, name="m", device="gpu", variant="fp16")
        out16 = (await half.run({"x": X}))["logits"]
        assert out16.dtype == np.float32
        np.testing.assert_allclose(out16, expected_logits(X), rtol=0.05, atol=0.02)
        await engine.close()
        await half.close()

    async def test_an_exported_program_moves_to_the_gpu(self, exported_mlp: Path) -> None:
        engine = TorchEngine.load(exported_mlp, name="m", device="gpu")
        out = (await engine.run({"x": X}))["logits"]
        np.testing.assert_allclose(out, expected_logits(X), rtol=1e-3, atol=1e-3)

    def test_nvml_reads_the_gpu_the_engine_uses(self) -> None:
        nvml = Nvml.probe()
        assert nvml is not None, "PyTorch sees a CUDA device, NVML must too (nvidia-ml-py)"
        assert nvml.sample(), "NVML reads the GPU"
