"""The benchmark's verdict: the machine, the aims met or not, and the table a person reads.

Everything here reads the results document that `run.py` writes to JSON, so the table can never
say something the JSON does not.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from cpu_meter import load_average

# The issue's aims; "added latency" is an upper bound, the others lower bounds.
AIM_CLASSIFIER_B_OVER_A = 0.9
AIM_MLP_B_OVER_D = 1.5
AIM_E_OVER_THEORY = 0.95
AIM_ADDED_LATENCY_MS = 1.0

DISTURBED_CORES = 0.25
"""Other processes using more than this during a measurement make it suspect."""


def machine() -> dict[str, Any]:
    model_name = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model_name,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "load_average_at_start": load_average(),
    }


def aims(results: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def aim(
        name: str, value: float | None, target: float, *, below: bool = False, note: str = ""
    ) -> None:
        met = value is not None and (value < target if below else value >= target)
        found.append(
            {
                "aim": name,
                "value": value,
                "target": f"{'<' if below else '>='} {target:g}",
                "met": met,
                "note": note,
            }
        )

    models = results["models"]
    for key, model in models.items():
        if key.startswith("classifier"):
            aim(
                f"b/a on the classifier, {model['intra_op_threads']} intra-op thread(s)",
                model["ratios"]["b/a"],
                AIM_CLASSIFIER_B_OVER_A,
            )
    if "mlp" in models:
        aim("b/d on the MLP", models["mlp"]["ratios"]["b/d"], AIM_MLP_B_OVER_D)
        added = (models["mlp"].get("added_latency") or {}).get("added_p50_ms")
        aim("added latency at P50, ms (MLP)", added, AIM_ADDED_LATENCY_MS, below=True)
    if "simulated" in results:
        sim = results["simulated"]
        ceiling = sim["ideal/theory"]
        note = (
            f"out of reach of any server here: a zero-overhead one reaches {ceiling:.2f}"
            if ceiling < AIM_E_OVER_THEORY
            else ""
        )
        aim("e/theory (simulated accelerator)", sim["e/theory"], AIM_E_OVER_THEORY, note=note)
    return found


def worst_others(model: dict[str, Any]) -> float | None:
    """The most CPU other processes took during any measurement behind a model's numbers."""
    values = [p["others_cores"] for p in model["raw"]]
    values += [model[k]["search"]["worst_others_cores"] for k in ("b", "c", "d") if k in model]
    if "added_latency" in model:
        values.append(model["added_latency"]["others_cores"])
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def _mean_rows(entry: dict[str, Any]) -> float | None:
    stats = entry["server"].get("batches") or {}
    value: float | None = stats.get("mean_rows_per_batch")
    return value


def table(results: dict[str, Any]) -> str:
    m = results["machine"]
    s = results["settings"]
    lines = [
        "",
        f"batchpilot bench: {m['cpu_count']} CPUs ({m['cpu_model']}), onnxruntime "
        f"{m['onnxruntime']}, intra-op threads {s['intra_op_threads']} (unless a column says "
        f"otherwise), SLA P99 <= "
        f"{s['sla_ms']:g} ms, 1 row per request, load driver '{s['driver']}', {s['mode']} run",
        "",
    ]
    models = results["models"]
    names = list(models)
    if names:
        width = 14
        lines.append(f"{'':40}" + "".join(f"{n:>{width}}" for n in names))

        def row(title: str, values: list[str]) -> None:
            lines.append(f"{title:40}" + "".join(f"{v:>{width}}" for v in values))

        for b in s["raw_batches"]:
            row(
                f"(a) raw session.run batch {b:>2}, rows/s",
                [
                    _num(next(p["rows_per_s"] for p in models[n]["raw"] if p["batch"] == b))
                    for n in names
                ],
            )
        row(
            "(a) the limit (best batch), rows/s",
            [_num(models[n]["a"]["rows_per_s"]) for n in names],
        )
        batching = s["server_batching"]
        row(
            f"(b) server, max batch {batching['max_batch_size']}, "
            f"{batching['max_queue_delay_ms']:g} ms: QPS",
            [_num(models[n]["b"]["qps"]) for n in names],
        )
        row("(c) server, max batch 1: QPS", [_num(models[n]["c"]["qps"]) for n in names])
        row("(d) plain FastAPI: QPS", [_num(models[n]["d"]["qps"]) for n in names])
        row(
            "    (b) P99 at its best rate, ms",
            [_num(models[n]["b"]["p99_ms"], ".1f") for n in names],
        )
        row("    (b) mean rows per batch", [_num(_mean_rows(models[n]["b"]), ".1f") for n in names])
        for ratio in ("b/a", "b/d", "c/d"):
            row(f"    {ratio}", [_num(models[n]["ratios"][ratio], ".3g") for n in names])
        row(
            "other processes, cores (worst)",
            [_num(worst_others(models[n]), ".2f") for n in names],
        )
        al = models.get("mlp", {}).get("added_latency")
        if al:
            lines += [
                "",
                "added latency at P50 (MLP; one request at a time; max queue delay 0):",
                f"  server {al['added_p50_ms']:.3f} ms = infer P50 "
                f"{al['server']['infer']['p50_ms']:.3f} ms - raw session.run P50 "
                f"{al['raw_session_run_p50_ms']:.3f} ms"
                f" (infer P99 {al['server']['infer']['p99_ms']:.3f} ms)",
                f"  plain FastAPI {al['plain_added_p50_ms']:.3f} ms; HTTP floor (GET "
                f"/v2/health/live P50, client included) {al['server']['health_live']['p50_ms']:.3f}"
                f" ms; server infer path beyond that floor {al['beyond_http_floor_p50_ms']:.3f} ms",
            ]
    if "simulated" in results:
        sim = results["simulated"]
        e = sim["e"]
        lines += [
            "",
            f"(e) simulated accelerator, t(b) = {sim['alpha_ms']:g} ms + {sim['beta_ms']:g} ms x b,"
            f" max batch {sim['max_batch_size']}, {sim['max_queue_delay_ms']:g} ms delay:",
            f"  theory {sim['theory_qps']:,.0f} QPS (b = {sim['theory_batch']}); server "
            f"{_num(e['qps'])} QPS (P99 {_num(e['p99_ms'], '.1f')} ms, mean rows per batch "
            f"{_num(_mean_rows(e), '.1f')}); e/theory {_num(sim['e/theory'], '.2f')}; other "
            f"processes {_num(e['search']['worst_others_cores'], '.2f')} cores (worst)",
            f"  a zero-overhead server with the same batching keeps P99 <= {s['sla_ms']:g} ms up "
            f"to {sim['ideal_within_sla_qps']:,.0f} QPS ({sim['ideal/theory']:.2f} x theory): "
            f"e/ideal {_num(sim['e/ideal'], '.2f')}",
        ]
        if "e_by_instances" in sim:
            lines.append(
                "  by model instances (sharing the one device): "
                + "; ".join(
                    f"{n}: {_num(e['qps'])} QPS, e/theory {_num(e['e/theory'], '.2f')}"
                    for n, e in sim["e_by_instances"].items()
                )
                + f" (the best, {sim['e_instances']}, is e above)"
            )
    lines += ["", "aims:"]
    for a in results["aims"]:
        mark = "met" if a["met"] else "NOT MET"
        note = f" ({a['note']})" if a["note"] else ""
        lines.append(f"  [{mark}] {a['aim']} {a['target']}: {_num(a['value'], '.3f')}{note}")
    quiet = results["quiet"]
    lines.append(
        f"\nother processes: measurements repeated {quiet['repeated_measurements']}, kept though "
        f"disturbed {quiet['disturbed_measurements_kept']}, waited {quiet['waited_s']:.0f} s for "
        f"quiet; {results['elapsed_s']:.0f} s in all"
    )
    return "\n".join(lines)
