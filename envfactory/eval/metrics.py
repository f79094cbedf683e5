"""pass@k and pass^k from n attempts per task, unbiased, and their means over tasks.

With n attempts of a task of which c succeed, the chance that k attempts drawn without replacement
from them hold at least one success is pass@k = 1 − C(n−c, k) / C(n, k) (Chen et al., 2021), and the
chance that all k succeed is pass^k = C(c, k) / C(n, k) (τ-bench / τ²-bench). Both equal c/n at k = 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import comb

from pydantic import BaseModel, Field

from envfactory.errors import DataError


class MetricError(DataError, ValueError):
    """Counts that cannot give the asked metric (k larger than the attempts, negative counts...)."""


def _check(n: int, c: int, k: int) -> None:
    if n < 1 or k < 1:
        raise MetricError(f"need at least one attempt and k ≥ 1 (n={n}, k={k})")
    if not 0 <= c <= n:
        raise MetricError(f"successes must be between 0 and the attempts (c={c}, n={n})")
    if k > n:
        raise MetricError(f"pass@{k} needs at least {k} attempts per task, this task has {n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k attempts (of the n made, c of them successes) succeeds."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all k attempts (of the n made, c of them successes) succeed: pass^k."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


class TaskOutcomes(BaseModel):
    """A task's attempts: how many were made and how many succeeded."""

    task: str
    attempts: int = Field(ge=1)
    successes: int = Field(ge=0)


class PassRates(BaseModel):
    """Means over tasks of pass@k and pass^k for each k asked (keys are k)."""

    tasks: int
    pass_at: dict[int, float]
    pass_hat: dict[int, float]


def pass_rates(outcomes: Iterable[TaskOutcomes], ks: Iterable[int]) -> PassRates:
    """The mean pass@k and pass^k over tasks; a k larger than some task's attempts is an error."""
    rows = list(outcomes)
    wanted = sorted(set(ks))
    if not rows:
        return PassRates(tasks=0, pass_at={k: 0.0 for k in wanted}, pass_hat={k: 0.0 for k in wanted})
    at = {k: sum(pass_at_k(r.attempts, r.successes, k) for r in rows) / len(rows) for k in wanted}
    hat = {k: sum(pass_hat_k(r.attempts, r.successes, k) for r in rows) / len(rows) for k in wanted}
    return PassRates(tasks=len(rows), pass_at=at, pass_hat=hat)
