"""Exceptions a user can act on. Every error the CLI reports derives from `EnvFactoryError`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def first_error(e: ValidationError, root: str = "") -> tuple[str, str]:
    """The first error of a pydantic validation: where (a dotted location, or `root` at the top) and what."""
    err = e.errors()[0]
    return ".".join(str(x) for x in err["loc"]) or root, err["msg"]


class EnvFactoryError(Exception):
    """Base class: the CLI prints the message on one line and exits non-zero."""


class MetadataError(EnvFactoryError):
    """A `metadata.json` (or metadata object) is malformed."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: field '{field}': {problem}")


class ContractError(EnvFactoryError):
    """An environment's code and metadata disagree, or the code breaks the environment contract."""

    def __init__(self, env: str, problems: list[str]) -> None:
        self.env, self.problems = env, problems
        joined = "; ".join(problems)
        super().__init__(f"environment '{env}' breaks the contract: {joined}")


class EnvNotFoundError(EnvFactoryError):
    """No environment of that name in the pool."""


class EnvLoadError(EnvFactoryError):
    """An environment folder exists but its code or files cannot be loaded."""


class ScenarioError(EnvFactoryError):
    """An initial config (scenario) does not exist or does not load into the state model."""


class ToolError(Exception):
    """Raised by a tool for bad input (unknown id, invalid value, violated precondition).

    A `Session` turns it into a structured error result and leaves the state untouched.
    It is not an `EnvFactoryError`: it is an expected outcome of a tool call, not a user error.
    """

    code = "tool_error"

    def __init__(self, message: str, **details: Any) -> None:
        self.message, self.details = message, details
        super().__init__(message)


class NotFoundError(ToolError):
    """An id that names no record."""

    code = "not_found"


class ConflictError(ToolError):
    """The request contradicts the current state (already cancelled, duplicate, insufficient funds...)."""

    code = "conflict"
