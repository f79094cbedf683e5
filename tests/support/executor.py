"""Runners for the process executor tests, importable by its worker processes (they unpickle them by reference)."""

from __future__ import annotations

import os
import signal


class DiesOn:
    """Returns ten times its unit, except on `fatal`: there its worker process is killed, as the kernel's
    out-of-memory killer would."""

    def __init__(self, fatal: int) -> None:
        self.fatal = fatal

    def __call__(self, unit: int) -> int:
        if unit == self.fatal:
            os.kill(os.getpid(), signal.SIGKILL)
        return unit * 10


class HangsOn:
    """Returns ten times its unit, except on `stuck`: there it never returns (a regular expression that backtracks
    for ever holds the interpreter the same way, deaf to signals)."""

    def __init__(self, stuck: int) -> None:
        self.stuck = stuck

    def __call__(self, unit: int) -> int:
        if unit == self.stuck:
            while True:
                pass
        return unit * 10
