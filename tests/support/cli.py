"""`envfactory ARGV` run in the test's process (no interpreter start, models and caches already loaded): the
exit code and what it printed on each stream, the way a shell sees them."""

from __future__ import annotations

import contextlib
import io
import sys
from typing import NamedTuple

from envfactory import cli


class CliRun(NamedTuple):
    code: int
    stdout: str
    stderr: str


def run_cli(argv: list[str]) -> CliRun:
    """The CLI's `main()` (plugins included) with `argv`; the environment is the caller's (monkeypatch it)."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["envfactory", *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return CliRun(code, out.getvalue(), err.getvalue())
