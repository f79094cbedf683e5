"""Confidence intervals for an evaluation's figures: pass@1 over items with a bootstrap, and a paired difference.

An evaluation makes k attempts at each of n items. An item's pass@1 is its share of successful attempts (the
unbiased estimate, c/k); the run's pass@1 is the mean over items. Its 95 % interval is a percentile bootstrap
over **items** (the items are the sample; the attempts of an item stay together), with a seeded generator, so
the same attempts give the same interval. Any per-attempt figure (the reward) works the same way.

Two runs over the same items (a model before and after training, same seeds) are compared **paired**: each
resample draws items, and the difference of the two means is taken on the same drawn items, which removes the
between-item variance that two separate intervals would count twice. Runs over different item sets are refused
(`StatsError` names items on each side): a difference between two different samples of items is not paired.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from envfactory.errors import DataError

RESAMPLES = 2000
LEVEL = 0.95


class StatsError(DataError):
    """Figures that cannot give an interval (no item, runs over different items...)."""


class Interval(BaseModel):
    """An estimate with its bootstrap confidence interval."""

    model_config = ConfigDict(extra="forbid")

    estimate: float
    low: float
    high: float
    level: float = Field(description="the interval's confidence level, e.g. 0.95")
    items: int = Field(description="items the estimate is a mean over")

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


class Attempt(Protocol):
    """What the statistics read of an attempt record (`envfactory.eval.run.AttemptRecord` has it)."""

    @property
    def item(self) -> str: ...

    @property
    def success(self) -> bool: ...


Record = TypeVar("Record", bound=Attempt)


def item_means(records: Iterable[Record], value: Callable[[Record], float] | None = None) -> dict[str, float]:
    """Each item's mean over its attempts of `value` (default: success, so the item's pass@1)."""
    read: Callable[[Record], float] = value or (lambda r: float(r.success))
    by_item: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_item[r.item].append(read(r))
    return {item: sum(xs) / len(xs) for item, xs in sorted(by_item.items())}


def _check(level: float, resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise StatsError(f"the confidence level must be between 0 and 1 (got {level})")
    if resamples < 1:
        raise StatsError(f"the bootstrap needs at least one resample (got {resamples})")


def _percentiles(means: list[float], level: float) -> tuple[float, float]:
    """The two-sided percentile interval of bootstrap means (nearest rank)."""
    means.sort()
    tail = (1.0 - level) / 2.0
    last = len(means) - 1
    return means[round(tail * last)], means[round((1.0 - tail) * last)]


def bootstrap_mean(
    values: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """The mean of per-item values with a percentile-bootstrap interval over items. With very few items (or all
    equal) the interval is as narrow as the data, not as the truth: one item gives [x, x]."""
    _check(level, resamples)
    n = len(values)
    if n == 0:
        raise StatsError("no item to estimate over: the evaluation holds no attempt")
    if any(not math.isfinite(v) for v in values):
        raise StatsError("an item's value is not a finite number (NaN or infinite): no interval over it")
    rng = random.Random(seed)
    means = [sum(rng.choices(values, k=n)) / n for _ in range(resamples)]
    low, high = _percentiles(means, level)
    return Interval(estimate=sum(values) / n, low=low, high=high, level=level, items=n)


def pass_at_1(
    records: Iterable[Attempt], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """pass@1 (each item's share of successful attempts, averaged over items) with its bootstrap interval."""
    return bootstrap_mean(list(item_means(records).values()), level=level, resamples=resamples, seed=seed)


def same_items(before: Mapping[str, float], after: Mapping[str, float]) -> list[str]:
    """The items both runs hold, sorted; a `StatsError` naming some items only one run holds, if any."""
    only_before = sorted(set(before) - set(after))
    only_after = sorted(set(after) - set(before))
    if only_before or only_after:
        raise StatsError(
            "the two runs are not over the same items, so they cannot be paired: "
            f"{len(only_before)} only in the first ({', '.join(only_before[:3]) or '-'}), "
            f"{len(only_after)} only in the second ({', '.join(only_after[:3]) or '-'}); "
            "evaluate both on the same items (same eval set, same --limit)"
        )
    return sorted(before)


def paired_difference(
    before: Mapping[str, float],
    after: Mapping[str, float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """after − before, the mean over items of each item's difference, with a paired bootstrap interval (items
    resampled once for both runs). Both maps are item → per-item value (`item_means`) over the same items."""
    items = same_items(before, after)
    return bootstrap_mean([after[i] - before[i] for i in items], level=level, resamples=resamples, seed=seed)


class Comparison(BaseModel):
    """Two runs over the same items: each one's figure and the paired difference, all with intervals."""

    model_config = ConfigDict(extra="forbid")

    before: Interval
    after: Interval
    difference: Interval


def compare(
    before: Iterable[Record],
    after: Iterable[Record],
    value: Callable[[Record], float] | None = None,
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Two runs' attempts compared on `value` (default success: pass@1), paired over their common items."""
    first, second = item_means(before, value), item_means(after, value)
    same_items(first, second)
    return Comparison(
        before=bootstrap_mean(list(first.values()), level=level, resamples=resamples, seed=seed),
        after=bootstrap_mean(list(second.values()), level=level, resamples=resamples, seed=seed),
        difference=paired_difference(first, second, level=level, resamples=resamples, seed=seed),
    )
