"""Suggesting a composition for a task budget: the (A, T, S, D) the fitted law predicts best.

For a budget of N training instances (N = A×T×S) the search tries every A and S among the divisors
of N, the powers of two and the limits themselves (`max_apps`: the apps you have), sets T = ⌊N/(A·S)⌋
(capped by `max_tasks`), so a composition uses N′ = A·T·S ≤ N instances — exactly N when A·S divides
it — and tries every allowed depth D. Candidates are ranked by the composition law's prediction.

The law sees A, S and D only through the product A·S·D, so compositions with the same product and
the same T tie. Each tie is listed once, by its representative with the most apps (tool diversity:
SynthAPI found more apps winning at large budgets, and apps are what the other two cannot replace),
then the least depth (D lengthens every trajectory: tokens, compute), then the fewest states;
`alternatives` counts the tied compositions not listed.

Limits matter because the law has no cost for D and no ceiling for A: with c_a > 0 it always prefers
the largest allowed D and as many apps as the budget allows. Set `max_apps` to the apps you have and
`depths` to what your generator and context length support; the CLI defaults S and D to the range
the table covers, so a suggestion does not extrapolate in them.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, Field, model_validator

from envfactory.scaling.errors import BudgetError
from envfactory.scaling.laws import CompositionParams

MAX_BUDGET = 10**12


class CompositionLimits(BaseModel):
    """What a suggested composition may use."""

    min_apps: int = Field(default=1, ge=1)
    max_apps: int | None = Field(default=None, ge=1, description="the apps you have; None: no limit")
    min_states: int = Field(default=1, ge=1)
    max_states: int | None = Field(default=None, ge=1)
    max_tasks: int | None = Field(default=None, ge=1, description="tasks per app you can generate")
    depths: list[int] = Field(default=[1, 2, 4], min_length=1, description="allowed data depths D")

    @model_validator(mode="after")
    def _ranges(self) -> CompositionLimits:
        if self.max_apps is not None and self.max_apps < self.min_apps:
            raise ValueError(f"max_apps {self.max_apps} is below min_apps {self.min_apps}")
        if self.max_states is not None and self.max_states < self.min_states:
            raise ValueError(f"max_states {self.max_states} is below min_states {self.min_states}")
        if any(d < 1 for d in self.depths):
            raise ValueError(f"depths must be positive integers, got {self.depths}")
        return self


class Suggestion(BaseModel):
    """A composition, the instances it uses and the law's predicted score."""

    apps: int
    tasks: int
    states: int
    depth: int
    n: int = Field(description="instances used: A×T×S ≤ the budget")
    predicted: float
    alternatives: int = Field(default=0, description="compositions with the same A·S·D and T (same prediction)")


def _divisors(n: int) -> list[int]:
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def candidates(n: int, low: int, high: int | None) -> list[int]:
    """Divisors of n and powers of two up to n, within [low, high], and both ends of that range themselves (the
    apps you have, `max_apps`, is a composition to try whether or not it divides the budget)."""
    top = n if high is None else min(n, high)
    values = set(_divisors(n))
    values.update(1 << k for k in range(n.bit_length()))
    values.update((low, top))
    return sorted(v for v in values if low <= v <= top)


def suggest_compositions(
    params: CompositionParams, budget: int, limits: CompositionLimits | None = None, top: int = 5
) -> list[Suggestion]:
    """The `top` compositions for `budget` instances, best predicted first (module docstring)."""
    limits = limits or CompositionLimits()
    if not 1 <= budget <= MAX_BUDGET:
        raise BudgetError(f"budget must be between 1 and {MAX_BUDGET:g} instances, got {budget}")
    if top < 1:
        raise BudgetError(f"top must be at least 1, got {top}")
    rows: list[tuple[int, int, int]] = []  # (A, T, S)
    for a in candidates(budget, limits.min_apps, limits.max_apps):
        for s in candidates(budget // a, limits.min_states, limits.max_states):
            t = budget // (a * s)
            if limits.max_tasks is not None:
                t = min(t, limits.max_tasks)
            if t >= 1:
                rows.append((a, t, s))
    if not rows:
        raise BudgetError(
            f"no composition of {budget} instances fits the limits (A ≥ {limits.min_apps}, S ≥ {limits.min_states}); "
            "raise the budget or lower the minimums"
        )
    depths = sorted(set(limits.depths))
    grid = np.array([(a, t, s, d) for a, t, s in rows for d in depths], dtype=float)
    pred = params.predict(grid[:, 0], grid[:, 1], grid[:, 2], grid[:, 3])

    # one entry per (A·S·D, T) class; its representative: most apps, then least depth, then fewest states
    classes: dict[tuple[int, int], list[int]] = {}
    for i, (a, t, s, d) in enumerate(grid.astype(int)):
        classes.setdefault((int(a * s * d), int(t)), []).append(i)
    best: list[Suggestion] = []
    for members in classes.values():
        rep = min(members, key=lambda i: (-grid[i, 0], grid[i, 3], grid[i, 2]))
        a, t, s, d = (int(v) for v in grid[rep])
        best.append(
            Suggestion(
                apps=a,
                tasks=t,
                states=s,
                depth=d,
                n=a * t * s,
                predicted=float(pred[rep]),
                alternatives=len(members) - 1,
            )
        )
    best.sort(key=lambda g: (-g.predicted, g.n * g.depth, -g.apps))
    return best[:top]
