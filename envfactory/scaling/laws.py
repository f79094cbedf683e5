"""The two laws fitted to a run table: SynthAPI's composition law and an N-only baseline.

**Composition law** (SynthAPI)::

    P(A, T, S, D) = σ(c₀ + c_a·log₂(A·S·D)) · σ(b₀ + b_t·log₂T)^ν

The first factor is a ceiling set by diversity — apps A, initial databases per task S and data depth
D enter only through their product; the second is the approach to that ceiling as tasks per app T
grow, a generalized logistic whose shape ν > 0 sets how sharply it saturates. Five parameters.

**N-only baseline**::

    P(N) = σ(a₀ + a₁·log₂N)^ν,   N = A·T·S

The same generalized-logistic form in the one size variable SynthAPI compares against, with three
parameters. Collapsing the composition law itself onto N (σ(c₀ + c₁·log₂N)·σ(b₀ + b₁·log₂N)^ν, five
parameters) is not an alternative: two sigmoids of the same variable trade intercepts and slopes
against each other, so its parameters are not identified. The baseline is what a user without the
composition variables would fit; any loss it shows is information N alone does not carry.

Both laws lie in (0, 1), like the normalized scores. A law here is stateless: `predict` and
`jacobian` take a parameter vector θ (in `param_names` order) and the `Features` of some runs;
`CompositionParams` and `NOnlyParams` are the named, validated forms users and other modules pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, Field
from scipy.special import expit, log_expit

from envfactory.scaling.errors import FitError

INTERCEPT = (-50.0, 50.0)
SLOPE = (-20.0, 20.0)
SHAPE = (1e-3, 100.0)  # ν > 0; beyond 100, σ(v)^ν ≈ exp(−e^(−(v − ln ν))): ν only shifts b₀ by ln ν

Values = float | Sequence[float] | np.ndarray  # a number or an array of them, broadcast like numpy

DISPLAY = {"c0": "c₀", "ca": "c_a", "b0": "b₀", "bt": "b_t", "nu": "ν", "a0": "a₀", "a1": "a₁"}


@dataclass(frozen=True)
class Features:
    """The composition columns of some runs, as float arrays of equal length."""

    apps: np.ndarray
    tasks: np.ndarray
    states: np.ndarray
    depth: np.ndarray

    @classmethod
    def of(
        cls,
        apps: Values,
        tasks: Values,
        states: Values,
        depth: Values,
    ) -> Features:
        arrays = [np.atleast_1d(np.asarray(v, dtype=float)) for v in (apps, tasks, states, depth)]
        arrays = list(np.broadcast_arrays(*arrays))
        return cls(*(np.array(a) for a in arrays))

    def __len__(self) -> int:
        return int(self.apps.shape[0])

    @property
    def log_diversity(self) -> np.ndarray:
        """log₂(A·S·D), the composition law's ceiling variable."""
        return np.log2(self.apps * self.states * self.depth)

    @property
    def log_tasks(self) -> np.ndarray:
        """log₂T."""
        return np.log2(self.tasks)

    @property
    def log_n(self) -> np.ndarray:
        """log₂N with N = A·T·S."""
        return np.log2(self.apps * self.tasks * self.states)


class Law(ABC):
    """A law P(θ; runs) with box bounds on θ, fitted by `envfactory.scaling.fit`."""

    name: ClassVar[str]
    title: ClassVar[str]
    formula: ClassVar[str]
    param_names: ClassVar[tuple[str, ...]]
    bounds: ClassVar[tuple[tuple[float, ...], tuple[float, ...]]]

    @abstractmethod
    def predict(self, theta: np.ndarray, f: Features) -> np.ndarray:
        """P for each run."""

    @abstractmethod
    def jacobian(self, theta: np.ndarray, f: Features) -> np.ndarray:
        """∂P/∂θ, one row per run."""

    @abstractmethod
    def linear_start(self, f: Features, scores: np.ndarray) -> np.ndarray:
        """A first start from a linear regression of logit(score)."""

    @abstractmethod
    def random_start(self, rng: np.random.Generator) -> np.ndarray:
        """A random start in a range where such laws usually live."""

    @abstractmethod
    def check_identifiable(self, f: Features, free: frozenset[str]) -> None:
        """Raise `FitError` when the runs cannot determine the `free` parameters (a variable never varies)."""

    def clip(self, theta: np.ndarray) -> np.ndarray:
        lo, hi = (np.asarray(b, dtype=float) for b in self.bounds)
        span = hi - lo
        return np.clip(theta, lo + 1e-6 * span, hi - 1e-6 * span)


def _logit_fit(columns: list[np.ndarray], scores: np.ndarray) -> np.ndarray:
    """Least-squares coefficients of logit(clipped score) on [1, *columns]."""
    y = np.log(np.clip(scores, 0.02, 0.98)) - np.log1p(-np.clip(scores, 0.02, 0.98))
    x = np.column_stack([np.ones_like(y), *columns])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return np.asarray(coef, dtype=float)


class CompositionLaw(Law):
    name = "composition"
    title = "composition law"
    formula = "P = σ(c₀ + c_a·log₂(A·S·D)) · σ(b₀ + b_t·log₂T)^ν"
    param_names = ("c0", "ca", "b0", "bt", "nu")
    bounds = (
        (INTERCEPT[0], SLOPE[0], INTERCEPT[0], SLOPE[0], SHAPE[0]),
        (INTERCEPT[1], SLOPE[1], INTERCEPT[1], SLOPE[1], SHAPE[1]),
    )

    def predict(self, theta: np.ndarray, f: Features) -> np.ndarray:
        c0, ca, b0, bt, nu = theta
        ceiling = expit(c0 + ca * f.log_diversity)
        return np.asarray(ceiling * np.exp(nu * log_expit(b0 + bt * f.log_tasks)), dtype=float)

    def jacobian(self, theta: np.ndarray, f: Features) -> np.ndarray:
        c0, ca, b0, bt, nu = theta
        x, y = f.log_diversity, f.log_tasks
        u, v = c0 + ca * x, b0 + bt * y
        p = expit(u) * np.exp(nu * log_expit(v))
        du = p * expit(-u)  # ∂P/∂u = P·(1 − σ(u))
        dv = nu * p * expit(-v)  # ∂P/∂v = ν·P·(1 − σ(v))
        return np.column_stack([du, du * x, dv, dv * y, p * log_expit(v)])

    def linear_start(self, f: Features, scores: np.ndarray) -> np.ndarray:
        b, bx, by = _logit_fit([f.log_diversity, f.log_tasks], scores)
        # both factors far from saturation: logit P ≈ u + v, so split the intercept between them
        return self.clip(np.array([b / 2, bx, b / 2, by, 1.0]))

    def random_start(self, rng: np.random.Generator) -> np.ndarray:
        return self.clip(
            np.array(
                [
                    rng.uniform(-4, 4),
                    rng.uniform(0.0, 1.5),
                    rng.uniform(-4, 4),
                    rng.uniform(0.0, 1.5),
                    float(np.exp(rng.uniform(np.log(0.25), np.log(4.0)))),
                ]
            )
        )

    def check_identifiable(self, f: Features, free: frozenset[str]) -> None:
        if "ca" in free and len(np.unique(f.log_diversity)) < 2:
            raise FitError("every run has the same A·S·D: the composition law's c_a cannot be fitted; vary A, S or D")
        if "bt" in free and len(np.unique(f.tasks)) < 2:
            raise FitError(
                "every run has the same T: the composition law's task term cannot be fitted; "
                "vary T, or hold it fixed (--fix bt=0 --fix nu=1)"
            )


class NOnlyLaw(Law):
    name = "n_only"
    title = "N-only baseline"
    formula = "P = σ(a₀ + a₁·log₂N)^ν,  N = A·T·S"
    param_names = ("a0", "a1", "nu")
    bounds = ((INTERCEPT[0], SLOPE[0], SHAPE[0]), (INTERCEPT[1], SLOPE[1], SHAPE[1]))

    def predict(self, theta: np.ndarray, f: Features) -> np.ndarray:
        a0, a1, nu = theta
        return np.asarray(np.exp(nu * log_expit(a0 + a1 * f.log_n)), dtype=float)

    def jacobian(self, theta: np.ndarray, f: Features) -> np.ndarray:
        a0, a1, nu = theta
        n = f.log_n
        w = a0 + a1 * n
        p = np.exp(nu * log_expit(w))
        dw = nu * p * expit(-w)
        return np.column_stack([dw, dw * n, p * log_expit(w)])

    def linear_start(self, f: Features, scores: np.ndarray) -> np.ndarray:
        a0, a1 = _logit_fit([f.log_n], scores)
        return self.clip(np.array([a0, a1, 1.0]))

    def random_start(self, rng: np.random.Generator) -> np.ndarray:
        return self.clip(
            np.array([rng.uniform(-4, 4), rng.uniform(0.0, 1.5), float(np.exp(rng.uniform(np.log(0.25), np.log(4.0))))])
        )

    def check_identifiable(self, f: Features, free: frozenset[str]) -> None:
        if "a1" in free and len(np.unique(f.log_n)) < 2:
            raise FitError("every run has the same N = A·T·S: the N-only baseline cannot be fitted; vary the budget")


COMPOSITION = CompositionLaw()
N_ONLY = NOnlyLaw()
LAWS: dict[str, Law] = {COMPOSITION.name: COMPOSITION, N_ONLY.name: N_ONLY}


class CompositionParams(BaseModel):
    """The composition law's parameters (the names `c0 ca b0 bt nu` are c₀, c_a, b₀, b_t, ν)."""

    c0: float
    ca: float
    b0: float
    bt: float
    nu: float = Field(gt=0.0)

    def theta(self) -> np.ndarray:
        return np.array([self.c0, self.ca, self.b0, self.bt, self.nu], dtype=float)

    def predict(
        self,
        apps: Values,
        tasks: Values,
        states: Values = 1,
        depth: Values = 1,
    ) -> np.ndarray:
        """P for each (A, T, S, D), broadcast like numpy."""
        return COMPOSITION.predict(self.theta(), Features.of(apps, tasks, states, depth))


class NOnlyParams(BaseModel):
    """The N-only baseline's parameters (a₀, a₁, ν)."""

    a0: float
    a1: float
    nu: float = Field(gt=0.0)

    def theta(self) -> np.ndarray:
        return np.array([self.a0, self.a1, self.nu], dtype=float)

    def predict(self, n: Values) -> np.ndarray:
        """P for each budget N."""
        return N_ONLY.predict(self.theta(), Features.of(n, 1, 1, 1))  # N = A with T = S = 1
