"""Runners for the Ray executor tests, importable by Ray's worker processes (they unpickle them by reference)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from envfactory.config import Settings
from envfactory.tasks.offline import UnitOutcome
from envfactory.tasks.plan import Unit
from envfactory.tasks.run import OfflineRunner


class SlowRunner(OfflineRunner):
    """Offline synthesis that takes at least `delay` seconds a unit and notes which process ran it (pids/)."""

    def __init__(self, settings: Settings, delay: float, notes: Path) -> None:
        super().__init__(settings)
        self.delay = delay
        self.notes = notes

    shipped = ("settings", "delay", "notes")

    def __call__(self, unit: Unit) -> UnitOutcome:
        (self.notes / str(os.getpid())).touch()
        time.sleep(self.delay)
        return super().__call__(unit)


class TaskOf:
    """Returns the Ray task that ran each job (units in one batch share it); a job of 13 raises."""

    def __call__(self, job: int) -> tuple[int, str]:
        import ray

        if job % 13 == 0:
            raise ValueError(f"job {job} fails")
        return job, ray.get_runtime_context().get_task_id() or ""


class SlowToStart:
    """Returns ten times its unit; a worker takes `start_s` to unpickle it (a runner that loads a pool, a model)."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s

    def __getstate__(self) -> dict[str, float]:
        return {"start_s": self.start_s}

    def __setstate__(self, state: dict[str, float]) -> None:
        time.sleep(state["start_s"])  # (in the worker: the driver never unpickles it)
        self.start_s = state["start_s"]

    def __call__(self, unit: int) -> int:
        return unit * 10


class _HoldsALock(Exception):
    """An exception that cannot be pickled (as a client library's, holding its connection or lock, can be)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        import threading

        self.lock = threading.Lock()


class _NeedsAKeyword(Exception):
    """Pickles, but cannot be rebuilt from its args (a required keyword-only argument, as openai's errors have)."""

    def __init__(self, message: str, *, response: object) -> None:
        super().__init__(message)
        self.response = response


class FailsOddly:
    """Returns ten times its job; job 5 raises an exception that cannot be pickled, job 7 one that cannot be
    unpickled, job 9 exits the worker's interpreter (`sys.exit`), job 11 raises an exception of a local class."""

    def __call__(self, job: int) -> int:
        if job == 5:
            raise _HoldsALock("job 5 holds a lock")
        if job == 7:
            raise _NeedsAKeyword("job 7 needs a keyword", response=None)
        if job == 9:
            raise SystemExit(3)
        if job == 11:  # plain pickle cannot take a class defined here; Ray's cloudpickle can: it travels as it is

            class LocalError(Exception):
                pass

            raise LocalError("job 11 is local")
        return job * 10
