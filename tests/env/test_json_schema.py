"""Validation whose patterns are matched under a time limit says what `jsonschema` says, and never hangs.

`envfactory.env.json_schema` replaces `pattern`, `patternProperties` and `additionalProperties`: on
honest patterns (random ones here) its verdicts and messages are `jsonschema`'s own; on a pattern that
backtracks for ever it refuses the value at once.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from envfactory.env.json_schema import search, timed_validator

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
