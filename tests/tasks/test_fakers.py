"""`tasks.fakers`: a thread's one Faker on a caller's stream gives what a Faker built and seeded for that caller
gives, weighted draws included (their running sums are kept), whatever order callers take turns in."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from faker import Faker
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.tasks.fakers import seeded_faker, thread_faker

# weighted tables (names, words by frequency), formats (company, address) and plain draws
METHODS = [
    "first_name",
    "last_name",
    "name",
    "company",
    "street_address",
    "city",
    "email",
    "phone_number",
    "word",
    "sentence",
    "user_name",
    "country",
    "job",
]


def _fresh(locale: str, seed: int) -> Faker:
    faker = Faker(locale)
    faker.seed_instance(seed)
    return faker


@settings(max_examples=30, deadline=None)
@given(
    locale=st.sampled_from(["en_US", "de_DE", "fr_FR"]),
    seeds=st.lists(st.integers(0, 2**63), min_size=1, max_size=3),
    turns=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(METHODS)), min_size=1, max_size=25),
)
def test_a_threads_faker_draws_what_a_new_seeded_one_draws(locale: str, seeds: list[int], turns: list[Any]) -> None:
    streams = [random.Random(s) for s in seeds]
    alone = [_fresh(locale, s) for s in seeds]
    for who, method in turns:
        i = who % len(seeds)
        assert getattr(thread_faker(streams[i], locale), method)() == getattr(alone[i], method)(), method


@settings(max_examples=30, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=40),
    length=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_weighted_draws_of_any_table_and_length_match_fakers_own(weights: list[float], length: int, seed: int) -> None:
    table = OrderedDict((f"v{i}", w) for i, w in enumerate(weights))
    # a provider's own draws (what its methods call; the Faker's `random_elements` is the one it was built with)
    ours = seeded_faker("en_US", seed).providers[0]
    want = _fresh("en_US", seed).providers[0]
    for _ in range(3):  # the sums are kept after the first draw
        assert ours.random_elements(table, length=length) == want.random_elements(table, length=length)
    n = min(2, len(table))  # without replacement: Faker's own
    assert ours.random_elements(table, length=n, unique=True) == want.random_elements(table, length=n, unique=True)
    assert ours.random_element(list(table)) == want.random_element(list(table))


def test_a_table_changed_in_place_is_summed_again() -> None:
    table = OrderedDict([("a", 1.0), ("b", 1.0)])
    ours, want = seeded_faker("en_US", 5).providers[0], _fresh("en_US", 5).providers[0]
    assert ours.random_elements(table, length=4) == want.random_elements(table, length=4)
    table["c"] = 50.0  # (Faker's own keeps the old keys: it is compared with a new table holding the same)
    assert ours.random_elements(table, length=6) == want.random_elements(OrderedDict(table), length=6)


def test_tables_made_per_draw_are_not_kept_without_bound() -> None:
    provider = seeded_faker("en_US", 9).providers[0]
    want = _fresh("en_US", 9).providers[0]
    for i in range(600):  # a provider that builds its weighted table at every draw
        table = OrderedDict([(f"a{i}", 1.0), (f"b{i}", 3.0)])
        assert provider.random_elements(table, length=1) == want.random_elements(table, length=1)
    assert len(provider.random_elements.sums) <= 256
