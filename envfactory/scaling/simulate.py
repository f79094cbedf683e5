"""Synthetic run tables from known composition-law parameters: to try the tools, and to test them.

Every combination of the grid's A, T, S and D values (powers of two by default, as in SynthAPI's
sweeps) becomes one run whose score is the composition law's prediction plus Gaussian noise
(standard deviation `noise`, from a generator seeded by `seed`), clipped to [0, 1]. No compute column
is written: the table's compute is then its proxy (N·D by default; see `table`).

The default parameters are illustrative, not SynthAPI's (the paper does not print its fitted values):
a diversity ceiling σ(−1 + 0.35·log₂(A·S·D)) that rises from 0.27 at A·S·D = 1 to 0.96 at 4096, and
a task term σ(−1.5 + 0.7·log₂T)^1.5 — so at a fixed budget N the split between apps and tasks
matters, which is what the N-only baseline cannot see.
"""

from __future__ import annotations

import itertools

import numpy as np
from pydantic import BaseModel, Field

from envfactory.scaling.laws import CompositionParams
from envfactory.scaling.table import Run, RunTable

DEFAULT_PARAMS = CompositionParams(c0=-1.0, ca=0.35, b0=-1.5, bt=0.7, nu=1.5)


class SimulationGrid(BaseModel):
    """The values of each composition variable; the table has one run per combination."""

    apps: list[int] = Field(default=[1, 2, 4, 8, 16, 32, 64], min_length=1)
    tasks: list[int] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128, 256], min_length=1)
    states: list[int] = Field(default=[1, 2, 4], min_length=1)
    depths: list[int] = Field(default=[1, 2, 4], min_length=1)


def simulate_table(
    params: CompositionParams = DEFAULT_PARAMS,
    grid: SimulationGrid | None = None,
    *,
    noise: float = 0.01,
    seed: int = 0,
    source: str = "<simulated>",
) -> RunTable:
    """One run per (A, T, S, D) of the grid, scored by the law plus seeded Gaussian noise."""
    if noise < 0:
        raise ValueError(f"noise must be non-negative, got {noise}")
    grid = grid or SimulationGrid()
    combos = list(itertools.product(grid.apps, grid.tasks, grid.states, grid.depths))
    a, t, s, d = (np.array(col, dtype=float) for col in zip(*combos, strict=True))
    rng = np.random.default_rng(seed)
    scores = np.clip(params.predict(a, t, s, d) + rng.normal(0.0, noise, len(combos)), 0.0, 1.0)
    runs = [
        Run(apps=ai, tasks=ti, states=si, depth=di, score=round(float(p), 6))
        for (ai, ti, si, di), p in zip(combos, scores, strict=True)
    ]
    return RunTable(source=source, runs=runs)
