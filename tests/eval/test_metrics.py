"""pass@k and pass^k: checked against counting every k-subset of the attempts, and their invariants."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envfactory.eval.metrics import MetricError, TaskOutcomes, pass_at_k, pass_hat_k, pass_rates

counts = st.integers(min_value=1, max_value=9).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(min_value=0, max_value=n), st.integers(min_value=1, max_value=n))
)


@given(counts)
def test_both_equal_counting_every_subset_of_the_attempts(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


@given(counts)
def test_invariants(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    at, hat = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    assert 0.0 <= hat <= c / n + 1e-12 <= at + 2e-12 <= 1.0 + 3e-12  # all k ≤ one ≤ any of k
    assert pass_at_k(n, c, 1) == pytest.approx(c / n) == pass_hat_k(n, c, 1)
    if k < n:  # more attempts: "any" can only rise, "all" only fall
        assert pass_at_k(n, c, k + 1) >= at - 1e-12 and pass_hat_k(n, c, k + 1) <= hat + 1e-12
    assert (at == 0.0) == (c == 0) and (hat == 1.0) == (c == n)


def test_means_over_tasks_and_bad_counts() -> None:
    rates = pass_rates(
        [TaskOutcomes(task="a", attempts=4, successes=4), TaskOutcomes(task="b", attempts=4, successes=1)], [1, 2, 4]
    )
    assert rates.tasks == 2
    assert rates.pass_at[1] == pytest.approx((1 + 0.25) / 2) and rates.pass_at[4] == 1.0
    assert rates.pass_hat[4] == pytest.approx(0.5) and rates.pass_hat[2] == pytest.approx((1 + 0) / 2)
    with pytest.raises(MetricError, match="needs at least 5 attempts"):
        pass_at_k(4, 1, 5)
    with pytest.raises(MetricError, match="between 0 and the attempts"):
        pass_hat_k(4, 5, 1)
    assert pass_rates([], [1]).tasks == 0
