"""The in-process CLI helper prints as a new process would: as wide as `COLUMNS` says now, whatever width the
CLI's module-level consoles were made with."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.paths import ROOT


@pytest.fixture(autouse=True)
def _own_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`envgen threads` reads the data folder's checkpoints: this test's own, not the checkout's (which other
    tests' runs may hold locked: one failed so under the full suite's load)."""
    monkeypatch.setenv("ENVFACTORY_ROOT", str(ROOT))
    monkeypatch.setenv("ENVFACTORY_DATA_DIR", str(tmp_path / "data"))


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
