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

from batchpilot.runtime.metrics import LATENCY_BUCKETS
from cpu_meter import load_average

# The issue's aims; "added latency" is an upper bound, the others lower bounds.
AIM_CLASSIFIER_B_OVER_A = 0.9
AIM_MLP_B_OVER_D = 1.5
AIM_E_OVER_THEORY = 0.95
AIM_ADDED_LATENCY_MS = 1.0
AIM_OVERLOAD_GOODPUT = 0.9
"""Overload, deadline admission: answers within the SLA per second, as a fraction of capacity."""
AIM_REFUSAL_P99_MS = 5.0
"""Overload, deadline admission: a refused request is answered within this, at P99."""
AIM_CASE_MAX_RATIO = 1.0
"""Classifier case: batchpilot's highest QPS within the SLA against the plain endpoint's."""
AIM_CASE_GOODPUT = 0.9
"""Classifier case at twice the plain endpoint's max: batchpilot's goodput over its own max."""

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
        name: str,
        value: float | None,
        target: float,
        *,
        below: bool = False,
        at_most: bool = False,
        note: str = "",
        invalid: str | None = None,
    ) -> None:
        """`invalid`: the run behind the value is not a result (why); never met then."""
        if at_most:
            met, sign = value is not None and value <= target, "<="
        elif below:
            met, sign = value is not None and value < target, "<"
        else:
            met, sign = value is not None and value >= target, ">="
        found.append(
            {
                "aim": name,
                "value": value,
                "target": f"{sign} {target:g}",
                "met": met and invalid is None,
                "note": note,
                "invalid": invalid,
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
    if "overload" in results:
        over = results["overload"]
        for cell in over["cells"].values():
            if cell["admission"] != "deadline":
                continue
            where = f"overload {cell['level']:g}x capacity, deadline admission"
            invalid = None if cell["valid"] else cell["invalid_reason"]
            aim(
                f"{where}: admitted P99, ms",
                cell["admitted_p99_ms"],
                over["sla_ms"],
                at_most=True,
                invalid=invalid,
            )
            aim(
                f"{where}: goodput / capacity",
                cell["goodput/capacity"],
                AIM_OVERLOAD_GOODPUT,
                invalid=invalid,
            )
            aim(
                f"{where}: refusals answered, P99 ms",
                cell["refusal_p99_ms"],
                AIM_REFUSAL_P99_MS,
                below=True,
                invalid=invalid,
            )
            # The same two in the server, to its histogram's bucket edges: the client's share
            # of the two above is the difference.
            aim(
                f"{where}: admitted P99 in the server, ms (bucket edge)",
                cell.get("server_admitted_p99_le_ms"),
                # the latency histogram's edges are 15 % apart: the first edge at or above the SLA
                min(
                    (b * 1e3 for b in LATENCY_BUCKETS if b * 1e3 >= over["sla_ms"]),
                    default=float("inf"),
                ),
                at_most=True,
                invalid=invalid,
            )
            aim(
                f"{where}: refusals in the server, P99 ms (bucket edge)",
                cell.get("server_refusal_p99_le_ms"),
                AIM_REFUSAL_P99_MS,
                below=True,
                invalid=invalid,
            )
    if "classifier_case" in results:
        case = results["classifier_case"]
        aim(
            "classifier case: batchpilot / plain FastAPI, highest QPS at P99 <= SLA",
            case["max_ratio"],
            AIM_CASE_MAX_RATIO,
        )
        if "max_ratio_2_instances" in case:
            aim(
                "classifier case: batchpilot with 2 instances (both cores, as the plain "
                "endpoint's thread pool) / plain FastAPI, highest QPS at P99 <= SLA",
                case["max_ratio_2_instances"],
                AIM_CASE_MAX_RATIO,
            )
        ours = (case.get("overload") or {}).get("batchpilot")
        note = case.get("overload_skipped", "")
        if ours:
            note = (
                f"its own max {_num(case['batchpilot_max']['qps'])} QPS; goodput / the plain "
                f"endpoint's max {_num(ours['goodput/plain_max'], '.2f')}"
            )
        aim(
            f"classifier case at {case['overload_factor']:g}x the plain endpoint's max: "
            "batchpilot goodput / its own max",
            ours["goodput/own_max"] if ours else None,
            AIM_CASE_GOODPUT,
            invalid=None if ours is None or ours["valid"] else ours["invalid_reason"],
            note=note,
        )
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
    if "overload" in results:
        lines += overload_lines(results["overload"])
    if "classifier_case" in results:
        lines += classifier_case_lines(results["classifier_case"])
    lines += ["", "aims:"]
    for a in results["aims"]:
        mark = "met" if a["met"] else "NOT MET"
        note = f" ({a['note']})" if a["note"] else ""
        if a.get("invalid"):
            # the table above gives the whole reason; here its first clause
            mark, note = "INVALID", f" (not a result: {a['invalid'].split(' (')[0]})"
        lines.append(f"  [{mark}] {a['aim']} {a['target']}: {_num(a['value'], '.3f')}{note}")
    quiet = results["quiet"]
    lines.append(
        f"\nother processes: measurements repeated {quiet['repeated_measurements']}, kept though "
        f"disturbed {quiet['disturbed_measurements_kept']}, waited {quiet['waited_s']:.0f} s for "
        f"quiet; {results['elapsed_s']:.0f} s in all"
    )
    return "\n".join(lines)


def _cell_columns(cell: dict[str, Any], reference_rps: float | None) -> list[str]:
    """offered, admitted P99 from the scheduled and from the actual send, goodput, its fraction
    of `reference_rps`, refusal P99, 200, 503, 504, other errors, send lag P99, other processes'
    cores."""
    status = cell["status"]
    other = sum(status["other"].values())
    cpu = cell.get("cpu") or {}
    goodput = cell["goodput_rps"]
    if cell["valid"]:
        measured = [
            _num(cell["admitted_p99_ms"], ".1f"),
            _num(cell["service_p99_ms"], ".1f"),
            _num(goodput),
            _num(goodput / reference_rps if goodput is not None and reference_rps else None, ".2f"),
            _num(cell["refusal_p99_ms"], ".1f"),
        ]
    else:
        measured = ["INVALID", "-", "-", "-", "-"]
    return [
        _num(cell["offered_rps"]),
        *measured,
        _num(status["200"], ",d"),
        _num(status["503"], ",d"),
        _num(status["504"], ",d"),
        _num(other, ",d"),
        _num(cell["send_lag_p99_ms"], ".1f"),
        _num(cpu.get("others_cores"), ".2f"),
    ]


_CELL_HEADS = (
    "offered/s", "P99 ms", "(sent)", "goodput/s", "/ref", "refusal P99", "200", "503", "504",
    "other", "lag P99", "others",
)  # fmt: skip
_CELL_WIDTHS = (10, 8, 8, 10, 6, 12, 7, 7, 7, 6, 8, 7)


_SERVER_HEADS = ("arrivals", "admitted", "pred.late", "q.full", "expired", "computed", "busy")
_SERVER_WIDTHS = (9, 9, 10, 7, 8, 9, 6)


def _server_columns(cell: dict[str, Any]) -> list[str]:
    """The server's /metrics over the run: arrivals, admitted, shed predicted late, queue full,
    expired, rows computed, and the fraction of the run the device was busy."""
    server = cell["server"]
    if not server:
        return ["-"] * len(_SERVER_HEADS)
    keys = ("arrivals", "admitted", "shed_predicted_late", "shed_queue_full", "shed_expired")
    wall = (cell.get("cpu") or {}).get("wall_s") or cell["seconds"]
    return [
        *(_num(server.get(k), ",.0f") for k in keys),
        _num(server.get("batch_rows"), ",.0f"),
        _num(server["device_busy_s"] / wall if "device_busy_s" in server else None, ".2f"),
    ]


def _row(values: list[str] | tuple[str, ...], widths: tuple[int, ...]) -> str:
    return "".join(f"{v:>{w}}" for v, w in zip(values, widths, strict=True))


def _invalid_notes(cells: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [
        f"    INVALID {label}: {cell['invalid_reason']}"
        for label, cell in cells
        if not cell["valid"]
    ]


def overload_lines(over: dict[str, Any]) -> list[str]:
    """The overload section: one row per load level and admission mode."""
    capacity = over["capacity_rps"]
    lines = [
        "",
        f"overload (bench/overload.py): simulated accelerator t(b) = {over['alpha_ms']:g} ms + "
        f"{over['beta_ms']:g} ms x b, max batch {over['max_batch_size']}, "
        f"{over['max_queue_delay_ms']:g} ms delay, deadline {over['deadline_ms']:g} ms: capacity "
        f"{capacity:,.0f} rps; open-loop Poisson, {over['seconds_per_run']:g} s per run, SLA "
        f"{over['sla_ms']:g} ms",
        "  P99: admitted (200) requests from the scheduled send, (sent): from the actual send; "
        "goodput: 200s within the SLA per second, /ref = / capacity;",
        "  refusal P99: send to 503; lag: client send lag P99; others: other processes' cores "
        "(cpu_meter); server: its /metrics over the run (computed: rows the device ran; busy: "
        "device busy / run time)",
    ]
    heads = ("load", "admission", *_CELL_HEADS)
    widths = (5, 10, *_CELL_WIDTHS)
    lines.append("  " + _row(heads, widths) + " | server:" + _row(_SERVER_HEADS, _SERVER_WIDTHS))
    labelled = []
    for cell in over["cells"].values():
        lines.append(
            "  "
            + _row(
                [f"{cell['level']:g}x", cell["admission"], *_cell_columns(cell, capacity)], widths
            )
            + " |        "
            + _row(_server_columns(cell), _SERVER_WIDTHS)
        )
        labelled.append((f"{cell['level']:g}x {cell['admission']}", cell))
    lines += _invalid_notes(labelled)
    lines.append(
        f"  aims (deadline admission): admitted P99 <= {over['sla_ms']:g} ms, goodput >= "
        f"{AIM_OVERLOAD_GOODPUT:g} x capacity, refusals P99 < {AIM_REFUSAL_P99_MS:g} ms"
    )
    return lines


def classifier_case_lines(case: dict[str, Any]) -> list[str]:
    """The classifier case: highest QPS within the SLA, then both at twice the plain one's."""
    ours, plain = case["batchpilot_max"], case["plain_max"]
    bp = case["batchpilot_settings"]
    lines = [
        "",
        f"classifier case (bench/classifier_case.py): {Path(case['model']).name}, "
        f"{case['session']['intra_op_threads']} intra-op thread(s), SLA P99 <= "
        f"{case['sla_ms']:g} ms; batchpilot max batch {bp['max_batch_size']}, "
        f"{bp['max_queue_delay_ms']:g} ms delay, {bp['admission']} admission, deadline "
        f"{bp['deadline_ms']:g} ms",
        f"  (i) highest QPS at P99 <= SLA: batchpilot {_num(ours['qps'])} (P99 "
        f"{_num(ours['p99_ms'], '.1f')} ms), plain FastAPI {_num(plain['qps'])} (P99 "
        f"{_num(plain['p99_ms'], '.1f')} ms): ratio {_num(case['max_ratio'], '.2f')}; other "
        f"processes up to {_num(ours['search']['worst_others_cores'], '.2f')} / "
        f"{_num(plain['search']['worst_others_cores'], '.2f')} cores",
    ]
    if (two := case.get("batchpilot_2_instances_max")) is not None:
        lines.append(
            f"      batchpilot with 2 instances (one core each, as the plain endpoint's thread "
            f"pool uses both): {_num(two['qps'])} (P99 {_num(two['p99_ms'], '.1f')} ms): ratio "
            f"{_num(case['max_ratio_2_instances'], '.2f')}"
        )
    entries = case.get("overload")
    if not entries:
        lines.append(f"  (ii) not run: {case.get('overload_skipped', '')}")
        return lines
    rate = next(iter(entries.values()))["rate_rps"]
    lines.append(
        f"  (ii) {case['overload_factor']:g}x the plain endpoint's max = {rate:,.0f} rps for "
        f"{case['overload_seconds']:g} s each (client timeout {case['overload_client_timeout_s']:g}"
        " s); /ref = goodput / the server's own highest QPS"
    )
    heads = ("server", *_CELL_HEADS)
    widths = (12, *_CELL_WIDTHS)
    lines.append("  " + _row(heads, widths) + " | server:" + _row(_SERVER_HEADS, _SERVER_WIDTHS))
    own = {"batchpilot": ours["qps"], "plain": plain["qps"]}
    for key, cell in entries.items():
        lines.append(
            "  "
            + _row([key, *_cell_columns(cell, own[key])], widths)
            + " |        "
            + _row(_server_columns(cell), _SERVER_WIDTHS)
        )
    lines += _invalid_notes(list(entries.items()))
    lines.append(
        "  goodput / the plain endpoint's max: "
        + ", ".join(
            f"{k} {_num(c.get('goodput/plain_max'), '.2f') if c['valid'] else 'INVALID'}"
            for k, c in entries.items()
        )
    )
    admission = ours["server"].get("admission")
    if admission:
        lines.append(
            f"  batchpilot over its find-max probes: {_num(admission['arrivals'], ',.0f')} "
            f"arrivals, {_num(admission['shed_predicted_late'], ',.0f')} refused as predicted "
            f"late, {_num(admission['shed_expired'], ',.0f')} expired"
        )
    return lines
