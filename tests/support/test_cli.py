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


def test_a_sub_command_is_registered_once_however_many_runs() -> None:
    from envfactory.cli.main import app

    for _ in range(3):
        assert run_cli(["envgen", "threads"]).code == 0
    names = [group.name for group in app.registered_groups]
    assert names.count("envgen") == 1, names
