"""JSON Schema validation whose regular expressions cannot hang the process.

`jsonschema` matches `pattern` and `patternProperties` with Python's `re`, which has no time limit and
holds the GIL while it backtracks. A schema's patterns come from outside — an API spec compiled into an
environment that runs in-process with no sandbox, an untrusted environment's metadata the parent checks
arguments against — and a pattern such as `^(a|a)*$` (no nested quantifier) took 3 s on 24 characters
and twice as long with each one more: one tool call would stop a whole server. Here those keywords match
with the `regex` module under a time limit (`PATTERN_TIMEOUT_S`); a value that cannot be checked in
time is refused, with a message saying so. Everything else is `jsonschema`'s own Draft 2020-12.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import re
import time
import warnings
from collections.abc import Iterator
from typing import Any

import regex
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.exceptions import SchemaError

_re_parser: Any = importlib.import_module("re._parser")  # private, the same since 3.11: `parse_pattern`
PATTERN_TIMEOUT_S = 0.05  # per match: an honest pattern on a bounded value takes microseconds
VALIDATION_BUDGET_S = 0.25  # all the matches of one validation (`pattern_budget`)
# tries of a match whose wall-clock limit passed while it used little CPU (the machine stalled it): a corpus run
# under load refused a UUID checked against a UUID pattern after two
_STALLED_TRIES = 5

# the match time left to the validation running in this thread (None: each match has its own limit only)
_LEFT: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("pattern_time_left", default=None)


@contextlib.contextmanager
def pattern_budget(seconds: float = VALIDATION_BUDGET_S) -> Iterator[None]:
    """The matches made inside share `seconds` of matching (past it, a match is not tried: it cannot be told in
    time): a call whose list held 1,000 hostile strings took each one's 50 ms, 205 s in all, in a server's one
    thread. Only the time inside the matches is charged, so a validation that the machine's load stalls between
    its (microsecond) matches is not refused for it (with a wall-clock deadline instead, two compiled environments
    failed their determinism check in a corpus run under load, and healthy alone: most likely that)."""
    token = _LEFT.set([seconds])
    try:
        yield
    finally:
        _LEFT.reset(token)


def search(pattern: str, text: str) -> bool | None:
    """Whether `pattern` matches somewhere in `text`; None when that cannot be told in time (or at all)."""
    timeout = PATTERN_TIMEOUT_S
    left = _LEFT.get()
    if left is not None:
        if left[0] <= 0:
            return None
        timeout = min(timeout, left[0])
    start = time.thread_time()  # the budget is charged in this thread's CPU time: what a match costs, load aside
    try:
        for _ in range(_STALLED_TRIES):
            try:
                return regex.search(pattern, text, timeout=timeout) is not None
            except TimeoutError:  # (the limit is wall-clock) a match the machine stalled, not one that worked: again
                if time.thread_time() - start >= timeout / 2:
                    return None
        return None
    except (regex.error, RecursionError, OverflowError):
        return None
    finally:
        if left is not None:
            left[0] -= time.thread_time() - start


def parse_pattern(pattern: str) -> Any:
    """`pattern` as Python's own parser of patterns reads it (its `.data`, `.getwidth()`); raises `re.error`,
    `RecursionError` or `OverflowError` when it cannot be read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "possible nested set": a FutureWarning, not an error
        return _re_parser.parse(pattern)


def shortest_match(pattern: str) -> int | None:
    """The length of the shortest string `pattern` can match; None when it cannot be read. `x{30000000}` made 30 MB
    values, four draws at a time."""
    try:
        return int(parse_pattern(pattern).getwidth()[0])
    except (re.error, RecursionError, OverflowError):
        return None


def readable(pattern: str) -> bool:
    """Whether the `regex` module reads `pattern` (what `search` matches with)."""
    try:
        regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError):
        return False
    return True


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    found = search(pattern, instance)
    if found is None:
        yield ValidationError(f"{_shown(instance)} cannot be checked against {pattern!r} in time")
    elif not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            found = search(pattern, key)
            if found is None:
                yield ValidationError(f"the key {_shown(key)} cannot be checked against {pattern!r} in time")
            elif found:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The keys neither `properties` nor (in time) a `patternProperties` pattern covers."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [k for k in instance if k not in properties and not any(search(p, k) for p in patterns)]


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """`jsonschema`'s `additionalProperties`, with its messages, matching `patternProperties` in time."""
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        shown = sorted(extras, key=str)
        joined = ", ".join(repr(each) for each in shown)
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({joined} {verb} unexpected)")


TimedValidator = validators.extend(
    Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties},
)


def timed_validator(schema: dict[str, Any], *, formats: bool = True) -> Draft202012Validator:
    """A Draft 2020-12 validator for `schema` whose patterns are matched under a time limit."""
    validator: Draft202012Validator = TimedValidator(schema, format_checker=FormatChecker() if formats else None)
    return validator


# ---- is it a schema these validators can use? ------------------------------------------------------------

_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
_KEYWORDS = frozenset(Draft202012Validator.VALIDATORS)  # what a validator acts on; any other keyword is ignored
_TEXTS = ("description", "title", "format", "$comment")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_SCHEMA_DEPTH = 64


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be validated with (`timed_validator`), or None when it can.

    A plan's schemas may come from a hand-edited file: a keyword with a value of the wrong type (`"type":
    "strin"`, `"minimum": "x"`) passes until a value is validated, and then `jsonschema` raises (`UnknownType`,
    `TypeError`) instead of answering. The schemas the compiler writes use a few keywords with plain values:
    those are read here in microseconds; anything else goes to `jsonschema`'s own check against the Draft
    2020-12 meta-schema (~10 ms). References (`$ref`) are refused: the compiler writes every schema in place, and
    a reference names another document (never fetched) or may loop back without descending (`{"$ref": "#"}`),
    which recurses until the stack runs out on any value."""
    try:
        if _plain(schema, 0):
            return None
    except RecursionError:
        return "it is nested too deeply"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        return f"{'at ' + where + ': ' if where else ''}{str(e.message)[:200]}"
    except RecursionError:
        return "it is nested too deeply"
    return _reference_problem(schema, 0)


@functools.lru_cache(maxsize=4096)
def _compiles(pattern: str) -> bool:
    """Whether `pattern` is a regular expression, as the meta-schema's "regex" format checks it (`re`)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set" (`[[A-Z]`): a FutureWarning, not an error
            re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def _plain(schema: Any, depth: int) -> bool:
    """Whether `schema` only uses keywords whose values are read here, each well formed (then it is valid)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or depth > _SCHEMA_DEPTH:
        return False
    for key, value in schema.items():
        if not isinstance(key, str):
            return False
        if key not in _KEYWORDS and not key.startswith("$"):
            continue  # ignored by every validator ("nullable", "x-...", "example")
        if key == "pattern":
            ok = isinstance(value, str) and _compiles(value)
        elif key in _TEXTS:
            ok = isinstance(value, str)
        elif key == "type":
            names = value if isinstance(value, list) else [value]
            known = all(isinstance(t, str) and t in _TYPES for t in names)
            ok = bool(names) and known and len(set(names)) == len(names)
        elif key in _BOUNDS or key == "multipleOf":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and (key != "multipleOf" or value > 0)
        elif key in _COUNTS:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif key in ("enum", "examples"):
            ok = isinstance(value, list)
        elif key in ("const", "default"):
            ok = True
        elif key == "uniqueItems":
            ok = isinstance(value, bool)
        elif key == "required":
            ok = isinstance(value, list) and all(isinstance(n, str) for n in value) and len(set(value)) == len(value)
        elif key == "properties":
            ok = isinstance(value, dict) and all(_plain(v, depth + 1) for v in value.values())
        elif key in ("items", "additionalProperties", "not"):
            ok = _plain(value, depth + 1)
        elif key in ("anyOf", "oneOf", "allOf"):
            ok = isinstance(value, list) and bool(value) and all(_plain(v, depth + 1) for v in value)
        else:  # references, $defs, conditionals...: the meta-schema decides
            ok = False
        if not ok:
            return False
    return True


def _reference_problem(node: Any, depth: int) -> str | None:
    """A `$ref` or `$dynamicRef` anywhere in `node`: a plan's schemas are written in place. (A reference may point
    elsewhere, which is never fetched, or loop back without descending — `{"$ref": "#"}` — which recurses until
    the stack runs out on any value.)"""
    if depth > _SCHEMA_DEPTH:
        return "it is nested too deeply"
    if isinstance(node, dict):
        for key in ("$ref", "$dynamicRef"):
            if key in node:
                return f"{key} {str(node[key])[:80]!r}: references are not supported (write the schema in its place)"
        items: list[Any] = list(node.values())
    elif isinstance(node, list):
        items = node
    else:
        return None
    for item in items:
        problem = _reference_problem(item, depth + 1)
        if problem is not None:
            return problem
    return None
