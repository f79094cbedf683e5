"""One Faker per thread and locale, drawing from the caller's own random stream.

A Faker takes about a millisecond to build (a quarter of a synthesis unit's time when every solver and every
initial state built its own), so each thread keeps one per locale and hands it the caller's stream before
each use: the values are those of `Faker(locale)` built and `seed_instance(seed)`-ed for that caller, and
callers that take turns on a thread do not disturb each other's streams. Its providers' weighted draws (a
first name by its frequency) keep their running sums instead of adding up ~1,000 weights at every draw:
the same draws from the same stream.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from itertools import accumulate
from typing import Any

from faker import Faker

_FAKERS = threading.local()
DEFAULT_LOCALE = "en_US"  # what `Faker()` uses
_TABLES_KEPT = 256  # weighted tables a provider keeps the sums of (Faker's own are a few dozen, made once)


def thread_faker(stream: random.Random, locale: str = DEFAULT_LOCALE) -> Faker:
    """This thread's Faker for `locale`, drawing from `stream` (`random.Random(seed)` gives the values of a
    new Faker seeded with `seed`)."""
    fakers: dict[str, Faker] | None = getattr(_FAKERS, "by_locale", None)
    if fakers is None:
        fakers = _FAKERS.by_locale = {}
    faker = fakers.get(locale)
    if faker is None:
        faker = fakers[locale] = Faker(locale)
        for provider in faker.providers:
            provider.random_elements = _WeightedDraws(provider)
    faker.random = stream  # type: ignore[attr-defined]  # what seed_instance(seed) sets up
    return faker


def seeded_faker(locale: str, seed: int) -> Faker:
    """This thread's Faker for `locale` on a new stream seeded with `seed`."""
    return thread_faker(random.Random(seed), locale)


class _WeightedDraws:
    """A provider's `random_elements` that keeps the running sums of each weighted table it draws from:
    `random.choices(keys, cum_weights=sums)` is what `random.choices(keys, weights=...)` does once it has
    summed them. Anything but a weighted draw with replacement of a given length goes to Faker's own."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.fakers_own = provider.random_elements
        self.sums: dict[int, tuple[OrderedDict[Any, Any], tuple[Any, ...], list[float]]] = {}

    def __call__(
        self,
        elements: Any = ("a", "b", "c"),
        length: int | None = None,
        unique: bool = False,
        use_weighting: bool | None = None,
    ) -> Any:
        weighted = self.provider.__use_weighting__ if use_weighting is None else use_weighting
        if unique or length is None or not weighted or not isinstance(elements, OrderedDict) or not elements:
            return self.fakers_own(elements, length, unique, use_weighting)
        table = self.sums.get(id(elements))
        if table is None or table[0] is not elements or len(table[1]) != len(elements):
            if len(self.sums) >= _TABLES_KEPT:  # a provider that builds its tables per draw: kept no longer
                self.sums.clear()
            table = self.sums[id(elements)] = (elements, tuple(elements), list(accumulate(elements.values())))
        return self.provider.generator.random.choices(table[1], cum_weights=table[2], k=length)
