"""Validation whose patterns are matched under a time limit says what `jsonschema` says, and never hangs.

`envfactory.env.json_schema` replaces `pattern`, `patternProperties` and `additionalProperties`: on
honest patterns (random ones here) its verdicts and messages are `jsonschema`'s own; on a pattern that
backtracks for ever it refuses the value at once. `schema_problem` passes only schemas that validate any
value without raising (random ones, right and wrong, here).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from envfactory.env.json_schema import (
    pattern_budget,
    readable,
    schema_problem,
    search,
    shortest_match,
    timed_validator,
)

HONEST = ["^[a-z]+$", "x", "^id_[0-9]{2}$", "[A-Z]", "^$", "b|c", "^[a-z]*[0-9]?$"]
keys = st.text(alphabet="abcxyzAB019_", max_size=6)
values = st.one_of(st.text(alphabet="abcxyzAB019_", max_size=8), st.integers(), st.none())


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    if draw(st.booleans()):
        schema["properties"] = {
            k: {"type": "string", "pattern": draw(st.sampled_from(HONEST))} for k in draw(st.lists(keys, max_size=3))
        }
    if draw(st.booleans()):
        schema["patternProperties"] = {
            p: {"type": draw(st.sampled_from(["string", "integer", "null"]))}
            for p in draw(st.lists(st.sampled_from(HONEST), max_size=2))
        }
    choice = draw(st.sampled_from(["absent", "false", "true", "schema"]))
    if choice != "absent":
        schema["additionalProperties"] = {"false": False, "true": True, "schema": {"type": "integer"}}[choice]
    return schema


def _errors(validator: Draft202012Validator, instance: Any) -> list[tuple[str, tuple[Any, ...], str]]:
    return sorted((e.validator, tuple(e.absolute_path), e.message) for e in validator.iter_errors(instance))


@settings(max_examples=300, deadline=None)
@given(schemas(), st.dictionaries(keys, values, max_size=5))
def test_on_honest_patterns_the_verdicts_and_messages_are_jsonschemas(schema: dict[str, Any], instance: Any) -> None:
    assert _errors(timed_validator(schema), instance) == _errors(Draft202012Validator(schema), instance)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["pattern", "patternProperties", "additionalProperties", "propertyNames"])
def test_a_pattern_that_backtracks_for_ever_refuses_the_value_at_once(where: str) -> None:
    slow = "^(a|a)*$"
    hostile = "a" * 64 + "!"
    schema: dict[str, Any] = {
        "pattern": {"type": "object", "properties": {"v": {"type": "string", "pattern": slow}}},
        "patternProperties": {"type": "object", "patternProperties": {slow: {"type": "integer"}}},
        "additionalProperties": {"type": "object", "patternProperties": {slow: {}}, "additionalProperties": False},
        "propertyNames": {"type": "object", "propertyNames": {"pattern": slow}},
    }[where]
    instance = {"v": hostile} if where == "pattern" else {hostile: "x"}
    errors = list(timed_validator(schema).iter_errors(instance))
    assert errors, where
    assert search(slow, hostile) is None
    assert search(slow, "aaaa") is True and search("^b", "aaaa") is False


@pytest.mark.timeout(60)
def test_one_validation_shares_one_budget_for_its_matches() -> None:
    """Each match had its own 50 ms: a call whose list held 1,000 hostile strings took 205 s of a server's one
    thread. The matches of one validation share `pattern_budget`; past it, a value is refused at once."""
    slow = "^(a|a)*$"
    schema = {"type": "array", "items": {"type": "string", "pattern": slow}}
    hostile = ["a" * 64 + "!"] * 3000  # 150 s at 50 ms each
    with pattern_budget():
        errors = list(timed_validator(schema).iter_errors(hostile))
    assert len(errors) == 3000 and all("cannot be checked" in e.message for e in errors)
    with pattern_budget(0.0):
        assert search("^a", "a") is None  # spent: not tried
    assert search("^a", "a") is True  # outside a validation, each match has its own limit only
    with pattern_budget(0.05):  # only the matches' own time is charged: a stall between them (load) is not
        time.sleep(0.1)
        assert search("^a", "a") is True and search("^a", "b") is False


def test_a_match_the_machine_stalled_is_tried_again_and_one_that_worked_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The match limit is wall-clock (`regex`'s): under load a UUID checked against a UUID pattern was refused, and a
    compiled environment failed its gate in a corpus run. A timeout that cost little CPU is a stall: tried again."""
    import envfactory.env.json_schema as js

    real = js.regex.search
    stalls = [3]

    def stalled(pattern: str, text: str, timeout: float) -> object:
        if stalls[0]:
            stalls[0] -= 1
            raise TimeoutError("regex timed out")  # no CPU spent: the process was not running
        return real(pattern, text, timeout=timeout)

    monkeypatch.setattr(js.regex, "search", stalled)
    assert search("^[a-f0-9]{8}$", "b6a8035f") is True and stalls == [0]

    tries = [0]

    def working(pattern: str, text: str, timeout: float) -> object:
        tries[0] += 1
        end = time.thread_time() + timeout  # a match that works its whole limit
        while time.thread_time() < end:
            pass
        raise TimeoutError("regex timed out")

    monkeypatch.setattr(js.regex, "search", working)
    assert search("^(a|a)*$", "a" * 30 + "!") is None and tries == [1]


def test_the_shortest_match_of_a_pattern() -> None:
    assert shortest_match("^x{30000000}$") == 30_000_000 and shortest_match("(ab|c)+d?") == 1
    assert shortest_match("(") is None and readable("^a") and not readable("(")


# ---- schema_problem: a schema it passes validates without raising ------------------------------------------

_KEYWORD_VALUES: dict[str, list[Any]] = {
    "type": ["string", "integer", "object", "array", "strin", ["string", "null"], ["string", "string"], [], 3],
    "minimum": [0, 1.5, "0", True, None],
    "maxLength": [3, 0, -1, "9", 2.5],
    "multipleOf": [2, 0, -1, 0.5, "2"],
    "required": [["a"], [{}], "a", ["a", "a"], []],
    "enum": [["a", 1], "a", []],
    "pattern": ["^a", 5, "("],
    "uniqueItems": [True, "yes"],
    "format": ["date", 1],
    "$ref": ["#", "#/properties/a", "#/$defs/x", "#/nowhere", "https://example.com/s", "#anchor", 1],
    "$defs": [{"x": {"type": "string"}}, {"x": "string"}, 3],
    "const": [1, None, {"a": 1}],
    "nullable": [True],
    "x-extension": [{"anything": 1}],
}


@st.composite
def loose_schemas(draw: st.DrawFn, depth: int = 0) -> Any:
    """A schema a person might write: known keywords with right and wrong values, nested under properties,
    items, anyOf, additionalProperties; sometimes a boolean or not an object at all."""
    if depth > 2 or draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([True, False, {}, "string", None]))
    out: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(_KEYWORD_VALUES)), max_size=4, unique=True)):
        out[key] = draw(st.sampled_from(_KEYWORD_VALUES[key]))
    nested = draw(st.sampled_from(["", "properties", "items", "anyOf", "additionalProperties", "not"]))
    if nested == "properties":
        out["properties"] = {k: draw(loose_schemas(depth + 1)) for k in draw(st.lists(keys, max_size=2))}
    elif nested == "anyOf":
        out["anyOf"] = draw(st.lists(loose_schemas(depth + 1), max_size=2))
    elif nested:
        out[nested] = draw(loose_schemas(depth + 1))
    return out


instances = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-3, 3), st.text("ab1", max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(loose_schemas(), st.lists(instances, min_size=1, max_size=4))
def test_a_schema_it_passes_validates_any_value_without_raising(schema: Any, values: list[Any]) -> None:
    problem = schema_problem(schema)
    if problem is not None:
        assert isinstance(problem, str) and problem and "\n" not in problem
        return
    Draft202012Validator.check_schema(schema)  # what jsonschema itself accepts...
    validator = timed_validator(schema)
    for value in values:  # ...and validates with: errors are answers, never exceptions
        list(validator.iter_errors(value))


def test_a_schema_that_would_raise_when_it_validates_is_named() -> None:
    assert schema_problem({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}}) is None
    assert schema_problem({"type": "strin"}) == "at type: 'strin' is not valid under any of the given schemas"
    said = "at properties/n/minimum: 'x' is not of type 'number'"
    assert schema_problem({"properties": {"n": {"minimum": "x"}}}) == said
    for ref in ("https://example.com/s", "#/$defs/t", "#"):  # elsewhere; in place; looping back without descending
        schema = {"$defs": {"t": {"type": "string"}}, "properties": {"a": {"$ref": ref}}}
        assert "references are not supported" in str(schema_problem(schema))
    assert schema_problem({"pattern": "("}) == "at pattern: '(' is not a 'regex'"


def test_a_pattern_python_warns_about_is_read_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning ("possible nested set") would fail here
        assert schema_problem({"type": "string", "pattern": "[[A-Z0-9]{1,18}"}) is None
