"""The in-process CLI helper prints as a new process would: as wide as `COLUMNS` says now, whatever width the
CLI's module-level consoles were made with."""

from __future__ import annotations

import importlib

import pytest

from tests.support.cli import run_cli


@pytest.mark.parametrize("module", ["envfactory.cli.main", "graphs.cli.envgen"])
def test_consoles_follow_columns_per_run(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    console = importlib.import_module(module).out
    made = console._width
    monkeypatch.setenv("COLUMNS", "217")
    seen: list[int] = []
    monkeypatch.setattr(console, "print", lambda *a, **k: seen.append(console.width))
    run_cli(["envgen", "threads"] if module.startswith("graphs") else ["envs", "list"])
    assert seen and set(seen) == {217}
    assert console._width == made  # put back for the next test
