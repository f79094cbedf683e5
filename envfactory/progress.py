"""Progress bars for long work that goes through named phases (a tool graph build: embedding, then the LLM)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


@contextmanager
def phase_bars(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    """A `progress(phase, done, total)` callback drawing one bar per phase on `console`, the first time it is named."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bars:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(phase, total=total)
            bars.update(tasks[phase], completed=done, total=total)

        yield progress
