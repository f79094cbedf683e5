"""Values the compiled scenario generator makes for a spec's fields (`tasks/compiled_state._Values`)."""

from __future__ import annotations

import random
from datetime import datetime, time

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from envfactory.tasks.compiled_state import _STAMP_ENDS, _Values
from envfactory.tasks.values import ValueMaker

CLOCK = datetime(2026, 1, 5, 9, 0)
bounds = st.one_of(st.none(), st.integers(min_value=0, max_value=40))


@given(seed=st.integers(0, 2**32), lo=bounds, hi=bounds, fmt=st.sampled_from(["date-time", "time"]))
def test_a_stamp_with_length_bounds_is_written_in_a_form_that_fits_them(
    seed: int, lo: int | None, hi: int | None, fmt: str
) -> None:
    """A spec whose date-times are 24 characters long (`2017-09-06T13:37:31.000Z`) gets a stamp with
    milliseconds, not a shorter one padded out with letters (`…T17:15:00Zxxxx`, which no user can read)."""
    assume(lo is None or hi is None or lo <= hi)
    schema: dict[str, object] = {"type": "string", "format": fmt}
    if lo is not None:
        schema["minLength"] = lo
    if hi is not None:
        schema["maxLength"] = hi
    value = _Values(random.Random(seed), CLOCK).make("last_use", schema, attempt=0)
    assert isinstance(value, str)
    clock_len = 19 if fmt == "date-time" else 8
    sizes = [clock_len + len(end) for end in _STAMP_ENDS]
    if any((lo is None or n >= lo) and (hi is None or n <= hi) for n in sizes):
        assert (lo is None or len(value) >= lo) and (hi is None or len(value) <= hi)
        parsed = datetime.fromisoformat(value) if fmt == "date-time" else time.fromisoformat(value)
        assert parsed.utcoffset() is not None and parsed.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        assert value[:clock_len] == parsed.strftime("%Y-%m-%dT%H:%M:%S" if fmt == "date-time" else "%H:%M:%S")
    else:  # no form fits: cut or padded to the bounds, as any string (the record's validation then retries)
        assert (lo is None or len(value) >= lo) and (hi is None or len(value) <= hi)


@pytest.mark.parametrize(
    ("description", "phone"),
    [
        ("Telephone numbers of each of the recipients", True),
        ("The customer's mobile numbers", True),
        ("A list of phone numbers to call", True),
        ("Whether the phone number is verified", False),
        ("The type of phone number", False),
        ("Phone number format", False),
        ("Tags of the message", False),
    ],
)
def test_the_items_of_a_list_hold_what_the_lists_description_says(description: str, phone: bool) -> None:
    """`destinations: array of string, "Telephone numbers of each of the recipients"`: the items are phone numbers,
    not dictionary words ("destinations check")."""
    schema = {"type": "array", "description": description, "items": {"type": "string", "maxLength": 10000}}
    for seed in range(5):
        items = _Values(random.Random(seed), CLOCK).make("destinations", schema, attempt=2)  # (no examples)
        assert items and all(isinstance(i, str) for i in items)
        looks = [sum(c.isdigit() for c in i) >= 7 and not any(c.isalpha() and c != "x" for c in i) for i in items]
        assert all(looks) if phone else not any(looks), items


@given(
    seed=st.integers(0, 2**32),
    fmt=st.sampled_from(["integer", "int32", "int64"]),
    lo=st.integers(-50, 50),
    span=st.integers(0, 100),
)
def test_a_number_whose_format_says_integer_is_a_whole_number(seed: int, fmt: str, lo: int, span: int) -> None:
    """`adults: {"type": "number", "format": "integer", "minimum": 1}` (a spec's count): 2, never 42.54."""
    schema = {"type": "number", "format": fmt, "minimum": lo, "maximum": lo + span}
    value = _Values(random.Random(seed), CLOCK).make("adults", schema, attempt=2)
    assert type(value) is int and lo <= value <= lo + span


@pytest.mark.parametrize(
    ("schema", "whole"),
    [
        ({"type": "number", "description": "The number of adult guests staying in the room.", "examples": [2]}, True),
        ({"type": "number", "description": "Number of retries"}, True),
        ({"type": "number", "description": "Total count of items"}, True),
        ({"type": "number", "examples": [3, 4.0]}, True),
        ({"type": "number", "examples": [2.5]}, False),
        ({"type": "number", "description": "Price per night"}, False),
        ({"type": "number", "description": "A number of the form 1.5"}, False),
    ],
)
def test_a_spec_number_that_counts_things_is_made_whole(schema: dict[str, object], whole: bool) -> None:
    """π*'s own values (`ValueMaker`) for a spec's `number`: a count said so, or shown so by every example, is whole;
    any other number keeps its decimals."""
    maker = ValueMaker(random.Random(3), CLOCK)
    values = [maker.make("adults", schema) for _ in range(20)]
    if whole:
        assert all(type(v) is int for v in values)
    else:
        assert any(type(v) is float and not v.is_integer() for v in values)
