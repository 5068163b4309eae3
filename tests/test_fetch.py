"""`batchpilot runtime fetch`: the init container that copies http(s) models into the pod."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchpilot.runtime.cli import main
from batchpilot.runtime.fetch import fetch


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        thread.join()


def test_copies_a_model_over_http(http_dir: tuple[str, Path], tmp_path: Path) -> None:
    url, root = http_dir
    (root / "m.onnx").write_bytes(b"onnx" * 1000)
    dest = tmp_path / "models" / "model.onnx"
    assert fetch(f"{url}/m.onnx", dest) == 4000
    assert dest.read_bytes() == b"onnx" * 1000
    assert [p.name for p in dest.parent.iterdir()] == ["model.onnx"]  # no temporary left


def test_an_http_error_fails_and_leaves_nothing(
    http_dir: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = http_dir
    dest = tmp_path / "models" / "model.onnx"
    assert main(["runtime", "fetch", f"{url}/missing.onnx", str(dest)]) == 1
    assert "404" in capsys.readouterr().err
    assert list(dest.parent.iterdir()) == []


def test_refuses_schemes_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only http"):
        fetch("s3://bucket/key", tmp_path / "m.onnx")
