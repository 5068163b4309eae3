"""The JSONPath subset that CRD printer columns and the scale subresource use.

`additionalPrinterColumns[].jsonPath` are kubectl-style JSONPath expressions such as
`.status.conditions[?(@.type=="Ready")].status`, `.spec.scaling.maxReplicas` or
`.metadata.labels['app\\.kubernetes\\.io/name']`. The server evaluates them to fill Table
cells. This module parses those paths once and evaluates them against plain dicts.
Supported: `.name` (with `\\.` escapes), `['name']`, `[n]` (negative too), `[*]`, `.*`, and
filters `[?(@.path)]` / `[?(@.path OP literal)]` with `== != < <= > >=`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class JSONPathError(ValueError):
    """An expression outside the supported subset (or malformed)."""


@dataclass(frozen=True)
class Child:
    name: str


@dataclass(frozen=True)
class Index:
    index: int


@dataclass(frozen=True)
class Wildcard:
    pass


@dataclass(frozen=True)
class Filter:
    path: tuple[Segment, ...]
    operator: str | None  # None: the path merely exists (and is not false/empty)
    literal: Any = None


Segment = Child | Index | Wildcard | Filter

_FILTER = re.compile(
    r"^\s*@(?P<path>[^=!<>]*?)\s*(?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<literal>.+?))?\s*$"
)


def _literal(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise JSONPathError(f"unsupported literal in filter: {text!r}") from None


@functools.lru_cache(maxsize=512)
def parse(expression: str) -> tuple[Segment, ...]:
    """Parse an expression like `.status.conditions[?(@.type=="Ready")].status`."""
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    segments: list[Segment] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char == ".":
            if text.startswith("..", pos):
                raise JSONPathError(f"recursive descent is not supported: {expression!r}")
            pos += 1
            if pos < len(text) and text[pos] == "*":
                segments.append(Wildcard())
                pos += 1
                continue
            name: list[str] = []
            while pos < len(text) and text[pos] not in ".[":
                if text[pos] == "\\" and pos + 1 < len(text):
                    name.append(text[pos + 1])
                    pos += 2
                else:
                    name.append(text[pos])
                    pos += 1
            if not name:
                if pos >= len(text):
                    break  # a lone "." means the object itself
                continue
            segments.append(Child("".join(name)))
        elif char == "[":
            end = _matching_bracket(text, pos, expression)
            inner = text[pos + 1 : end].strip()
            pos = end + 1
            segments.append(_bracket(inner, expression))
        else:
            raise JSONPathError(f"unexpected {char!r} at {pos} in {expression!r}")
    return tuple(segments)


def _matching_bracket(text: str, start: int, expression: str) -> int:
    depth = 0
    quote: str | None = None
    for pos in range(start, len(text)):
        char = text[pos]
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return pos
    raise JSONPathError(f"unclosed '[' in {expression!r}")


def _bracket(inner: str, expression: str) -> Segment:
    if inner == "*":
        return Wildcard()
    if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
        return Child(inner[1:-1])
    if inner.startswith("?(") and inner.endswith(")"):
        found = _FILTER.match(inner[2:-1])
        if found is None:
            raise JSONPathError(f"unsupported filter {inner!r} in {expression!r}")
        path = parse(found.group("path") or "")
        op = found.group("op")
        literal = _literal(found.group("literal")) if op else None
        return Filter(path, op, literal)
    try:
        return Index(int(inner))
    except ValueError:
        raise JSONPathError(f"unsupported subscript [{inner}] in {expression!r}") from None


def _compare(actual: Any, operator: str, literal: Any) -> bool:
    if operator == "==":
        return bool(actual == literal)
    if operator == "!=":
        return bool(actual != literal)
    numeric = (int, float)
    if isinstance(actual, bool) or not isinstance(actual, numeric):
        if not (isinstance(actual, str) and isinstance(literal, str)):
            return False
    elif isinstance(literal, bool) or not isinstance(literal, numeric):
        return False
    match operator:
        case "<":
            return bool(actual < literal)
        case "<=":
            return bool(actual <= literal)
        case ">":
            return bool(actual > literal)
        case ">=":
            return bool(actual >= literal)
    return False  # pragma: no cover - the parser only produces the operators above


def _children(node: Any) -> Sequence[Any]:
    if isinstance(node, Mapping):
        return [node[key] for key in sorted(node)]
    if isinstance(node, list):
        return node
    return []


def _apply(segments: Sequence[Segment], nodes: list[Any]) -> list[Any]:
    for segment in segments:
        found: list[Any] = []
        for node in nodes:
            match segment:
                case Child(name=name):
                    if isinstance(node, Mapping) and name in node:
                        found.append(node[name])
                case Index(index=index):
                    if isinstance(node, list) and -len(node) <= index < len(node):
                        found.append(node[index])
                case Wildcard():
                    found.extend(_children(node))
                case Filter(path=path, operator=operator, literal=literal):
                    for item in _children(node):
                        values = _apply(path, [item])
                        if operator is None:
                            if values and values[0] not in (None, False, "", [], {}):
                                found.append(item)
                        elif values and _compare(values[0], operator, literal):
                            found.append(item)
        nodes = found
    return nodes


def find(expression: str, obj: Any) -> list[Any]:
    """All values the expression selects in `obj` (empty when nothing matches)."""
    return _apply(parse(expression), [obj])


def simple_path(expression: str) -> tuple[str, ...]:
    """A dotted path (`.spec.replicas`) as its field names, for reading *and* writing."""
    segments = parse(expression)
    names: list[str] = []
    for segment in segments:
        if not isinstance(segment, Child):
            raise JSONPathError(f"only simple field paths are allowed here: {expression!r}")
        names.append(segment.name)
    if not names:
        raise JSONPathError(f"empty path: {expression!r}")
    return tuple(names)
