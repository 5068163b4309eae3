"""Shared fixtures: test models built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import onnx_models


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def mlp_model(model_dir: Path) -> Path:
    return onnx_models.mlp(model_dir / "mlp.onnx")


@pytest.fixture(scope="session")
def multi_io_model(model_dir: Path) -> Path:
    return onnx_models.multi_io(model_dir / "multi_io.onnx")


@pytest.fixture(scope="session")
def variable_length_model(model_dir: Path) -> Path:
    return onnx_models.variable_length(model_dir / "variable_length.onnx")


@pytest.fixture(scope="session")
def image_model(model_dir: Path) -> Path:
    return onnx_models.image_signature(model_dir / "image.onnx")


@pytest.fixture(scope="session")
def fixed_batch_model(model_dir: Path) -> Path:
    return onnx_models.fixed_batch(model_dir / "fixed_batch.onnx")
