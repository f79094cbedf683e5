"""pass@1 with a bootstrap interval over items, and the paired difference of two runs (`envfactory.eval.stats`).

Simulations with fixed seeds: items of random difficulty drawn from a known population, k attempts each; the 95 %
interval of pass@1 must cover the population's true pass@1 in most trials (generous bounds: the percentile
bootstrap runs a little short of its level on small samples), the paired difference must exclude 0 for a clear
effect and include it when the two runs have the same success chances.
"""

from __future__ import annotations

import random

import pytest

from envfactory.eval.run import AttemptRecord, summarize
from envfactory.eval.stats import (
    Interval,
    StatsError,
    bootstrap_mean,
    compare,
    item_means,
    paired_difference,
    pass_at_1,
)


def attempts(chances: list[float], k: int, rng: random.Random, prefix: str = "item") -> list[AttemptRecord]:
    return [
        AttemptRecord(
            item=f"{prefix}{i}",
            attempt=a,
            success=rng.random() < p,
            reward=p,
            env="shop",
            kind="read",
            chain_length=1,
        )
        for i, p in enumerate(chances)
        for a in range(k)
    ]


POPULATIONS = {
    "uniform": (lambda rng: rng.random(), 0.5),
    "mostly hard": (lambda rng: rng.betavariate(0.5, 3.0), 0.5 / 3.5),
}


@pytest.mark.parametrize("population", sorted(POPULATIONS))
def test_the_interval_covers_the_true_pass_at_1_most_of_the_time(population: str) -> None:
    draw, truth = POPULATIONS[population]
    trials, covered, widths = 150, 0, []
    for trial in range(trials):
        rng = random.Random(1000 + trial)
        records = attempts([draw(rng) for _ in range(60)], 4, rng)
        interval = pass_at_1(records, resamples=400, seed=trial)
        covered += interval.covers(truth)
        widths.append(interval.high - interval.low)
    assert 0.85 <= covered / trials <= 0.995, covered
    assert max(widths) < 0.4  # an interval that covers by being huge is no interval


def test_pass_at_1_is_the_evaluations_own_figure() -> None:
    rng = random.Random(3)
    records = attempts([rng.random() for _ in range(25)], 4, rng)
    interval = pass_at_1(records)
    assert interval.estimate == pytest.approx(summarize(records, 4).pass_rates.pass_at[1])
    assert interval.items == 25 and interval.low <= interval.estimate <= interval.high
    assert pass_at_1(records) == interval  # seeded: the same attempts give the same interval
    assert pass_at_1(records, seed=1) != interval
    rewards = item_means(records, lambda r: r.reward)  # any per-attempt figure
    assert bootstrap_mean(list(rewards.values())).estimate == pytest.approx(summarize(records, 4).mean_reward)


def test_the_paired_difference_sees_a_clear_effect_and_no_effect() -> None:
    clear = excluded_none = 0
    trials = 60
    for trial in range(trials):
        rng = random.Random(trial)
        chances = [rng.random() * 0.6 for _ in range(50)]
        base = attempts(chances, 4, rng)
        better = attempts([p + 0.3 for p in chances], 4, rng)
        same = attempts(chances, 4, rng)
        effect = compare(base, better, resamples=400, seed=trial).difference
        none = compare(base, same, resamples=400, seed=trial).difference
        clear += effect.low > 0
        excluded_none += not none.covers(0.0)
        assert effect.estimate > none.estimate
    assert clear == trials  # +0.3 on 50 items × 4 attempts: never missed
    assert excluded_none <= 0.15 * trials  # about 5 % expected


def test_pairing_is_narrower_than_two_separate_intervals() -> None:
    rng = random.Random(7)
    chances = [rng.random() for _ in range(80)]  # items differ a lot; a run's attempts depend on them
    result = compare(attempts(chances, 4, rng), attempts([min(1.0, p + 0.05) for p in chances], 4, rng))
    separate = (result.before.high - result.before.low) + (result.after.high - result.after.low)
    assert result.difference.high - result.difference.low < separate / 2


def test_runs_over_different_items_are_refused() -> None:
    rng = random.Random(0)
    first = attempts([0.5] * 5, 2, rng)
    second = attempts([0.5] * 4, 2, rng) + attempts([0.5], 2, rng, prefix="other")
    with pytest.raises(StatsError, match=r"1 only in the first \(item4\), 1 only in the second \(other0\)"):
        compare(first, second)
    with pytest.raises(StatsError, match="not over the same items"):
        paired_difference({"a": 1.0}, {"b": 1.0})


def test_degenerate_and_wrong_inputs() -> None:
    assert bootstrap_mean([0.25]) == Interval(estimate=0.25, low=0.25, high=0.25, level=0.95, items=1)
    assert str(bootstrap_mean([0.0, 1.0], resamples=50)).startswith("0.500 [")
    with pytest.raises(StatsError, match="no item"):
        pass_at_1([])
    with pytest.raises(StatsError, match="between 0 and 1"):
        bootstrap_mean([1.0], level=95)
    with pytest.raises(StatsError, match="at least one resample"):
        bootstrap_mean([1.0], resamples=0)
    with pytest.raises(StatsError, match="not a finite number"):
        bootstrap_mean([0.5, float("nan")])
