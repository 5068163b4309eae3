"""`batchpilot optimize`: variants written, their signatures unchanged, the report sane, and bad
input refused in one line with nothing written. Real onnx conversions and onnxruntime sessions
on the small models of tests/onnx_models.py; timing is kept to a tenth of a second per model.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from batchpilot.runtime.cli import main as cli
from batchpilot.runtime.engine import TensorSpec
from batchpilot.runtime.optimize.plan import (
    Job,
    OptimizeError,
    check_arrays,
    plan_jobs,
    random_inputs,
    take_rows,
)
from batchpilot.runtime.optimize.report import compare_outputs, looks_like_class_scores
from batchpilot.runtime.optimize.variants import missing_variant_message, variant_path
from tests import onnx_models

FAST = ("--measure-s", "0.1")


def optimize(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli(["optimize", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def op_types(path: Path) -> Counter[str]:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def io_types(path: Path) -> list[tuple[str, int]]:
    graph = onnx.load(str(path)).graph
    return [(v.name, v.type.tensor_type.elem_type) for v in (*graph.input, *graph.output)]


def mlp_rows(rows: int, *, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    return {"x": np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)}


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `batchpilot optimize mlp.onnx` with no variant flag, report as JSON."""
    work = tmp_path_factory.mktemp("optimize-mlp")
    model = onnx_models.mlp(work / "mlp.onnx")
    report = work / "report.json"
    assert cli(["optimize", str(model), *FAST, "--json", str(report)]) == 0
    return {"model": model, "dir": work, "report": json.loads(report.read_text())}


# --- What the command writes ------------------------------------------------------------------


class TestVariantsWritten:
    def test_no_flag_writes_fp16_and_int8_beside_the_model(self, mlp_run: dict[str, Any]) -> None:
        work: Path = mlp_run["dir"]
        assert sorted(p.name for p in work.iterdir()) == [
            "mlp.fp16.onnx",
            "mlp.int8.onnx",
            "mlp.onnx",
            "report.json",
        ]
        assert [v["variant"] for v in mlp_run["report"]["variants"]] == ["fp16", "int8"]

    def test_fp16_keeps_the_input_and_output_types_and_halves_the_weights(
        self, mlp_run: dict[str, Any]
    ) -> None:
        model: Path = mlp_run["model"]
        fp16 = variant_path(model, "fp16")
        assert (
            io_types(fp16)
            == io_types(model)
            == [("x", TensorProto.FLOAT), ("logits", TensorProto.FLOAT)]
        )
        weights = {t.name: t.data_type for t in onnx.load(str(fp16)).graph.initializer}
        assert weights["w1"] == weights["w2"] == TensorProto.FLOAT16
        assert op_types(fp16)["Cast"] >= 2  # at the float32 edges

    def test_int8_contains_quantized_ops_and_keeps_the_signature(
        self, mlp_run: dict[str, Any]
    ) -> None:
        model: Path = mlp_run["model"]
        int8 = variant_path(model, "int8")
        ops = op_types(int8)
        assert ops["MatMulInteger"] == 2, ops
        assert ops["DynamicQuantizeLinear"] == 2, ops
        assert io_types(int8) == io_types(model)

    def test_variants_run_with_the_original_inputs(self, mlp_run: dict[str, Any]) -> None:
        model: Path = mlp_run["model"]
        rows = mlp_rows(4, seed=3)
        want = ort.InferenceSession(str(model)).run(None, rows)[0]
        for variant in ("fp16", "int8"):
            got = ort.InferenceSession(str(variant_path(model, variant))).run(None, rows)[0]
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, want, atol=0.1)

    def test_files_have_the_model_permissions(self, tmp_path: Path) -> None:
        model = onnx_models.mlp(tmp_path / "mlp.onnx")
        model.chmod(0o644)
        assert cli(["optimize", str(model), "--fp16", "--measure-s", "0"]) == 0
        assert variant_path(model, "fp16").stat().st_mode & 0o777 == 0o644

    def test_out_dir_is_created_and_holds_the_variants(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.mlp(tmp_path / "mlp.onnx")
        out = tmp_path / "variants" / "v1"
        code, _, err = optimize(capsys, str(model), "--fp16", "--out-dir", str(out), *FAST)
        assert code == 0, err
        assert sorted(p.name for p in out.iterdir()) == ["mlp.fp16.onnx"]
        assert not variant_path(model, "fp16").exists()

    def test_static_int8_is_calibrated_on_the_given_rows(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.mlp(tmp_path / "mlp.onnx")
        calibration = tmp_path / "calibration.npz"
        # float64, as numpy saves Python floats: cast to the input's FP32.
        np.savez(calibration, x=np.random.default_rng(1).standard_normal((40, 64)))
        report = tmp_path / "r.json"
        code, out, err = optimize(
            capsys,
            str(model),
            "--int8",
            "static",
            "--calibration",
            str(calibration),
            "--json",
            str(report),
            *FAST,
        )
        assert code == 0, err
        ops = op_types(variant_path(model, "int8"))
        assert ops["QuantizeLinear"] > 0, ops
        assert ops["DequantizeLinear"] > 0, ops
        data = json.loads(report.read_text())
        assert data["evaluation"]["source"] == "calibration"
        assert data["evaluation"]["rows"] == 40
        assert [v["method"] for v in data["variants"]] == ["int8-static"]
        assert "int8-static" in out

    def test_a_variant_that_cannot_be_made_is_skipped_when_no_flag_asked_for_it(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # multi_io: float constants to halve, but no operator INT8 applies to. Its FP16 input
        # stays FP16, its FP32 input FP32.
        model = onnx_models.multi_io(tmp_path / "multi_io.onnx")
        code, out, err = optimize(capsys, str(model), *FAST)
        assert code == 0, err
        assert "skipped: int8 (int8-dynamic): nothing in the model can be quantized" in out
        assert io_types(variant_path(model, "fp16")) == io_types(model)
        assert not variant_path(model, "int8").exists()


# --- The report -------------------------------------------------------------------------------


class TestReport:
    def test_sizes_speeds_and_agreement_are_present_and_sane(self, mlp_run: dict[str, Any]) -> None:
        report = mlp_run["report"]
        assert set(report["original"]["rows_per_s"]) == {"1", "8"}
        assert all(rate > 0 for rate in report["original"]["rows_per_s"].values())
        fp16, int8 = report["variants"]
        assert 0.4 < fp16["size_ratio"] < 0.6  # FP16 weights: half the bytes
        assert int8["size_ratio"] < 0.4  # INT8 weights: a quarter, plus scales
        for variant in (fp16, int8):
            assert set(variant["rows_per_s"]) == set(variant["speed_ratio"]) == {"1", "8"}
            for batch, rate in variant["rows_per_s"].items():
                assert rate > 0
                ratio = rate / report["original"]["rows_per_s"][batch]
                assert variant["speed_ratio"][batch] == pytest.approx(ratio)
            [logits] = variant["outputs"]
            assert logits["name"] == "logits"
            assert logits["top1_agreement"] >= 0.9
        # The MLP's logits are of order 1: FP16 rounding costs ~1e-3, INT8 ~1e-2.
        assert fp16["outputs"][0]["max_abs_diff"] < 0.01
        assert int8["outputs"][0]["max_abs_diff"] < 0.1
        assert 0 < fp16["outputs"][0]["mean_abs_diff"] <= fp16["outputs"][0]["max_abs_diff"]

    def test_random_inputs_are_said_to_measure_only_agreement_on_noise(
        self, mlp_run: dict[str, Any]
    ) -> None:
        evaluation = mlp_run["report"]["evaluation"]
        assert evaluation["source"] == "random"
        assert "only agreement on noise" in evaluation["note"]

    def test_table_on_stdout_and_eval_inputs_used(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.mlp(tmp_path / "mlp.onnx")
        eval_inputs = tmp_path / "eval.npz"
        np.savez(eval_inputs, **mlp_rows(12, seed=5))
        code, out, err = optimize(
            capsys, str(model), "--fp16", "--eval-inputs", str(eval_inputs), "--batches", "2", *FAST
        )
        assert code == 0, err
        header, rule, original, fp16 = out.splitlines()[:4]
        assert header.split()[:4] == ["variant", "method", "size", "size"]
        assert "rows/s b2" in header
        assert "top-1 agree" in header
        assert set(rule) == {"-", " "}
        assert original.split()[0] == "original"
        assert fp16.split()[:2] == ["fp16", "fp16"]
        assert fp16.endswith("100.0%")
        assert "outputs compared on the --eval-inputs rows; 12 rows." in out

    def test_the_pretrained_classifier(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        classifier = onnx_models.pretrained_classifier()
        images = tmp_path / "images.npz"
        np.savez(images, x=np.random.default_rng(0).random((4, 3, 224, 224), dtype=np.float32))
        report = tmp_path / "r.json"
        code, _, err = optimize(
            capsys,
            str(classifier),
            "--fp16",
            "--int8",
            "dynamic",
            "--out-dir",
            str(tmp_path),
            "--eval-inputs",
            str(images),
            "--batches",
            "1",
            "--measure-s",
            "0.05",
            "--json",
            str(report),
        )
        assert code == 0, err
        fp16, int8 = json.loads(report.read_text())["variants"]
        assert op_types(Path(int8["path"]))["ConvInteger"] > 0
        assert io_types(Path(fp16["path"])) == io_types(classifier)
        # Softmax probabilities: FP16 moves them by ~1e-3 and keeps the winning class.
        assert fp16["outputs"][0]["max_abs_diff"] < 0.01
        assert fp16["outputs"][0]["top1_agreement"] == 1.0


# --- Bad input --------------------------------------------------------------------------------


def _not_onnx(tmp: Path, model: Path) -> list[str]:
    text = tmp / "notes.onnx"
    text.write_text("these are not the weights you are looking for\n" * 20)
    return [str(text)]


def _npz(tmp: Path, **arrays: Any) -> str:
    path = tmp / "data.npz"
    np.savez(path, **arrays)
    return str(path)


BAD_INPUTS = {
    "missing model": (lambda t, m: [str(t / "absent.onnx")], "does not exist"),
    "not an ONNX file": (_not_onnx, "is not an ONNX model"),
    "static without calibration": (
        lambda t, m: [str(m), "--int8", "static"],
        "--int8 static needs --calibration FILE.npz",
    ),
    "calibration with the wrong names": (
        lambda t, m: [str(m), "--calibration", _npz(t, images=np.zeros((2, 64), np.float32))],
        "does not match the model's inputs ['x']: missing ['x']; unexpected ['images']",
    ),
    "calibration with the wrong shape": (
        lambda t, m: [str(m), "--calibration", _npz(t, x=np.zeros((2, 63), np.float32))],
        "array 'x' has shape [2, 63], the model's input has [-1, 64]",
    ),
    "calibration of the wrong kind": (
        lambda t, m: [str(m), "--calibration", _npz(t, x=np.zeros((2, 64), np.int64))],
        "array 'x' holds int64, the model's input is FP32",
    ),
    "calibration with no rows": (
        lambda t, m: [str(m), "--calibration", _npz(t, x=np.zeros((0, 64), np.float32))],
        "has no rows",
    ),
    "calibration that is no npz": (
        lambda t, m: [str(m), "--calibration", str(m)],
        "cannot be read as .npz",
    ),
    "eval inputs that are one .npy array": (
        lambda t, m: [str(m), "--eval-inputs", _npy(t)],
        "is a single array: save one array per input with np.savez",
    ),
    "output dir under a file": (
        lambda t, m: [str(m), "--out-dir", str(m / "variants")],
        "is not writable",
    ),
    "batch sizes": (lambda t, m: [str(m), "--batches", "0,8"], "--batches '0,8'"),
}


def _npy(tmp: Path) -> str:
    path = tmp / "x.npy"
    np.save(path, np.zeros((2, 64), np.float32))
    return str(path)


class TestBadInput:
    @pytest.mark.parametrize("case", list(BAD_INPUTS))
    def test_one_line_exit_2_nothing_written(
        self, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.mlp(tmp_path / "mlp.onnx")
        make_args, message = BAD_INPUTS[case]
        args = make_args(tmp_path, model)
        before = sorted(tmp_path.iterdir())
        code, out, err = optimize(capsys, *args, *FAST)
        assert code == 2, (out, err)
        assert err.count("\n") == 1, err
        assert err.startswith("batchpilot optimize: error: ")
        assert message in err
        assert sorted(tmp_path.iterdir()) == before

    def test_fp16_of_a_model_without_float_weights(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.variable_length(tmp_path / "sum.onnx")
        code, _, err = optimize(capsys, str(model), "--fp16", *FAST)
        assert code == 2
        assert "fp16: the model has no FP32 weights" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sum.onnx"]

    def test_nothing_that_can_be_made(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.variable_length(tmp_path / "sum.onnx")
        code, _, err = optimize(capsys, str(model), *FAST)
        assert code == 2
        assert "no variant can be made: fp16 (fp16): the model has no FP32 weights" in err

    def test_all_or_nothing_when_one_asked_for_variant_fails(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # FP16 of multi_io works, INT8 does not: neither file is left behind.
        model = onnx_models.multi_io(tmp_path / "multi_io.onnx")
        code, _, err = optimize(capsys, str(model), "--fp16", "--int8", "dynamic", *FAST)
        assert code == 2
        assert "int8: nothing in the model can be quantized to INT8" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["multi_io.onnx"]

    def test_a_model_that_cannot_be_batched(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = onnx_models.fixed_batch(tmp_path / "fixed.onnx")
        code, _, err = optimize(capsys, str(model), *FAST)
        assert code == 2
        assert "dimension 0 must be a dynamic batch axis" in err


# --- The pure parts ---------------------------------------------------------------------------


class TestPlan:
    @pytest.mark.parametrize(
        ("fp16", "int8", "calibration", "expected"),
        [
            (False, None, None, [("fp16", "fp16", False), ("int8", "int8-dynamic", False)]),
            (False, None, "c.npz", [("fp16", "fp16", False), ("int8", "int8-static", False)]),
            (True, None, None, [("fp16", "fp16", True)]),
            (False, "dynamic", "c.npz", [("int8", "int8-dynamic", True)]),
            (True, "static", "c.npz", [("fp16", "fp16", True), ("int8", "int8-static", True)]),
        ],
    )
    def test_jobs_from_flags(
        self,
        fp16: bool,
        int8: Any,
        calibration: str | None,
        expected: list[tuple[str, str, bool]],
    ) -> None:
        jobs = plan_jobs(
            Path("/m/net.onnx"),
            fp16=fp16,
            int8=int8,
            calibration=Path(calibration) if calibration else None,
            out_dir=None,
        )
        assert [(j.variant, j.method, j.explicit) for j in jobs] == expected
        assert all(j.target == Path(f"/m/net.{j.variant}.onnx") for j in jobs)

    def test_out_dir_moves_the_targets(self) -> None:
        [job] = plan_jobs(
            Path("/m/net.onnx"), fp16=True, int8=None, calibration=None, out_dir=Path("/o")
        )
        assert job == Job("fp16", "fp16", Path("/o/net.fp16.onnx"), True)

    def test_static_needs_calibration(self) -> None:
        with pytest.raises(OptimizeError, match="--int8 static needs --calibration"):
            plan_jobs(Path("m.onnx"), fp16=False, int8="static", calibration=None, out_dir=None)

    def test_arrays_are_cast_within_their_kind_only(self) -> None:
        specs = [TensorSpec("x", "FP32", (-1, 3)), TensorSpec("ids", "INT64", (-1, -1))]
        out = check_arrays(
            {"x": np.ones((2, 3)), "ids": np.ones((2, 7), np.int32)}, specs, source="data"
        )
        assert (out["x"].dtype, out["ids"].dtype) == (np.float32, np.int64)
        with pytest.raises(OptimizeError, match="'ids' has 3 rows, the others have 2"):
            check_arrays(
                {"x": np.ones((2, 3)), "ids": np.ones((3, 7), np.int64)}, specs, source="data"
            )

    def test_random_inputs_and_wrapped_rows(self) -> None:
        specs = [TensorSpec("x", "FP32", (-1, 2, -1)), TensorSpec("n", "INT32", (-1,))]
        rows = random_inputs(specs, rows=3)
        assert rows["x"].shape == (3, 2, 1)
        assert rows["x"].dtype == np.float32
        assert rows["n"].dtype == np.int32
        assert np.array_equal(take_rows(rows, 2, 4)["n"], rows["n"][[2, 0, 1, 2]])

    def test_missing_variant_names_the_file_and_the_command(self) -> None:
        message = missing_variant_message(Path("/models/net.onnx"), "int8")
        assert "looked for /models/net.int8.onnx" in message
        assert "`batchpilot optimize /models/net.onnx --int8 dynamic`" in message
        assert variant_path(Path("/m/a.onnx"), "original") == Path("/m/a.onnx")


class TestCompare:
    def test_top1_only_for_class_scores(self) -> None:
        ref = {"scores": np.array([[0.1, 0.9], [0.8, 0.2]]), "value": np.array([[1.0], [2.0]])}
        got = {"scores": np.array([[0.2, 0.8], [0.4, 0.6]]), "value": np.array([[1.5], [2.0]])}
        scores, value = compare_outputs(ref, got)
        assert scores.top1_agreement == 0.5  # row 0 agrees, row 1 flips
        assert scores.max_abs_diff == pytest.approx(0.4)
        assert value.top1_agreement is None
        assert (value.max_abs_diff, value.mean_abs_diff) == (0.5, 0.25)
        assert not looks_like_class_scores(np.zeros((2, 1), np.float32))
        assert not looks_like_class_scores(np.zeros((2, 4), np.int64))
