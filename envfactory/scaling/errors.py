"""The errors of the scaling-law tools: each message is one line that says what to change."""

from __future__ import annotations

from envfactory.errors import DataError


class ScalingError(DataError):
    """Base class of the errors of `envfactory.scaling`."""


class RunTableError(ScalingError):
    """A run table cannot be read or a row of it is invalid (the message names the row and column)."""


class FitError(ScalingError):
    """A law cannot be fitted: too few runs, a variable that never varies, or no start converged."""


class BudgetError(ScalingError):
    """A composition search has no admissible composition (budget or limits out of range)."""
