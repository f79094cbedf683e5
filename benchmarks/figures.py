"""The headline figures a benchmark hands on (`--json PATH`), each beside what it is compared with in the same run.

`benchmarks/summary.py` runs the benchmarks with `--json` and makes the table of docs/performance.md from these
files, so the table is what the scripts measured, never typed in by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter


class Figure(BaseModel):
    """One measured figure: what, how much (`shown`: as the table prints it), beside what, and its target."""

    model_config = ConfigDict(extra="forbid")

    path: str  # the path: "reward", "offline synthesis", ...
    measure: str
    value: float
    shown: str
    beside: str = ""  # the baseline measured in the same run, shown with its name, or a quoted figure
    target: str = ""
    met: bool | None = None  # None: no target


FIGURES = TypeAdapter(list[Figure])


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the headline figures here (summary.py)")


def write_figures(path: Path | None, figures: list[Figure]) -> None:
    """Write `figures` to `path` as JSON (nothing when `path` is None)."""
    if path is not None:
        path.write_bytes(FIGURES.dump_json(figures, indent=1))


def read_figures(path: Path) -> list[Figure]:
    return FIGURES.validate_json(path.read_bytes())
