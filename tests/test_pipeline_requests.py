"""A pipeline server's requests, against a real `batchpilot runtime serve` process with an image
preprocess on the simulated accelerator: a request is bounded by what its preprocess would make
of it before anything is decoded or allocated, and the arrival metrics add up as the README
defines them, whatever the preprocess refuses or the deadline cuts short."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from PIL import Image

from tests.runtime_process import Reply, RuntimeProcess, Scrape, runtime_process, send

MODEL = "image"
INFER = f"/v2/models/{MODEL}/infer"
MAX_BATCH = 4
MAX_BODY_BYTES = 1 << 20
ROW_BYTES = 3 * 224 * 224 * 4  # one preprocessed row: FP32 [3, 224, 224], 602112 bytes
# a request may make a batch's rows (4), or what --max-body-bytes holds (1 row): 4 rows
MAX_ROWS = max(MAX_BATCH, MAX_BODY_BYTES // ROW_BYTES)


@pytest.fixture(scope="module")
def server(image_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    folder = tmp_path_factory.mktemp("pipeline-requests")
    config = folder / "pipeline.json"
    config.write_bytes(
        orjson.dumps({"preprocess": {"image": {"input": "images", "resize": "stretch"}}})
    )
    with runtime_process(
        image_model,
        "--engine",
        "simulated",
        "--pipeline-config",
        str(config),
        "--max-batch-size",
        str(MAX_BATCH),
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        log_dir=folder,
    ) as running:
        yield running


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()  # 69 bytes


def images(
    server: RuntimeProcess, elements: list[bytes], *, timeout_us: int | None = None
) -> Reply:
    """The elements as one binary BYTES input, shape [len(elements)]."""
    blob = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    doc: dict[str, object] = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [len(elements)],
                "parameters": {"binary_data_size": len(blob)},
            }
        ]
    }
    if timeout_us is not None:
        doc["parameters"] = {"timeout": timeout_us}
    header = orjson.dumps(doc)
    return send(
        server, "POST", INFER, header + blob, {"Inference-Header-Content-Length": str(len(header))}
    )


def peak_rss_bytes(server: RuntimeProcess) -> int:
    """The process's resident memory high-water mark (VmHWM)."""
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


class TestRowsAreBoundedBeforeDecoding:
    def test_the_rows_of_a_batch_are_served(self, server: RuntimeProcess) -> None:
        reply = images(server, [png()] * MAX_ROWS)
        assert reply.status == 200, reply.body
        assert reply.json()["outputs"][0]["shape"] == [MAX_ROWS, 1000]

    @pytest.mark.parametrize(
        "elements",
        [
            pytest.param([png()] * (MAX_ROWS + 1), id="one-row-too-many"),
            # 142 kB on the wire, 1.2 GB preprocessed
            pytest.param([png()] * 2000, id="2000-tiny-images"),
            # 400 kB on the wire, 56 GiB preprocessed: refused before row 0 is found empty
            pytest.param([b""] * 100_000, id="100000-empty-elements"),
        ],
    )
    def test_more_is_413_naming_the_limit_and_allocates_nothing(
        self, server: RuntimeProcess, elements: list[bytes]
    ) -> None:
        peak = peak_rss_bytes(server)
        reply = images(server, elements)
        assert reply.status == 413, reply.body
        assert reply.json()["error"] == (
            f"the request has {len(elements)} rows; this pipeline takes at most {MAX_ROWS} per "
            f"request: each row preprocesses to {ROW_BYTES} bytes, and a request may make no more "
            f"than the largest batch the server runs ({MAX_BATCH} rows) or --max-body-bytes "
            f"({MAX_BODY_BYTES} bytes), whichever is more"
        )
        # nothing like the preprocessed tensor was allocated (2000 rows: 1.2 GB)
        assert peak_rss_bytes(server) - peak < 64 * 1024 * 1024
        assert "Traceback" not in server.log()
        assert images(server, [png()]).status == 200


def arrival_counts(server: RuntimeProcess) -> dict[str, float]:
    scrape = Scrape(server)
    counts = {
        "arrivals": scrape.value("batchpilot_arrivals_total"),
        "admitted": scrape.value("batchpilot_admitted_total"),
    }
    for reason in ("predicted_late", "queue_full", "draining", "expired"):
        counts[reason] = scrape.value("batchpilot_shed_total", reason=reason)
    for outcome in ("success", "invalid", "timeout"):
        counts[outcome] = scrape.value("batchpilot_requests_total", outcome=outcome)
    return counts


def test_the_arrival_metrics_add_up_as_the_readme_defines_them(server: RuntimeProcess) -> None:
    before = arrival_counts(server)
    assert images(server, [png()]).status == 200
    assert images(server, [b"not an image"]).status == 400  # refused by the preprocess
    assert images(server, [png(), b""]).status == 400
    assert images(server, [png()] * (MAX_ROWS + 1)).status == 413
    # a deadline of 1 µs, shorter than any batch the server has run: refused for good, before
    # anything is preprocessed (one that passes while preprocessing: test_pipeline_deadline)
    too_short = images(server, [png()], timeout_us=1)
    assert too_short.status == 400, too_short.body
    assert "shorter than any batch this server has run" in too_short.json()["error"]
    after = arrival_counts(server)
    grew = {name: after[name] - before[name] for name in after}
    # an invalid request is no arrival, as on a server without a pipeline
    assert grew["invalid"] == 4
    assert grew["arrivals"] == 1
    # arrivals = admitted + predicted_late + queue_full + draining
    assert grew["arrivals"] == (
        grew["admitted"] + grew["predicted_late"] + grew["queue_full"] + grew["draining"]
    )
    assert grew["admitted"] == grew["success"] == 1
    assert grew["expired"] == grew["timeout"] == 0
    assert after["arrivals"] == (
        after["admitted"] + after["predicted_late"] + after["queue_full"] + after["draining"]
    )
