"""Matching an observed value with an expected one.

Matching rules (`expect_result`, and the values of `expect_state`):
- a dict matches when every expected key is present in the actual dict with a matching value
  (a subset: unmentioned keys are ignored); `{"$absent": true}` as a value means the key must be missing;
- a list matches a list of the same length element by element, in order;
- an operator object `{"$contains": [...], "$len": n}` matches a list holding, for each expected
  item, a distinct matching element (any order), and/or exactly n elements;
- numbers match numbers with math.isclose (rel 1e-9, abs 1e-9), 3 == 3.0; booleans only booleans;
  everything else by equality. `expect_result: null` means "not checked".
- `expect_state` keys are paths into the state dump ("bookings.BK-0002.status", "log.0.op"), read by the
  one state-path resolver, `envfactory.env.state_path` (a key may contain dots: the longest existing key
  wins; a number after a dot indexes a list, as `[0]` does).
"""

from __future__ import annotations

import math
from typing import Any

_OPERATORS = frozenset({"$contains", "$len", "$absent"})


def _operator_problem(value: Any, where: str) -> str | None:
    """Unknown `$` operators are a scenario mistake, caught when the scenario is parsed."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and k.startswith("$") and k not in _OPERATORS:
                return f"{where}: unknown operator '{k}' (known: {', '.join(sorted(_OPERATORS))})"
            problem = _operator_problem(v, f"{where}.{k}")
            if problem:
                return problem
    elif isinstance(value, list):
        for i, v in enumerate(value):
            problem = _operator_problem(v, f"{where}[{i}]")
            if problem:
                return problem
    return None


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def match(expected: Any, actual: Any, path: str = "result") -> str | None:
    """Why `actual` does not match `expected` (the rules in the module docstring), or None."""
    if isinstance(expected, dict) and expected and all(isinstance(k, str) and k.startswith("$") for k in expected):
        return _match_operators(expected, actual, path)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected an object, got {_short(actual)}"
        for key, want in expected.items():
            if isinstance(want, dict) and want.get("$absent") is True:
                if key in actual:
                    return f"{path}.{key}: expected no such key, got {_short(actual[key])}"
                continue
            if key not in actual:
                return f"{path}.{key}: missing (expected {_short(want)})"
            problem = match(want, actual[key], f"{path}.{key}")
            if problem:
                return problem
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{path}: expected a list, got {_short(actual)}"
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} items, got {len(actual)}: {_short(actual)}"
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            problem = match(want, got, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return None if expected is actual else f"{path}: expected {_short(expected)}, got {_short(actual)}"
    if _is_number(expected) and _is_number(actual):
        ok = math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-9)
        return None if ok else f"{path}: expected {_short(expected)}, got {_short(actual)}"
    if expected == actual and type(expected) is type(actual):
        return None
    return f"{path}: expected {_short(expected)}, got {_short(actual)}"


def _match_operators(expected: dict[str, Any], actual: Any, path: str) -> str | None:
    if "$absent" in expected:
        return f"{path}: '$absent' only applies to a key or a state path"
    if not isinstance(actual, list):
        return f"{path}: expected a list, got {_short(actual)}"
    if "$len" in expected and len(actual) != expected["$len"]:
        return f"{path}: expected {expected['$len']} items, got {len(actual)}"
    wanted = expected.get("$contains", [])
    if not isinstance(wanted, list):
        wanted = [wanted]
    free = list(range(len(actual)))
    for want in wanted:
        hit = next((i for i in free if match(want, actual[i], path) is None), None)
        if hit is None:
            return f"{path}: no item matches {_short(want)} among {_short(actual)}"
        free.remove(hit)
    return None
