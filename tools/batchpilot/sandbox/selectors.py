"""Label and field selectors, as `?labelSelector=` and `?fieldSelector=` filter lists and watches.

Operators select their children by label (`app.kubernetes.io/instance=x`), `kubectl delete`
waits on `metadata.name=x`, and `kubectl describe` finds a resource's Events with
`involvedObject.name=x,involvedObject.uid=...`. The grammar follows k8s.io/apimachinery's
`labels.Parse` and `fields.ParseSelector`; fields are looked up as dotted paths in the object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_OPERATORS = ("=", "==", "!=", "in", "notin", "exists", "!", "gt", "lt")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class SelectorError(ValueError):
    """A selector the real server would refuse with 400 BadRequest."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # one of _OPERATORS; "!" means "does not exist"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case "=" | "==" | "in":
                return present and value in self.values
            case "!=" | "notin":
                return not present or value not in self.values
            case "exists":
                return present
            case "!":
                return not present
            case "gt" | "lt":
                if not present or value is None:
                    return False
                try:
                    actual, bound = int(value), int(self.values[0])
                except ValueError:
                    return False
                return actual > bound if self.operator == "gt" else actual < bound
        return False  # pragma: no cover - the parser produces known operators only


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(req.matches(labels or {}) for req in self.requirements)

    def __str__(self) -> str:
        return ",".join(_format_requirement(req) for req in self.requirements)


def _format_requirement(req: Requirement) -> str:
    match req.operator:
        case "exists":
            return req.key
        case "!":
            return f"!{req.key}"
        case "in" | "notin":
            return f"{req.key} {req.operator} ({','.join(req.values)})"
        case "gt":
            return f"{req.key}>{req.values[0]}"
        case "lt":
            return f"{req.key}<{req.values[0]}"
        case _:
            return f"{req.key}{req.operator}{req.values[0]}"


_TOKEN = re.compile(r"\s*(\(|\)|,|!=|==|=|!|>|<|[^\s(),!=<>]+)")


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        found = _TOKEN.match(text, pos)
        if found is None:  # pragma: no cover - the pattern matches any non-space character
            raise SelectorError(f"unable to parse requirement: {text[pos:]!r}")
        tokens.append(found.group(1))
        pos = found.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


def _check_key(key: str) -> str:
    if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"invalid label key {key!r}: must be a qualified name")
    return key


def _check_value(value: str) -> str:
    if not _LABEL_VALUE.match(value) or len(value) > 63:
        raise SelectorError(f"invalid label value: {value!r}: must be a valid label value")
    return value


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse `a=b,c!=d,e in (f,g),!h,i` into a selector; raise `SelectorError` if malformed."""
    if not text or not text.strip():
        return LabelSelector()
    tokens = _tokenize(text)
    requirements: list[Requirement] = []
    pos = 0

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise SelectorError(f"unexpected end of label selector {text!r}")
        token = tokens[pos]
        pos += 1
        return token

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    while pos < len(tokens):
        token = take()
        if token == "!":
            requirements.append(Requirement(_check_key(take()), "!"))
        else:
            key = _check_key(token)
            op = peek()
            if op is None or op == ",":
                requirements.append(Requirement(key, "exists"))
            elif op in ("=", "==", "!="):
                take()
                nxt = peek()
                value = "" if nxt is None or nxt == "," else take()
                requirements.append(Requirement(key, op, (_check_value(value),)))
            elif op in (">", "<"):
                take()
                value = take()
                if not value.lstrip("-").isdigit():
                    raise SelectorError(f"invalid value {value!r} for {op}: must be an integer")
                requirements.append(Requirement(key, "gt" if op == ">" else "lt", (value,)))
            elif op in ("in", "notin"):
                take()
                if take() != "(":
                    raise SelectorError(f"expected '(' after {op} in {text!r}")
                values: list[str] = []
                while True:
                    item = take()
                    if item == ")":
                        break
                    if item == ",":
                        continue
                    values.append(_check_value(item))
                if op == "in" and not values:
                    raise SelectorError(f"for 'in' operator, values set can't be empty: {text!r}")
                requirements.append(Requirement(key, op, tuple(sorted(set(values)))))
            else:
                raise SelectorError(f"unable to parse requirement {text!r} near {op!r}")
        nxt = peek()
        if nxt is not None:
            if nxt != ",":
                raise SelectorError(f"expected ',' in label selector {text!r} near {nxt!r}")
            take()
    return LabelSelector(tuple(requirements))


def selector_from_label_selector_object(spec: Mapping[str, Any] | None) -> LabelSelector:
    """A `metav1.LabelSelector` (`matchLabels` + `matchExpressions`) as a selector."""
    if not spec:
        return LabelSelector()
    requirements = [
        Requirement(key, "=", (str(value),))
        for key, value in sorted((spec.get("matchLabels") or {}).items())
    ]
    operators = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expression in spec.get("matchExpressions") or []:
        op = operators.get(str(expression.get("operator")))
        if op is None:
            raise SelectorError(f"{expression.get('operator')!r} is not a valid selector operator")
        values = tuple(sorted(str(value) for value in expression.get("values") or []))
        requirements.append(Requirement(str(expression.get("key")), op, values))
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    operator: str  # "=" or "!="
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = field_value(obj, self.path)
        return (actual == self.value) == (self.operator == "=")


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(req.matches(obj) for req in self.requirements)

    def exact(self, path: str) -> str | None:
        """The value this selector pins `path` to (`metadata.name=x` gives `x`), if any."""
        for req in self.requirements:
            if req.path == path and req.operator == "=":
                return req.value
        return None


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """A field as the server compares it: a string, "" when absent."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parse `metadata.name=x,involvedObject.kind!=Pod` (values may escape `\\,` and `\\=`)."""
    if not text or not text.strip():
        return FieldSelector()
    requirements: list[FieldRequirement] = []
    for term in _split_requirements(text):
        for op in ("!=", "==", "="):
            index = _find_unescaped(term, op)
            if index >= 0:
                path = term[:index].strip()
                raw_value = term[index + len(op) :]
                value = _unescape(raw_value)
                if not path:
                    raise SelectorError(f"invalid field selector {text!r}: empty field name")
                requirements.append(FieldRequirement(path, "!=" if op == "!=" else "=", value))
                break
        else:
            raise SelectorError(f"invalid selector: {term!r}; can't understand {term!r}")
    return FieldSelector(tuple(requirements))


def _split_requirements(text: str) -> Sequence[str]:
    terms: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append("\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term for term in terms if term.strip()]


def _find_unescaped(text: str, needle: str) -> int:
    index = 0
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text.startswith(needle, index):
            return index
        index += 1
    return -1
