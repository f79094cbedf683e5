"""`envfactory ARGV` run in the test's process (no interpreter start, models and caches already loaded): the
exit code and what it printed on each stream, the way a shell sees them."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import NamedTuple

from rich.console import Console

from envfactory import cli
from envfactory.llm import usage
from envfactory.llm.scripted import reset_scripted_models
from envfactory_agents.common import reset_model_cache


class CliRun(NamedTuple):
    code: int
    stdout: str
    stderr: str


def _cli_consoles() -> list[Console]:
    """The CLI's module-level consoles (made once, at import, with the width of that moment's `COLUMNS`): its own
    modules' and its sub-commands' (the `envfactory.cli` entry points: graphs.cli.envgen, ...)."""
    homes = ("envfactory.cli", "graphs.cli")
    modules = [m for name, m in list(sys.modules.items()) if name.startswith(homes) and m is not None]
    return [v for m in modules for v in vars(m).values() if isinstance(v, Console)]


def run_cli(argv: list[str]) -> CliRun:
    """The CLI's `main()` (plugins included) with `argv`; the environment is the caller's (monkeypatch it). The
    consoles print as wide as `COLUMNS` says now (default 80), as a new process's would, whatever width the
    test that first imported them had."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["envfactory", *argv]
    columns = os.environ.get("COLUMNS", "")
    consoles = {id(c): (c, c._width) for c in _cli_consoles()}
    for console, _ in consoles.values():
        console.width = int(columns) if columns.isdigit() else 80
    # what a new process starts without: scripted replies from the top, no models loaded, no LLM usage counted
    reset_model_cache()
    reset_scripted_models()
    counted = usage._PROCESS_USAGE
    usage._PROCESS_USAGE = usage.UsageTracker()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
        usage._PROCESS_USAGE = counted
        for console in _cli_consoles():  # a console made during the run goes back to the default width
            console._width = consoles.get(id(console), (console, None))[1]
    return CliRun(code, out.getvalue(), err.getvalue())
