"""Fitting the laws to a run table, and SynthAPI's hold-out check of extrapolation.

**Fitting** — `scipy.optimize.least_squares` (trust-region reflective, the analytic Jacobian) on the squared
error of the score, within box bounds: intercepts in [−50, 50], slopes in [−20, 20] and ν in [0.001, 100] (ν >
0; past 100, σ(v)^ν is its Gompertz limit exp(−e^(−(v − ln ν))) and ν only trades against the intercept).
Starts: a linear regression of logit(score) on the law's variables first, then `restarts − 1` random starts
from a generator seeded by `seed` — the same table and seed give the same fit. The lowest sum of squares among
the converged starts wins, polished at tolerances of 1e-15 (`POLISH_TOL`, below); when none converges, `FitError`. A
law needs more runs than free parameters (6 for the composition law, 4 for the baseline) and runs that vary in
its variables.

**Fixed parameters** — a small table (the first real runs of a project: three or four compositions)
cannot pin five parameters. `fixed` holds named parameters at given values in every law that has them
(`nu` is in both) and fits the rest, so a law needs one run more than its *free* parameters. At a
single T the task factor σ(b₀ + b_t·log₂T)^ν is one constant: fixing b_t and ν (and b₀, to give that
constant a value) leaves σ(c₀ + c_a·log₂(A·S·D)), the diversity term alone. A fixed parameter is
reported with its value, no standard error, and `fixed`; it is never "at its bound".

**Standard errors** — from the Jacobian J at the optimum: cov = s²·(JᵀJ)⁻¹ with s² = RSS/(n − p), what
`curve_fit` reports with ``absolute_sigma=False``. A parameter at a bound, or on a direction the runs
do not determine (a zero singular value of J), gets no standard error and a warning.

**Hold-out** — sort the runs by compute (the table's column or its proxy, see `table`; ties keep
table order) and hold out the top ⌈fraction·n⌉ (SynthAPI: 25 %), fit both laws on the rest, and
report each law's mean absolute error on the fit runs and on the held-out runs, and the ratio of the
baseline's held-out MAE to the composition law's. A fraction of 0 fits on every run (no held-out MAE).
SynthAPI reports 0.0285 for the composition law against 0.1706 for the N-only baseline (≈ 6×).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy.optimize import least_squares

from envfactory.scaling.errors import FitError, ScalingError
from envfactory.scaling.laws import (
    COMPOSITION,
    DISPLAY,
    LAWS,
    N_ONLY,
    CompositionParams,
    Features,
    Law,
    NOnlyParams,
)
from envfactory.scaling.table import ComputeProxy, RunTable

# least_squares stops when the scaled gradient falls below gtol. Near a score of 0 or 1 the gradient is scaled
# down by σ'(v) as well (~0.007 at 0.993), so scipy's default 1e-8 stopped early there: on exact scores from
# c₀ = 0, c_a = 0.969 at A = 35–37, c₀ came back 1.1e-4 off (0.53 off at c₀ = c_a = 1, A = 62–64). Every start
# runs at the defaults; the best optimum is then polished with all three tolerances at POLISH_TOL (3e-11 off at worst
# over 300 random exact tables), in at most POLISH_NFEV evaluations, and kept only if it succeeds and is no
# worse. Tight tolerances on every start were tried: on a table whose rounded scores leave the gradient above
# them along a flat b₀/ν ridge, every start ran to its evaluation limit and the fit failed.
POLISH_TOL = 1e-15
POLISH_NFEV = 200

LawName = Literal["composition", "n_only"]
Fixed = Mapping[str, float]


def check_fixed(fixed: Fixed) -> None:
    """Every fixed name is some law's parameter, and its value lies within that parameter's bounds."""
    known = {name for spec in LAWS.values() for name in spec.param_names}
    for name, value in fixed.items():
        if name not in known:
            raise ScalingError(f"cannot fix '{name}': the laws' parameters are {', '.join(sorted(known))}")
        if not math.isfinite(value):
            raise ScalingError(f"cannot fix {name} at {value}: a fixed value must be a finite number")
        for spec in LAWS.values():
            if name in spec.param_names:
                i = spec.param_names.index(name)
                lo, hi = spec.bounds[0][i], spec.bounds[1][i]
                if not lo <= value <= hi:
                    raise ScalingError(
                        f"cannot fix {name} at {value:g}: the {spec.title} bounds it to [{lo:g}, {hi:g}]"
                    )


def free_count(law: Law | str, fixed: Fixed | None = None) -> int:
    """How many of the law's parameters a fit with `fixed` estimates."""
    return sum(1 for name in _law(law).param_names if name not in (fixed or {}))


class ParamEstimate(BaseModel):
    """One fitted parameter: its value and standard error (None where the runs do not give one)."""

    name: str
    value: float
    stderr: float | None = None
    at_bound: bool = False
    fixed: bool = Field(default=False, description="held at its value, not fitted")

    @property
    def display(self) -> str:
        return DISPLAY.get(self.name, self.name)


class LawFit(BaseModel):
    """A fitted law: parameters, goodness of fit on the runs it was fitted to, and how the fit went."""

    law: LawName
    formula: str
    params: list[ParamEstimate]
    n_runs: int
    rss: float = Field(description="residual sum of squares")
    mae: float = Field(description="mean absolute error on the fitted runs")
    rmse: float
    starts: int
    converged: int = Field(description="starts that converged (the best of them was kept)")
    warnings: list[str] = []

    def values(self) -> dict[str, float]:
        return {p.name: p.value for p in self.params}

    def theta(self) -> np.ndarray:
        return np.array([p.value for p in self.params], dtype=float)

    def predict(self, f: Features) -> np.ndarray:
        return LAWS[self.law].predict(self.theta(), f)

    def composition(self) -> CompositionParams:
        if self.law != "composition":
            raise ScalingError(f"a fit of the {self.law} law has no composition-law parameters")
        return CompositionParams.model_validate(self.values())

    def n_only(self) -> NOnlyParams:
        if self.law != "n_only":
            raise ScalingError(f"a fit of the {self.law} law has no N-only parameters")
        return NOnlyParams.model_validate(self.values())


def _law(law: Law | str) -> Law:
    if isinstance(law, Law):
        return law
    try:
        return LAWS[law]
    except KeyError:
        raise ScalingError(f"unknown law '{law}' (laws: {', '.join(LAWS)})") from None


def _too_few(spec: Law, fixed: Fixed | None, runs: int, detail: str = "") -> FitError:
    free = free_count(spec, fixed)
    p = len(spec.param_names)
    what = f"{p} parameters" if free == p else f"{free} free parameters ({p - free} fixed)"
    hint = "" if free < p else "; or hold some parameters fixed (--fix)"
    return FitError(f"the {spec.title} has {what} and needs at least {free + 1} runs to fit; got {runs}{detail}{hint}")


def fit_law(law: Law | str, table: RunTable, *, seed: int = 0, restarts: int = 8, fixed: Fixed | None = None) -> LawFit:
    """Fit one law to every run of `table` (module docstring: starts, bounds, standard errors, fixed
    parameters)."""
    spec = _law(law)
    fixed = dict(fixed or {})
    check_fixed(fixed)
    if restarts < 1:
        raise ScalingError(f"restarts must be at least 1, got {restarts}")
    free = np.array([name not in fixed for name in spec.param_names])
    if not free.any():
        raise ScalingError(f"every parameter of the {spec.title} is fixed: there is nothing to fit")
    if len(table) < int(free.sum()) + 1:
        raise _too_few(spec, fixed, len(table))
    f, y = table.features(), table.scores()
    if float(np.ptp(y)) <= 1e-9:  # all zeros, all ones: any law fits it, its errors are rounding and its SEs huge
        raise FitError(
            f"every run scored {y[0]:g}: a score that does not vary says nothing of how it scales "
            "(a harder evaluation, more attempts, or runs further apart give scores to fit)"
        )
    spec.check_identifiable(f, frozenset(n for n in spec.param_names if n not in fixed))
    held = np.array([fixed.get(name, 0.0) for name in spec.param_names], dtype=float)
    rng = np.random.default_rng(seed)
    starts = [spec.linear_start(f, y)] + [spec.random_start(rng) for _ in range(restarts - 1)]
    starts = [x0[free] for x0 in starts]
    lo, hi = (np.asarray(b, dtype=float)[free] for b in spec.bounds)

    def full(x: np.ndarray) -> np.ndarray:
        theta = held.copy()
        theta[free] = x
        return theta

    best: np.ndarray | None = None
    best_cost = math.inf
    converged = 0
    last_problem = "no start ran"

    def solve(x0: np.ndarray, tol: float, max_nfev: int) -> Any:
        return least_squares(
            lambda x: spec.predict(full(x), f) - y,
            x0,
            jac=lambda x: spec.jacobian(full(x), f)[:, free],
            bounds=(lo, hi),
            method="trf",
            x_scale="jac",
            ftol=tol,
            xtol=tol,
            gtol=tol,
            max_nfev=max_nfev,
        )

    for x0 in starts:
        try:
            res = solve(x0, 1e-8, 2000)  # scipy's default tolerances
        except (ValueError, FloatingPointError, np.linalg.LinAlgError) as e:
            last_problem = str(e).splitlines()[0]
            continue
        if not res.success or not np.all(np.isfinite(res.x)) or not np.isfinite(res.cost):
            last_problem = str(res.message)
            continue
        converged += 1
        if res.cost < best_cost:
            best, best_cost = np.asarray(res.x, dtype=float), float(res.cost)
    if best is not None:  # the best optimum polished at `POLISH_TOL`, kept only if that succeeds and is no worse
        try:
            res = solve(best, POLISH_TOL, POLISH_NFEV)
            if res.success and np.all(np.isfinite(res.x)) and np.isfinite(res.cost) and res.cost <= best_cost:
                best, best_cost = np.asarray(res.x, dtype=float), float(res.cost)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            pass
    if best is None:
        raise FitError(
            f"the {spec.title} did not converge from {len(starts)} starts ({last_problem}); "
            "check that the scores vary with the composition, or raise --restarts"
        )

    theta = full(best)
    resid = spec.predict(theta, f) - y
    params, warnings = _estimates(spec, theta, spec.jacobian(theta, f), resid, free)
    return LawFit(
        law=spec.name,
        formula=spec.formula,
        params=params,
        n_runs=len(table),
        rss=float(resid @ resid),
        mae=float(np.mean(np.abs(resid))),
        rmse=float(np.sqrt(np.mean(resid**2))),
        starts=len(starts),
        converged=converged,
        warnings=warnings,
    )


def _estimates(
    spec: Law, theta: np.ndarray, full_jac: np.ndarray, resid: np.ndarray, free: np.ndarray
) -> tuple[list[ParamEstimate], list[str]]:
    """Standard errors of the free parameters (the columns of `full_jac` where `free`)."""
    jac = full_jac[:, free]
    n, p = jac.shape
    lo, hi = (np.asarray(b, dtype=float)[free] for b in spec.bounds)
    x = theta[free]
    at_bound = np.abs(x - lo) <= 1e-5 * (hi - lo)
    at_bound |= np.abs(hi - x) <= 1e-5 * (hi - lo)
    stderr = np.full(p, np.nan)
    undetermined = np.zeros(p, dtype=bool)
    _, sing, vt = np.linalg.svd(jac, full_matrices=False)
    tol = np.finfo(float).eps * max(n, p) * (sing[0] if sing.size else 0.0)
    keep = sing > tol
    null = vt[~keep]
    if null.size:
        undetermined = np.any(np.abs(null) > 1e-6, axis=0)
    if n > p and keep.any():
        s2 = float(resid @ resid) / (n - p)
        v = vt[keep]
        cov = (v.T / sing[keep] ** 2) @ v * s2
        stderr = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    warnings: list[str] = []
    params: list[ParamEstimate] = []
    free_names = [name for name, is_free in zip(spec.param_names, free, strict=True) if is_free]
    for name, value in zip(spec.param_names, theta, strict=True):
        if name not in free_names:
            params.append(ParamEstimate(name=name, value=float(value), fixed=True))
            continue
        i = free_names.index(name)
        se: float | None = float(stderr[i])
        label = DISPLAY.get(name, name)
        if at_bound[i]:
            bound = lo[i] if abs(x[i] - lo[i]) < abs(hi[i] - x[i]) else hi[i]
            warnings.append(f"{label} sits at its bound {bound:g}: the runs do not pin it")
            se = None
        elif undetermined[i]:
            warnings.append(f"{label} is not determined by these runs (no standard error)")
            se = None
        elif se is None or not math.isfinite(se):
            se = None
        params.append(ParamEstimate(name=name, value=float(value), stderr=se, at_bound=bool(at_bound[i])))
    return params, warnings


# -- hold-out ------------------------------------------------------------------------------------


class RowPrediction(BaseModel):
    """One run of the table with both laws' predictions; `held` when it was held out of the fit."""

    row: int = Field(description="1-based position in the table")
    apps: int
    tasks: int
    states: int
    depth: int
    n: int
    compute: float
    score: float
    held: bool
    composition: float
    n_only: float
    label: str | None = None


class ModelScore(BaseModel):
    """A law fitted on the fit runs, and its mean absolute error on fit and held-out runs."""

    fit: LawFit
    mae_fit: float
    mae_held: float | None = None


class HoldoutReport(BaseModel):
    """Both laws fitted on the lower-compute runs and scored on the highest-compute ones."""

    source: str
    model: str | None = None
    fraction: float
    compute_name: str
    n_fit: int
    n_held: int
    threshold: float | None = Field(default=None, description="the smallest held-out compute")
    extrapolation: float | None = Field(
        default=None, description="largest held-out compute / largest fit compute (SynthAPI: ≈16×)"
    )
    composition: ModelScore
    n_only: ModelScore
    fixed: dict[str, float] = Field(default={}, description="parameters held at these values in every law")
    ratio: float | None = Field(default=None, description="baseline held-out MAE / composition held-out MAE")
    rows: list[RowPrediction]


def split_by_compute(
    table: RunTable, fraction: float = 0.25, proxy: ComputeProxy = "nd"
) -> tuple[list[int], list[int]]:
    """(fit rows, held-out rows) as 0-based indices: the top ⌈fraction·n⌉ by compute are held out."""
    if not 0.0 <= fraction < 1.0:
        raise ScalingError(f"hold-out fraction must be in [0, 1), got {fraction:g}")
    compute = table.compute(proxy)
    order = sorted(range(len(table)), key=lambda i: (compute[i], i))
    n_held = math.ceil(fraction * len(table) - 1e-9)
    cut = len(order) - n_held
    return sorted(order[:cut]), sorted(order[cut:])


def evaluate_holdout(
    table: RunTable,
    *,
    fraction: float = 0.25,
    proxy: ComputeProxy = "nd",
    seed: int = 0,
    restarts: int = 8,
    fixed: Fixed | None = None,
) -> HoldoutReport:
    """Hold out the top `fraction` of runs by compute, fit both laws on the rest (holding `fixed`
    parameters at their values), score both."""
    fixed = dict(fixed or {})
    check_fixed(fixed)
    fit_idx, held_idx = split_by_compute(table, fraction, proxy)
    fit_table = table.subset(fit_idx)
    held = len(held_idx)
    for spec in (COMPOSITION, N_ONLY):
        if len(fit_idx) < free_count(spec, fixed) + 1:
            raise _too_few(spec, fixed, len(fit_idx), f" ({len(table)} runs, {held} held out)")
    fits = {
        spec.name: fit_law(spec, fit_table, seed=seed, restarts=restarts, fixed=fixed) for spec in (COMPOSITION, N_ONLY)
    }

    f, y, compute = table.features(), table.scores(), table.compute(proxy)
    pred = {name: fit.predict(f) for name, fit in fits.items()}
    held_mask = np.zeros(len(table), dtype=bool)
    held_mask[held_idx] = True

    def score(name: str) -> ModelScore:
        err = np.abs(pred[name] - y)
        return ModelScore(
            fit=fits[name],
            mae_fit=float(err[~held_mask].mean()),
            mae_held=float(err[held_mask].mean()) if held else None,
        )

    comp, base = score("composition"), score("n_only")
    ratio = None
    if comp.mae_held is not None and base.mae_held is not None and comp.mae_held > 0:
        ratio = base.mae_held / comp.mae_held
    rows = [
        RowPrediction(
            row=i + 1,
            apps=r.apps,
            tasks=r.tasks,
            states=r.states,
            depth=r.depth,
            n=r.n,
            compute=float(compute[i]),
            score=r.score,
            held=bool(held_mask[i]),
            composition=float(pred["composition"][i]),
            n_only=float(pred["n_only"][i]),
            label=r.label,
        )
        for i, r in enumerate(table.runs)
    ]
    models = table.models()
    return HoldoutReport(
        source=table.source,
        model=models[0] if len(models) == 1 else None,
        fraction=fraction,
        compute_name=table.compute_name(proxy),
        n_fit=len(fit_idx),
        n_held=held,
        threshold=float(compute[held_mask].min()) if held else None,
        extrapolation=float(compute[held_mask].max() / compute[~held_mask].max()) if held else None,
        composition=comp,
        n_only=base,
        fixed=fixed,
        ratio=ratio,
        rows=rows,
    )
