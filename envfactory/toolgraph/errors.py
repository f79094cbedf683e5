"""The tool graph's one error type."""

from __future__ import annotations

from envfactory.errors import EnvFactoryError


class ToolGraphError(EnvFactoryError):
    """The tool graph cannot be built, read or used as asked (the CLI prints it on one line)."""
