"""The tool graph's one error type."""

from __future__ import annotations

from envfactory.errors import DataError


class ToolGraphError(DataError):
    """The tool graph cannot be built, read or used as asked (the CLI prints it on one line)."""
