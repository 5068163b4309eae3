"""`GET /metrics`'s text, byte for byte what prometheus_client's `generate_latest` writes, at a
fraction of its cost.

`generate_latest` checks and escapes every label name and value of every line on every scrape:
about 5 ms for a runtime's ~250 lines, spent on the event loop that serves inference, so each
scrape stalls the requests in flight by that much (and a process serving many pods, such as the
sandbox's pod host, spends most of its CPU on it). The lines' label sets hardly ever change, so
`Exposition` remembers each one's rendered `name{labels} ` prefix and only formats the value.
The escaping is prometheus_client's own functions', and a test compares the two outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

from prometheus_client import utils as _utils
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
_PROMETHEUS_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
_NAME_SUFFIX = {"counter": "_total", "info": "_info"}
_value = cast(Callable[[float], str], _utils.floatToGoString)
"""Values as Go's strconv writes them (1, 0.5, +Inf, NaN), as prometheus_client writes them."""
MAX_REMEMBERED = 20_000
"""Label sets remembered at most (a runtime has a few hundred); beyond, the memory starts over."""


class Exposition:
    """`render()`: the registry's samples in the Prometheus text format (version 0.0.4)."""

    def __init__(self, registry: Collector) -> None:
        self._registry = registry
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def render(self) -> bytes:
        output: list[str] = []
        for metric in self._registry.collect():
            mname = metric.name + _NAME_SUFFIX.get(metric.type, "")
            mtype = _PROMETHEUS_TYPES.get(metric.type, metric.type)
            if mtype == "unknown":
                mtype = "untyped"
            help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            output.append(f"# HELP {_name(mname)} {help_text}\n")
            output.append(f"# TYPE {_name(mname)} {mtype}\n")
            extra: dict[str, list[str]] = {}
            line = self._line
            for sample in metric.samples:
                if sample.name.endswith(_OPENMETRICS_SUFFIXES):
                    suffix = sample.name.removeprefix(metric.name)
                    if suffix in _OPENMETRICS_SUFFIXES:
                        extra.setdefault(suffix, []).append(line(sample))
                        continue
                output.append(line(sample))
            for suffix, lines in sorted(extra.items()):
                output.append(f"# HELP {_name(metric.name + suffix)} {help_text}\n")
                output.append(f"# TYPE {_name(metric.name + suffix)} gauge\n")
                output.extend(lines)
        return "".join(output).encode("utf-8")

    def _line(self, sample: Sample) -> str:
        key = (sample.name, tuple(sample.labels.items()))
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= MAX_REMEMBERED:
                self._prefixes.clear()
            prefix = self._prefixes[key] = _prefix(sample.name, sorted(key[1]))
        if sample.timestamp is None:
            return f"{prefix}{_value(sample.value)}\n"
        millis = int(float(sample.timestamp) * 1000)
        return f"{prefix}{_value(sample.value)} {millis:d}\n"


def _name(name: str) -> str:
    return str(openmetrics.escape_metric_name(name, openmetrics.UNDERSCORES))


def _prefix(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """`name{k="v",...} `, escaped as `generate_latest` escapes (label values keep UTF-8)."""
    text = ",".join(
        f'{openmetrics.escape_label_name(k, openmetrics.UNDERSCORES)}="{_label_value(v)}"'
        for k, v in labels
    )
    return f"{_name(name)}{{{text}}} " if text else f"{_name(name)} "


def _label_value(value: str) -> str:
    """A label value as the text format writes it: UTF-8 kept, `\\`, newline and `"` escaped."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
