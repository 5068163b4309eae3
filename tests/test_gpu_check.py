"""The GPU check (`make gpu-check`, batchpilot.gpucheck) runs end to end on the CPU with a tiny
model, so that it cannot rot between the rare runs on a GPU; its arithmetic is checked with
numbers. On a machine with CUDA the GPU-marked test runs it there too.

No onnx and no shared conftest fixtures: `make gpu-check` runs the GPU tests here on a machine
with PyTorch and without onnx (`pytest --noconftest -m gpu`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

from batchpilot.gpucheck.check import Plan, run_check  # noqa: E402
from batchpilot.gpucheck.serving import Sample, Scrape, histogram_quantile  # noqa: E402
from batchpilot.gpucheck.timing import least_squares  # noqa: E402


class TestArithmetic:
    def test_the_line_through_exact_points_is_found(self) -> None:
        line = least_squares([(b, 0.002 + 0.0005 * b, 1.0) for b in (1, 2, 4, 8)])
        assert line is not None
        assert line.alpha_s == pytest.approx(0.002)
        assert line.beta_s == pytest.approx(0.0005)
        assert least_squares([(4, 0.004, 3.0)]) is None  # one batch size: no line

    def test_histogram_quantile_interpolates_inside_the_bucket_of_the_increase(self) -> None:
        def scrape(counts: dict[str, float]) -> Scrape:
            return Scrape([Sample("h_bucket", {"le": le}, c) for le, c in counts.items()], at=0.0)

        before = scrape({"0.01": 5, "0.02": 5, "+Inf": 5})
        after = scrape({"0.01": 55, "0.02": 105, "+Inf": 105})
        # 100 new: 50 below 10 ms, 50 between 10 and 20 ms; the 99th lies at 49/50 of the second
        assert histogram_quantile(0.99, before, after, "h") == pytest.approx(0.0198)
        assert histogram_quantile(0.5, before, after, "h") == pytest.approx(0.01)
        assert histogram_quantile(0.99, before, before, "h") is None


def _check_results(results: dict, out: Path) -> None:  # type: ignore[type-arg]
    assert json.loads((out / "results.json").read_text())["model"] == results["model"]
    assert (out / "gpu-check.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert [d["batch"] for d in results["direct_timing"]] == list(Plan.quick().batches)
    assert results["t_of_b"]["direct"]["beta_ms"] > 0
    assert results["t_of_b"]["startup"] is not None  # two sizes timed at start-up: a line
    for label in ("batch1", "dynamic"):
        configuration = results["configurations"][label]
        assert configuration["probes"], label
        steady = configuration["steady"]
        assert steady["server"]["qps"] > 0, label
        assert steady["utilization"]["busy_counter"] > 0, label
        assert configuration["runtime_compute"], label
    assert results["configurations"]["batch1"]["max_batch_size"] == 1
    assert {p["bucket"] for p in results["configurations"]["batch1"]["runtime_compute"]} == {1}
    dynamic = results["configurations"]["dynamic"]
    server = dynamic["steady"]["server"]
    # the start-up timing, 1 row and the batch limit, beside the direct timing
    assert [p["rows"] for p in server["startup"]] == [1, min(dynamic["max_batch_size"], 64)]
    assert all(p["seconds"] > 0 for p in server["startup"])
    assert server["outside_s"] is not None
    assert 0 <= server["outside_s"] < server["p99_s"]
    decision = results["autopilot"]["decision"]
    assert decision["action"] in {"hold", "steady", "scale-up", "scale-down", "retune"}
    assert decision["metrics_available"]


@pytest.mark.timeout(240)
def test_the_check_runs_end_to_end_on_the_cpu_with_a_tiny_model(tmp_path: Path) -> None:
    results = run_check(
        tmp_path, plan=Plan.quick(), model_kind="tiny", device="cpu", intra_op_threads=1
    )
    _check_results(results, tmp_path)
    assert not results["on_gpu"]
    assert results["notes"][0].startswith("NO GPU")
    assert results["configurations"]["dynamic"]["steady"]["utilization"]["nvml"] is None


@pytest.mark.gpu
@pytest.mark.timeout(240)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to PyTorch")
def test_the_check_runs_on_the_gpu_and_reads_nvml(tmp_path: Path) -> None:
    results = run_check(tmp_path, plan=Plan.quick(), model_kind="tiny", device="gpu")
    _check_results(results, tmp_path)
    assert results["on_gpu"]
    assert results["configurations"]["dynamic"]["steady"]["utilization"]["nvml"] is not None
