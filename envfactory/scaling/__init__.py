"""SynthAPI's composition scaling law: run tables, the two laws, fitting with a compute hold-out,
the figure, and composition suggestions for a task budget.

- `table`    the run table (A, T, S, D, score[, compute, model, label]) from CSV / JSONL / JSON
- `laws`     P = σ(c₀ + c_a·log₂(A·S·D)) · σ(b₀ + b_t·log₂T)^ν and the N-only baseline σ(a₀ + a₁·log₂N)^ν
- `fit`      least-squares fits with seeded restarts and standard errors; the top-25 %-compute hold-out
- `plot`     observed vs predicted and the extrapolation frontier, one PNG
- `budget`   the best compositions for a budget of N = A×T×S instances
- `simulate` synthetic tables from known parameters

`envfactory scaling fit | suggest | simulate` (`envfactory/cli/scaling.py`) is the command line.
"""

from envfactory.scaling.budget import CompositionLimits, Suggestion, suggest_compositions
from envfactory.scaling.errors import BudgetError, FitError, RunTableError, ScalingError
from envfactory.scaling.fit import HoldoutReport, LawFit, ParamEstimate, evaluate_holdout, fit_law, split_by_compute
from envfactory.scaling.laws import COMPOSITION, N_ONLY, CompositionParams, Features, NOnlyParams
from envfactory.scaling.simulate import DEFAULT_PARAMS, SimulationGrid, simulate_table
from envfactory.scaling.table import Run, RunTable, load_table, write_table

__all__ = [
    "COMPOSITION",
    "DEFAULT_PARAMS",
    "N_ONLY",
    "BudgetError",
    "CompositionLimits",
    "CompositionParams",
    "Features",
    "FitError",
    "HoldoutReport",
    "LawFit",
    "NOnlyParams",
    "ParamEstimate",
    "Run",
    "RunTable",
    "RunTableError",
    "ScalingError",
    "SimulationGrid",
    "Suggestion",
    "evaluate_holdout",
    "fit_law",
    "load_table",
    "simulate_table",
    "split_by_compute",
    "suggest_compositions",
    "write_table",
]
