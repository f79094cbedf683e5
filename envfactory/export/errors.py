"""The one error the exporters raise: something a user can fix (a bad input file, an unknown environment)."""

from __future__ import annotations

from envfactory.errors import DataError


class ExportError(DataError):
    """Export failed: the CLI prints it on one line and exits 1."""
