"""`ValueMaker` draws from one Faker per thread with its own random stream: the values are those of a Faker
built and seeded for each maker (as before the sharing), whatever order makers on one thread take turns in."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import pytest
from faker import Faker
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.tasks.values import ValueMaker

NAMES = ["email", "phone", "guest_name", "name", "city", "country", "address", "title", "notes", "code", "word"]
CLOCK = datetime(2026, 5, 1, 9, 0)


class OwnFaker(ValueMaker):
    """The maker as it was: a Faker of its own, built and seeded with the same draw."""

    def __init__(self, rng: random.Random, clock: datetime) -> None:
        super().__init__(rng, clock)
        self._own = Faker()
        self._own.seed_instance(self.faker_seed)

    @property
    def faker(self) -> Faker:
        return self._own


@settings(max_examples=40, deadline=None)
@given(
    seeds=st.lists(st.integers(0, 2**31), min_size=1, max_size=4),
    turns=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(NAMES)), min_size=1, max_size=30),
)
def test_shared_faker_gives_each_maker_its_own_values(seeds: list[int], turns: list[tuple[int, str]]) -> None:
    shared = [ValueMaker(random.Random(s), CLOCK) for s in seeds]
    alone = [OwnFaker(random.Random(s), CLOCK) for s in seeds]
    got: list[Any] = []
    want: list[Any] = []
    for who, name in turns:
        i = who % len(seeds)
        got.append(shared[i].make(name, {"type": "string"}))
        want.append(alone[i].make(name, {"type": "string"}))
    assert got == want


def test_a_maker_seeded_alike_repeats_its_values_and_another_seed_differs() -> None:
    def values(seed: int) -> list[Any]:
        maker = ValueMaker(random.Random(seed), CLOCK)
        return [maker.make(n, {"type": "string"}) for n in NAMES * 3]

    assert values(7) == values(7) and values(7) != values(8)


def test_a_value_its_description_calls_an_email_address_is_one_in_a_list_too() -> None:
    maker = ValueMaker(random.Random(3), CLOCK)
    described = [
        ("people", {"type": "array", "items": {"type": "string"}, "description": "Email addresses of everyone."}),
        ("to", {"type": "string", "description": "The recipient's email address"}),
        ("owner", {"type": "string", "description": "Email of the account's owner"}),
    ]
    for name, schema in described:
        made = maker.make(name, schema)
        for value in made if isinstance(made, list) else [made]:
            assert isinstance(value, str) and "@" in value.split()[-1], (name, value)
    for name, description in [("subject", "Subject of the email"), ("body", "Email body to send")]:  # not addresses
        assert "@" not in maker.make(name, {"type": "string", "description": description})


@pytest.mark.parametrize(
    ("name", "schema"),
    [
        ("updated", {"type": "string", "description": "Last modification time of the task (as a RFC 3339 timestamp)."}),
        ("updated", {"type": "string"}),
        ("created_on", {"type": "string"}),
        ("last_modified", {"type": "string"}),
        ("due", {"type": "string", "description": "Due date of the task (ISO 8601 timestamp)."}),
    ],
)
def test_a_field_named_or_described_as_a_moment_gets_one(name: str, schema: dict[str, Any]) -> None:
    """Google's specs give their timestamps no format: compiled records said "updated": "event"."""
    value = ValueMaker(random.Random(0), CLOCK).make(name, schema)
    assert isinstance(value, str) and datetime.fromisoformat(value.replace("Z", "+00:00")), value


@pytest.mark.parametrize(
    ("name", "description"),
    [  # a skeptic's: flags, durations, formats and names of fields that only mention time
        ("status", "Status of the task."),
        ("sort_by", "Field to sort by: name or timestamp."),
        ("time_format", "How times are shown: 'iso' (a date-time) or 'unix'."),
        ("since", "Only events after this Unix timestamp (seconds)."),
        ("is_completed", "'Y' or 'N'."),
        ("deleted", "Whether the record is deleted ('true' or 'false')."),
        ("expires", "Cache lifetime, e.g. '30m' or '2h'."),
        ("timestamp_field", "Name of the column holding the timestamp."),
        ("window", "Duration in ISO 8601 format (PT30M)."),
    ],
)
def test_a_field_that_only_mentions_time_keeps_its_words(name: str, description: str) -> None:
    value = ValueMaker(random.Random(0), CLOCK).make(name, {"type": "string", "description": description})
    with pytest.raises(ValueError):
        datetime.fromisoformat(str(value))
