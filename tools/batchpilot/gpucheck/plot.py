"""The check's picture, `gpu-check.png`: t(b) timed directly and from the runtime's counters, the
highest QPS within the SLA at max batch 1 and with dynamic batching, and GPU utilization from
NVML and from the busy counter, side by side.

With matplotlib (the dev extra) the panels are labelled. The GPU machine has no matplotlib, so
without it the same three panels are drawn by a small PNG writer here, unlabelled, in this
order and these colours: t(b) in ms against b (blue: direct timing, orange: the runtime's
buckets, lines their fits); max QPS (grey: batch 1, blue: dynamic); utilization (for batch 1,
then dynamic: blue NVML, orange busy counter). results.json holds every number.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from pathlib import Path
from typing import Any

BLUE = (31, 119, 180)
ORANGE = (255, 127, 14)
GREY = (127, 127, 127)


def _series(results: dict[str, Any]) -> dict[str, Any]:
    direct = [(d["batch"], d["median_s"] * 1e3) for d in results["direct_timing"]]
    runtime = [
        (p["mean_batch"], p["mean_seconds"] * 1e3)
        for p in results["configurations"]["dynamic"]["runtime_compute"]
    ]
    qps = [results["configurations"][c]["max_qps_within_sla"] for c in ("batch1", "dynamic")]
    util = [
        (
            results["configurations"][c]["steady"]["utilization"]["nvml"],
            results["configurations"][c]["steady"]["utilization"]["busy_counter"],
        )
        for c in ("batch1", "dynamic")
    ]
    return {"direct": direct, "runtime": runtime, "qps": qps, "util": util}


def plot(results: dict[str, Any], path: Path) -> str:
    """Writes the PNG; returns "matplotlib" or "builtin" (which renderer drew it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _builtin(_series(results), path)
        return "builtin"
    s = _series(results)
    lines = results["t_of_b"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    where = results["environment"]["gpu"] or "CPU (no GPU)"
    fig.suptitle(f"batchpilot GPU check: {results['model']} on {where}")
    for points, color, label, key in (
        (s["direct"], BLUE, "direct timing", "direct"),
        (s["runtime"], ORANGE, "runtime counters", "runtime_metrics"),
    ):
        rgb = tuple(c / 255 for c in color)
        ax1.plot([b for b, _ in points], [t for _, t in points], "o", color=rgb, label=label)
        line = lines[key]
        if line is not None and points:
            top = max(b for b, _ in points)
            ax1.plot(
                [1, top],
                [line["alpha_ms"] + line["beta_ms"], line["alpha_ms"] + line["beta_ms"] * top],
                "-",
                color=rgb,
                label=f"{line['alpha_ms']:.2f} + {line['beta_ms']:.3f}·b ms",
            )
    ax1.set(xlabel="batch rows b", ylabel="t(b), ms", title="t(b)")
    ax1.legend()
    ax2.bar(["max batch 1", "dynamic batching"], s["qps"], color=["grey", "tab:blue"])
    ax2.set(ylabel="requests/s", title=f"max QPS at P99 ≤ {results['sla_ms']:g} ms")
    xs = [0, 1]
    ax3.bar([x - 0.2 for x in xs], [u[0] or 0 for u in s["util"]], 0.4, label="NVML")
    ax3.bar([x + 0.2 for x in xs], [u[1] or 0 for u in s["util"]], 0.4, label="busy counter")
    ax3.set_xticks(xs, ["max batch 1", "dynamic"])
    ax3.set(ylim=(0, 1.05), ylabel="utilization", title="GPU utilization at max QPS")
    ax3.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "matplotlib"


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        for y in range(min(y0, y1), max(y0, y1) + 1):
            for x in range(min(x0, x1), max(x0, x1) + 1):
                self.dot(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(steps + 1):
            self.dot(x0 + (x1 - x0) * k // steps, y0 + (y1 - y0) * k // steps, color)

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3])
            for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def _builtin(s: dict[str, Any], path: Path) -> None:
    panel, margin, height = 300, 30, 300
    canvas = _Canvas(3 * panel, height)
    for k in range(3):
        x0 = k * panel + margin
        canvas.line(x0, height - margin, x0 + panel - 2 * margin, height - margin, (0, 0, 0))
        canvas.line(x0, margin, x0, height - margin, (0, 0, 0))
    span = panel - 2 * margin
    top_b = max([b for b, _ in s["direct"] + s["runtime"]] or [1])
    top_t = max([t for _, t in s["direct"] + s["runtime"]] or [1]) or 1
    for points, color in ((s["direct"], BLUE), (s["runtime"], ORANGE)):
        placed = [
            (margin + int(b / top_b * span), height - margin - int(t / top_t * span))
            for b, t in points
        ]
        for x, y in placed:
            canvas.rect(x - 2, y - 2, x + 2, y + 2, color)
        for (xa, ya), (xb, yb) in itertools.pairwise(placed):
            canvas.line(xa, ya, xb, yb, color)
    top_q = max(s["qps"]) or 1
    for k, (q, color) in enumerate(zip(s["qps"], (GREY, BLUE), strict=True)):
        x = panel + margin + 30 + k * 110
        canvas.rect(x, height - margin - int(q / top_q * span), x + 70, height - margin, color)
    for k, (nvml, busy) in enumerate(s["util"]):
        x = 2 * panel + margin + 20 + k * 120
        for j, (value, color) in enumerate(((nvml, BLUE), (busy, ORANGE))):
            bar = int(min(value or 0.0, 1.0) * span)
            canvas.rect(x + 45 * j, height - margin - bar, x + 45 * j + 40, height - margin, color)
    path.write_bytes(canvas.png())
