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

from collections.abc import Iterator
from typing import Any

import regex
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators

PATTERN_TIMEOUT_S = 0.05  # per match: an honest pattern on a bounded value takes microseconds


def search(pattern: str, text: str) -> bool | None:
    """Whether `pattern` matches somewhere in `text`; None when that cannot be told in time (or at all)."""
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except (TimeoutError, regex.error, RecursionError, OverflowError):
        return None


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
