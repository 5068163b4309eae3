"""`x-kubernetes-validations`: the CRD's CEL rules, evaluated with cel-python as the server does.

Cross-field rules ("minReplicas must not exceed maxReplicas", "batchSize <= maxBatchSize")
cannot be said in OpenAPI; the project's CRD says them in CEL. The real API server evaluates
each rule where its schema node is present, with `self` bound to that node's value (and
`oldSelf` to the previous value on updates, for transition rules), and refuses the write with
the rule's `message`, its `messageExpression`, or `failed rule: <rule>`.

Property names are escaped as the server escapes them (`namespace` is `__namespace__`, `a-b`
is `a__dash__b`: CEL reserved words, `__`, `.`, `-`, `/`), so upstream rules such as the Gateway
API's `has(p.__namespace__)` read the same fields.

Differences from the real server, kept on purpose: no cost budget; rules using `oldSelf` with
`optionalOldSelf: true` are skipped on create (cel-python has no optionals); numbers compare
by CEL's strict typing (schema `number` values are passed as doubles, as the server does);
only part of the Kubernetes CEL library exists (strings: `lowerAscii`, `upperAscii`, `trim`,
`split`, `join`, `replace`, `substring`, `charAt`, `indexOf`, `lastIndexOf`; lists: `isSorted`,
`sum`, `min`, `max`, `indexOf`, `lastIndexOf`), and a rule calling any other function is refused
when its CRD is installed (`check_schema_rules`), naming the rule and the function, rather than
failing on every write later; validation ratcheting applies to unchanged values on update, as in
Kubernetes 1.30+.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions

from batchpilot.sandbox.errors import FieldError
from batchpilot.sandbox.schema import is_int64

Schema = Mapping[str, Any]
_OLD_SELF = re.compile(r"\boldSelf\b")
ROOT_PATH = "<nil>"  # Go prints the root field.Path this way, and so do real rule failures


class RuleCompileError(ValueError):
    """A rule that cel-python cannot parse; the CRD carrying it must be refused."""


def _cel_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, celtypes.ListType) else []


def _lower_ascii(value: Any) -> celtypes.StringType:
    return celtypes.StringType(str(value).lower())


def _upper_ascii(value: Any) -> celtypes.StringType:
    return celtypes.StringType(str(value).upper())


def _trim(value: Any) -> celtypes.StringType:
    return celtypes.StringType(str(value).strip())


def _is_sorted(value: Any) -> celtypes.BoolType:
    items = _cel_list(value)
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(items)))


def _sum(value: Any) -> Any:
    items = _cel_list(value)
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def _min(value: Any) -> Any:
    return min(_cel_list(value))


def _max(value: Any) -> Any:
    return max(_cel_list(value))


def _index_of(value: Any, item: Any) -> celtypes.IntType:
    if isinstance(value, celtypes.StringType):
        return celtypes.IntType(str(value).find(str(item)))
    items = _cel_list(value)
    return celtypes.IntType(items.index(item) if item in items else -1)


def _last_index_of(value: Any, item: Any) -> celtypes.IntType:
    if isinstance(value, celtypes.StringType):
        return celtypes.IntType(str(value).rfind(str(item)))
    items = _cel_list(value)
    return celtypes.IntType(len(items) - 1 - items[::-1].index(item) if item in items else -1)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {type(value).__name__}")  # "no such overload"
    return int(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")  # "no such overload"
    return str(value)


def _split(value: Any, separator: Any, limit: Any = None) -> celtypes.ListType:
    """`'a/b'.split('/')`, and `split(sep, n)`: at most n parts (0: none, negative: all)."""
    text, sep = _str(value), _str(separator)
    count = -1 if limit is None else _int(limit)
    if count == 0:
        return celtypes.ListType([])
    if sep == "":
        parts = list(text)
        if count > 0 and len(parts) > count:
            parts = [*parts[: count - 1], "".join(parts[count - 1 :])]
    else:
        parts = text.split(sep, count - 1) if count > 0 else text.split(sep)
    return celtypes.ListType([celtypes.StringType(part) for part in parts])


def _join(value: Any, separator: Any = "") -> celtypes.StringType:
    items = _cel_list(value)
    if not all(isinstance(item, celtypes.StringType) for item in items):
        raise TypeError("join needs a list of strings")
    return celtypes.StringType(_str(separator).join(str(item) for item in items))


def _replace(value: Any, old: Any, new: Any, limit: Any = None) -> celtypes.StringType:
    count = -1 if limit is None else _int(limit)
    return celtypes.StringType(_str(value).replace(_str(old), _str(new), count))


def _substring(value: Any, start: Any, end: Any = None) -> celtypes.StringType | CELEvalError:
    text = _str(value)
    first = _int(start)
    last = len(text) if end is None else _int(end)
    if not 0 <= first <= last <= len(text):
        return CELEvalError(f"index out of range: substring({first}, {last}) of {len(text)}")
    return celtypes.StringType(text[first:last])


def _char_at(value: Any, index: Any) -> celtypes.StringType | CELEvalError:
    text, at = _str(value), _int(index)
    if not 0 <= at <= len(text):
        return CELEvalError(f"index out of range: charAt({at}) of {len(text)}")
    return celtypes.StringType(text[at : at + 1])


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "trim": _trim,
    "split": _split,
    "join": _join,
    "replace": _replace,
    "substring": _substring,
    "charAt": _char_at,
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _min,
    "max": _max,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
}
_MACROS = frozenset({"has", "dyn", "all", "exists", "exists_one", "map", "filter"})
_KNOWN_FUNCTIONS = (
    frozenset(name for name in base_functions if name.isidentifier())
    | frozenset(_FUNCTIONS)
    | _MACROS
)
"""What a rule may call: CEL's standard functions (as cel-python has them), its macros, and the
part of the Kubernetes library above. Anything else is refused when the CRD is installed."""
_RESERVED = frozenset(
    {
        "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
        "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
        "void", "while",
    }
)  # fmt: skip


def escape(name: str) -> str:
    """A property's name as rules see it (Kubernetes' `cel.Escape`): reserved words become
    `__word__`; `__`, `.`, `-` and `/` become `__underscores__`, `__dot__`, `__dash__` and
    `__slash__`."""
    if name in _RESERVED:
        return f"__{name}__"
    return (
        name.replace("__", "__underscores__")
        .replace(".", "__dot__")
        .replace("-", "__dash__")
        .replace("/", "__slash__")
    )


def _called(tree: Any) -> list[str]:
    """The names of the functions and macros an expression calls (in cel-python's parse tree,
    a call's name is its first token: lark tokens are strings, subtrees are not)."""
    names = []
    for node in tree.iter_subtrees():
        if node.data in ("member_dot_arg", "ident_arg", "dot_ident_arg"):
            token = next((child for child in node.children if isinstance(child, str)), None)
            if token is not None:
                names.append(str(token))
    return names


@functools.lru_cache(maxsize=1024)
def compile_expression(expression: str) -> celpy.Runner:
    """Compile one CEL expression (cached: CRDs are read many times)."""
    env = celpy.Environment()
    try:
        ast = env.compile(expression)
    except CELParseError as exc:
        raise RuleCompileError(f"compilation failed: {exc}") from None
    unknown = sorted({name for name in _called(ast) if name not in _KNOWN_FUNCTIONS})
    if unknown:
        names = ", ".join(f"'{name}'" for name in unknown)
        raise RuleCompileError(
            f"compilation failed: undeclared reference to {names}: not a function of the"
            " sandbox's CEL (batchpilot/sandbox/cel.py), so the rule could not be evaluated"
        )
    return env.program(ast, functions=cast(Any, _FUNCTIONS))


@dataclass(frozen=True)
class Rule:
    rule: str
    message: str | None = None
    message_expression: str | None = None
    reason: str | None = None
    field_path: str | None = None
    optional_old_self: bool = False

    @property
    def transition(self) -> bool:
        return bool(_OLD_SELF.search(self.rule))

    @classmethod
    def from_schema(cls, raw: Mapping[str, Any]) -> Rule:
        return cls(
            rule=str(raw.get("rule", "")),
            message=raw.get("message"),
            message_expression=raw.get("messageExpression"),
            reason=raw.get("reason"),
            field_path=raw.get("fieldPath"),
            optional_old_self=bool(raw.get("optionalOldSelf")),
        )


def _rules(schema: Schema) -> list[Rule]:
    return [Rule.from_schema(raw) for raw in schema.get("x-kubernetes-validations") or []]


def check_schema_rules(schema: Schema, path: str = "openAPIV3Schema") -> list[FieldError]:
    """Compile every rule in a schema; errors name the rules that do not compile."""
    errors: list[FieldError] = []
    for index, rule in enumerate(_rules(schema)):
        for what, text in (("rule", rule.rule), ("messageExpression", rule.message_expression)):
            if text is None:
                continue
            try:
                compile_expression(text)
            except RuleCompileError as exc:
                errors.append(
                    FieldError(
                        f"{path}.x-kubernetes-validations[{index}].{what}",
                        detail=str(exc).splitlines()[0],
                        value=text,
                    )
                )
    for key, sub in (schema.get("properties") or {}).items():
        errors.extend(check_schema_rules(sub, f"{path}.properties[{key}]"))
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            errors.extend(check_schema_rules(sub, f"{path}.{key}"))
    return errors


def to_cel(value: Any, schema: Schema | None) -> Any:
    """A JSON value as a CEL value, typed by its schema (`number` is always a double)."""
    schema = schema or {}
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int | float):
        if schema.get("type") == "number":
            return celtypes.DoubleType(float(value))
        if isinstance(value, float) and not value.is_integer():
            return celtypes.DoubleType(value)
        if not is_int64(int(value)):  # beyond int64: a double in the API server too
            return celtypes.DoubleType(float(value))
        return celtypes.IntType(int(value))
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else None
        return celtypes.ListType([to_cel(item, items) for item in value])
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        converted = {}
        for key, item in value.items():
            if key in properties:  # an object's field: escaped; a map's key: as it is
                converted[celtypes.StringType(escape(key))] = to_cel(item, properties[key])
                continue
            sub = additional if isinstance(additional, Mapping) else None
            converted[celtypes.StringType(key)] = to_cel(item, sub)
        return celtypes.MapType(converted)
    return json_to_cel(value)


def _schema_type(schema: Schema) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer-or-string"  # pragma: no cover - rare in rules' error messages
    return str(schema.get("type") or "object")


def _matches_type(value: Any, schema: Schema) -> bool:
    expected = schema.get("type")
    if value is None or not expected:
        return value is not None
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int | float) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
    }.get(str(expected), True)


def _field(path: str, field_path: str | None) -> str:
    if not field_path:
        return path
    suffix = field_path if field_path.startswith(("[", ".")) else f".{field_path}"
    base = "" if path == ROOT_PATH else path
    return (base + suffix).lstrip(".")


def _message(rule: Rule, activation: dict[str, Any]) -> str:
    if rule.message_expression:
        try:
            result = compile_expression(rule.message_expression).evaluate(activation)
        except (RuleCompileError, CELEvalError):
            result = None
        if isinstance(result, str) and result.strip():
            return str(result)
    if rule.message:
        return rule.message
    return f"failed rule: {rule.rule.strip()}"


_OUTCOMES: collections.OrderedDict[tuple[Rule, str, str, str], tuple[FieldError, ...]] = (
    collections.OrderedDict()
)
_OUTCOMES_KEPT = 4096
_OUTCOMES_LOCK = threading.Lock()  # several sandboxes may run in one process (tests)


def _evaluate_rule(
    rule: Rule, value: Any, old: Any, schema: Schema, path: str, errors: list[FieldError]
) -> None:
    """A rule's errors for a value; those of rules without `oldSelf` are remembered by value
    (cel-python interprets the parse tree on every evaluation, a few ms each, and a fleet's
    objects repeat the same small values: `scaling`, `sla`, `runtime`)."""
    if rule.transition and old is None:
        return
    if rule.transition:
        _evaluate_rule_now(rule, value, old, schema, path, errors)
        return
    key = (rule, path, _schema_type(schema), json.dumps(value, sort_keys=True, default=str))
    with _OUTCOMES_LOCK:
        found = _OUTCOMES.get(key)
    if found is None:
        fresh: list[FieldError] = []
        _evaluate_rule_now(rule, value, old, schema, path, fresh)
        found = tuple(fresh)
        with _OUTCOMES_LOCK:
            _OUTCOMES[key] = found
            if len(_OUTCOMES) > _OUTCOMES_KEPT:
                _OUTCOMES.popitem(last=False)
    errors.extend(found)


def _evaluate_rule_now(
    rule: Rule, value: Any, old: Any, schema: Schema, path: str, errors: list[FieldError]
) -> None:
    activation: dict[str, Any] = {"self": to_cel(value, schema)}
    if rule.transition:
        activation["oldSelf"] = to_cel(old, schema)
    try:
        outcome = compile_expression(rule.rule).evaluate(activation)
    except RuleCompileError as exc:
        errors.append(FieldError(path, detail=f"rule compile error: {exc}"))
        return
    except CELEvalError as exc:
        detail = exc.args[0] if exc.args else str(exc)
        errors.append(FieldError(path, detail=f"{detail} evaluating rule: {rule.rule.strip()}"))
        return
    if isinstance(outcome, celtypes.BoolType | bool) and bool(outcome):
        return
    if not isinstance(outcome, celtypes.BoolType | bool):
        errors.append(FieldError(path, detail=f"rule did not evaluate to a bool: {rule.rule}"))
        return
    field = _field(path, rule.field_path)
    message = _message(rule, activation)
    match rule.reason:
        case "FieldValueForbidden":
            errors.append(FieldError(field, "FieldValueForbidden", message))
        case "FieldValueRequired":
            errors.append(FieldError(field, "FieldValueRequired", message))
        case "FieldValueDuplicate":
            errors.append(FieldError(field, "FieldValueDuplicate", value=_schema_type(schema)))
        case _:
            errors.append(FieldError(field, detail=message, value=_schema_type(schema)))


def _child(path: str, name: str) -> str:
    return name if path == ROOT_PATH else f"{path}.{name}"


def _walk(value: Any, old: Any, schema: Schema, path: str, errors: list[FieldError]) -> None:
    if not _matches_type(value, schema):
        return
    ratcheted = old is not None and value == old
    for rule in _rules(schema):
        if ratcheted and not rule.transition:
            continue
        _evaluate_rule(rule, value, old, schema, path, errors)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            sub = properties.get(key)
            if sub is not None:
                _walk(item, old_map.get(key), sub, _child(path, key), errors)
            elif isinstance(additional, Mapping):
                _walk(item, old_map.get(key), additional, f"{path}[{key}]", errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        items: Schema = schema["items"]
        keys = list(schema.get("x-kubernetes-list-map-keys") or [])
        correlate = schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list)
        previous: dict[str, Any] = {}
        if correlate:
            for entry in cast(list[Any], old):
                if isinstance(entry, dict):
                    previous[repr([entry.get(key) for key in keys])] = entry
        for index, item in enumerate(value):
            old_item = None
            if correlate and isinstance(item, dict):
                old_item = previous.get(repr([item.get(key) for key in keys]))
            _walk(item, old_item, items, f"{path}[{index}]", errors)


def validate(
    obj: Mapping[str, Any], schema: Schema, *, old: Mapping[str, Any] | None = None
) -> list[FieldError]:
    """Evaluate every rule of the schema against a custom resource (and its previous state)."""
    errors: list[FieldError] = []
    _walk(_root_view(obj), _root_view(old) if old is not None else None, schema, ROOT_PATH, errors)
    return errors


def _root_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """At the root, rules see only `metadata.name` and `metadata.generateName`, as on a server."""
    view = dict(obj)
    metadata = obj.get("metadata") or {}
    view["metadata"] = {key: metadata[key] for key in ("name", "generateName") if key in metadata}
    return view
